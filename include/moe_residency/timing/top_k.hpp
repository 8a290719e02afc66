#pragma once
/// timing/top_k.hpp: top-k as a lever of the what-if — a route trace brought
/// to another number of experts per routing, so that the replay and the
/// timing model can be asked what top-K would cost on the same tokens.
///
/// - **Narrower** (K < the trace's k): each routing keeps its first K slots
///   (the K highest-weighted experts: slot is the rank). Replayed, not
///   modelled: a router run at top-K selects exactly those. The weights stay
///   as recorded (an engine would renormalise them; only a drop policy reads
///   them).
/// - **Wider** (K > k): the trace never saw the experts a wider routing would
///   add, so they are **modelled**: each routing of layer l gains K − k
///   experts it does not already route, drawn without replacement with
///   probability proportional to how often layer l routed each expert over the
///   whole trace (its frequency), from a generator seeded by `seed` and the
///   routing's (turn, phase, step, layer) — the same routing gains the same
///   experts in every call. When fewer than K − k experts outside the routing
///   were ever routed at layer l, the rest are drawn uniformly from the
///   never-routed ones. An added slot's weight is the routing's lowest recorded
///   weight, its recorded residency a miss. A real top-K router's extra experts
///   are the next ranks of the same logits, correlated with the first k;
///   frequency draws are not, so a wider what-if's hit rate is a model's.
///
/// Standard library only.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/trace/types.hpp"
#include "moe_residency/trace/validate.hpp"

namespace moe_residency {

/// What with_top_k did.
struct top_k_change {
  std::size_t from = 0, to = 0;
  bool modelled = false;        ///< true when experts were added (K > k): not a replay of what ran
  std::uint64_t seed = 0;       ///< the draws' seed (modelled only)
  std::size_t routings = 0;     ///< routings changed
  std::size_t added_slots = 0;  ///< experts added (K > k), or slots removed (K < k)
};

namespace detail {

/// SplitMix64: the draws' generator (small, seedable, the same on every platform).
inline std::uint64_t top_k_mix(std::uint64_t& s) noexcept {
  std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// A uniform double in [0, 1) from 53 bits of the generator.
inline double top_k_unit(std::uint64_t& s) noexcept {
  return static_cast<double>(top_k_mix(s) >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace detail

/// σ (expert_compute_share) from the trace header's bytes: a layer's compute
/// on a CPU that decodes one token at a time is bound by the weight bytes it
/// streams, so the share that scales with the experts executed is the
/// experts' bytes at the trace's top-k over those and the dense bytes,
/// k × Σ expert_bytes / (k × Σ expert_bytes + Σ dense_bytes), over every
/// layer. Throws `error` when the header records no dense bytes (the share
/// would be 1, which no model computes at) or no expert bytes.
inline double expert_share_from_bytes(const trace_header& h) {
  double expert = 0, dense = 0;
  for (std::uint64_t b : h.expert_bytes) expert += static_cast<double>(b);
  for (std::uint64_t b : h.dense_bytes) dense += static_cast<double>(b);
  expert *= static_cast<double>(h.n_expert_used);
  if (!(dense > 0) || !(expert > 0))
    throw error("expert share from bytes: the trace header records " +
                std::to_string(static_cast<std::uint64_t>(dense)) + " dense and " +
                std::to_string(static_cast<std::uint64_t>(expert)) +
                " expert bytes per token; expected both > 0 (its '# layer=' lines' dense_bytes and expert_bytes)");
  return expert / (expert + dense);
}

/// `t` with every routing brought to `k` experts (see the header comment).
/// Throws `error` naming k and the trace's bounds when k is 0, above 32 (the
/// replay's routing width) or above the trace's experts; and like
/// validate_route_trace on the result. `info`, when given, says what changed.
inline validated_route_trace with_top_k(const route_trace& t, std::size_t k, std::uint64_t seed,
                                        top_k_change* info = nullptr) {
  const trace_header& h = t.header;
  const std::size_t from = h.n_expert_used, n_expert = h.n_expert;
  if (k < 1 || k > 32 || k > n_expert)
    throw error("top-k " + std::to_string(k) + "; expected 1 to " +
                std::to_string(std::min<std::size_t>(32, n_expert)) + " (at most the trace's " +
                std::to_string(n_expert) + " experts, and 32)");
  top_k_change c;
  c.from = from;
  c.to = k;
  c.modelled = k > from;
  c.seed = seed;
  route_trace out;
  out.header = h;
  out.header.n_expert_used = k;
  out.rows.reserve(t.rows.size() / std::max<std::size_t>(1, from) * k + k);
  // Each layer's frequency over the whole trace (every phase): the draws' weights.
  std::vector<std::vector<double>> freq(h.n_layer, std::vector<double>(n_expert, 0.0));
  if (c.modelled)
    for (const trace_row& r : t.rows)
      if (to_index(r.layer) < h.n_layer && to_index(r.expert) < n_expert)
        freq[to_index(r.layer)][to_index(r.expert)] += 1;
  auto same_routing = [](const trace_row& a, const trace_row& b) {
    return a.turn == b.turn && a.phase == b.phase && a.step == b.step && a.layer == b.layer;
  };
  std::vector<double> w;
  std::vector<bool> taken(n_expert);
  for (std::size_t i = 0; i < t.rows.size();) {
    std::size_t j = i + 1;
    while (j < t.rows.size() && same_routing(t.rows[i], t.rows[j])) ++j;
    ++c.routings;
    const std::size_t have = j - i;
    for (std::size_t s = i; s < j && s - i < k; ++s) out.rows.push_back(t.rows[s]);
    if (have > k) c.added_slots += have - k;
    if (have < k) {
      const trace_row& first = t.rows[i];
      const std::size_t layer = to_index(first.layer);
      std::fill(taken.begin(), taken.end(), false);
      float lowest = std::numeric_limits<float>::quiet_NaN();
      for (std::size_t s = i; s < j; ++s) {
        if (to_index(t.rows[s].expert) < n_expert) taken[to_index(t.rows[s].expert)] = true;
        if (std::isfinite(t.rows[s].weight) && !(lowest <= t.rows[s].weight)) lowest = t.rows[s].weight;
      }
      // A generator per routing: the same routing gains the same experts whatever else the trace holds.
      std::uint64_t state = seed;
      for (std::uint64_t key : {std::uint64_t{first.turn}, std::uint64_t{first.phase == run_phase::decode},
                                std::uint64_t{first.step}, std::uint64_t{layer}})
        state = detail::top_k_mix(state) ^ key;
      const std::vector<double>& f = freq[layer < freq.size() ? layer : 0];
      for (std::size_t add = have; add < k; ++add) {
        // Proportional to frequency among the experts the layer routed and this routing did not;
        // uniform over the never-routed ones when those run out.
        double total = 0;
        w.assign(n_expert, 0.0);
        for (std::size_t e = 0; e < n_expert; ++e)
          if (!taken[e]) total += (w[e] = f[e]);
        if (!(total > 0))
          for (std::size_t e = 0; e < n_expert; ++e)
            if (!taken[e]) total += (w[e] = 1.0);
        double x = detail::top_k_unit(state) * total;
        std::size_t pick = n_expert;
        for (std::size_t e = 0; e < n_expert; ++e) {
          if (w[e] <= 0) continue;
          pick = e;
          if (x < w[e]) break;
          x -= w[e];
        }
        taken[pick] = true;
        trace_row r = first;
        r.expert = expert_id(static_cast<std::uint16_t>(pick));
        r.slot = static_cast<std::uint8_t>(add);
        r.weight = lowest;
        r.residency = 0;
        r.expert_bytes = layer < h.expert_bytes.size() ? h.expert_bytes[layer] : 0;
        r.dropped = h.has_dropped_column ? 0 : -1;
        out.rows.push_back(r);
        ++c.added_slots;
      }
    }
    i = j;
  }
  if (info) *info = c;
  return validate_route_trace(std::move(out), "top-k " + std::to_string(k) + " of the trace");
}

}  // namespace moe_residency
