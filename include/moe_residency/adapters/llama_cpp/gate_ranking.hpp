#pragma once
/// The residency manager's predictor (residency.hpp's `predicted` part): at
/// an MoE layer's routing, the stale gate's ranking of the MoE layer
/// `horizon` ahead, from this layer's gate input and that layer's router in
/// host memory. What is read for it is the manager's `speculation` object's
/// to decide (speculation.hpp: the planner around the cache, the scheduler's
/// lanes), as it is for the session and the replay.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>

#include "moe_residency/adapters/llama_cpp/observer.hpp"
#include "moe_residency/adapters/llama_cpp/residency_options.hpp"
#include "moe_residency/predict/gate.hpp"

namespace moe_residency::llama_cpp::detail {

class gate_ranking {
 public:
  /// The routers the observer found in host memory. Throws `error` when none is.
  void init(const observer& obs, const model_shape& shape, const residency_options& o) {
    shape_ = shape;
    horizon_ = o.horizon;
    degrade_ = o.degrade;
    bank_ = router_bank(shape_);
    for (std::size_t l = 0; l < obs.n_layer(); ++l) {
      const layer_structure& s = obs.layers()[l];
      if (s.moe && s.router_readable) bank_.set(layer_id(static_cast<std::uint16_t>(l)), s.router, s.spec);
    }
    if (bank_.size() == 0)
      throw error("mmap_residency: predicted reads need the routers in host memory as f32/f16/bf16; none is");
    gate1_.reset(shape_);
    gate2_.reset(shape_);
    rng_.seed(o.seed);
  }

  /// Ranks MoE layer `target` from layer l's gate input row x; with
  /// `degrade`, a seeded share of its top-k slots is replaced by experts
  /// outside it. False when no ranking could be made (its router not in host memory).
  bool rank(layer_id l, layer_id target, const float* x, ranking& out) {
    const bool ok = horizon_ == 1 ? gate1_.predict(bank_, l, target, x, out) : gate2_.predict(bank_, l, target, x, out);
    if (ok && degrade_ > 0) degrade(out, shape_.top_k());
    return ok;
  }

 private:
  // Replaces a seeded share of the top-k predicted slots by experts outside it.
  void degrade(ranking& pr, std::size_t k) {
    ranking out;
    const std::size_t n = shape_.n_experts(), depth = std::min(k, pr.size());
    std::uniform_real_distribution<double> coin(0.0, 1.0);
    std::uniform_int_distribution<std::size_t> pick(0, n - 1);
    std::size_t free = n > depth ? n - depth : 0;  // experts a replacement may take
    for (std::size_t r = 0; r < pr.size(); ++r) {
      expert_id e = pr.id(r);
      if (r < depth && free > 0 && coin(rng_) < degrade_) {
        do e = expert_id(static_cast<std::uint16_t>(pick(rng_)));
        while (pr.contains(e, depth) || out.contains(e));
        --free;
      }
      out.push_back(e, pr.score(r), pr.weight(r));
    }
    pr = out;
  }

  model_shape shape_;
  std::size_t horizon_ = 1;
  double degrade_ = 0.0;
  router_bank bank_;
  stale_gate_predictor gate1_;
  stale_gate_l2_predictor gate2_;
  std::mt19937_64 rng_;
};

}  // namespace moe_residency::llama_cpp::detail
