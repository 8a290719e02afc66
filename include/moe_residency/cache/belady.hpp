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
#include "moe_residency/detail/cache_heap.hpp"

namespace moe_residency {

/// For every lookup of a batch sequence (unique ids per batch, in order of
/// first occurrence), the index of the next batch that looks the same
/// (layer, expert) up again, or `never`.
class next_use_index {
 public:
  static constexpr std::uint32_t never = std::numeric_limits<std::uint32_t>::max();

  explicit next_use_index(const model_shape& shape)
      : shape_(shape), n_experts_(static_cast<std::uint32_t>(shape.n_experts())),
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

namespace detail {
struct cache_belady_order {
  std::vector<std::uint32_t> next;
  std::vector<std::uint64_t> last;
  bool operator()(std::uint32_t a, std::uint32_t b) const noexcept {
    return before(key_of(a), key_of(b));
  }
  /// The farthest next use first, then the older last access.
  struct key_type {
    std::uint32_t next;
    std::uint64_t last;
  };
  key_type key_of(std::uint32_t s) const noexcept { return key_type{next[s], last[s]}; }
  static bool before(const key_type& a, const key_type& b) noexcept {
    return (a.next > b.next) | ((a.next == b.next) & (a.last < b.last));  // branch-free
  }
};
}  // namespace detail

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

  void init(const model_shape& shape, std::uint64_t /*budget*/) {
    const std::size_t n = shape.n_layers() * shape.n_experts();
    heap_.order().next.assign(n, next_use_index::never);
    heap_.order().last.assign(n, 0);
    upcoming_.resize(n);
    for (std::size_t s = 0; s < n; ++s) upcoming_[s] = index_->first_use(s);
    heap_.reset(n);
  }
  void on_hit(std::uint32_t s) noexcept { advance(s, false); }
  void on_insert(std::uint32_t s) noexcept { advance(s, true); }
  /// Admission without a lookup (expert_cache::insert: a preload or a
  /// completed speculative read): keyed by the slot's next use from here,
  /// without consuming the index entry that belongs to the next lookup.
  void on_admit(std::uint32_t s) noexcept {
    auto& o = heap_.order();
    o.next[s] = upcoming_[s];
    o.last[s] = ++tick_;
    heap_.push_deferred(s);  // protected during insert()'s own eviction
  }
  void on_repeat(std::uint32_t s) noexcept {
    heap_.order().last[s] = ++tick_;
    heap_.update(s);
  }
  void on_evict(std::uint32_t s) noexcept { heap_.erase(s); }
  template <class View>
  std::uint32_t victim(const View& v, std::size_t /*layer*/) noexcept {
    while (!heap_.empty() && !v.evictable(heap_.top())) heap_.stash_top();
    return heap_.empty() ? no_slot : heap_.top();
  }
  void end_eviction() noexcept { heap_.restore(); }
  /// Lookups consumed so far, and whether any diverged from the index.
  std::size_t position() const noexcept { return cursor_; }
  bool diverged() const noexcept { return diverged_; }

 private:
  void advance(std::uint32_t s, bool insert) noexcept {
    auto& o = heap_.order();
    if (cursor_ < index_->size() && index_->slot(cursor_) == s) {
      o.next[s] = index_->next_use(cursor_);
      upcoming_[s] = o.next[s];
    } else {
      diverged_ = true;  // sequence differs from the index: treat as never again
      o.next[s] = next_use_index::never;
    }
    ++cursor_;
    o.last[s] = ++tick_;
    if (insert) heap_.push_deferred(s);  // not evictable before this batch's eviction ends
    else heap_.update(s);
  }

  std::shared_ptr<const next_use_index> index_;
  std::size_t cursor_ = 0;
  std::uint64_t tick_ = 0;
  bool diverged_ = false;
  std::vector<std::uint32_t> upcoming_;  // per slot: the next batch that looks it up
  detail::cache_slot_heap<detail::cache_belady_order> heap_;
};

}  // namespace moe_residency
