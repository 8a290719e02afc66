// Top-k selection of a router's scores (k = 2, 4, 6, 8 of 128 and 256
// experts): the library's one-pass insertion buffer (detail::top_k_indices,
// what route_token/select_experts run) against std::partial_sort of an index
// array and a full index sort (what ggml's argsort does before taking the
// first k), all with the same order (higher score first, ties to the lower
// index). Each benchmark checks once that its answer equals the full sort.
// Scores are fresh logits per call from a pool of 64 (routers' logits are
// roughly normal), so branch predictors cannot learn one input.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "moe_residency/router.hpp"

namespace {

namespace mr = moe_residency;
constexpr std::size_t pool = 64;

struct scores {
  std::vector<std::vector<float>> s;
  explicit scores(std::size_t n) : s(pool, std::vector<float>(n)) {
    std::mt19937 rng(7);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto& v : s)
      for (auto& x : v) x = d(rng);
  }
};

const scores& get(std::size_t n) {
  static const scores s128(128), s256(256);
  return n == 128 ? s128 : s256;
}

bool by_rank(const float* s, std::uint32_t a, std::uint32_t b) {
  return mr::detail::ranks_before(s[a], a, s[b], b);
}

void full_sort(const float* s, std::size_t n, std::size_t k, std::uint32_t* idx, std::uint32_t* out) {
  std::iota(idx, idx + n, 0u);
  std::sort(idx, idx + n, [s](std::uint32_t a, std::uint32_t b) { return by_rank(s, a, b); });
  std::copy(idx, idx + k, out);
}

void partial(const float* s, std::size_t n, std::size_t k, std::uint32_t* idx, std::uint32_t* out) {
  std::iota(idx, idx + n, 0u);
  std::partial_sort(idx, idx + k, idx + n,
                    [s](std::uint32_t a, std::uint32_t b) { return by_rank(s, a, b); });
  std::copy(idx, idx + k, out);
}

void library(const float* s, std::size_t n, std::size_t k, std::uint32_t*, std::uint32_t* out) {
  mr::detail::top_k_indices(s, n, k, out);
}

template <class F>
void run(benchmark::State& st, F f) {
  const auto n = static_cast<std::size_t>(st.range(0)), k = static_cast<std::size_t>(st.range(1));
  const scores& sc = get(n);
  std::vector<std::uint32_t> idx(n), out(k), want(k);
  for (const auto& v : sc.s) {  // the answer, checked before timing
    full_sort(v.data(), n, k, idx.data(), want.data());
    f(v.data(), n, k, idx.data(), out.data());
    if (out != want) {
      st.SkipWithError("top-k differs from the full index sort");
      return;
    }
  }
  std::size_t i = 0;
  for (auto _ : st) {
    f(sc.s[i++ % pool].data(), n, k, idx.data(), out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  st.SetItemsProcessed(st.iterations());
}

void args(benchmark::internal::Benchmark* b) {
  for (const std::int64_t n : {128, 256})
    for (const std::int64_t k : {2, 4, 6, 8}) b->Args({n, k});
}

void BM_topk_library(benchmark::State& st) { run(st, library); }
void BM_topk_partial_sort(benchmark::State& st) { run(st, partial); }
void BM_topk_full_sort(benchmark::State& st) { run(st, full_sort); }

}  // namespace

BENCHMARK(BM_topk_library)->Apply(args);
BENCHMARK(BM_topk_partial_sort)->Apply(args);
BENCHMARK(BM_topk_full_sort)->Apply(args);
