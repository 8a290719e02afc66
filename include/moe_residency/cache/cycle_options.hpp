#pragma once
/// cycle_options: the tuning of cycle_policy (moe_residency/cache/cycle.hpp,
/// which includes this header) and its check, which the policy's constructor
/// runs.

#include <string>

#include "moe_residency/error.hpp"

namespace moe_residency {

/// Tuning of cycle_policy.
struct cycle_policy_options {
  /// Decay of usage per token of the layer, in (0, 1). Effective memory is
  /// about 1 / (1 − decay) tokens.
  double decay = 0.9;
  /// Pseudo-uses of the prior p0 = k / n_experts blended into the estimate.
  double prior_weight = 1.0;
  /// Multiply ETNU by the entry's bytes (free the most bytes per expected
  /// step first) — matters only when expert bytes differ between layers.
  bool weigh_bytes = true;
  /// Reference mode for tests: find each victim by scanning every layer
  /// (O(L × E) per eviction) instead of the arrays and trees. Same decisions.
  bool reference_scan = false;
};

namespace detail {

/// Returns o; throws error on a decay outside (0, 1) or a negative prior weight.
inline const cycle_policy_options& checked_cycle_options(const cycle_policy_options& o) {
  if (!(o.decay > 0.0 && o.decay < 1.0))
    throw error("cycle_policy: decay " + std::to_string(o.decay) + " out of range; expected (0, 1)");
  if (!(o.prior_weight >= 0.0))
    throw error("cycle_policy: prior_weight " + std::to_string(o.prior_weight) + " out of range; expected >= 0");
  return o;
}

}  // namespace detail
}  // namespace moe_residency
