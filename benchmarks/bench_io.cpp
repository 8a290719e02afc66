// The read scheduler's cost per demanded load: quiesce() + demand(k reads)
// (+ handing 2 speculative reads over) against calling the same callback k
// times directly, as a ratio measured in the same process (counter `x_direct`).
//
//   cmake --preset benchmarks   (or: cmake -S . -B build-bench -G Ninja
//     -DCMAKE_BUILD_TYPE=Release -DMOE_RESIDENCY_BUILD_BENCHMARKS=ON)
//   cmake --build build/benchmarks --target bench_io && ./build/benchmarks/benchmarks/bench_io
//
// Args: {lanes (0 = synchronous), callback work in µs (busy-wait; 0 = empty)}.
// k = 8 demanded reads per load (Qwen3-30B top-8, all misses: the worst case).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "moe_residency/io.hpp"

namespace {

using namespace moe_residency;
using clock_type = std::chrono::steady_clock;

constexpr std::size_t k = 8;
std::atomic<std::uint64_t> g_sink{0};

// The callback's work: a busy-wait of `us` microseconds (sleeping would
// measure the timer, not the scheduler), then a counter bump.
read_status work(std::int64_t us) noexcept {
  if (us > 0) {
    const auto until = clock_type::now() + std::chrono::microseconds(us);
    while (clock_type::now() < until) {
    }
  }
  g_sink.fetch_add(1, std::memory_order_relaxed);
  return read_status::ok;
}

// Nanoseconds per load for k direct calls (the reference), median of 5 runs.
double direct_ns_per_load(std::int64_t us) {
  auto direct = [us](layer_id, expert_id, read_reason) noexcept { return work(us); };
  const int loads = us > 0 ? 200 : 200000;
  std::vector<double> runs;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = clock_type::now();
    for (int i = 0; i < loads; ++i)
      for (std::size_t j = 0; j < k; ++j)
        benchmark::DoNotOptimize(direct(layer_id{}, expert_id(static_cast<std::uint16_t>(j)), read_reason::demanded));
    runs.push_back(std::chrono::duration<double, std::nano>(clock_type::now() - t0).count() / loads);
  }
  std::sort(runs.begin(), runs.end());
  return runs[2];
}

void report(benchmark::State& state, double ns_per_load, double direct_ns) {
  state.counters["ns_per_load"] = ns_per_load;
  state.counters["direct_ns_per_load"] = direct_ns;
  state.counters["x_direct"] = ns_per_load / direct_ns;
  state.counters["overhead_ns_per_load"] = ns_per_load - direct_ns;
}

// The loop both benchmarks share: a scheduler with the lanes and callback
// work of the args {lanes, work_us}, each iteration quiesce() then the k
// demanded reads, then `after(s)`; reports ns per load against k direct
// calls. Returns the scheduler's stats at the end.
template <class After>
scheduler_stats run_loads(benchmark::State& state, After after) {
  const std::size_t lanes = static_cast<std::size_t>(state.range(0));
  const std::int64_t us = state.range(1);
  const double direct = direct_ns_per_load(us);
  scheduler_options o;
  o.lanes = lanes;
  read_scheduler s([us](layer_id, expert_id, read_reason) { return work(us); }, o);
  std::vector<read_request> reads;
  for (std::size_t j = 0; j < k; ++j)
    reads.push_back(read_request{layer_id{}, expert_id(static_cast<std::uint16_t>(j)), 1});
  std::vector<read_outcome> out(k);
  std::uint64_t loads = 0;
  const auto t0 = clock_type::now();
  for (auto _ : state) {
    benchmark::DoNotOptimize(s.quiesce().size());
    benchmark::DoNotOptimize(s.demand({reads.data(), k}, {out.data(), k}));
    after(s);
    ++loads;
  }
  const double ns = std::chrono::duration<double, std::nano>(clock_type::now() - t0).count() /
                    static_cast<double>(std::max<std::uint64_t>(loads, 1));
  report(state, ns, direct);
  return s.stats();
}

// One demanded load through the scheduler: quiesce, then the k misses.
void BM_demanded_load(benchmark::State& state) {
  run_loads(state, [](read_scheduler&) {});
}

// A layer's whole I/O cycle with speculation: quiesce (cancelling or waiting
// for the 2 reads handed over last layer), the k demanded reads, then 2
// speculative reads handed over (synchronous mode runs them at pump()).
void BM_layer_with_speculation(benchmark::State& state) {
  const scheduler_stats st = run_loads(state, [](read_scheduler& s) {
    s.speculate(read_request{layer_id{1}, expert_id{100}, 1});
    s.speculate(read_request{layer_id{1}, expert_id{101}, 1});
    s.pump();
  });
  state.counters["spec_completed_pct"] =
      st.issued ? 100.0 * static_cast<double>(st.completed) / static_cast<double>(st.issued) : 0.0;
}

void args(benchmark::internal::Benchmark* b) {
  for (int lanes : {0, 1, 2})
    for (int us : {0, 20}) b->Args({lanes, us});
  b->ArgNames({"lanes", "work_us"});
  b->UseRealTime();
  b->MinTime(0.2);
}

BENCHMARK(BM_demanded_load)->Apply(args);
BENCHMARK(BM_layer_with_speculation)->Apply(args);

}  // namespace
