#pragma once
/// The two views of a route trace a replay needs: the engine's load batches
/// (what a cache sees) and one routing per (token, layer) (what a predictor is
/// scored on). See docs/traces.md.

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

/// One load batch of the engine: the experts one layer demanded at once.
struct load_batch {
  run_phase phase;
  std::uint32_t turn;
  std::uint32_t step;  ///< the first token's position
  layer_id layer;
  std::uint32_t first;  ///< index of the batch's first id in load_batches::experts (and in rows)
  std::uint32_t count;  ///< ids in the batch, duplicates included
};

/// The engine's load batches in execution order.
struct load_batches {
  /// Routed ids, batch after batch; token-major inside a prefill batch;
  /// duplicates kept. `experts[i]` is `rows[i].expert` of the trace.
  std::vector<expert_id> experts;
  std::vector<load_batch> batches;
  span<const expert_id> experts_of(const load_batch& b) const noexcept {
    return span<const expert_id>(experts.data() + b.first, b.count);
  }
};

/// Groups rows into the engine's load batches: prefill is one batch per
/// (turn, layer) holding every prompt token's ids, token-major (a new batch
/// also starts where the layer goes back down, i.e. at the next ubatch);
/// decode is one batch per (token, layer).
load_batches group_load_batches(const validated_route_trace& trace);
/// Validates the trace first (validate_route_trace), then groups it.
load_batches group_load_batches(const route_trace& trace);

/// One routing per (turn, phase, step, layer), ids and weights in rank
/// order; `declined` counts routings wider than 32, which are left out.
struct trace_routings {
  std::vector<routing> routings;
  std::size_t declined = 0;
};
trace_routings collect_routings(const validated_route_trace& trace);
/// Validates the trace first, then collects.
trace_routings collect_routings(const route_trace& trace);

namespace detail {
// `trace` is known valid.
inline load_batches group_valid_rows(const route_trace& trace) {
  if (trace.rows.size() > std::numeric_limits<std::uint32_t>::max())
    throw error("route_trace: " + std::to_string(trace.rows.size()) + " rows; load batches index at most 2^32 - 1");
  load_batches out;
  out.experts.reserve(trace.rows.size());
  const trace_row* prev = nullptr;
  for (std::size_t i = 0; i < trace.rows.size(); ++i) {
    const trace_row& r = trace.rows[i];
    // Prefill: a batch is a run of one layer's rows (all prompt tokens);
    // decode: one token's routing of one layer.
    const bool same = prev && r.turn == prev->turn && r.phase == prev->phase && r.layer == prev->layer &&
                      (r.phase == run_phase::prefill || r.step == prev->step);
    if (!same) out.batches.push_back(load_batch{r.phase, r.turn, r.step, r.layer, static_cast<std::uint32_t>(i), 0});
    ++out.batches.back().count;
    out.experts.push_back(r.expert);
    prev = &r;
  }
  return out;
}

inline trace_routings collect_valid_rows(const route_trace& trace) {
  trace_routings out;
  const auto& rows = trace.rows;
  for (std::size_t i = 0; i < rows.size();) {
    // Validation guarantees a routing is a run of rows with slots 0, 1, ...
    std::size_t j = i + 1;
    while (j < rows.size() && rows[j].slot != 0) ++j;
    if (j - i > routing::capacity) {
      ++out.declined;
    } else {
      routing r;
      r.layer = rows[i].layer;
      r.phase = rows[i].phase;
      r.token = rows[i].step;
      for (std::size_t s = i; s < j; ++s) r.push_back(rows[s].expert, rows[s].weight);
      out.routings.push_back(r);
    }
    i = j;
  }
  return out;
}
}  // namespace detail

inline load_batches group_load_batches(const validated_route_trace& trace) {
  return detail::group_valid_rows(trace.trace());
}
inline load_batches group_load_batches(const route_trace& trace) {
  detail::validate_rows(trace, "route_trace");
  return detail::group_valid_rows(trace);
}
inline trace_routings collect_routings(const validated_route_trace& trace) {
  return detail::collect_valid_rows(trace.trace());
}
inline trace_routings collect_routings(const route_trace& trace) {
  detail::validate_rows(trace, "route_trace");
  return detail::collect_valid_rows(trace);
}

}  // namespace moe_residency
