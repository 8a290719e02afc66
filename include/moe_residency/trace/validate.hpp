#pragma once
/// Route trace validation: the row-order state machine and value checks every
/// parser runs on every row (`detail::trace_row_checker`), and
/// `validate_route_trace`, which turns a `route_trace` built by hand into a
/// `validated_route_trace`. The rules are in docs/traces.md ("Row order").
///
/// The checker's pieces shared with the parsers are beside it: each value's
/// domain and message in trace/row_values.hpp, the layer sequence of a token
/// in trace/token_layers.hpp.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/trace/row_values.hpp"
#include "moe_residency/trace/token_layers.hpp"
#include "moe_residency/trace/types.hpp"

namespace moe_residency {

/// Checks `trace` as the parsers check what they read and returns it as a
/// `validated_route_trace`. Throws `error` ("<source_name>: rows[i], column
/// <name>: ...", or "<source_name>: header: ...") on the first defect.
validated_route_trace validate_route_trace(route_trace trace, const std::string& source_name = "route_trace");

namespace detail {

/// Checks rows one at a time, in order: value ranges against the header,
/// the expert_bytes rule, slots in rank order, distinct experts per routing,
/// and the row order (see docs/traces.md). No allocation unless a row fails.
class trace_row_checker {
 public:
  /// `h` must satisfy header_problem(h).empty().
  explicit trace_row_checker(const trace_header& h)
      : h_(h),
        layer_bytes_(h.expert_bytes.data()),
        n_layer_(h.n_layer),
        n_expert_(h.n_expert),
        k_(h.n_expert_used),
        has_dropped_(h.has_dropped_column),
        layers_(h),
        stamp_(h.n_expert, 0) {}

  /// True when `r` may follow the rows checked so far; otherwise fills
  /// `issue` and leaves the checker's state as it was.
  bool check(const trace_row& r, trace_issue& issue) {
    const fault f = find_fault(r);
    if (f == fault::none) return true;
    describe(f,
             wide_row{static_cast<std::uint8_t>(r.phase), to_index(r.layer), r.slot, to_index(r.expert), r.residency,
                      r.expert_bytes, r.dropped, r.weight},
             r, issue);
    return false;
  }

  /// True when the rows checked so far may end the trace: at least one
  /// routing, the last one with all its n_expert_used rows, the last token
  /// with all its layers. Otherwise fills `issue` (its column is not meaningful).
  bool finish(trace_issue& issue) const {
    using std::to_string;
    if (!has_prev_) {
      issue.message = "no routing rows; expected at least one token";
      return false;
    }
    const std::string routing = "(turn " + to_string(prev_turn_) + ", " + phase_word(prev_phase_) + " step " +
                                to_string(prev_step_) + ", layer " + to_string(to_index(prev_layer_)) + ")";
    if (prev_slot_ + 1u != k_) {
      issue.column = trace_column::slot;
      issue.message = "the last routing " + routing + " has " + to_string(prev_slot_ + 1u) + " of " + to_string(k_) +
                      " experts; expected " + to_string(k_) + " (n_expert_used): is the file cut short?";
      return false;
    }
    const auto prev_layer = static_cast<std::uint32_t>(to_index(prev_layer_));
    if (layers_.end(true, prev_layer) != token_layers::fault::none) {
      issue.column = trace_column::layer;
      issue.message = "the last token (" + phase_word(prev_phase_) + " step " + to_string(prev_step_) + " of turn " +
                      to_string(prev_turn_) + ") ends at layer " + to_string(prev_layer) + "; expected its " +
                      layers_.rest_after(prev_layer) +
                      " too (every token routes every MoE layer): is the file cut short?";
      return false;
    }
    return true;
  }

  /// A row's values as wide as a parser holds them before narrowing them into
  /// a trace_row (a CSV layer of 70000 must not be cut to 16 bits first).
  struct wide_row {
    std::uint64_t phase, layer, slot, expert, residency, expert_bytes;
    std::int64_t dropped;  ///< -1 when the trace has no dropped column
    float weight;
  };
  /// The checks of one row against the header alone (ranges, listed layers,
  /// the expert_bytes rule, the dropped column), the same ones check() makes
  /// first: true when they pass, else fills `issue`. Row order is not looked at.
  bool check_values(const wide_row& v, trace_issue& issue) const {
    const fault f = range_fault(v.phase, v.layer, v.slot, v.expert, v.weight, v.residency, v.expert_bytes, v.dropped);
    if (f == fault::none) return true;
    describe(f, v, trace_row{}, issue);
    return false;
  }

 private:
  enum class fault : std::uint8_t {
    none,
    phase,
    layer_range,
    layer_unlisted,
    layer_zero,
    slot_range,
    expert_range,
    weight,
    residency,
    bytes_mismatch,
    bytes_on_hit,
    dropped_range,
    dropped_absent,
    slot_order,
    slot_start,
    duplicate_expert,
    turn_back,
    prefill_after_decode,
    decode_step_back,
    decode_layer_back,
    prefill_step_back,
    prefill_overlap,
    routing_short,
    layer_start,
    layer_skip,
    token_cut
  };

  static std::string phase_word(run_phase p) { return p == run_phase::prefill ? "prefill" : "decode"; }

  // The one range check, for parsed values (wide) and rows (widened).
  fault range_fault(std::uint64_t phase, std::uint64_t layer, std::uint64_t slot, std::uint64_t expert, float weight,
                    std::uint64_t residency, std::uint64_t bytes, std::int64_t dropped) const noexcept {
    if (phase > 1) return fault::phase;
    if (layer >= n_layer_) return fault::layer_range;
    const std::uint64_t layer_bytes = layer_bytes_[layer];
    if (layer_bytes == 0)
      return !h_.layer_listed.empty() && !h_.layer_listed[static_cast<std::size_t>(layer)] ? fault::layer_unlisted
                                                                                           : fault::layer_zero;
    if (slot >= k_) return fault::slot_range;
    if (expert >= n_expert_) return fault::expert_range;
    if (!weight_in_domain(weight)) return fault::weight;
    if (residency > 2) return fault::residency;
    if (bytes != 0) {
      if (bytes != layer_bytes) return fault::bytes_mismatch;
      if (residency != 0) return fault::bytes_on_hit;
    }
    if (has_dropped_ ? (dropped != 0 && dropped != 1) : dropped != -1)
      return has_dropped_ ? fault::dropped_range : fault::dropped_absent;
    return fault::none;
  }

  // The hot path: comparisons only, state updated only when the row passes.
  fault find_fault(const trace_row& r) noexcept {
    const fault f = range_fault(static_cast<std::uint8_t>(r.phase), to_index(r.layer), r.slot, to_index(r.expert),
                                r.weight, r.residency, r.expert_bytes, r.dropped);
    if (f != fault::none) return f;
    const std::size_t expert = to_index(r.expert);
    const bool same_routing =
        has_prev_ && r.turn == prev_turn_ && r.phase == prev_phase_ && r.step == prev_step_ && r.layer == prev_layer_;
    if (same_routing) {
      if (r.slot != prev_slot_ + 1) return fault::slot_order;
      if ((stamp_[expert] >> 8) == routing_) return fault::duplicate_expert;
    } else {
      if (r.slot != 0) return fault::slot_start;
      const fault f = order_fault(r);
      if (f != fault::none) return f;
      if (has_prev_ && prev_slot_ + 1u != k_) return fault::routing_short;
      switch (layers_.next(has_prev_, prev_turn_, static_cast<unsigned>(prev_phase_), prev_step_,
                           static_cast<std::uint32_t>(to_index(prev_layer_)), r.turn, static_cast<unsigned>(r.phase),
                           r.step, static_cast<std::uint32_t>(to_index(r.layer)))) {
        case token_layers::fault::none: break;
        case token_layers::fault::start: return fault::layer_start;
        case token_layers::fault::skip: return fault::layer_skip;
        case token_layers::fault::cut:
        case token_layers::fault::empty: return fault::token_cut;
      }
      commit_new_routing(r);
    }
    stamp_[expert] = routing_ << 8 | r.slot;
    prev_slot_ = r.slot;
    return fault::none;
  }

  // A new routing (turn, phase, step, layer) begins at r: is it in order?
  fault order_fault(const trace_row& r) const noexcept {
    if (!has_prev_ || r.turn > prev_turn_) return fault::none;  // a new turn starts afresh
    if (r.turn < prev_turn_) return fault::turn_back;
    if (r.phase == run_phase::prefill && prev_phase_ == run_phase::decode) return fault::prefill_after_decode;
    if (r.phase == run_phase::decode) {
      if (prev_phase_ == run_phase::prefill) return fault::none;
      if (r.step < prev_step_) return fault::decode_step_back;
      if (r.step == prev_step_ && r.layer < prev_layer_) return fault::decode_layer_back;
      return fault::none;
    }
    // Prefill rows are layer-major: within a layer steps ascend; a lower
    // layer starts the next prompt batch (ubatch), whose tokens all follow
    // the earlier batches' tokens.
    if (r.layer == prev_layer_ && r.step < prev_step_) return fault::prefill_step_back;
    const bool floor_set = floor_set_ || r.layer < prev_layer_;
    const std::uint32_t floor = r.layer < prev_layer_ ? max_step_ : floor_;
    if (floor_set && r.step <= floor) return fault::prefill_overlap;
    return fault::none;
  }

  void commit_new_routing(const trace_row& r) noexcept {
    const bool new_turn = !has_prev_ || r.turn != prev_turn_;
    if (new_turn) {
      prefill_any_ = false;
      floor_set_ = false;
    }
    if (r.phase == run_phase::prefill) {
      if (!new_turn && prev_phase_ == run_phase::prefill && r.layer < prev_layer_) {
        floor_ = max_step_;
        floor_set_ = true;
      }
      max_step_ = prefill_any_ ? std::max(max_step_, r.step) : r.step;
      prefill_any_ = true;
    }
    ++routing_;
    has_prev_ = true;
    prev_turn_ = r.turn;
    prev_phase_ = r.phase;
    prev_step_ = r.step;
    prev_layer_ = r.layer;
  }

  // The cold path: words for a fault, from the state before the row.
  // Range faults are described from `v`, order faults from `r` (both the same row).
  void describe(fault f, const wide_row& v, const trace_row& r, trace_issue& issue) const {
    using std::to_string;
    const std::uint64_t layer = v.layer;
    const std::string turn = to_string(r.turn);
    auto set = [&issue](trace_column c, std::string m) {
      issue.column = c;
      issue.message = std::move(m);
    };
    switch (f) {
      case fault::none: break;
      case fault::phase: set(trace_column::phase, phase_message(v.phase)); break;
      case fault::layer_range: set(trace_column::layer, range_message("layer", layer, h_.n_layer)); break;
      case fault::layer_unlisted:
        set(trace_column::layer, "layer " + to_string(layer) +
                                     " is routed but has no '# layer=' line; expected its expert bytes in the header");
        break;
      case fault::layer_zero:
        set(trace_column::layer, "layer " + to_string(layer) + " is routed but its expert_bytes is 0; expected > 0");
        break;
      case fault::slot_range: set(trace_column::slot, slot_message(v.slot, h_.n_expert_used)); break;
      case fault::expert_range: set(trace_column::expert, range_message("expert", v.expert, h_.n_expert)); break;
      case fault::weight: set(trace_column::weight, weight_message(v.weight)); break;
      case fault::residency: set(trace_column::residency, residency_message(v.residency)); break;
      case fault::bytes_mismatch:
        set(trace_column::expert_bytes, "expert_bytes " + to_string(v.expert_bytes) + " for layer " + to_string(layer) +
                                            "; expected 0 or the layer's " +
                                            to_string(h_.expert_bytes[static_cast<std::size_t>(layer)]));
        break;
      case fault::bytes_on_hit:
        set(trace_column::expert_bytes, "expert_bytes " + to_string(v.expert_bytes) + " on a hit (residency " +
                                            to_string(v.residency) + "); expected 0 (only a miss reads)");
        break;
      case fault::dropped_range:
        set(trace_column::dropped, "dropped " + to_string(v.dropped) + " out of range; expected 0 or 1");
        break;
      case fault::dropped_absent:
        set(trace_column::dropped,
            "dropped " + to_string(v.dropped) + " but the trace has no dropped column; expected -1");
        break;
      case fault::slot_order:
        set(trace_column::slot, "slot " + to_string(r.slot) + " after slot " + to_string(prev_slot_) +
                                    " of the same routing; expected " + to_string(prev_slot_ + 1) +
                                    " (rows in rank order)");
        break;
      case fault::slot_start:
        set(trace_column::slot, "slot " + to_string(r.slot) + " starts a routing; expected 0 (rows in rank order)");
        break;
      case fault::duplicate_expert:
        set(trace_column::expert, "expert " + to_string(to_index(r.expert)) + " already routed at slot " +
                                      to_string(stamp_[to_index(r.expert)] & 0xff) +
                                      " of this routing; expected distinct experts");
        break;
      case fault::turn_back:
        set(trace_column::turn,
            "turn " + turn + " after turn " + to_string(prev_turn_) + "; expected non-decreasing turns");
        break;
      case fault::prefill_after_decode:
        set(trace_column::phase,
            "prefill row after decode rows of turn " + turn + "; expected each turn's prefill before its decode");
        break;
      case fault::decode_step_back:
        set(trace_column::step, "step " + to_string(r.step) + " after step " + to_string(prev_step_) +
                                    " in decode of turn " + turn + "; expected non-decreasing steps");
        break;
      case fault::decode_layer_back:
        set(trace_column::layer, "layer " + to_string(layer) + " after layer " + to_string(to_index(prev_layer_)) +
                                     " at decode step " + to_string(r.step) +
                                     "; expected ascending layers within a token");
        break;
      case fault::prefill_step_back:
        set(trace_column::step, "step " + to_string(r.step) + " after step " + to_string(prev_step_) +
                                    " in prefill of layer " + to_string(layer) + ", turn " + turn +
                                    "; expected ascending steps within a layer (rows layer-major)");
        break;
      case fault::prefill_overlap:
        set(trace_column::step, "step " + to_string(r.step) + " in a prefill batch of turn " + turn +
                                    " that follows step " + to_string(r.layer < prev_layer_ ? max_step_ : floor_) +
                                    "; expected each batch's tokens after the previous batch's");
        break;
      case fault::routing_short:
        set(trace_column::slot, "slot 0 starts a routing, but the routing before it (turn " + to_string(prev_turn_) +
                                    ", " + phase_word(prev_phase_) + " step " + to_string(prev_step_) + ", layer " +
                                    to_string(to_index(prev_layer_)) + ") has " + to_string(prev_slot_ + 1u) + " of " +
                                    to_string(k_) + " experts; expected " + to_string(k_) + " (n_expert_used)");
        break;
      case fault::layer_start:
        set(trace_column::layer,
            "layer " + to_string(layer) +
                (!has_prev_ ? std::string(" is the trace's first routing")
                 : r.phase == run_phase::decode
                     ? " begins decode step " + to_string(r.step) + " of turn " + turn
                     : " begins a prompt batch at prefill step " + to_string(r.step) + " of turn " + turn) +
                "; expected layer " + to_string(layers_.first()) +
                " (the first MoE layer: every token routes every MoE layer, in order)");
        break;
      case fault::layer_skip: {
        const auto prev = static_cast<std::uint32_t>(to_index(prev_layer_));
        set(trace_column::layer, "layer " + to_string(layer) + " after layer " + to_string(prev) + " at " +
                                     phase_word(r.phase) + " step " + to_string(r.step) + " of turn " + turn +
                                     "; expected layer " + to_string(layers_.after(prev)) +
                                     " (every token routes every MoE layer once, in order)");
        break;
      }
      case fault::token_cut: {
        const auto prev = static_cast<std::uint32_t>(to_index(prev_layer_));
        const bool new_turn = r.turn != prev_turn_, new_phase = !new_turn && r.phase != prev_phase_;
        const std::string begins =
            new_turn    ? "turn " + turn + " begins"
            : new_phase ? "decode of turn " + turn + " begins"
            : r.phase == run_phase::decode
                ? "decode step " + to_string(r.step) + " of turn " + turn + " begins"
                : "a prompt batch of turn " + turn + " begins at prefill step " + to_string(r.step);
        set(new_turn    ? trace_column::turn
            : new_phase ? trace_column::phase
                        : trace_column::step,
            begins + ", but " + phase_word(prev_phase_) + " step " + to_string(prev_step_) + " of turn " +
                to_string(prev_turn_) + " ended at layer " + to_string(prev) + "; expected its " +
                layers_.rest_after(prev) + " first (every token routes every MoE layer)");
        break;
      }
    }
  }

  const trace_header& h_;
  // Copies of the header's hot fields: stores through std::uint8_t members
  // may alias anything, and would otherwise force reloads through h_.
  const std::uint64_t* layer_bytes_;
  std::size_t n_layer_, n_expert_, k_;
  bool has_dropped_;
  token_layers layers_;
  // Per expert: (routing that last routed it) << 8 | its slot there. Not
  // std::uint8_t arrays, for the same aliasing reason.
  std::vector<std::uint64_t> stamp_;
  std::uint64_t routing_ = 0;  // routings started so far (0 = none)
  bool has_prev_ = false;
  std::uint32_t prev_turn_ = 0, prev_step_ = 0;
  run_phase prev_phase_ = run_phase::decode;
  layer_id prev_layer_{};
  std::uint8_t prev_slot_ = 0;
  bool prefill_any_ = false;  // this turn has prefill rows; max_step_ is their largest step
  bool floor_set_ = false;    // a later prompt batch began; its steps must exceed floor_
  std::uint32_t max_step_ = 0;
  std::uint32_t floor_ = 0;
};

inline void validate_rows(const route_trace& t, const std::string& source_name) {
  if (const std::string p = header_problem(t.header); !p.empty()) throw error(source_name + ": header: " + p);
  trace_row_checker checker(t.header);
  trace_issue issue;
  for (std::size_t i = 0; i < t.rows.size(); ++i)
    if (!checker.check(t.rows[i], issue))
      throw error(source_name + ": rows[" + std::to_string(i) + "], column " + column_name(issue.column) + ": " +
                  issue.message);
  if (!checker.finish(issue))
    throw error(source_name + ": end of rows (" + std::to_string(t.rows.size()) + " rows): " + issue.message);
}
}  // namespace detail

inline validated_route_trace validate_route_trace(route_trace trace, const std::string& source_name) {
  detail::validate_rows(trace, source_name);
  return detail::trace_access::make(std::move(trace));
}

}  // namespace moe_residency
