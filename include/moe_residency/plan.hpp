#pragma once
/// The cache-aware drop policy and the drop-aware speculation planner.
///
/// Both are pure decision functions over a residency query
/// `bool(layer_id, expert_id)` (an `expert_cache`'s `is_resident`, or any
/// callable that answers the same question). Neither touches storage, neither
/// allocates on the hot path; docs/speculation.md has the rules and the
/// measurements behind them.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "moe_residency/core.hpp"
#include "moe_residency/detail/format.hpp"
#include "moe_residency/error.hpp"

namespace moe_residency {

/// How the cache-aware drop policy is configured.
struct drop_options {
  /// `F`: a routed expert is dropped only when it is a miss and its weight is
  /// below `F × 1/k`. Must satisfy 0 < F <= 1 (NaN and infinities rejected).
  double fraction = 1.0;
  /// Also drop in prefill routings (default: decode only).
  bool include_prefill = false;
  /// Receives the one-time warning issued when k <= 4. Empty: printed once to
  /// stderr (`moe_residency: warning: ...`), like the cache's cycle warning.
  /// Kept in `drop_policy::warning()` either way.
  warning_sink on_warning;
};

/// What the drop policy decided for one routing: a mask over its slots.
struct drop_decision {
  std::uint32_t dropped_mask = 0;   ///< bit s set: slot s is skipped (not read, not computed)
  std::uint8_t n_dropped = 0;       ///< popcount of dropped_mask
  bool eligible = false;            ///< false: prefill (not asked) or a non-MoE layer; nothing dropped
  std::uint64_t bytes_avoided = 0;  ///< expert bytes of the dropped misses
  double weight_discarded = 0.0;    ///< sum of the dropped slots' router weights

  bool dropped(std::size_t slot) const noexcept { return slot < 32 && ((dropped_mask >> slot) & 1u) != 0; }
  bool kept(std::size_t slot) const noexcept { return !dropped(slot); }
  bool any() const noexcept { return dropped_mask != 0; }
};

/// Cumulative counters of a drop policy (decode only unless include_prefill).
struct drop_stats {
  std::uint64_t routings = 0;            ///< eligible routings decided
  std::uint64_t routings_with_drop = 0;  ///< of those, routings with at least one slot dropped
  std::uint64_t experts = 0;             ///< routed experts in eligible routings
  std::uint64_t experts_dropped = 0;
  std::uint64_t misses = 0;              ///< routed experts that were misses when decided
  std::uint64_t miss_bytes = 0;          ///< bytes those misses would read without dropping
  std::uint64_t miss_bytes_avoided = 0;  ///< bytes not read because of a drop
  double weight_total = 0.0;             ///< sum of finite router weights seen
  double weight_discarded = 0.0;         ///< sum of router weights dropped
  std::uint64_t nan_weights = 0;         ///< routed experts whose weight was NaN (never dropped)
  std::uint64_t ineligible = 0;          ///< routings not considered (prefill, non-MoE layer)

  /// Router weight discarded as a fraction of the weight seen, in [0, 1]; 0 when none seen.
  double weight_discarded_fraction() const noexcept {
    return weight_total > 0.0 ? weight_discarded / weight_total : 0.0;
  }
  /// Miss bytes avoided as a fraction of the miss bytes seen, in [0, 1].
  double miss_bytes_avoided_fraction() const noexcept {
    return miss_bytes > 0 ? static_cast<double>(miss_bytes_avoided) / static_cast<double>(miss_bytes) : 0.0;
  }
};

/// Cache-aware expert dropping: skip a routed expert only when it is a miss
/// AND its weight is below `F × 1/k`; never the top-weighted expert of the
/// routing. A NaN weight is never below the threshold, so a NaN-weighted
/// expert is never dropped (the engine did not say it is unimportant).
///
/// The top-weighted expert is the slot with the largest finite weight (the
/// first such slot on ties), which is slot 0 for an engine's rank-ordered
/// routing; it is protected even if it is a miss below the threshold (k = 1
/// with F = 1 never drops anything).
///
/// It needs a residency query at every decision: dropping without a cache
/// would skip experts the engine then lacks for no saved read.
class drop_policy {
 public:
  /// Throws `error` when F is not in (0, 1]. Warns once, here, when k <= 4:
  /// through `options.on_warning`, or to stderr when it is empty (and in
  /// `warning()`). Copies and moves never warn again.
  drop_policy(const model_shape& shape, drop_options options = {}) : shape_(shape), options_(std::move(options)) {
    const double f = options_.fraction;
    if (std::isnan(f)) throw error("drop_policy: fraction F = nan is not a number; expected 0 < F <= 1");
    if (!(f > 0.0) || !(f <= 1.0))
      throw error("drop_policy: fraction F = " + detail::format_number(f) + " out of range; expected 0 < F <= 1" +
                  (f > 1.0 ? " (F > 1 could drop every expert but the top one)"
                           : " (F <= 0 never drops; disable the policy instead)"));
    threshold_ = f / static_cast<double>(shape_.top_k());
    if (shape_.top_k() <= 4) {
      warning_ = "drop_policy: top-k " + std::to_string(shape_.top_k()) +
                 " <= 4: the drop threshold F/k = " + detail::format_number(threshold_) +
                 " (F = " + detail::format_number(f) +
                 ") can remove a large share of the routing and its weight; watch the "
                 "router weight discarded in the drop line";
      detail::emit_warning(options_.on_warning, warning_);
    }
  }

  /// `F × 1/k`: a miss whose weight is strictly below it may be dropped.
  double threshold() const noexcept { return threshold_; }
  double fraction() const noexcept { return options_.fraction; }
  const model_shape& shape() const noexcept { return shape_; }
  /// The k <= 4 warning text, or empty when none was issued.
  const std::string& warning() const noexcept { return warning_; }
  const drop_stats& stats() const noexcept { return stats_; }
  void reset_stats() noexcept { stats_ = {}; }

  /// Decides one routing without recording it. `is_resident(layer, expert)`
  /// must not throw. Routing ids are expected unique (an engine's top-k).
  template <class IsResident>
  drop_decision evaluate(const routing& r, IsResident&& is_resident) const noexcept {
    return evaluate_slots(r, is_resident, nullptr);
  }

  /// Decides one routing and adds it to `stats()`. Call it after the
  /// scheduler's quiesce has integrated completed speculative reads: an
  /// expert a speculative read made resident is a hit, so it is never
  /// dropped (speculation "un-drops" it).
  template <class IsResident>
  drop_decision decide(const routing& r, IsResident&& is_resident) noexcept {
    std::uint32_t miss_mask = 0;  // residency asked once per slot, for the decision and the stats
    const drop_decision d = evaluate_slots(r, is_resident, &miss_mask);
    if (!d.eligible) {
      ++stats_.ineligible;
      return d;
    }
    const std::uint64_t bytes = shape_.expert_bytes(r.layer);
    ++stats_.routings;
    stats_.experts += r.size();
    for (std::size_t s = 0; s < r.size(); ++s) {
      const float w = r.weight(s);
      if (std::isnan(w)) {
        ++stats_.nan_weights;
      } else if (std::isfinite(w)) {
        stats_.weight_total += static_cast<double>(w);
      }
      if ((miss_mask >> s) & 1u) {
        ++stats_.misses;
        stats_.miss_bytes += bytes;
      }
    }
    if (d.any()) ++stats_.routings_with_drop;
    stats_.experts_dropped += d.n_dropped;
    stats_.miss_bytes_avoided += d.bytes_avoided;
    stats_.weight_discarded += d.weight_discarded;
    return d;
  }

  /// The slot the policy never drops: the largest finite weight, first on
  /// ties; slot 0 when no weight is finite (then nothing is dropped anyway,
  /// unless weights are -inf, which are below any threshold).
  static std::size_t top_weighted_slot(const routing& r) noexcept {
    std::size_t top = 0;
    bool found = false;
    float best = 0.0f;
    for (std::size_t s = 0; s < r.size(); ++s) {
      const float w = r.weight(s);
      if (std::isnan(w)) continue;
      if (!found || w > best) {
        best = w;
        top = s;
        found = true;
      }
    }
    return top;
  }

 private:
  // The rule. With `miss_mask`, residency is asked for every slot once and
  // the misses recorded (decide's statistics need them all); without, only
  // for the slots below the threshold.
  template <class IsResident>
  drop_decision evaluate_slots(const routing& r, IsResident& is_resident, std::uint32_t* miss_mask) const noexcept {
    drop_decision d;
    const std::uint64_t bytes = shape_.expert_bytes(r.layer);
    if ((r.phase == run_phase::prefill && !options_.include_prefill) || bytes == 0) return d;
    d.eligible = true;
    const std::size_t top = top_weighted_slot(r);
    for (std::size_t s = 0; s < r.size(); ++s) {
      const float w = r.weight(s);
      // NaN compares false: a NaN weight is never below the threshold.
      const bool candidate = s != top && static_cast<double>(w) < threshold_;
      if (!candidate && miss_mask == nullptr) continue;
      const bool miss = !is_resident(r.layer, r.id(s));
      if (miss && miss_mask != nullptr) *miss_mask |= (1u << s);
      if (!candidate || !miss) continue;
      d.dropped_mask |= (1u << s);
      ++d.n_dropped;
      d.bytes_avoided += bytes;
      d.weight_discarded += static_cast<double>(w);
    }
    return d;
  }

  model_shape shape_;
  drop_options options_;
  double threshold_ = 0.0;
  std::string warning_;
  drop_stats stats_;
};

/// At most `capacity` predicted misses in rank order, with the rank and
/// predicted weight each came from, and why the others were skipped.
class speculation_plan {
 public:
  static constexpr std::size_t capacity = max_top_k;

  layer_id layer{};  ///< the layer the reads are for (the ranking's target)

  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  expert_id id(std::size_t i) const noexcept { return ids_[i]; }
  float weight(std::size_t i) const noexcept { return weights_[i]; }
  /// Rank (0 = top prediction) of the i-th planned read.
  std::size_t rank(std::size_t i) const noexcept { return ranks_[i]; }
  span<const expert_id> ids() const noexcept { return {ids_.data(), size_}; }

  std::uint8_t considered = 0;               ///< ranks examined before the cap was reached
  std::uint8_t skipped_resident = 0;         ///< predictions already resident (do not use the cap)
  std::uint8_t skipped_below_threshold = 0;  ///< predicted misses the armed drop would discard
  std::uint8_t skipped_duplicate = 0;        ///< an id already seen at a better rank

  /// Internal: appends a planned read (the planner never exceeds capacity).
  void push_back(expert_id e, float w, std::size_t rank) noexcept {
    MOE_RESIDENCY_ASSERT(size_ < capacity);
    ids_[size_] = e;
    weights_[size_] = w;
    ranks_[size_] = static_cast<std::uint8_t>(rank);
    ++size_;
  }

 private:
  std::array<expert_id, capacity> ids_{};
  std::array<float, capacity> weights_{};
  std::array<std::uint8_t, capacity> ranks_{};
  std::uint8_t size_ = 0;
};

/// The drop-aware speculation planner: which predicted experts of a coming
/// layer (l+1, or l+2 for a longer lead) to read now.
///
/// Rules, applied to the first `top_k` ranks of the prediction, best first:
///  1. a prediction already resident is skipped and does not use the cap;
///  2. with dropping armed, a predicted miss whose predicted weight is below
///     the drop threshold is skipped — except rank 0, always kept; a NaN
///     predicted weight is never below the threshold (kept);
///  3. an id already seen at a better rank is skipped (rankings are expected
///     unique; this keeps a malformed one from reading twice);
///  4. the first `cap` remaining predicted misses are the plan, in rank order.
/// Pure (no state changes) and allocation-free.
class speculation_planner {
 public:
  static constexpr std::size_t default_cap = 2;

  /// Throws `error` when cap > 32 (a ranking holds at most 32). cap 0 plans nothing.
  explicit speculation_planner(std::size_t cap = default_cap) : cap_(cap) {
    if (cap_ > speculation_plan::capacity)
      throw error("speculation_planner: cap " + std::to_string(cap_) + " out of range; expected [0, " +
                  std::to_string(speculation_plan::capacity) + "] (2 is the measured default)");
  }

  std::size_t cap() const noexcept { return cap_; }

  /// Plans reads for layer `target` from its predicted ranking. Considers the
  /// first min(top_k, predicted.size()) ranks. `drop_threshold`: the drop
  /// policy's F/k when dropping is armed, empty otherwise.
  /// `is_resident(layer, expert)` must not throw.
  template <class IsResident>
  speculation_plan plan(layer_id target, const ranking& predicted, std::size_t top_k, IsResident&& is_resident,
                        std::optional<double> drop_threshold = std::nullopt) const noexcept {
    speculation_plan p;
    p.layer = target;
    const std::size_t depth = std::min(top_k, predicted.size());
    for (std::size_t r = 0; r < depth && p.size() < cap_; ++r) {
      ++p.considered;
      const expert_id e = predicted.id(r);
      if (predicted.contains(e, r)) {
        ++p.skipped_duplicate;
        continue;
      }
      if (is_resident(target, e)) {
        ++p.skipped_resident;
        continue;
      }
      const float w = predicted.weight(r);
      if (drop_threshold && r != 0 && static_cast<double>(w) < *drop_threshold) {
        ++p.skipped_below_threshold;
        continue;
      }
      p.push_back(e, w, r);
    }
    return p;
  }

 private:
  std::size_t cap_ = default_cap;
};

}  // namespace moe_residency
