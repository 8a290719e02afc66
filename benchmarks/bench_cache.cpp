// Cache speed: lookups per second per core of each policy on a long synthetic
// decode trace, and one (policy, budget) replay cell of the real Qwen trace,
// each against a std::list + std::unordered_map LRU with the same batch
// accounting, measured in the same run. Report ratios, not absolute times.
//
//   cmake -S . -B build-rel -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOE_RESIDENCY_BUILD_BENCHMARKS=ON
//   cmake --build build-rel --target bench_cache && build-rel/benchmarks/bench_cache

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <list>
#include <random>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "moe_residency/replay.hpp"

// Replaces global new/delete with counting versions (this program's only TU):
// the synthetic cells report heap allocations during lookups, which must be 0.
#include "../tests/alloc_counter.hpp"

using namespace moe_residency;

namespace {

struct synthetic {
  model_shape shape = presets::qwen3_30b_a3b(8);
  std::vector<expert_id> ids;  // 8 per (token, layer)
  std::size_t batches = 0;
  synthetic() {
    std::mt19937 rng(42);
    // Skewed routing (Zipf-like per layer) so the cache hits about half the time.
    std::vector<double> w(128);
    for (int e = 0; e < 128; ++e) w[e] = 1.0 / (1 + e);
    std::discrete_distribution<int> d(w.begin(), w.end());
    for (int t = 0; t < 2000; ++t)
      for (int l = 0; l < 48; ++l) {
        std::vector<int> r;
        while (r.size() < 8) {
          const int e = (d(rng) + l * 13) % 128;
          if (std::find(r.begin(), r.end(), e) == r.end()) r.push_back(e);
        }
        for (int e : r) ids.push_back(expert_id(static_cast<std::uint16_t>(e)));
        ++batches;
      }
  }
};

const synthetic& synth() {
  static const synthetic s;
  return s;
}

/// The naive reference: std::list + std::unordered_map LRU, same accounting.
class naive_lru {
 public:
  naive_lru(const model_shape& s, std::uint64_t budget) : shape_(s), budget_(budget) {}
  void batch(layer_id l, span<const expert_id> ids) {
    touched_.clear();
    for (expert_id e : ids) {
      const std::uint32_t key = static_cast<std::uint32_t>(to_index(l) << 16 | to_index(e));
      const bool first = touched_.insert(key).second;
      auto it = where_.find(key);
      if (it != where_.end()) {
        hits_ += first;
        order_.splice(order_.begin(), order_, it->second);
      } else {
        order_.push_front(key);
        where_[key] = order_.begin();
        used_ += shape_.expert_bytes(l);
      }
    }
    auto it = order_.end();
    while (used_ > budget_ && it != order_.begin()) {
      --it;
      if (touched_.count(*it)) continue;
      used_ -= shape_.expert_bytes(layer_id(static_cast<std::uint16_t>(*it >> 16)));
      where_.erase(*it);
      it = order_.erase(it);
    }
  }
  std::uint64_t hits() const { return hits_; }

 private:
  const model_shape& shape_;
  std::uint64_t budget_, used_ = 0, hits_ = 0;
  std::list<std::uint32_t> order_;
  std::unordered_map<std::uint32_t, std::list<std::uint32_t>::iterator> where_;
  std::unordered_set<std::uint32_t> touched_;
};

constexpr double synthetic_budget_mib = 3000;

template <class Policy>
void synthetic_cell(benchmark::State& st, Policy proto) {
  const synthetic& s = synth();
  std::uint64_t hits = 0;
  long allocations = 0;
  for (auto _ : st) {
    cache_options o;
    o.budget_bytes = from_mib(synthetic_budget_mib);
    expert_cache<Policy> c(s.shape, o, proto);  // allocates here, not below
    const long before = moe_residency_test::allocations();
    for (std::size_t b = 0; b < s.batches; ++b)
      c.access_batch(run_phase::decode, layer_id(static_cast<std::uint16_t>(b % 48)),
                     span<const expert_id>(s.ids.data() + b * 8, 8));
    allocations += moe_residency_test::allocations() - before;
    hits = c.stats().all.hits;
    benchmark::DoNotOptimize(hits);
  }
  // Heap allocations per lookup on the hot path (after construction): 0.
  st.counters["allocs_per_lookup"] =
      static_cast<double>(allocations) / (static_cast<double>(s.ids.size()) * static_cast<double>(st.iterations()));
  st.counters["lookups/s"] = benchmark::Counter(
      static_cast<double>(s.ids.size()) * static_cast<double>(st.iterations()), benchmark::Counter::kIsRate);
  st.counters["hit%"] = 100.0 * static_cast<double>(hits) / static_cast<double>(s.ids.size());
}

void BM_synthetic_naive_list_lru(benchmark::State& st) {
  const synthetic& s = synth();
  for (auto _ : st) {
    naive_lru c(s.shape, from_mib(synthetic_budget_mib));
    for (std::size_t b = 0; b < s.batches; ++b)
      c.batch(layer_id(static_cast<std::uint16_t>(b % 48)), span<const expert_id>(s.ids.data() + b * 8, 8));
    benchmark::DoNotOptimize(c.hits());
  }
  st.counters["lookups/s"] = benchmark::Counter(
      static_cast<double>(s.ids.size()) * static_cast<double>(st.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_synthetic_naive_list_lru)->Unit(benchmark::kMillisecond);

void BM_synthetic_lru(benchmark::State& st) { synthetic_cell(st, lru_policy{}); }
void BM_synthetic_lfu(benchmark::State& st) { synthetic_cell(st, lfu_policy{}); }
void BM_synthetic_random(benchmark::State& st) { synthetic_cell(st, random_policy{}); }
void BM_synthetic_layer(benchmark::State& st) { synthetic_cell(st, layer_lru_policy{}); }
void BM_synthetic_layerlfu(benchmark::State& st) { synthetic_cell(st, layer_lfu_policy{}); }
void BM_synthetic_arc(benchmark::State& st) { synthetic_cell(st, arc_policy{}); }
void BM_synthetic_s3fifo(benchmark::State& st) { synthetic_cell(st, s3fifo_policy{}); }
void BM_synthetic_sieve(benchmark::State& st) { synthetic_cell(st, sieve_policy{}); }
void BM_synthetic_cycle(benchmark::State& st) { synthetic_cell(st, cycle_policy{}); }
// Eight shadow caches behind every lookup: the price of choosing among them.
void BM_synthetic_adaptive(benchmark::State& st) { synthetic_cell(st, adaptive_policy{}); }
void BM_synthetic_belady(benchmark::State& st) {
  static const auto idx = [] {
    auto i = std::make_shared<next_use_index>(synth().shape);
    for (std::size_t b = 0; b < synth().batches; ++b)
      i->add_batch(layer_id(static_cast<std::uint16_t>(b % 48)), span<const expert_id>(synth().ids.data() + b * 8, 8));
    i->finish();
    return i;
  }();
  synthetic_cell(st, belady_policy{idx});
}
BENCHMARK(BM_synthetic_lru)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_synthetic_lfu)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_synthetic_random)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_synthetic_layer)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_synthetic_layerlfu)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_synthetic_belady)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_synthetic_arc)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_synthetic_s3fifo)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_synthetic_sieve)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_synthetic_cycle)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_synthetic_adaptive)->Unit(benchmark::kMillisecond);

// ---- one cell of the real Qwen trace (4000 MiB, the phone's budget) --------

const replay_input* qwen() {
  static const std::unique_ptr<replay_input> in = []() -> std::unique_ptr<replay_input> {
    const char* env = std::getenv("MOE_RESIDENCY_TRACES");
    const std::string dir = env && *env ? env : MOE_RESIDENCY_DEFAULT_TRACES;
    try {
      return std::make_unique<replay_input>(replay_input::from_file(dir + "/qwen.route.csv"));
    } catch (const std::exception&) {
      return nullptr;
    }
  }();
  return in.get();
}

void BM_qwen_cell_naive_list_lru(benchmark::State& st) {
  const replay_input* in = qwen();
  if (!in) return st.SkipWithError("qwen.route.csv not found (set MOE_RESIDENCY_TRACES)");
  for (auto _ : st) {
    naive_lru c(in->shape(), from_mib(4000));
    for (const auto& b : in->batches().batches) c.batch(b.layer, in->batches().experts_of(b));
    benchmark::DoNotOptimize(c.hits());
  }
}
BENCHMARK(BM_qwen_cell_naive_list_lru)->Unit(benchmark::kMicrosecond);

void BM_qwen_cell(benchmark::State& st, const char* policy) {
  const replay_input* in = qwen();
  if (!in) return st.SkipWithError("qwen.route.csv not found (set MOE_RESIDENCY_TRACES)");
  for (auto _ : st) benchmark::DoNotOptimize(replay_cell(*in, policy, 4000).stats.all.hits);
}
BENCHMARK_CAPTURE(BM_qwen_cell, lru, "lru")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_qwen_cell, layerlfu, "layerlfu")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_qwen_cell, belady, "belady")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_qwen_cell, cycle, "cycle")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_qwen_cell, adaptive, "adaptive")->Unit(benchmark::kMicrosecond);

}  // namespace
