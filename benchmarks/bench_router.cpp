// Router GEMV throughput as bytes of router matrix per second, against
// references measured in the same run: a streaming read of the same bytes
// (the memory-bandwidth roofline for this matrix), the scalar reference
// kernel, and a naive f16 GEMV that converts every element through an
// out-of-line function (the mistake that cost a first implementation
// 109 ms/token). Compare the ratios, not absolute times.
#include <benchmark/benchmark.h>

#include "moe_residency/router.hpp"
#include "router_fixture.hpp"

namespace mr = moe_residency;

namespace {

using namespace router_bench;

// Roofline: read the same bytes with full-width SIMD integer loads and four
// independent sums (no conversion, no multiply): the most a GEMV over this
// matrix could stream from wherever it lives (cache or DRAM) in this run.
void BM_stream_read(benchmark::State& st) { run_stream_read(st, read_compiled); }

void BM_gemv(benchmark::State& st) {
  run_gemv(
      st, [](const mr::matrix_view& w, const float* x, float* y) { mr::gemv(w, x, y); },
      mr::gemv_arch_name());
}

void BM_gemv_scalar(benchmark::State& st) {
  run_gemv(st, [](const mr::matrix_view& w, const float* x, float* y) { mr::gemv_scalar(w, x, y); });
}

// One token's 48 routers (from the last-level cache or DRAM).
void BM_stream_read_token(benchmark::State& st) { run_stream_read_token(st, read_compiled); }
void BM_gemv_token(benchmark::State& st) {
  run_gemv_token(
      st, [](const mr::matrix_view& w, const float* x, float* y) { mr::gemv(w, x, y); },
      mr::gemv_arch_name());
}

// The 109 ms/token mistake: one out-of-line call per element.
void BM_gemv_naive_f16_call(benchmark::State& st) { run_gemv_naive_f16_call(st); }

}  // namespace

BENCHMARK(BM_stream_read)->Apply(shapes);
BENCHMARK(BM_gemv)->Apply(shapes);
BENCHMARK(BM_gemv_scalar)->Apply(shapes);
BENCHMARK(BM_stream_read_token)->Arg(0)->Arg(1)->Arg(2);
BENCHMARK(BM_gemv_token)->Arg(0)->Arg(1)->Arg(2);
BENCHMARK(BM_gemv_naive_f16_call)->Args({1, 128})->Args({1, 256});
