#pragma once
/// What the residency manager's predicted reads are planned from: at a MoE
/// layer's routing, a ranking of the MoE layer `horizon` ahead. The manager's
/// own is the stale gate (`stale_gate_ranking`: this layer's gate input times
/// that layer's router, from host memory); a host that knows the routing to
/// come (a recorded trace driving llama.cpp: forced_routing.hpp's
/// `trace_oracle`) hands the manager its own with
/// `mmap_residency::set_predictor`. One virtual call per MoE layer, never per
/// expert.

#include <cstddef>

#include "moe_residency/adapters/llama_cpp/observer.hpp"
#include "moe_residency/core.hpp"
#include "moe_residency/predict/gate.hpp"

namespace moe_residency::llama_cpp {

/// Ranks the MoE layer ahead at a layer's routing (the host's thread, decode only).
class routing_predictor {
 public:
  virtual ~routing_predictor() = default;
  /// Fills `out` with the predicted ranking of MoE layer `target` (top first,
  /// each with the weight the layer's gating would give it, or NaN) from
  /// what layer `b.layer`'s routing event carries. False: no prediction (the
  /// manager then plans no read for `target`).
  virtual bool rank(const layer_batch& b, layer_id target, ranking& out) = 0;
  /// For summaries: "stale-gate", "oracle:0.886", ….
  virtual const char* name() const noexcept = 0;
};

/// The stale gate: layer l's gate input (the batch's last token) times MoE
/// layer l+1's router (or l+2's, horizon 2), with that layer's selection
/// rule, through predict/gate.hpp's predictors.
class stale_gate_ranking final : public routing_predictor {
 public:
  /// The routers the observer found in host memory. Throws `error` when none is.
  void init(const observer& obs, const model_shape& shape, std::size_t horizon) {
    shape_ = shape;
    horizon_ = horizon;
    bank_ = router_bank(shape_);
    for (std::size_t l = 0; l < obs.n_layer(); ++l) {
      const layer_structure& s = obs.layers()[l];
      if (s.moe && s.router_readable) bank_.set(layer_id(static_cast<std::uint16_t>(l)), s.router, s.spec);
    }
    if (bank_.size() == 0)
      throw refusal("mmap_residency: predicted reads need the routers in host memory as f32/f16/bf16; none is");
    gate1_.reset(shape_);
    gate2_.reset(shape_);
  }

  bool rank(const layer_batch& b, layer_id target, ranking& out) override {
    if (b.n_tokens == 0) return false;
    const float* x = b.x(b.n_tokens - 1);
    return horizon_ == 1 ? gate1_.predict(bank_, b.layer, target, x, out)
                         : gate2_.predict(bank_, b.layer, target, x, out);
  }
  const char* name() const noexcept override { return "stale-gate"; }

 private:
  model_shape shape_;
  std::size_t horizon_ = 1;
  router_bank bank_;
  stale_gate_predictor gate1_;
  stale_gate_l2_predictor gate2_;
};

}  // namespace moe_residency::llama_cpp
