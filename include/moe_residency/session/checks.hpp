#pragma once
/// The session's event checks (session.hpp): the anomaly policy (throw, or
/// count and keep the first message) and every check an event runs before
/// the session acts on it — batch begun, layer in range and MoE, order and
/// duplicates, the shape and values of a gate input, the experts of a
/// routing — with the message each anomaly carries. Member definitions of
/// the session class, declared there; session.hpp includes this header after
/// the class, and this header includes session.hpp, so either one gives both.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "moe_residency/core.hpp"
#include "moe_residency/detail/format.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/session.hpp"
#include "moe_residency/session_types.hpp"

namespace moe_residency {

// `message()` builds the anomaly's text. It runs only to throw, or to keep
// the first counted anomaly's text: counting allocates nothing afterwards,
// an engine repeating an anomaly every token stays allocation-free, and
// count mode never throws (a message that cannot be built is not kept, and
// the next anomaly tries again).
template <class... P, class... X>
template <class Message>
inline bool session<predictor_set<P...>, X...>::anomaly(anomaly_kind k, Message&& message) {
  if (options_.on_anomaly == anomaly_action::throw_error) throw error(message());
  ++anomalies_.by_kind[static_cast<std::size_t>(k)];
  if (anomalies_.first_message.empty()) {
    try {
      anomalies_.first_message = message();
    } catch (...) {  // bad_alloc: the count stands, the text is lost
    }
  }
  return false;
}

// Where an anomaly happened: "session: decode token 7 layer 3: ".
template <class... P, class... X>
inline std::string session<predictor_set<P...>, X...>::where(layer_id l) const {
  std::string s = "session: " + std::string(to_string(phase_)) + " token";
  if (n_tokens_ > 1)
    s += "s " + std::to_string(first_token_) + ".." + std::to_string(token_of_row(n_tokens_, n_tokens_ - 1));
  else s += " " + std::to_string(first_token_);
  return s + " layer " + std::to_string(to_index(l)) + ": ";
}
template <class... P, class... X>
inline std::string session<predictor_set<P...>, X...>::describe(const gate_input_view& g, std::size_t stride) {
  return std::string(g.data ? "" : "null data, ") + std::to_string(g.n_tokens) + " token(s) of " +
         std::to_string(g.length) + " floats, stride " + std::to_string(stride) + " bytes";
}

template <class... P, class... X>
inline bool session<predictor_set<P...>, X...>::check_layer(layer_id l, const char* event) {
  if (!in_batch_)
    return anomaly(anomaly_kind::no_batch, [&] {
      return std::string("session: ") + event + "(layer " + std::to_string(to_index(l)) +
             "): no batch has begun; call begin_batch first";
    });
  if (to_index(l) >= shape_.n_layers())
    return anomaly(anomaly_kind::layer_out_of_range, [&] {
      return where(l) + event + ": layer out of range [0, " + std::to_string(shape_.n_layers()) + ")";
    });
  if (!shape_.is_moe(l))
    return anomaly(anomaly_kind::dense_layer,
                   [&] { return where(l) + event + ": the layer is dense in model '" + shape_.name() + "'"; });
  return true;
}

// A batch's event covers every token, except that a prefill batch's layer
// may see only its last rows (llama.cpp computes the last layer of a prompt
// for the output rows only): those are the batch's last n tokens.
template <class... P, class... X>
inline bool session<predictor_set<P...>, X...>::batch_size_ok(std::size_t n) const noexcept {
  return n == n_tokens_ || (phase_ == run_phase::prefill && n >= 1 && n < n_tokens_);
}

template <class... P, class... X>
inline bool session<predictor_set<P...>, X...>::check_routing_event(layer_id l, std::size_t n_tokens) {
  if (!check_layer(l, "routed")) return false;
  const std::uint8_t st = layer_state_[to_index(l)];
  if (st & routed_seen)
    return anomaly(anomaly_kind::duplicate_routing,
                   [&] { return where(l) + "routed: a second routing for this layer in one batch"; });
  if (!batch_size_ok(n_tokens))
    return anomaly(anomaly_kind::routing_shape, [&] {
      return where(l) + "routed: " + std::to_string(n_tokens) + " token(s); expected the batch's " +
             std::to_string(n_tokens_) +
             (phase_ == run_phase::prefill && n_tokens_ > 1 ? " (or its last 1.." + std::to_string(n_tokens_) + ")"
                                                            : std::string());
    });
  if (gate_required_ && !(st & gate_seen))
    return anomaly(anomaly_kind::routing_without_gate_input, [&] {
      return where(l) +
             "routed: the layer's gate input never came; expected "
             "gate_input before routed";
    });
  return true;
}

// Non-null rows of the router's input length (when known), a stride of at
// least a row, and the batch's tokens (see batch_size_ok).
template <class... P, class... X>
inline bool session<predictor_set<P...>, X...>::check_gate_input_shape(layer_id l, const gate_input_view& g,
                                                                       std::size_t stride) {
  if (!g.data || g.length == 0 || !batch_size_ok(g.n_tokens) || stride < g.length * sizeof(float) ||
      stride % sizeof(float) != 0 || (bank_.n_embd() != 0 && g.length != bank_.n_embd()))
    return anomaly(anomaly_kind::gate_input_shape, [&] {
      return where(l) + "gate_input: " + describe(g, stride) + "; expected " + std::to_string(n_tokens_) + " token(s)" +
             (phase_ == run_phase::prefill && n_tokens_ > 1
                  ? " (or the batch's last 1.." + std::to_string(n_tokens_) + ")"
                  : std::string()) +
             " of " + (bank_.n_embd() ? std::to_string(bank_.n_embd()) : std::string("> 0")) +
             " floats, stride >= a row, non-null data";
    });
  return true;
}

// Every element finite (session_options::check_gate_inputs).
template <class... P, class... X>
inline bool session<predictor_set<P...>, X...>::check_gate_input_finite(layer_id l, const gate_input_view& g,
                                                                        std::size_t stride) {
  for (std::size_t t = 0; t < g.n_tokens; ++t) {
    const float* x = row(g.data, t, stride);
    for (std::size_t i = 0; i < g.length; ++i)
      if (!std::isfinite(x[i]))
        return anomaly(anomaly_kind::nan_gate_input, [&] {
          return where(l) + "gate_input: token " + std::to_string(token_of_row(g.n_tokens, t)) + " element " +
                 std::to_string(i) + " is " + detail::format_number(x[i]) + "; expected a finite value";
        });
  }
  return true;
}

// One routing of layer l, its token already set: experts in range, none
// twice, at least one.
template <class... P, class... X>
inline bool session<predictor_set<P...>, X...>::check_routing(layer_id l, const routing& r) {
  for (std::size_t i = 0; i < r.size(); ++i) {
    if (to_index(r.id(i)) >= shape_.n_experts())
      return anomaly(anomaly_kind::expert_out_of_range, [&] {
        return where(l) + "routed: token " + std::to_string(r.token) + " slot " + std::to_string(i) + ": expert " +
               std::to_string(to_index(r.id(i))) + " out of range [0, " + std::to_string(shape_.n_experts()) + ")";
      });
    for (std::size_t j = 0; j < i; ++j)
      if (r.id(j) == r.id(i))
        return anomaly(anomaly_kind::duplicate_expert, [&] {
          return where(l) + "routed: token " + std::to_string(r.token) + ": expert " +
                 std::to_string(to_index(r.id(i))) + " in slots " + std::to_string(j) + " and " + std::to_string(i);
        });
  }
  if (r.empty())
    return anomaly(anomaly_kind::routing_shape,
                   [&] { return where(l) + "routed: token " + std::to_string(r.token) + ": an empty routing"; });
  return true;
}

}  // namespace moe_residency
