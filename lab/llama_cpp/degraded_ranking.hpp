#pragma once
/// A lab instrument: a routing predictor whose rankings have a seeded share
/// of their top-k slots replaced by experts outside them, so that a
/// random-weight model's flattering stale gate predicts at a real model's
/// accuracy (the memory lab's `degraded` configuration; the seed engine's
/// 88.6% slot accuracy on Qwen3-30B). Wraps the predictor the manager would
/// use: `res.set_predictor(&degraded)`.

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>

#include "moe_residency/adapters/llama_cpp/residency/predictor.hpp"
#include "moe_residency/error.hpp"

namespace moe_residency::llama_cpp::lab {

class degraded_ranking final : public routing_predictor {
 public:
  /// `share` in [0, 1] of the top-k slots replaced; throws `configuration_error` otherwise.
  degraded_ranking(routing_predictor& inner, std::size_t top_k, std::size_t n_experts, double share, std::uint64_t seed)
      : inner_(&inner), k_(top_k), n_(n_experts), share_(share), rng_(seed) {
    if (!(share >= 0.0 && share <= 1.0))
      throw configuration_error("--degrade " + std::to_string(share) + "; expected a share in [0, 1]");
    name_ = std::string(inner.name()) + " degraded " + std::to_string(share);
  }

  bool rank(const layer_batch& b, layer_id target, ranking& out) override {
    if (!inner_->rank(b, target, out)) return false;
    if (share_ > 0) degrade(out);
    return true;
  }
  const char* name() const noexcept override { return name_.c_str(); }

 private:
  void degrade(ranking& pr) {
    ranking out;
    const std::size_t depth = k_ < pr.size() ? k_ : pr.size();
    std::uniform_real_distribution<double> coin(0.0, 1.0);
    std::uniform_int_distribution<std::size_t> pick(0, n_ - 1);
    std::size_t free = n_ > depth ? n_ - depth : 0;  // experts a replacement may take
    for (std::size_t r = 0; r < pr.size(); ++r) {
      expert_id e = pr.id(r);
      if (r < depth && free > 0 && coin(rng_) < share_) {
        do e = expert_id(static_cast<std::uint16_t>(pick(rng_)));
        while (pr.contains(e, depth) || out.contains(e));
        --free;
      }
      out.push_back(e, pr.score(r), pr.weight(r));
    }
    pr = out;
  }

  routing_predictor* inner_;
  std::size_t k_, n_;
  double share_;
  std::mt19937_64 rng_;
  std::string name_;
};

}  // namespace moe_residency::llama_cpp::lab
