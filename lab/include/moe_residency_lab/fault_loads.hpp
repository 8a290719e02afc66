#pragma once
/// moe_residency_lab/fault_loads.hpp: the decode loads of the memory lab's
/// fault-driven configurations (moe_residency_lab/mapping.hpp): a route trace run
/// through the lab's page cache with read-around (moe_residency_lab/page_cache.hpp),
/// each load's misses the faults it takes, and `predicted`'s speculative reads
/// offered to the timing model. moe_residency_lab/lab.hpp times them. Standard library only.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/plan.hpp"
#include "moe_residency/replay/dynamic.hpp"
#include "moe_residency_lab/mapping.hpp"
#include "moe_residency_lab/page_cache.hpp"
#include "moe_residency/trace/batches.hpp"
#include "moe_residency/trace/types.hpp"

namespace moe_residency::lab {

/// The decode loads of a fault-driven run: every batch of the trace (prompt
/// and decode, in order) touches its layer's dense pages, then each routed
/// expert's slices; one load_event per decode (token, layer) whose `misses`
/// are the faults taken and `expert_bytes` the mean bytes a fault read (so
/// timing_simulator's reads are the faults, one after another on one lane).
/// `hits` counts routed experts that took no fault.
///
/// With the mapping's speculation (`predicted`): after each decode load, the
/// oracle's ranking (oracle_ranking, seeded by the speculation's seed) of the
/// MoE layer `horizon` ahead, planned by speculation_planner with nothing
/// counted resident (the manager plans around its pinned cache, which
/// `predicted` alone has not); each planned expert's missing slice pages are
/// one speculative read, offered to `obs.admit` (the timing model's
/// equation 7) and, when admitted, read into the page cache without
/// read-around. The target load counts them in `speculative_inserted` and
/// `speculative_inserted_bytes`, its experts they spared a fault in
/// `speculative_hits`. `obs.on_load` sees every decode load before its reads
/// are planned, as in replay_dynamic.
inline std::vector<load_event> readaround_loads(const route_trace& trace, const lab_mapping& m, double readaround_mib,
                                                std::size_t tensors = 3, page_reclaim reclaim = page_reclaim::two_list,
                                                const replay_observer& obs = {}) {
  if (m.kind != lab_model_kind::faults) throw error("readaround_loads: the mapping is not a fault-driven one");
  const lab_file_layout f = make_lab_file_layout(trace.header, tensors);
  const auto pages = [&](double mib) {
    return static_cast<std::uint64_t>(mib * 1048576.0 / static_cast<double>(f.page));
  };
  std::uint64_t capacity = pages(m.cache_mib);
  readaround_page_cache pc(f.pages, std::max<std::uint64_t>(1, capacity), pages(readaround_mib), reclaim);
  if (m.dense_pinned)
    for (const auto& b : f.layers) pc.pin(b.dense_first, b.dense_first + b.dense_pages);
  const replay_speculation& sp = m.speculation;
  const bool speculate = sp.source != speculation_source::none;
  if (speculate && sp.source != speculation_source::oracle)
    throw error(std::string("readaround_loads: speculation '") + sp.name() +
                "'; the fault model knows the oracle's predictions only");
  if (speculate && !sp.oracle_profile.empty() && sp.oracle_profile.size() != trace.header.n_layer)
    throw error("readaround_loads: oracle profile has " + std::to_string(sp.oracle_profile.size()) +
                " entries; expected " + std::to_string(trace.header.n_layer) + " (one P per layer)");
  std::optional<routed_replay_input> in;
  if (speculate) in.emplace(routed_replay_input::from_trace(trace));
  const speculation_planner planner(speculate ? sp.cap : 0);
  std::uint64_t rng = sp.seed;
  ranking rank;
  struct spec_read {
    layer_id layer;
    expert_id expert;
    std::uint64_t bytes;
  };
  std::vector<spec_read> pending;  // made resident, for a later load of this token

  const load_batches lb = group_load_batches(trace);
  std::vector<load_event> out;
  std::uint32_t token = 0;
  std::uint32_t last_step = 0;
  bool any_decode = false;
  std::vector<std::uint8_t> seen(trace.header.n_expert, 0);
  for (const load_batch& b : lb.batches) {
    const std::size_t l = to_index(b.layer);
    if (l >= f.layers.size()) continue;
    const bool decode = b.phase == run_phase::decode;
    if (decode) {
      if (any_decode && b.step != last_step) ++token, pending.clear();
      any_decode = true;
      last_step = b.step;
    }
    std::uint64_t read = 0;
    std::uint32_t faults = pc.touch(f.layers[l].dense_first, f.layers[l].dense_first + f.layers[l].dense_pages, read);
    std::uint16_t routed = 0, clean = 0, spared = 0;
    std::vector<expert_id> uniq;
    for (expert_id e : lb.experts_of(b)) {
      if (to_index(e) >= seen.size() || seen[to_index(e)]) continue;
      seen[to_index(e)] = 1;
      uniq.push_back(e);
    }
    const auto is_pending = [&](expert_id e) {
      for (const spec_read& r : pending)
        if (r.layer == b.layer && r.expert == e) return true;
      return false;
    };
    for (expert_id e : uniq) {
      seen[to_index(e)] = 0;
      std::uint32_t ef = 0;
      for (std::size_t t = 0; t < tensors; ++t) {
        const auto r = f.slice_pages(l, t, to_index(e));
        ef += pc.touch(r.first, r.second, read);
      }
      faults += ef;
      ++routed;
      clean += ef == 0;
      if (ef == 0 && decode && is_pending(e)) ++spared;
    }
    if (!decode) continue;
    load_event ev;
    ev.token = token;
    ev.layer = b.layer;
    ev.routed = routed;
    ev.hits = clean;
    ev.misses = static_cast<std::uint16_t>(std::min<std::uint32_t>(faults, 65535));
    ev.demanded_bytes = read * f.page;
    ev.expert_bytes = faults ? read * f.page / faults : 0;
    ev.speculative_hits = spared;
    std::size_t keep = 0;
    for (const spec_read& r : pending) {
      if (r.layer != b.layer) {
        pending[keep++] = r;
        continue;
      }
      ++ev.speculative_inserted;
      ev.speculative_inserted_bytes += r.bytes;
    }
    pending.resize(keep);
    if (obs.on_load) obs.on_load(ev);
    layer_id target{};
    if (speculate && moe_layer_ahead(in->shape(), b.layer, sp.horizon, target)) {
      const routing* truth = in->decode_routing(token, target);
      if (truth) {
        const double p = sp.oracle_profile.empty() ? sp.oracle_p : sp.oracle_profile[to_index(target)];
        detail::oracle_ranking(*truth, p, in->shape().n_experts(), rng, rank);
        const speculation_plan plan =
            planner.plan(target, rank, in->shape().top_k(), [](layer_id, expert_id) noexcept { return false; });
        for (std::size_t i = 0; i < plan.size(); ++i) {
          const std::size_t tl = to_index(target), e = to_index(plan.id(i));
          std::uint64_t missing = 0;
          for (std::size_t t = 0; t < tensors; ++t) {
            const auto r = f.slice_pages(tl, t, e);
            missing += pc.missing(r.first, r.second);
          }
          ++ev.speculative_issued;
          if (obs.admit && !obs.admit(target, missing * f.page)) {
            ++ev.speculative_cancelled;
            continue;
          }
          for (std::size_t t = 0; t < tensors; ++t) {
            const auto r = f.slice_pages(tl, t, e);
            pc.read(r.first, r.second);
          }
          ev.speculative_bytes += missing * f.page;
          pending.push_back(spec_read{target, plan.id(i), missing * f.page});
        }
      }
    }
    out.push_back(ev);
  }
  return out;
}

}  // namespace moe_residency::lab
