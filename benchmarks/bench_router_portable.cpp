// Router GEMV as a user's default build runs it: this file must be compiled
// WITHOUT -march flags (benchmarks/CMakeLists.txt excludes it from
// -march=native), so on x86-64 the TU has SSE2 only and `gemv` reaches
// AVX2+FMA+F16C through run-time dispatch. Every benchmark reports bytes of
// router matrix per second; compare each against the rooflines measured in
// the same run:
//   BM_stream_read_best      the widest streaming read the CPU can do (AVX2
//                            via a target attribute where available): the
//                            ceiling a GEMV over these bytes could reach;
//   BM_stream_read_compiled  the same read with the TU's own SIMD (SSE2).
// Kernels: BM_gemv (what users get: dispatched where the CPU allows),
// BM_gemv_compiled_arch (gemv_simd<xsimd::default_arch>: the kernel `gemv` ran
// before dispatch existed), BM_gemv_scalar, and the naive one-call-per-element
// f16 GEMV (the 109 ms/token mistake).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "moe_residency/router.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(_MSC_VER)
#define BENCH_X86_GNU 1
#include <immintrin.h>
#else
#define BENCH_X86_GNU 0
#endif

namespace mr = moe_residency;

namespace {

constexpr std::size_t cols = 2048;

#if defined(__AVX2__) && defined(__F16C__)
constexpr bool built_portable = false;
#else
constexpr bool built_portable = true;
#endif

// Refuses to measure a TU built with -march flags: its numbers would not be
// the default build's.
bool check_flags(benchmark::State& st) {
  if (!built_portable) {
    st.SkipWithError("bench_router_portable was compiled with AVX2+F16C; build it without -march");
    return false;
  }
  return true;
}

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

void set_bytes(benchmark::State& st, const mr::matrix_view& w, const std::string& what) {
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) *
                       static_cast<std::int64_t>(w.bytes()));
  st.SetLabel(std::string(mr::to_string(w.type)) + " " + std::to_string(w.rows) + "x" +
              std::to_string(w.cols) + " " + what);
}

// Four independent integer sums over the bytes, no conversion, no multiply.
std::uint32_t read_compiled(const std::uint32_t* p, std::size_t words) {
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

#if BENCH_X86_GNU
__attribute__((target("avx2"))) std::uint32_t read_avx2(const std::uint32_t* p,
                                                        std::size_t words) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (std::size_t i = 0; i + 32 <= words; i += 32) {
    a = _mm256_add_epi32(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_add_epi32(b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    c = _mm256_add_epi32(c, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 16)));
    d = _mm256_add_epi32(d, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 24)));
  }
  const __m256i s = _mm256_add_epi32(_mm256_add_epi32(a, b), _mm256_add_epi32(c, d));
  return static_cast<std::uint32_t>(_mm256_extract_epi32(s, 0));
}
#endif

bool cpu_has_avx2() {
#if BENCH_X86_GNU
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") != 0;
#else
  return false;
#endif
}

void BM_stream_read_best(benchmark::State& st) {
  if (!check_flags(st)) return;
  const auto t = type_of(st.range(0));
  const auto rows = static_cast<std::size_t>(st.range(1));
  const fixture f(t, rows);
  const auto w = f.view(t, rows);
  const std::size_t words = w.bytes() / 4;
  const auto* p = static_cast<const std::uint32_t*>(w.data);
  const bool avx2 = cpu_has_avx2();
  for (auto _ : st) {
#if BENCH_X86_GNU
    const std::uint32_t s = avx2 ? read_avx2(p, words) : read_compiled(p, words);
#else
    const std::uint32_t s = read_compiled(p, words);
#endif
    benchmark::DoNotOptimize(s);
  }
  set_bytes(st, w, avx2 ? "avx2 (target attribute)" : xsimd::default_arch::name());
}

void BM_stream_read_compiled(benchmark::State& st) {
  if (!check_flags(st)) return;
  const auto t = type_of(st.range(0));
  const auto rows = static_cast<std::size_t>(st.range(1));
  const fixture f(t, rows);
  const auto w = f.view(t, rows);
  const std::size_t words = w.bytes() / 4;
  const auto* p = static_cast<const std::uint32_t*>(w.data);
  for (auto _ : st) {
    const std::uint32_t s = read_compiled(p, words);
    benchmark::DoNotOptimize(s);
  }
  set_bytes(st, w, xsimd::default_arch::name());
}

void BM_gemv(benchmark::State& st) {
  if (!check_flags(st)) return;
  const auto t = type_of(st.range(0));
  const auto rows = static_cast<std::size_t>(st.range(1));
  fixture f(t, rows);
  const auto w = f.view(t, rows);
  for (auto _ : st) {
    mr::gemv(w, f.x.data(), f.y.data());
    benchmark::DoNotOptimize(f.y.data());
    benchmark::ClobberMemory();
  }
  set_bytes(st, w, mr::gemv_arch_name());
}

void BM_gemv_compiled_arch(benchmark::State& st) {
  if (!check_flags(st)) return;
  const auto t = type_of(st.range(0));
  const auto rows = static_cast<std::size_t>(st.range(1));
  fixture f(t, rows);
  const auto w = f.view(t, rows);
  for (auto _ : st) {
    mr::gemv_simd<xsimd::default_arch>(w, f.x.data(), f.y.data());
    benchmark::DoNotOptimize(f.y.data());
    benchmark::ClobberMemory();
  }
  set_bytes(st, w, xsimd::default_arch::name());
}

void BM_gemv_scalar(benchmark::State& st) {
  if (!check_flags(st)) return;
  const auto t = type_of(st.range(0));
  const auto rows = static_cast<std::size_t>(st.range(1));
  fixture f(t, rows);
  const auto w = f.view(t, rows);
  for (auto _ : st) {
    mr::gemv_scalar(w, f.x.data(), f.y.data());
    benchmark::DoNotOptimize(f.y.data());
    benchmark::ClobberMemory();
  }
  set_bytes(st, w, "scalar");
}

#if defined(__GNUC__)
__attribute__((noinline))
#endif
float exported_f16_to_f32(std::uint16_t h) {
  return mr::detail::f16_to_f32(h);
}

void BM_gemv_naive_f16_call(benchmark::State& st) {
  if (!check_flags(st)) return;
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
  set_bytes(st, w, "naive call per element");
}

void shapes(benchmark::internal::Benchmark* b) {
  for (const std::int64_t t : {0, 1, 2})
    for (const std::int64_t rows : {128, 256}) b->Args({t, rows});
}

}  // namespace

BENCHMARK(BM_stream_read_best)->Apply(shapes);
BENCHMARK(BM_stream_read_compiled)->Apply(shapes);
BENCHMARK(BM_gemv)->Apply(shapes);
BENCHMARK(BM_gemv_compiled_arch)->Apply(shapes);
BENCHMARK(BM_gemv_scalar)->Apply(shapes);
BENCHMARK(BM_gemv_naive_f16_call)->Args({1, 128})->Args({1, 256});
