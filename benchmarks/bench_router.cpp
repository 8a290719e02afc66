// Router GEMV throughput as bytes of router matrix per second, against
// references measured in the same run: a streaming read of the same bytes
// (the memory-bandwidth roofline for this matrix), the scalar reference
// kernel, and a naive f16 GEMV that converts every element through an
// out-of-line function (the mistake that cost a first implementation
// 109 ms/token). Compare the ratios, not absolute times.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "moe_residency/router.hpp"

namespace mr = moe_residency;

namespace {

constexpr std::size_t cols = 2048;

struct fixture {
  std::vector<float> f32;
  std::vector<std::uint16_t> h16;
  std::vector<float> x, y;
  fixture(mr::element_type t, std::size_t rows) : x(cols), y(rows) {
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 0.05f);
    for (auto& v : x) v = d(rng) * 20.0f;
    if (t == mr::element_type::f32) {
      f32.resize(rows * cols);
      for (auto& v : f32) v = d(rng);
    } else {
      h16.resize(rows * cols);
      for (auto& v : h16)
        v = t == mr::element_type::f16 ? mr::detail::f32_to_f16_bits(d(rng))
                                       : mr::detail::f32_to_bf16_bits(d(rng));
    }
  }
  mr::matrix_view view(mr::element_type t, std::size_t rows) const {
    if (t == mr::element_type::f32) return mr::matrix_view::f32(f32.data(), rows, cols);
    if (t == mr::element_type::f16) return mr::matrix_view::f16(h16.data(), rows, cols);
    return mr::matrix_view::bf16(h16.data(), rows, cols);
  }
};

mr::element_type type_of(std::int64_t i) { return static_cast<mr::element_type>(i); }

void set_bytes(benchmark::State& st, const mr::matrix_view& w) {
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) *
                       static_cast<std::int64_t>(w.bytes()));
  st.SetLabel(std::string(mr::to_string(w.type)) + " " + std::to_string(w.rows) + "x" +
              std::to_string(w.cols));
}

// Roofline: read the same bytes with full-width SIMD integer loads and four
// independent sums (no conversion, no multiply): the most a GEMV over this
// matrix could stream from wherever it lives (cache or DRAM) in this run.
void BM_stream_read(benchmark::State& st) {
  using U = xsimd::batch<std::uint32_t, xsimd::default_arch>;
  const auto t = type_of(st.range(0));
  const auto rows = static_cast<std::size_t>(st.range(1));
  const fixture f(t, rows);
  const auto w = f.view(t, rows);
  const std::size_t words = w.bytes() / 4;
  const auto* p = static_cast<const std::uint32_t*>(w.data);
  for (auto _ : st) {
    U a(0u), b(0u), c(0u), d(0u);
    for (std::size_t i = 0; i + 4 * U::size <= words; i += 4 * U::size) {
      a += U::load_unaligned(p + i);
      b += U::load_unaligned(p + i + U::size);
      c += U::load_unaligned(p + i + 2 * U::size);
      d += U::load_unaligned(p + i + 3 * U::size);
    }
    alignas(64) std::uint32_t out[U::size];
    ((a + b) + (c + d)).store_aligned(out);
    benchmark::DoNotOptimize(out[0]);
  }
  set_bytes(st, w);
}

void BM_gemv(benchmark::State& st) {
  const auto t = type_of(st.range(0));
  const auto rows = static_cast<std::size_t>(st.range(1));
  fixture f(t, rows);
  const auto w = f.view(t, rows);
  for (auto _ : st) {
    mr::gemv(w, f.x.data(), f.y.data());
    benchmark::DoNotOptimize(f.y.data());
    benchmark::ClobberMemory();
  }
  set_bytes(st, w);
  st.SetLabel(std::string(mr::to_string(t)) + " " + std::to_string(rows) + "x2048 " +
              mr::gemv_arch_name());
}

void BM_gemv_scalar(benchmark::State& st) {
  const auto t = type_of(st.range(0));
  const auto rows = static_cast<std::size_t>(st.range(1));
  fixture f(t, rows);
  const auto w = f.view(t, rows);
  for (auto _ : st) {
    mr::gemv_scalar(w, f.x.data(), f.y.data());
    benchmark::DoNotOptimize(f.y.data());
    benchmark::ClobberMemory();
  }
  set_bytes(st, w);
}

// The 109 ms/token mistake: one out-of-line call per element.
#if defined(__GNUC__)
__attribute__((noinline))
#endif
float exported_f16_to_f32(std::uint16_t h) {
  return mr::detail::f16_to_f32(h);
}

void BM_gemv_naive_f16_call(benchmark::State& st) {
  const auto rows = static_cast<std::size_t>(st.range(1));
  fixture f(mr::element_type::f16, rows);
  const auto w = f.view(mr::element_type::f16, rows);
  for (auto _ : st) {
    for (std::size_t r = 0; r < rows; ++r) {
      float s = 0.0f;
      for (std::size_t c = 0; c < cols; ++c) s += exported_f16_to_f32(f.h16[r * cols + c]) * f.x[c];
      f.y[r] = s;
    }
    benchmark::DoNotOptimize(f.y.data());
    benchmark::ClobberMemory();
  }
  set_bytes(st, w);
}

void shapes(benchmark::internal::Benchmark* b) {
  for (const std::int64_t t : {0, 1, 2})
    for (const std::int64_t rows : {128, 256}) b->Args({t, rows});
}

}  // namespace

BENCHMARK(BM_stream_read)->Apply(shapes);
BENCHMARK(BM_gemv)->Apply(shapes);
BENCHMARK(BM_gemv_scalar)->Apply(shapes);
BENCHMARK(BM_gemv_naive_f16_call)->Args({1, 128})->Args({1, 256});
