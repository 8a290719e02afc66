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
#include "moe_residency/adapters/llama_cpp/residency/predictor.hpp"

namespace moe_residency::llama_cpp::detail {

class gate_ranking {
 public:
  /// The predictor the reads are planned from: `given` (the host's, see
  /// mmap_residency::set_predictor), else the stale gate over the routers the
  /// observer found in host memory (throws `error` when none is).
  void init(const observer& obs, const model_shape& shape, const residency_options& o, routing_predictor* given) {
    shape_ = shape;
    degrade_ = o.degrade;
    if (given != nullptr) {
      predictor_ = given;
    } else {
      stale_.init(obs, shape, o.horizon);
      predictor_ = &stale_;
    }
    rng_.seed(o.seed);
  }

  /// Ranks MoE layer `target` at the routing of batch `b`; with `degrade`,
  /// a seeded share of its top-k slots is replaced by experts outside it.
  /// False when no ranking could be made.
  bool rank(const layer_batch& b, layer_id target, ranking& out) {
    const bool ok = predictor_ != nullptr && predictor_->rank(b, target, out);
    if (ok && degrade_ > 0) degrade(out, shape_.top_k());
    return ok;
  }
  const routing_predictor* predictor() const noexcept { return predictor_; }

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
  double degrade_ = 0.0;
  stale_gate_ranking stale_;
  routing_predictor* predictor_ = nullptr;
  std::mt19937_64 rng_;
};

}  // namespace moe_residency::llama_cpp::detail
