#pragma once
/// A trace's first `n` layers: the same tokens, each routing only the layers
/// below `n`. What a model of the trace's first layers (a shape cut in half to
/// fit a disk, say) routes when a recorded trace drives it: like the whole
/// model, the cut one computes its last MoE layer of a prompt only for the
/// rows whose logits it needs, so that layer's prompt rows are those of the
/// steps the trace's own last MoE layer routed (llama.cpp's output rows).
/// Standard library only.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <utility>

#include "moe_residency/error.hpp"
#include "moe_residency/trace/types.hpp"
#include "moe_residency/trace/validate.hpp"

namespace moe_residency {

/// The first `n` layers of `t` (1 <= n <= its layers; throws `error` naming
/// `source`, n and the layer count otherwise, or when no routed layer is left).
/// The result is validated (a prompt's rows now end at layer n - 1 for every
/// prompt token, which the row order allows).
inline validated_route_trace first_layers(const validated_route_trace& t, std::size_t n,
                                          const std::string& source = "route_trace") {
  const trace_header& h = t.header();
  if (n < 1 || n > h.n_layer)
    throw error(source + ": first " + std::to_string(n) + " layers; expected 1 to " + std::to_string(h.n_layer) +
                " (its n_layer)");
  route_trace out;
  out.header = h;
  out.header.n_layer = n;
  out.header.expert_bytes.resize(n);
  out.header.dense_bytes.resize(n);
  if (!out.header.layer_listed.empty()) out.header.layer_listed.resize(n);
  // The prompt steps the trace's last MoE layer routed, and the cut's last MoE layer.
  std::size_t last = 0, cut_last = 0;
  for (const trace_row& r : t.rows()) {
    last = std::max<std::size_t>(last, to_index(r.layer));
    if (to_index(r.layer) < n) cut_last = std::max<std::size_t>(cut_last, to_index(r.layer));
  }
  std::set<std::pair<std::uint32_t, std::uint32_t>> output_rows;  // (turn, step)
  for (const trace_row& r : t.rows())
    if (r.phase == run_phase::prefill && to_index(r.layer) == last) output_rows.emplace(r.turn, r.step);
  for (const trace_row& r : t.rows()) {
    if (to_index(r.layer) >= n) continue;
    if (r.phase == run_phase::prefill && cut_last != last && to_index(r.layer) == cut_last &&
        output_rows.count({r.turn, r.step}) == 0)
      continue;
    out.rows.push_back(r);
  }
  if (out.rows.empty())
    throw error(source + ": its first " + std::to_string(n) + " layers route nothing; expected a MoE layer among them");
  return validate_route_trace(std::move(out), source + " (first " + std::to_string(n) + " layers)");
}

}  // namespace moe_residency
