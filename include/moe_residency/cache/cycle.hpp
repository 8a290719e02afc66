#pragma once
/// cycle: a layer-cycle-aware online approximation of Belady (this library's
/// own policy). MoE decode visits layers in a fixed cycle, so an expert of
/// layer j can next be needed only when the cycle returns to j. The policy
/// estimates each entry's expected time to next use, in layer steps,
///
///   ETNU(j, e) = d(j) + L × (1 / p(j, e) − 1)      (× expert bytes, by default)
///
/// where d(j) is the number of layer steps until the cycle reaches j again
/// (1 … L; L for the layer just processed), L the number of layers, and
/// p(j, e) the expert's per-token routing probability estimated from
/// exponentially decayed usage (decay γ per token of that layer; a duplicate
/// in a prefill batch counts as a use; usage persists across evictions), and
/// evicts the largest ETNU.
///
/// Cost: O(log E) per access (amortised: a use only marks its layer's heap
/// stale, the heap settles where its top is read), O(L + log E) per eviction
/// (a scan of the L per-layer K values, a few dozen doubles), one exp per
/// layer whose top changed. Why it is exact and cheap: write d(j) = v(j) − t with t a layer
/// clock and v(j) the absolute step of j's next visit. Between two visits of
/// j, v(j) does not move, and neither does any p(j, ·) (decay advances only
/// at j's own batches). So K(j) = v(j) + L / p(top of j) is time-invariant,
/// and ETNU = bytes(j) × (K(j) − t − L): within one byte size the largest K
/// is the victim at every t. Each layer keeps a heap of its entries (ordered
/// by a time-invariant usage key) and its K; a victim is the best of the
/// largest K of each byte size (C = number of distinct expert sizes, 1–3 in
/// practice).
///
/// Never collapses below the token cycle: the layer just used has the
/// largest d.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
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
  /// Reference mode for tests: find each victim by scanning every layer
  /// (O(L × E) per eviction) instead of the per-size heaps. Same decisions.
  bool reference_scan = false;
};

namespace detail {
struct cache_cycle_order {
  std::vector<double> key;            // usage × γ^−τ(layer): order-preserving in a layer
  std::vector<std::uint64_t> last;    // tick of the last access
  bool operator()(std::uint32_t a, std::uint32_t b) const noexcept {
    return before(key_type{key[a], last[a]}, key_type{key[b], last[b]});
  }
  struct key_type {
    double key;
    std::uint64_t last;
  };
  key_type key_of(std::uint32_t s) const noexcept { return key_type{key[s], last[s]}; }
  static bool before(const key_type& a, const key_type& b) noexcept {
    return (a.key < b.key) | ((a.key == b.key) & (a.last < b.last));  // branch-free
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
    inv_decay_ = 1.0 / o_.decay;
  }

  void init(const model_shape& shape, std::uint64_t /*budget*/) {
    n_experts_ = static_cast<std::uint32_t>(shape.n_experts());
    expert_shift_ = 0;
    while ((std::uint32_t{1} << expert_shift_) < n_experts_) ++expert_shift_;
    if ((std::uint32_t{1} << expert_shift_) != n_experts_) expert_shift_ = no_shift;
    n_layers_ = shape.n_layers();
    top_k_ = shape.top_k();
    p0_ = static_cast<double>(shape.top_k()) / static_cast<double>(shape.n_experts());
    layer_bytes_ = shape.all_expert_bytes();
    heaps_.assign(n_layers_, detail::cache_slot_heap<detail::cache_cycle_order>{detail::cache_cycle_order{}});
    for (auto& h : heaps_) {
      h.order().key.assign(n_experts_, 0.0);
      h.order().last.assign(n_experts_, 0);
      h.reset(n_experts_);
    }
    scale_.assign(n_layers_, 1.0);
    // One class per distinct expert size (all layers in one when bytes are not weighed).
    class_of_.assign(n_layers_, 0);
    class_bytes_.clear();
    for (std::size_t l = 0; l < n_layers_; ++l) {
      const std::uint64_t b = o_.weigh_bytes ? layer_bytes_[l] : 1;
      std::size_t c = 0;
      while (c < class_bytes_.size() && class_bytes_[c] != b) ++c;
      if (c == class_bytes_.size()) class_bytes_.push_back(b);
      class_of_[l] = static_cast<std::uint32_t>(c);
    }
    layer_k_.assign(n_layers_, no_k);
    class_layers_.clear();
    class_start_.assign(class_bytes_.size() + 1, 0);
    for (std::size_t c = 0; c < class_bytes_.size(); ++c) {
      class_start_[c] = static_cast<std::uint32_t>(class_layers_.size());
      for (std::size_t l = 0; l < n_layers_; ++l)
        if (class_of_[l] == c) class_layers_.push_back(static_cast<std::uint32_t>(l));
    }
    class_start_[class_bytes_.size()] = static_cast<std::uint32_t>(class_layers_.size());
    scan_k_.assign(class_bytes_.size(), -1.0);
    scan_l_.assign(class_bytes_.size(), no_slot);
    scan_e_.assign(class_bytes_.size(), no_slot);
    stashed_.assign(n_layers_, 0);
    stashed_list_.clear();
    stashed_list_.reserve(n_layers_);
    now_ = n_layers_ - 1;
    t_ = 0;
    dirty_ = false;
  }
  void on_batch_begin(run_phase, std::size_t layer) noexcept {
    advance(layer);
    occ_ = 0;
  }
  void on_hit(std::uint32_t s) noexcept { use(s, false); }
  void on_repeat(std::uint32_t s) noexcept { use(s, false); }
  void on_insert(std::uint32_t s) noexcept { use(s, true); }
  void on_evict(std::uint32_t s) noexcept {
    const std::uint32_t l = layer_of(s);
    heaps_[l].erase(s - l * n_experts_);
    if (!o_.reference_scan) refresh(l);
  }
  void on_batch_end(std::size_t layer) noexcept {
    // A batch of n routed ids is n / k tokens of this layer (prefill holds many).
    const double tokens = static_cast<double>(occ_) / static_cast<double>(top_k_);
    decay_layer(layer, tokens < 1.0 ? 1.0 : tokens);
    if (!o_.reference_scan) refresh(layer);
    if (layer == now_) dirty_ = false;
  }

  template <class View>
  std::uint32_t victim(const View& v, std::size_t layer) noexcept {
    advance(layer);  // insert() outside a batch may name another layer
    if (o_.reference_scan) return victim_scan(v);
    if (dirty_) {
      refresh(now_);
      dirty_ = false;
    }
    std::uint32_t best_l = no_slot;
    double best = -1.0;
    for (std::size_t c = 0; c + 1 < class_start_.size(); ++c) {
      std::uint32_t l = no_slot;
      for (;;) {
        l = largest_k(c);
        if (l == no_slot) break;
        auto& h = heaps_[l];
        const auto base = static_cast<std::uint32_t>(l * n_experts_);
        bool stashed = false;
        h.settle_top();
        while (!h.empty() && !v.evictable(base + h.top())) {
          h.stash_top();
          h.settle_top();
          stashed = true;
        }
        if (!stashed) break;
        if (!stashed_[l]) {
          stashed_[l] = 1;
          stashed_list_.push_back(l);
        }
        refresh(l);
      }
      if (l == no_slot) continue;
      const double score = cost(l, layer_k_[l]);
      if (score > best) {
        best = score;
        best_l = l;
      }
    }
    return best_l == no_slot ? no_slot : static_cast<std::uint32_t>(best_l * n_experts_ + heaps_[best_l].top());
  }
  void end_eviction() noexcept {
    if (o_.reference_scan) return;
    for (std::uint32_t l : stashed_list_) {
      heaps_[l].restore();
      stashed_[l] = 0;
      refresh(l);
    }
    stashed_list_.clear();
  }

  /// Expected layer steps until (layer, expert) is needed, seen from a
  /// cache that just processed layer `now` (ETNU without the bytes factor).
  double expected_steps(layer_id layer, expert_id expert, layer_id now) const noexcept {
    const std::size_t l = to_index(layer);
    const double d = static_cast<double>(steps_to(l, to_index(now)));
    const double L = static_cast<double>(n_layers_);
    return d + L * (1.0 / prob(l, static_cast<std::uint32_t>(to_index(expert))) - 1.0);
  }

 private:
  // ---- the layer clock ----------------------------------------------------
  /// Absolute step of layer l's next visit, seen from the clock (t_, now_).
  double next_visit(std::size_t l) const noexcept { return static_cast<double>(t_ + steps_to(l, now_)); }
  /// Layer steps from `from` to l's next visit, 1 … L: (l + L − from − 1) mod L + 1
  /// for l, from < L, without a division.
  std::size_t steps_to(std::size_t l, std::size_t from) const noexcept {
    const std::size_t r = l + n_layers_ - from - 1;  // 0 … 2L − 2
    return (r >= n_layers_ ? r - n_layers_ : r) + 1;
  }
  std::uint32_t layer_of(std::uint32_t s) const noexcept {
    return expert_shift_ != no_shift ? s >> expert_shift_ : s / n_experts_;
  }
  /// Moves the clock to `layer`. In cycle order nothing else changes; a
  /// layer skipped over (out-of-order access) gets its K recomputed.
  void advance(std::size_t layer) noexcept {
    if (layer == now_ || layer >= n_layers_) return;
    if (dirty_ && !o_.reference_scan) refresh(now_);  // e.g. insert() that evicted nothing
    const std::size_t dist = steps_to(layer, now_);  // 1 … L−1
    const std::size_t from = now_;
    t_ += dist;
    now_ = layer;
    if (o_.reference_scan) return;
    for (std::size_t i = 1; i <= dist; ++i) refresh((from + i) % n_layers_);  // skipped + now
    dirty_ = false;
  }

  // ---- estimates ------------------------------------------------------------
  double usage(std::size_t l, std::uint32_t e) const noexcept {
    return heaps_[l].order().key[e] / scale_[l];
  }
  double prob(std::size_t l, std::uint32_t e) const noexcept {
    // Decayed count → per-token rate: u converges to r / (1 − γ) at rate r.
    const double w = 1.0 - o_.decay;
    const double rate = (usage(l, e) * w + o_.prior_weight * p0_ * w) / (1.0 + o_.prior_weight * w);
    return rate > 1.0 ? 1.0 : (rate < 1e-9 ? 1e-9 : rate);
  }
  /// K of layer l's entry e: v(l) + L / p (time-invariant between visits).
  double k_of(std::size_t l, std::uint32_t e) const noexcept {
    return next_visit(l) + static_cast<double>(n_layers_) / prob(l, e);
  }
  /// ETNU × bytes of a layer with key K at the current clock.
  double cost(std::size_t l, double k) const noexcept {
    const double steps = k - static_cast<double>(t_) - static_cast<double>(n_layers_);
    return steps * static_cast<double>(class_bytes_[class_of_[l]]);
  }
  /// Recomputes layer l's K from its heap top (no_k when the layer holds nothing).
  void refresh(std::size_t l) noexcept {
    auto& h = heaps_[l];
    if (h.empty()) {
      layer_k_[l] = no_k;
      return;
    }
    h.settle_top();
    layer_k_[l] = k_of(l, h.top());
  }
  /// The layer of class c with the largest K, ties to the lower layer (a scan
  /// of at most L doubles: cheaper than keeping a heap of layers in order
  /// through every refresh), or no_slot when none holds anything.
  std::uint32_t largest_k(std::size_t c) const noexcept {
    std::uint32_t pick = no_slot;
    double best = no_k;
    for (std::uint32_t i = class_start_[c], end = class_start_[c + 1]; i < end; ++i) {
      const std::uint32_t l = class_layers_[i];
      if (layer_k_[l] > best) {
        best = layer_k_[l];
        pick = l;
      }
    }
    return pick;
  }

  /// The reference: the same decision by scanning every layer's entries.
  template <class View>
  std::uint32_t victim_scan(const View& v) noexcept {
    auto& best_k = scan_k_;
    auto& best_l = scan_l_;
    auto& best_e = scan_e_;
    std::fill(best_k.begin(), best_k.end(), -1.0);
    std::fill(best_l.begin(), best_l.end(), no_slot);
    for (std::size_t l = 0; l < n_layers_; ++l) {
      const auto& ord = heaps_[l].order();
      std::uint32_t top = no_slot;  // first by the layer heap's order among evictable
      for (std::uint32_t e = 0; e < n_experts_; ++e) {
        const auto s = static_cast<std::uint32_t>(l * n_experts_ + e);
        if (!heaps_[l].contains(e) || !v.evictable(s)) continue;
        if (top == no_slot || ord(e, top)) top = e;
      }
      if (top == no_slot) continue;
      const std::size_t c = class_of_[l];
      const double k = k_of(l, top);
      if (k > best_k[c]) {  // ties to the lower layer (scanned first)
        best_k[c] = k;
        best_l[c] = static_cast<std::uint32_t>(l);
        best_e[c] = top;
      }
    }
    double best = -1.0;
    std::uint32_t pick = no_slot;
    for (std::size_t c = 0; c < class_bytes_.size(); ++c) {
      if (best_l[c] == no_slot) continue;
      const double score = cost(best_l[c], best_k[c]);
      if (score > best) {
        best = score;
        pick = static_cast<std::uint32_t>(best_l[c] * n_experts_ + best_e[c]);
      }
    }
    return pick;
  }

  void use(std::uint32_t s, bool insert) noexcept {
    const std::uint32_t l = layer_of(s);
    const std::uint32_t e = s - l * n_experts_;
    auto& h = heaps_[l];
    h.order().key[e] += scale_[l];  // usage += 1, in the layer's undecayed units
    h.order().last[e] = ++tick_;
    ++occ_;
    // A use only moves an entry later in its layer's order (more usage, newer
    // tick): the heap settles lazily where its top is read (refresh, victim).
    if (insert) h.push(e);
    if (l == now_) dirty_ = true;
    else if (!o_.reference_scan) refresh(l);  // insert() of another layer
  }
  /// Advances layer l's decay by `tokens`; keeps its keys finite by rescaling
  /// them (a uniform positive factor: the heap's order is unchanged, but it
  /// is rebuilt in case rounding made two keys equal).
  void decay_layer(std::size_t l, double tokens) noexcept {
    scale_[l] *= tokens == 1.0 ? inv_decay_ : std::pow(inv_decay_, tokens);
    if (scale_[l] < 1e150) return;
    auto& h = heaps_[l];
    auto& key = h.order().key;
    const double f = 1.0 / scale_[l];
    for (double& k : key) k *= f;
    scale_[l] = 1.0;
    h.rekey_all();
  }

  cycle_policy_options o_;
  double inv_decay_ = 1.0, p0_ = 0.0;
  static constexpr std::uint32_t no_shift = 0xffffffffu;
  std::uint32_t n_experts_ = 1;
  std::uint32_t expert_shift_ = no_shift;  // log2(n_experts) when a power of two
  std::size_t n_layers_ = 1, top_k_ = 1, now_ = 0;
  std::uint64_t tick_ = 0, occ_ = 0, t_ = 0;
  bool dirty_ = false;
  std::vector<std::uint64_t> layer_bytes_;
  std::vector<double> scale_;  // γ^−τ(l): usage(l, e) = key / scale
  std::vector<detail::cache_slot_heap<detail::cache_cycle_order>> heaps_;
  std::vector<std::uint32_t> class_of_;
  std::vector<std::uint64_t> class_bytes_;
  static constexpr double no_k = -std::numeric_limits<double>::infinity();
  std::vector<double> layer_k_;             // per layer: K of its top, or no_k when empty
  std::vector<std::uint32_t> class_layers_;  // the layers of each class, ascending
  std::vector<std::uint32_t> class_start_;   // class c's layers: [class_start_[c], class_start_[c + 1])
  std::vector<double> scan_k_;                // reference mode scratch
  std::vector<std::uint32_t> scan_l_, scan_e_;
  std::vector<std::uint8_t> stashed_;
  std::vector<std::uint32_t> stashed_list_;
};

}  // namespace moe_residency
