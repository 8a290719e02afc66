#pragma once
/// The predictor contract. A predictor is a plain class (no base, no virtual
/// call) that a `session` composes as a template argument. Two kinds:
///
/// **History predictors** (`timing == prediction_timing::history`) know a
/// layer's prediction for the current token from routings already observed:
/// ```
///   static predictor_label label();                  // how the report names it
///   static constexpr prediction_timing timing = prediction_timing::history;
///   static constexpr bool tie_aware = false;         // scores are not selection scores
///   void reset(const model_shape&);                  // may allocate and throw
///   bool predict(layer_id target, ranking& out) noexcept;   // false: cannot rank
///   void observe(const routing& r) noexcept;         // after r was scored
/// ```
/// **Gate predictors** (`timing == prediction_timing::gate`) rank layer
/// `target` from the gate input of an earlier layer `source`, `horizon` MoE
/// layers before it (0 = the layer's own input: the control):
/// ```
///   static constexpr prediction_timing timing = prediction_timing::gate;
///   static constexpr std::size_t horizon = 1;
///   static constexpr bool tie_aware = true;          // scores are the engine's selection scores
///   bool predict(const router_bank&, layer_id source, layer_id target,
///                const float* gate_input, ranking& out) noexcept;
///   (plus label, reset, observe as above)
/// ```
/// `predict` is called on the host's thread in the event that makes the
/// prediction possible and must not read anything the engine has not produced
/// yet; `observe` sees every accepted routing (prefill included) after the
/// scorer did. Both are noexcept and allocation-free.

#include <cstddef>
#include <type_traits>
#include <utility>

#include "moe_residency/core.hpp"
#include "moe_residency/score.hpp"

namespace moe_residency {

/// When a predictor can name a layer's experts.
enum class prediction_timing {
  history,  ///< from earlier tokens: any layer, any time during the token
  gate,     ///< from a gate input `horizon` MoE layers earlier
};

namespace detail {

template <class P, class = void>
struct predict_has_timing : std::false_type {};
template <class P>
struct predict_has_timing<P, std::void_t<decltype(P::timing), decltype(P::tie_aware), decltype(P::label()),
                                         decltype(std::declval<P&>().reset(std::declval<const model_shape&>())),
                                         decltype(std::declval<P&>().observe(std::declval<const routing&>()))>>
    : std::true_type {};

template <class P, class = void>
struct predict_is_history : std::false_type {};
template <class P>
struct predict_is_history<
    P, std::enable_if_t<
           predict_has_timing<P>::value &&
           std::is_same<decltype(std::declval<P&>().predict(layer_id{}, std::declval<ranking&>())), bool>::value>>
    : std::true_type {};

}  // namespace detail

/// True when P satisfies the history-predictor contract.
template <class P>
inline constexpr bool is_history_predictor_v =
    detail::predict_is_history<P>::value&& P::timing == prediction_timing::history;

}  // namespace moe_residency
