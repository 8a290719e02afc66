#pragma once
/// Predictors that multiply a gate input by a router matrix: stale-gate
/// (layer l's input × layer l+1's router, one GEMV, available one layer
/// early), its decoupled l → l+2 horizon, and the fresh-gate control (layer
/// l's own router on layer l's own input, which must reproduce the engine).
/// The routers they read live in a `router_bank` of views (never copied;
/// predict/router_bank.hpp).

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/predict/contract.hpp"
#include "moe_residency/predict/router_bank.hpp"
#include "moe_residency/router.hpp"
#include "moe_residency/score.hpp"

namespace moe_residency {

/// Options of the gate predictors.
struct gate_predictor_options {
  /// Experts ranked per prediction (with their selection scores); 0 = 32 or
  /// the number of experts if smaller. More than top-k lets the scorer see
  /// ties with the k-th score and a planner look past the top-k.
  std::size_t ranked = 0;
  /// Round the activation like the engine (ggml converts it to the weight's
  /// 16-bit type). `none` is for experiments; it can break the control.
  activation_rounding rounding = activation_rounding::engine;
};

/// Ranks MoE layer `source + Horizon` from the gate input of layer `source`
/// through the target layer's router and `router_spec` (logits, gating,
/// selection bias, groups, top-k; predicted weights from the spec's weight
/// function). Horizon 0 is the fresh-gate control; 1 is stale-gate; 2 the
/// decoupled l → l+2 horizon. Cannot rank when the target has no router, or
/// when the gate input yields a NaN.
template <std::size_t Horizon>
class gate_predictor {
 public:
  static constexpr prediction_timing timing = prediction_timing::gate;
  static constexpr std::size_t horizon = Horizon;
  static constexpr bool tie_aware = true;
  static predictor_label label() {
    if (Horizon == 0) return {"fresh-gate control", "control", "ctrl", 6, true};
    if (Horizon == 1) return {"stale-gate", "stale-gate", "stale", 7, false};
    const std::string h = std::to_string(Horizon);
    return {"stale-gate l+" + h, "stale-gate+" + h, "stale+" + h, 8, false};
  }

  gate_predictor() = default;
  explicit gate_predictor(gate_predictor_options o) : options_(o) {}

  void reset(const model_shape& shape) {
    n_experts_ = shape.n_experts();
    ws_.resize(n_experts_);
    logits_.assign(n_experts_, 0.0f);
    if (options_.ranked > max_top_k)
      throw error("gate_predictor: ranked " + std::to_string(options_.ranked) + " exceeds " +
                  std::to_string(max_top_k));
    ranked_ = options_.ranked ? options_.ranked : std::min<std::size_t>(max_top_k, n_experts_);
  }

  /// Ranks `target` from `gate_input` (bank.n_embd() floats of layer
  /// `source`'s gate input). noexcept, allocation-free.
  bool predict(const router_bank& bank, layer_id /*source*/, layer_id target, const float* gate_input,
               ranking& out) noexcept {
    out.clear();
    const layer_router* r = bank.find(target);
    if (!r || !gate_input || r->spec.n_experts > logits_.size()) return false;
    gemv(r->matrix, gate_input, logits_.data(), options_.rounding);
    return rank_experts(r->spec, logits_.data(), out, ws_, std::min<std::size_t>(ranked_, r->spec.n_experts));
  }
  void observe(const routing&) noexcept {}

  /// The logits W·x of the last prediction (n_experts floats).
  span<const float> last_logits() const noexcept { return {logits_.data(), logits_.size()}; }
  /// The workspace of the last prediction: its selection scores.
  const router_workspace& workspace() const noexcept { return ws_; }

 private:
  gate_predictor_options options_;
  std::size_t n_experts_ = 0;
  std::size_t ranked_ = max_top_k;
  router_workspace ws_;
  std::vector<float> logits_;
};

/// Layer l's gate input × layer l+1's router: one GEMV, no training.
using stale_gate_predictor = gate_predictor<1>;
/// Layer l's gate input × layer l+2's router: two layers of lead time.
using stale_gate_l2_predictor = gate_predictor<2>;
/// Layer l's own router on layer l's own input: must read 100.0%.
using fresh_gate_control = gate_predictor<0>;

namespace detail {
template <class P, class = void>
struct predict_is_gate : std::false_type {};
template <class P>
struct predict_is_gate<P, std::enable_if_t<predict_has_timing<P>::value &&
                                           std::is_same<decltype(std::declval<P&>().predict(
                                                            std::declval<const router_bank&>(), layer_id{}, layer_id{},
                                                            std::declval<const float*>(), std::declval<ranking&>())),
                                                        bool>::value &&
                                           std::is_convertible<decltype(P::horizon), std::size_t>::value>>
    : std::true_type {};
}  // namespace detail

/// True when P satisfies the gate-predictor contract.
template <class P>
inline constexpr bool is_gate_predictor_v = detail::predict_is_gate<P>::value&& P::timing == prediction_timing::gate;

static_assert(is_gate_predictor_v<stale_gate_predictor>, "contract");
static_assert(is_gate_predictor_v<fresh_gate_control>, "contract");

}  // namespace moe_residency
