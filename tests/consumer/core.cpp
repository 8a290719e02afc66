// A user of moe_residency::core only: every core header, no xsimd, Eigen or
// threads on the include path when scripts/check-core-only.sh builds it. It
// parses a small trace and replays it through an LRU cache big enough to hold
// every expert, so the hits are exactly the repeats: 8 lookups, 4 hits; and
// again through the core's replay grid (replay/cells.hpp, no threads).
#include <moe_residency/cache.hpp>
#include <moe_residency/core.hpp>
#include <moe_residency/error.hpp>
#include <moe_residency/plan.hpp>
#include <moe_residency/predict/contract.hpp>
#include <moe_residency/predict/history.hpp>
#include <moe_residency/replay/cells.hpp>
#include <moe_residency/score.hpp>
#include <moe_residency/trace.hpp>
#include <moe_residency/version.hpp>

#include <cstdio>

int main() {
  using namespace moe_residency;
  // 2 layers x 4 experts, top-2; three decode tokens; layer 1 repeats {2,3} twice.
  const char* csv =
      "# route_trace v1\n"
      "# model=m.gguf arch=tiny n_layer=2 n_expert=4 n_expert_used=2\n"
      "# layer=0 expert_bytes=100 dense_bytes=0\n"
      "# layer=1 expert_bytes=100 dense_bytes=0\n"
      "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n"
      "0,1,0,0,0,0,0.6,0,100\n0,1,0,0,1,1,0.4,0,100\n"
      "0,1,0,1,0,2,0.5,0,100\n0,1,0,1,1,3,0.5,0,100\n"
      "0,1,1,0,0,0,0.8,1,0\n0,1,1,0,1,1,0.2,1,0\n"
      "0,1,1,1,0,3,0.7,1,0\n0,1,1,1,1,2,0.3,1,0\n";
  const route_trace trace = parse_route_trace_csv(csv, "core consumer");
  const load_batches lb = group_load_batches(trace);
  cache_options opt;
  opt.budget_bytes = 1000;
  expert_cache<lru_policy> cache(trace.shape(), opt);
  for (const load_batch& b : lb.batches) cache.access_batch(b.phase, b.layer, lb.experts_of(b));
  const cache_counters& c = cache.stats().all;
  std::printf("consumer (core): moe-residency %d, %zu batches, %llu lookups, %llu hits\n", MOE_RESIDENCY_VERSION,
              lb.batches.size(), static_cast<unsigned long long>(c.lookups), static_cast<unsigned long long>(c.hits));
  // The same trace, budget and policy through the core's replay grid: the same hits.
  const replay_input in = replay_input::from_trace(trace);
  const std::vector<replay_result> grid = replay_cells(in, {1000.0 / 1048576}, {"lru"});
  const bool same = grid.size() == 1 && grid[0].stats.all.hits == c.hits && grid[0].stats.all.lookups == c.lookups;
  return lb.batches.size() == 4 && c.lookups == 8 && c.hits == 4 && same ? 0 : 1;
}
