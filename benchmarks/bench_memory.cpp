// The machine's memory bandwidth, for docs/benchmarks.md's header: one core
// streaming reads over a 512 MiB buffer (far beyond every cache), with the
// widest integer loads this TU is compiled for and four independent sums.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include <xsimd/xsimd.hpp>

namespace {

std::uint32_t read(const std::uint32_t* p, std::size_t words) {
  using U = xsimd::batch<std::uint32_t, xsimd::default_arch>;
  U a(0u), b(0u), c(0u), d(0u);
  for (std::size_t i = 0; i + 4 * U::size <= words; i += 4 * U::size) {
    a += U::load_unaligned(p + i);
    b += U::load_unaligned(p + i + U::size);
    c += U::load_unaligned(p + i + 2 * U::size);
    d += U::load_unaligned(p + i + 3 * U::size);
  }
  alignas(64) std::uint32_t out[U::size];
  ((a + b) + (c + d)).store_aligned(out);
  return out[0];
}

void BM_dram_read(benchmark::State& st) {
  const std::size_t bytes = std::size_t{512} << 20;
  std::vector<std::uint32_t> buf(bytes / 4);
  for (std::size_t i = 0; i < buf.size(); i += 1024) buf[i] = static_cast<std::uint32_t>(i);
  for (auto _ : st) benchmark::DoNotOptimize(read(buf.data(), buf.size()));
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * static_cast<std::int64_t>(bytes));
  st.SetLabel("512 MiB, one core");
}

}  // namespace

BENCHMARK(BM_dram_read)->Unit(benchmark::kMillisecond);
