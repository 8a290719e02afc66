#pragma once
/// The session's calls to its predictors (session.hpp): a gate predictor
/// ranks the MoE layer `horizon` ahead when a gate input arrives, a history
/// predictor ranks on demand, and each ranking is kept for the current
/// one-token batch (stamped with its serial) until the routing it predicts
/// is scored. Member definitions of the session class, declared there;
/// session.hpp includes this header after the class, and this header
/// includes session.hpp, so either one gives both.

#include <cstddef>
#include <tuple>
#include <utility>

#include "moe_residency/core.hpp"
#include "moe_residency/predict/contract.hpp"
#include "moe_residency/predict/gate.hpp"
#include "moe_residency/session.hpp"

namespace moe_residency {

template <class... P, class... X>
template <std::size_t I>
inline const ranking* session<predictor_set<P...>, X...>::prediction(layer_id target) noexcept {
  using PI = std::tuple_element_t<I, std::tuple<P...>>;
  const std::size_t l = to_index(target);
  if (!in_batch_ || n_tokens_ != 1 || l >= shape_.n_layers()) return nullptr;
  if (stamp_[I][l] == serial_) return &board_[I][l];
  if constexpr (is_history_predictor_v<PI>) {
    if (std::get<I>(predictors_).predict(target, board_[I][l])) {
      stamp_[I][l] = serial_;
      return &board_[I][l];
    }
  }
  return nullptr;
}

template <class... P, class... X>
template <std::size_t I>
inline void session<predictor_set<P...>, X...>::predict_one_from_gate(layer_id source, const float* x) noexcept {
  using PI = std::tuple_element_t<I, std::tuple<P...>>;
  if constexpr (is_gate_predictor_v<PI>) {
    layer_id target{};
    if (!moe_layer_ahead(shape_, source, PI::horizon, target)) return;
    const std::size_t t = to_index(target);
    if (std::get<I>(predictors_).predict(bank_, source, target, x, board_[I][t])) stamp_[I][t] = serial_;
  }
}

template <class... P, class... X>
template <std::size_t... I>
inline void session<predictor_set<P...>, X...>::predict_from_gate_impl(layer_id source, const float* x,
                                                                       std::index_sequence<I...>) noexcept {
  (predict_one_from_gate<I>(source, x), ...);
}

template <class... P, class... X>
inline void session<predictor_set<P...>, X...>::predict_from_gate(layer_id source, const float* x) noexcept {
  predict_from_gate_impl(source, x, std::index_sequence_for<P...>{});
}

// Predictor I's ranking of layer l for the routing being scored.
template <class... P, class... X>
template <std::size_t I>
inline const ranking* session<predictor_set<P...>, X...>::gathered(layer_id l) noexcept {
  using PI = std::tuple_element_t<I, std::tuple<P...>>;
  const std::size_t t = to_index(l);
  if constexpr (is_gate_predictor_v<PI>) {
    // Only a ranking made from this batch's gate input, and only when
    // this layer's own input was sound (a NaN input is no prediction).
    return stamp_[I][t] == serial_ ? &board_[I][t] : nullptr;
  } else {
    return prediction<I>(l);
  }
}

}  // namespace moe_residency
