#pragma once
/// moe_residency_lab/manager_counts.hpp: the memory-lab manager's counts per decode
/// load of a lanes configuration (moe_residency_lab/mapping.hpp), equation (6)'s a_l
/// and p_l of timing.hpp: the experts it requests and its pinned cache's
/// misses. Their cost per count is measured by moe_residency_lab/manager.hpp;
/// moe_residency_lab/lab.hpp sets the counts on each load. Standard library only.

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/replay/dynamic.hpp"
#include "moe_residency_lab/mapping.hpp"
#include "moe_residency/trace/types.hpp"

namespace moe_residency::lab {

/// The pinned cache's misses at each decode load, as the manager's cache sees
/// them: the dynamic replay of an LRU of `budget_mib` with prefill_cached off
/// (the manager neither pins nor looks up a prompt batch), the rule the live
/// manager's own test holds it to; keyed (decode token, layer) like
/// load_event. Every miss is a lock (and, the cache being full, an
/// eviction's unlock).
class pinned_misses {
 public:
  pinned_misses(const route_trace& trace, double budget_mib) {
    dynamic_replay_options o;
    o.policy = "lru";
    o.budget_mib = budget_mib;
    o.guard = cycle_guard::off;
    o.prefill_cached = false;
    for (const load_event& e : replay_dynamic(routed_replay_input::from_trace(trace), o).decode_loads) {
      by_load_.push_back({{e.token, static_cast<std::uint16_t>(to_index(e.layer))}, e.misses});
      total_ += e.misses;
    }
  }
  /// The misses at load `e` (0 for a load the trace's decode batches do not have).
  std::uint16_t at(const load_event& e) const noexcept {
    const key k{e.token, static_cast<std::uint16_t>(to_index(e.layer))};
    // Execution order is token by token, layer by layer: sorted by key.
    const auto it =
        std::lower_bound(by_load_.begin(), by_load_.end(), k, [](const entry& x, const key& y) { return x.first < y; });
    return it != by_load_.end() && it->first == k ? it->second : std::uint16_t{0};
  }
  std::uint64_t total() const noexcept { return total_; }

 private:
  using key = std::pair<std::uint32_t, std::uint16_t>;
  using entry = std::pair<key, std::uint16_t>;
  std::vector<entry> by_load_;
  std::uint64_t total_ = 0;
};

/// The manager's counts of equation (6) on a lanes cell's loads: `requested`
/// (every routed expert with `exact` alone, plus each speculative read made
/// resident) and `pinned` (the pinned cache's misses).
inline void set_manager_counts(load_event& e, const lab_mapping& m, std::uint16_t pins) noexcept {
  e.requested = static_cast<std::uint16_t>((m.requests_routed ? e.hits + e.misses : 0) + e.speculative_inserted);
  e.pinned = m.pinned_mib > 0 ? pins : 0;
}

}  // namespace moe_residency::lab
