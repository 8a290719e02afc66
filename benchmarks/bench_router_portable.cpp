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

#include <cstddef>
#include <cstdint>

#include "moe_residency/router.hpp"
#include "router_fixture.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(_MSC_VER)
#define BENCH_X86_GNU 1
#include <immintrin.h>
#else
#define BENCH_X86_GNU 0
#endif

namespace mr = moe_residency;

namespace {

using namespace router_bench;

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

#if BENCH_X86_GNU
__attribute__((target("avx2"))) std::uint32_t read_avx2(const std::uint32_t* p, std::size_t words) {
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

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") != 0;
}
#endif

// The widest read the CPU can do: AVX2 through the target attribute where the
// CPU has it, else the TU's own SIMD.
void BM_stream_read_best(benchmark::State& st) {
  if (!check_flags(st)) return;
#if BENCH_X86_GNU
  if (cpu_has_avx2()) {
    run_stream_read(st, read_avx2, "avx2 (target attribute)");
    return;
  }
#endif
  run_stream_read(st, read_compiled, xsimd::default_arch::name());
}

void BM_stream_read_compiled(benchmark::State& st) {
  if (!check_flags(st)) return;
  run_stream_read(st, read_compiled, xsimd::default_arch::name());
}

void BM_gemv(benchmark::State& st) {
  if (!check_flags(st)) return;
  run_gemv(
      st, [](const mr::matrix_view& w, const float* x, float* y) { mr::gemv(w, x, y); }, mr::gemv_arch_name());
}

void BM_gemv_compiled_arch(benchmark::State& st) {
  if (!check_flags(st)) return;
  run_gemv(
      st, [](const mr::matrix_view& w, const float* x, float* y) { mr::gemv_simd<xsimd::default_arch>(w, x, y); },
      xsimd::default_arch::name());
}

void BM_gemv_scalar(benchmark::State& st) {
  if (!check_flags(st)) return;
  run_gemv(
      st, [](const mr::matrix_view& w, const float* x, float* y) { mr::gemv_scalar(w, x, y); }, "scalar");
}

// One token's 48 routers (from the last-level cache or DRAM).
void BM_stream_read_token_best(benchmark::State& st) {
  if (!check_flags(st)) return;
#if BENCH_X86_GNU
  if (cpu_has_avx2()) {
    run_stream_read_token(st, read_avx2, "avx2 (target attribute)");
    return;
  }
#endif
  run_stream_read_token(st, read_compiled, xsimd::default_arch::name());
}

void BM_gemv_token(benchmark::State& st) {
  if (!check_flags(st)) return;
  run_gemv_token(
      st, [](const mr::matrix_view& w, const float* x, float* y) { mr::gemv(w, x, y); }, mr::gemv_arch_name());
}

// The two above alternating in one loop: their ratio on the same machine state.
void BM_token_pair(benchmark::State& st) {
  if (!check_flags(st)) return;
  const auto kernel = [](const mr::matrix_view& w, const float* x, float* y) { mr::gemv(w, x, y); };
#if BENCH_X86_GNU
  if (cpu_has_avx2()) {
    run_token_pair(st, read_avx2, kernel, mr::gemv_arch_name() + std::string(" vs avx2 read"));
    return;
  }
#endif
  run_token_pair(st, read_compiled, kernel, mr::gemv_arch_name());
}

// One router in cache, the best read and `gemv` in turn (see bench_router's
// BM_cache_pair).
void BM_cache_pair(benchmark::State& st) {
  if (!check_flags(st)) return;
  const auto kernel = [](const mr::matrix_view& w, const float* x, float* y) { mr::gemv(w, x, y); };
#if BENCH_X86_GNU
  if (cpu_has_avx2()) {
    run_token_pair(st, read_avx2, kernel, mr::gemv_arch_name() + std::string(" vs avx2 read"), 1);
    return;
  }
#endif
  run_token_pair(st, read_compiled, kernel, mr::gemv_arch_name(), 1);
}

#if BENCH_X86_GNU && MOE_RESIDENCY_DETAIL_GEMV_DISPATCH
// The dispatched kernels in turn with the best read on one fixture (args
// {type, routers}: 0 routers is a token's 48, 1 one router in cache): `gemv`
// (f16 and bf16 on the 512-bit kernel where the CPU has AVX-512F) and
// `narrow`, the 256-bit kernel alone (x86_tune_narrow). Counters: each one's
// CPU time over the read's. (A 32-register copy of the f32 kernel for
// AVX-512VL CPUs was timed here and not kept: docs/results/2026-12-03-benchmark-runs.md,
// 2026-12-02.)
void BM_token_kernels(benchmark::State& st) {
  if (!check_flags(st)) return;
  if (!cpu_has_avx2()) {
    st.SkipWithError("the CPU lacks AVX2+FMA+F16C: nothing is dispatched");
    return;
  }
  constexpr bool fused = MOE_RESIDENCY_FUSED_MADD != 0;
  run_token_kernels(st, read_avx2,
                    {{"gemv", [](const mr::matrix_view& w, const float* x, float* y) { mr::gemv(w, x, y); }},
                     {"narrow", [](const mr::matrix_view& w, const float* x, float* y) {
                        mr::detail::gemv_x86_impl<mr::detail::gemv_default_tag, fused, mr::detail::x86_tune_narrow>(
                            w.data, w.type, w.rows, w.cols, w.row_stride_bytes, x, y, mr::activation_rounding::engine);
                      }}});
}
#endif

void BM_gemv_naive_f16_call(benchmark::State& st) {
  if (!check_flags(st)) return;
  run_gemv_naive_f16_call(st, "naive call per element");
}

}  // namespace

BENCHMARK(BM_stream_read_best)->Apply(shapes);
BENCHMARK(BM_stream_read_compiled)->Apply(shapes);
BENCHMARK(BM_gemv)->Apply(shapes);
BENCHMARK(BM_gemv_compiled_arch)->Apply(shapes);
BENCHMARK(BM_gemv_scalar)->Apply(shapes);
BENCHMARK(BM_stream_read_token_best)->Arg(0)->Arg(1)->Arg(2);
BENCHMARK(BM_gemv_token)->Arg(0)->Arg(1)->Arg(2);
BENCHMARK(BM_token_pair)->Arg(0)->Arg(1)->Arg(2);
BENCHMARK(BM_cache_pair)->Arg(0)->Arg(1)->Arg(2);
BENCHMARK(BM_gemv_naive_f16_call)->Args({1, 128})->Args({1, 256});
#if BENCH_X86_GNU && MOE_RESIDENCY_DETAIL_GEMV_DISPATCH
BENCHMARK(BM_token_kernels)->Args({1, 0})->Args({1, 1})->Args({2, 0})->Args({2, 1});
#endif
