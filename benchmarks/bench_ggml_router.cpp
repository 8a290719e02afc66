// The library's router GEMV next to ggml's own CPU mat-vec on the same router
// and the same input: a one-token ggml_mul_mat graph (what llama.cpp runs for
// a MoE layer's ffn_gate_inp in decode), single-threaded, with a persistent
// threadpool and work buffer so only the graph's compute is timed. Built only
// when an installed ggml is found (benchmarks/CMakeLists.txt; e.g.
// -DCMAKE_PREFIX_PATH=<scripts/fetch-llama-cpp.sh --install prefix>).
//
// Two placements, each for f32, f16 and bf16 routers of 128 x 2048:
//   /1  one router, hot in cache (the same matrix every call);
//   /48 one token's 48 routers (Qwen3-30B shape, 24 MiB of f16): ggml as one
//       graph of 48 mul_mat nodes, the library as 48 gemv calls.
// Before timing, every benchmark checks that ggml's logits and gemv's are the
// same bits (ggml built with FMA: gemv in this -march=native TU fuses too) and
// refuses to report otherwise; the counter bit_identical_rows says how many
// rows were compared. BM_pair runs the two in turn on one setup (the ratio
// scripts/bench.sh reports).
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <ggml-cpu.h>
#include <ggml.h>

#include "moe_residency/router.hpp"
#include "router_fixture.hpp"

namespace {

namespace mr = moe_residency;

constexpr std::size_t rows = 128, cols = 2048;

mr::element_type type_of(std::int64_t i) { return static_cast<mr::element_type>(i); }

ggml_type ggml_type_of(mr::element_type t) {
  return t == mr::element_type::f32 ? GGML_TYPE_F32 : t == mr::element_type::f16 ? GGML_TYPE_F16 : GGML_TYPE_BF16;
}

/// n_routers routers of type t and an input per router, as ggml tensors in
/// one graph (Y_l = W_l · x_l) and as matrix_views of the same bytes.
struct setup {
  mr::element_type t;
  std::size_t n;
  ggml_context* ctx = nullptr;
  ggml_cgraph* graph = nullptr;
  std::vector<ggml_tensor*> w, x, y;
  ggml_threadpool* pool = nullptr;
  ggml_cplan plan{};
  std::vector<std::uint8_t> work;

  setup(mr::element_type type, std::size_t n_routers) : t(type), n(n_routers) {
    const std::size_t es = mr::element_size(t);
    ggml_init_params ip{};
    ip.mem_size =
        n * (rows * cols * es + cols * 4 + rows * 4 + 4 * ggml_tensor_overhead()) + ggml_graph_overhead() + (1u << 20);
    ip.mem_buffer = nullptr;
    ip.no_alloc = false;
    ctx = ggml_init(ip);
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 0.05f);
    graph = ggml_new_graph(ctx);
    for (std::size_t l = 0; l < n; ++l) {
      ggml_tensor* wl = ggml_new_tensor_2d(ctx, ggml_type_of(t), cols, rows);
      ggml_tensor* xl = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, cols, 1);
      for (std::size_t i = 0; i < rows * cols; ++i) {
        const float v = d(rng);
        if (t == mr::element_type::f32) static_cast<float*>(wl->data)[i] = v;
        else
          static_cast<std::uint16_t*>(wl->data)[i] =
              t == mr::element_type::f16 ? mr::detail::f32_to_f16_bits(v) : mr::detail::f32_to_bf16_bits(v);
      }
      for (std::size_t i = 0; i < cols; ++i) static_cast<float*>(xl->data)[i] = d(rng) * 20.0f;
      ggml_tensor* yl = ggml_mul_mat(ctx, wl, xl);
      ggml_build_forward_expand(graph, yl);
      w.push_back(wl);
      x.push_back(xl);
      y.push_back(yl);
    }
    ggml_threadpool_params tp = ggml_threadpool_params_default(1);
    pool = ggml_threadpool_new(&tp);
    plan = ggml_graph_plan(graph, 1, pool);
    work.resize(plan.work_size + 64);
    plan.work_data = work.data();
  }
  ~setup() {
    ggml_threadpool_free(pool);
    ggml_free(ctx);
  }
  setup(const setup&) = delete;
  setup& operator=(const setup&) = delete;

  mr::matrix_view view(std::size_t l) const {
    if (t == mr::element_type::f32)
      return mr::matrix_view::f32(static_cast<const float*>(w[l]->data), rows, cols, w[l]->nb[1]);
    if (t == mr::element_type::f16)
      return mr::matrix_view::f16(static_cast<const std::uint16_t*>(w[l]->data), rows, cols, w[l]->nb[1]);
    return mr::matrix_view::bf16(static_cast<const std::uint16_t*>(w[l]->data), rows, cols, w[l]->nb[1]);
  }
  void run_ggml() { ggml_graph_compute(graph, &plan); }
  void run_ours(float* out) const {
    for (std::size_t l = 0; l < n; ++l) mr::gemv(view(l), static_cast<const float*>(x[l]->data), out + l * rows);
  }
  /// Rows whose bits agree (all n * rows when identical).
  std::size_t identical_rows() {
    run_ggml();
    std::vector<float> ours(n * rows);
    run_ours(ours.data());
    std::size_t same = 0;
    for (std::size_t l = 0; l < n; ++l)
      same += std::memcmp(y[l]->data, ours.data() + l * rows, rows * sizeof(float)) == 0 ? rows : 0;
    return same;
  }
};

std::string label(mr::element_type t, std::size_t n) {
  return std::string(mr::to_string(t)) + " " + std::to_string(n) + " x " + std::to_string(rows) + "x" +
         std::to_string(cols);
}

void BM_ggml_mul_mat(benchmark::State& st) {
  setup s(type_of(st.range(0)), static_cast<std::size_t>(st.range(1)));
  const std::size_t same = s.identical_rows();
  if (same != s.n * rows) return st.SkipWithError("ggml and gemv logits differ");
  for (auto _ : st) {
    s.run_ggml();
    benchmark::ClobberMemory();
  }
  st.counters["bit_identical_rows"] = static_cast<double>(same);
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) *
                       static_cast<std::int64_t>(s.n * rows * cols * mr::element_size(s.t)));
  st.SetLabel(label(s.t, s.n) + " ggml " + std::string(ggml_cpu_has_fma() ? "fma" : "no-fma"));
}

void BM_gemv_same_router(benchmark::State& st) {
  setup s(type_of(st.range(0)), static_cast<std::size_t>(st.range(1)));
  const std::size_t same = s.identical_rows();
  if (same != s.n * rows) return st.SkipWithError("ggml and gemv logits differ");
  std::vector<float> out(s.n * rows);
  for (auto _ : st) {
    s.run_ours(out.data());
    benchmark::ClobberMemory();
  }
  st.counters["bit_identical_rows"] = static_cast<double>(same);
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) *
                       static_cast<std::int64_t>(s.n * rows * cols * mr::element_size(s.t)));
  st.SetLabel(label(s.t, s.n) + " " + mr::gemv_arch_name());
}

// The two in turn within each iteration (which goes first alternating), each
// timed with the thread's CPU clock, 32 calls a turn for one router: the two
// benchmarks above run seconds apart, and on a shared VM the ratio of their
// times moved by 20% between runs. Counters: ours_over_ggml (the ratio
// scripts/bench.sh reports), each one's mean µs per call.
void BM_pair(benchmark::State& st) {
  setup s(type_of(st.range(0)), static_cast<std::size_t>(st.range(1)));
  const std::size_t same = s.identical_rows();
  if (same != s.n * rows) return st.SkipWithError("ggml and gemv logits differ");
  std::vector<float> out(s.n * rows);
  const std::size_t reps = s.n < 4 ? 32 : 1;
  double spent[2] = {0, 0};
  std::size_t first = 0;
  for (auto _ : st) {
    for (std::size_t j = 0; j < 2; ++j) {
      const std::size_t which = (first + j) % 2;
      const double t0 = router_bench::thread_seconds();
      for (std::size_t r = 0; r < reps; ++r) {
        if (which == 0) s.run_ggml();
        else s.run_ours(out.data());
        benchmark::ClobberMemory();
      }
      spent[which] += router_bench::thread_seconds() - t0;
    }
    first ^= 1;
  }
  const double calls = static_cast<double>(st.iterations()) * static_cast<double>(reps);
  st.counters["bit_identical_rows"] = static_cast<double>(same);
  st.counters["ggml_us"] = 1e6 * spent[0] / calls;
  st.counters["ours_us"] = 1e6 * spent[1] / calls;
  st.counters["ours_over_ggml"] = spent[0] > 0 ? spent[1] / spent[0] : 0.0;
  st.SetLabel(label(s.t, s.n) + " " + mr::gemv_arch_name() + " and ggml in turn");
}

void args(benchmark::internal::Benchmark* b) {
  for (const std::int64_t t : {0, 1, 2})
    for (const std::int64_t n : {1, 48}) b->Args({t, n});
}

}  // namespace

BENCHMARK(BM_ggml_mul_mat)->Apply(args)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_gemv_same_router)->Apply(args)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_pair)->Apply(args)->Unit(benchmark::kMicrosecond);
