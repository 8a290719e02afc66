#pragma once
/// belady: the offline oracle. Evicts the evictable entry whose next use is
/// farthest (never used again = infinitely far; ties to the least recently
/// used). It needs the future: a next_use_index built from the exact batch
/// sequence the cache will then see. Optimal only when every entry has the
/// same size; with per-layer bytes it is the classic reference, not a bound.

#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "moe_residency/cache/expert_cache.hpp"
#include "moe_residency/detail/cache_buckets.hpp"

namespace moe_residency {

/// For every lookup of a batch sequence (unique ids per batch, in order of
/// first occurrence), the index of the next batch that looks the same
/// (layer, expert) up again, or `never`.
class next_use_index {
 public:
  static constexpr std::uint32_t never = std::numeric_limits<std::uint32_t>::max();

  explicit next_use_index(const model_shape& shape)
      : shape_(shape),
        n_experts_(static_cast<std::uint32_t>(shape.n_experts())),
        seen_(shape.n_layers() * shape.n_experts(), 0) {}

  /// Appends one load batch. Ids outside the shape and batches of a dense
  /// layer are skipped (the cache rejects them too); the batch still counts
  /// in the numbering. Throws error after finish().
  void add_batch(layer_id layer, span<const expert_id> ids) {
    if (finished_) throw error("next_use_index: add_batch after finish(); expected all batches first");
    ++n_batches_;
    if (!shape_.is_moe(layer)) return;
    for (expert_id e : ids) {
      if (to_index(e) >= n_experts_) continue;
      const auto s = static_cast<std::uint32_t>(to_index(layer) * n_experts_ + to_index(e));
      if (seen_[s] == n_batches_) continue;
      seen_[s] = n_batches_;
      slots_.push_back(s);
      batch_of_.push_back(n_batches_ - 1);
    }
  }
  /// Computes the next uses (a backward pass). Idempotent.
  void finish() {
    if (finished_) return;
    finished_ = true;
    next_.assign(slots_.size(), never);
    first_.assign(seen_.size(), never);
    for (std::size_t i = slots_.size(); i-- > 0;) {
      next_[i] = first_[slots_[i]];
      first_[slots_[i]] = batch_of_[i];
    }
    seen_.clear();
    seen_.shrink_to_fit();
  }
  bool finished() const noexcept { return finished_; }
  /// Batches added (dense and empty ones included): every next use is below it.
  std::uint32_t batches() const noexcept { return n_batches_; }
  std::size_t size() const noexcept { return slots_.size(); }
  std::uint32_t slot(std::size_t i) const noexcept { return slots_[i]; }
  std::uint32_t next_use(std::size_t i) const noexcept { return next_[i]; }
  /// The first batch that looks slot `s` (layer × n_experts + expert) up, or
  /// `never` (also for a slot outside the shape). Valid after finish().
  std::uint32_t first_use(std::size_t s) const noexcept { return s < first_.size() ? first_[s] : never; }

 private:
  model_shape shape_;
  std::uint32_t n_experts_;
  std::uint32_t n_batches_ = 0;
  bool finished_ = false;
  std::vector<std::uint32_t> seen_, slots_, batch_of_, next_, first_;
};

class belady_policy : public policy_base {
 public:
  static constexpr const char* name = "belady";
  static constexpr bool collapses_below_cycle = false;

  /// `index` must be finished and describe the exact sequence of lookups the
  /// cache will see; it is shared, not copied. Throws error when unfinished.
  explicit belady_policy(std::shared_ptr<const next_use_index> index) : index_(std::move(index)) {
    if (!index_ || !index_->finished())
      throw error("belady_policy: next_use_index is null or unfinished; expected finish() first");
  }

  // Every resident entry sits in the bucket of its next use (a calendar:
  // never = bucket 0, then the farthest batch first), appended at each new
  // tick so a bucket is in recency order: the first evictable entry of the
  // first non-empty bucket is the farthest next use, ties to the older last
  // access — O(1) per access, no heap.
  void init(const model_shape& shape, std::uint64_t /*budget*/) {
    const std::size_t n = shape.n_layers() * shape.n_experts();
    next_.assign(n, next_use_index::never);
    upcoming_.resize(n);
    for (std::size_t s = 0; s < n; ++s) upcoming_[s] = index_->first_use(s);
    n_batches_ = index_->batches();
    buckets_.reset(n, std::size_t{n_batches_} + 1);
  }
  void on_hit(std::uint32_t s) noexcept { advance(s); }
  void on_insert(std::uint32_t s) noexcept { advance(s); }
  /// Admission without a lookup (expert_cache::insert: a preload or a
  /// completed speculative read): keyed by the slot's next use from here,
  /// without consuming the index entry that belongs to the next lookup.
  void on_admit(std::uint32_t s) noexcept {
    next_[s] = upcoming_[s];
    file(s);  // the cache protects it during insert()'s own eviction
  }
  void on_repeat(std::uint32_t s) noexcept { file(s); }
  void on_evict(std::uint32_t s) noexcept { buckets_.erase(s); }
  template <class View>
  std::uint32_t victim(const View& v, std::size_t /*layer*/) noexcept {
    for (std::uint32_t b = buckets_.first_from(0); b != detail::cache_slot_buckets::none;
         b = buckets_.first_from(std::size_t{b} + 1))
      for (std::uint32_t s = buckets_.head(b); s != detail::cache_slot_buckets::none; s = buckets_.newer(s))
        if (v.evictable(s)) return s;
    return no_slot;
  }
  /// Lookups consumed so far, and whether any diverged from the index.
  std::size_t position() const noexcept { return cursor_; }
  bool diverged() const noexcept { return diverged_; }

 private:
  void advance(std::uint32_t s) noexcept {
    if (cursor_ < index_->size() && index_->slot(cursor_) == s) {
      next_[s] = index_->next_use(cursor_);
      upcoming_[s] = next_[s];
    } else {
      diverged_ = true;  // sequence differs from the index: treat as never again
      next_[s] = next_use_index::never;
    }
    ++cursor_;
    file(s);
  }
  /// A new access of s: the newest entry of its next use's bucket.
  void file(std::uint32_t s) noexcept {
    const std::uint32_t nx = next_[s];
    // A next use at or past the index's end cannot come from it; treat it as never.
    const std::uint32_t b = nx >= n_batches_ ? 0u : n_batches_ - nx;
    buckets_.move_back(b, s);
  }

  std::shared_ptr<const next_use_index> index_;
  std::size_t cursor_ = 0;
  std::uint32_t n_batches_ = 0;
  bool diverged_ = false;
  std::vector<std::uint32_t> next_;      // per resident slot: its next use (batch index) or never
  std::vector<std::uint32_t> upcoming_;  // per slot: the next batch that looks it up
  detail::cache_slot_buckets buckets_;
};

}  // namespace moe_residency
