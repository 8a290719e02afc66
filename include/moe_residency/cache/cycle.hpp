#pragma once
/// cycle: a layer-cycle-aware online approximation of Belady (this library's
/// own policy). MoE decode visits layers in a fixed cycle, so an expert of
/// layer j can next be needed only when the cycle returns to j. The policy
/// estimates each entry's expected time to next use, in layer steps,
///
///   ETNU(j, e) = d(j) + L × (1 / p(j, e) − 1)
///
/// where d(j) is the number of layer steps until the cycle reaches j again
/// (1 … L; L for the layer just processed), L the number of layers, and
/// p(j, e) the expert's per-token routing probability estimated from
/// exponentially decayed usage (decay γ per token of that layer; a duplicate
/// in a prefill batch counts as a use), and evicts the largest ETNU.
///
/// Within one layer d is shared and decay is common, so each layer keeps a
/// heap ordered by decayed usage (a time-invariant log key) and a victim is
/// the best of the L heap tops: O(L + log n) per eviction, O(log n) per
/// access. Never collapses below the token cycle: the layer just used has the
/// largest d.

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "moe_residency/cache/expert_cache.hpp"
#include "moe_residency/detail/cache_heap.hpp"

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
  /// Soft partition: a layer holding at most `layer_floor` × its fair share
  /// (budget / layers / expert bytes) entries is evicted from only when no
  /// other layer has a candidate. 0 disables it.
  double layer_floor = 0.0;
};

namespace detail {
struct cache_cycle_order {
  std::vector<double> key;            // ln(usage) + g × stamp: order-preserving in a layer
  std::vector<std::uint64_t> last;    // tick of the last access
  bool operator()(std::uint32_t a, std::uint32_t b) const noexcept {
    if (key[a] != key[b]) return key[a] < key[b];
    return last[a] < last[b];
  }
};
}  // namespace detail

class cycle_policy : public policy_base {
 public:
  static constexpr const char* name = "cycle";
  static constexpr bool collapses_below_cycle = false;

  /// Throws error on a decay outside (0, 1) or a negative prior weight.
  explicit cycle_policy(cycle_policy_options o = {}) : o_(o) {
    if (!(o_.decay > 0.0 && o_.decay < 1.0))
      throw error("cycle_policy: decay " + std::to_string(o_.decay) + " out of range; expected (0, 1)");
    if (!(o_.prior_weight >= 0.0))
      throw error("cycle_policy: prior_weight " + std::to_string(o_.prior_weight) +
                  " out of range; expected >= 0");
    g_ = -std::log(o_.decay);
  }

  void init(const model_shape& shape, std::uint64_t budget) {
    n_experts_ = static_cast<std::uint32_t>(shape.n_experts());
    n_layers_ = shape.n_layers();
    top_k_ = shape.top_k();
    p0_ = static_cast<double>(shape.top_k()) / static_cast<double>(shape.n_experts());
    layer_bytes_ = shape.all_expert_bytes();
    heaps_.assign(n_layers_, detail::cache_slot_heap<detail::cache_cycle_order>{detail::cache_cycle_order{}});
    for (auto& h : heaps_) {
      h.order().key.assign(n_experts_, -std::numeric_limits<double>::infinity());
      h.order().last.assign(n_experts_, 0);
      h.reset(n_experts_);
    }
    tau_.assign(n_layers_, 0.0);
    occ_ = 0;
    floor_.assign(n_layers_, 0);
    for (std::size_t l = 0; l < n_layers_; ++l)
      if (layer_bytes_[l])
        floor_[l] = static_cast<std::uint32_t>(o_.layer_floor * static_cast<double>(budget) /
                                               static_cast<double>(shape.n_moe_layers()) /
                                               static_cast<double>(layer_bytes_[l]));
  }
  void on_batch_begin(run_phase, std::size_t) noexcept { occ_ = 0; }
  void on_hit(std::uint32_t s) noexcept { use(s, false); }
  void on_repeat(std::uint32_t s) noexcept { use(s, false); }
  void on_insert(std::uint32_t s) noexcept { use(s, true); }
  void on_evict(std::uint32_t s) noexcept { heaps_[s / n_experts_].erase(s % n_experts_); }
  void on_batch_end(std::size_t layer) noexcept {
    // A batch of n routed ids is n / k tokens of this layer (prefill holds many).
    const double tokens = static_cast<double>(occ_) / static_cast<double>(top_k_);
    tau_[layer] += tokens < 1.0 ? 1.0 : tokens;
    current_ = layer;
  }

  template <class View>
  std::uint32_t victim(const View& v, std::size_t layer) noexcept {
    const std::uint32_t s = pick(v, layer, true);
    return s != no_slot ? s : pick(v, layer, false);
  }
  void end_eviction() noexcept {
    for (auto& h : heaps_) h.restore();
  }

  /// Expected layer steps until (layer, expert) is needed, seen from a
  /// cache that just processed layer `now`.
  double expected_steps(layer_id layer, expert_id expert, layer_id now) const noexcept {
    return etnu(to_index(layer), static_cast<std::uint32_t>(to_index(expert)), to_index(now));
  }

 private:
  template <class View>
  std::uint32_t pick(const View& v, std::size_t layer, bool respect_floor) noexcept {
    double best = -1.0;
    std::uint32_t pick = no_slot;
    for (std::size_t l = 0; l < n_layers_; ++l) {
      if (respect_floor && v.layer_count(l) <= floor_[l]) continue;
      auto& h = heaps_[l];
      const auto base = static_cast<std::uint32_t>(l * n_experts_);
      while (!h.empty() && !v.evictable(base + h.top())) h.stash_top();
      if (h.empty()) continue;
      const double score = etnu(l, h.top(), layer);
      if (score > best) {
        best = score;
        pick = base + h.top();
      }
    }
    return pick;
  }
  double usage(std::size_t l, std::uint32_t e) const noexcept {
    const double k = heaps_[l].order().key[e];
    return std::isinf(k) ? 0.0 : std::exp(k - g_ * tau_[l]);
  }
  double etnu(std::size_t l, std::uint32_t e, std::size_t now) const noexcept {
    const double u = usage(l, e);
    // Decayed count → per-token rate: u converges to r / (1 − γ) at rate r.
    const double rate = (u * (1.0 - o_.decay) + o_.prior_weight * p0_ * (1.0 - o_.decay)) /
                        (1.0 + o_.prior_weight * (1.0 - o_.decay));
    const double p = rate > 1.0 ? 1.0 : (rate < 1e-9 ? 1e-9 : rate);
    const double L = static_cast<double>(n_layers_);
    const double d = static_cast<double>((l + n_layers_ - now - 1) % n_layers_ + 1);
    const double steps = d + L * (1.0 / p - 1.0);
    return o_.weigh_bytes ? steps * static_cast<double>(layer_bytes_[l]) : steps;
  }
  void use(std::uint32_t s, bool insert) noexcept {
    const std::size_t l = s / n_experts_;
    const std::uint32_t e = s % n_experts_;
    auto& h = heaps_[l];
    const double u = usage(l, e) + 1.0;
    h.order().key[e] = std::log(u) + g_ * tau_[l];
    h.order().last[e] = ++tick_;
    ++occ_;
    if (insert) h.push(e);
    else h.update(e);
  }

  cycle_policy_options o_;
  double g_ = 0.0, p0_ = 0.0;
  std::uint32_t n_experts_ = 1;
  std::size_t n_layers_ = 1, top_k_ = 1, current_ = 0;
  std::uint64_t tick_ = 0, occ_ = 0;
  std::vector<std::uint64_t> layer_bytes_;
  std::vector<double> tau_;
  std::vector<std::uint32_t> floor_;
  std::vector<detail::cache_slot_heap<detail::cache_cycle_order>> heaps_;
};

}  // namespace moe_residency
