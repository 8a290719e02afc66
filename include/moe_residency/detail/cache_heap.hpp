#pragma once
// An indexed binary heap over dense slot indices: push, update (after the
// caller changed a slot's key), erase and top, all O(log n), no allocation
// after reset(). `Before` describes the order: `key_of(s)` is slot s's key as the
// order sees it now, and `before(ka, kb)` is true when a slot with key ka must
// come out before one with kb (a strict total order: ties broken inside the
// key). The heap keeps a copy of each member's key next to its slot, taken at
// push and update, so sifting compares contiguous memory instead of chasing
// the order's arrays; a caller that changes a member's key must therefore
// call update (or rekey_all after changing many). A stash holds slots popped
// temporarily (e.g. not evictable right now) and puts them back with
// restore(). push_deferred(s) adds a slot that cannot be a victim before the
// next restore() (a policy's just-inserted entry during its own batch's
// eviction): it joins the heap at restore(), so an eviction does not have to
// stash it off the top and sift it back.

#include <cstdint>
#include <utility>
#include <vector>

namespace moe_residency {
namespace detail {

template <class Before>
class cache_slot_heap {
 public:
  static constexpr std::uint32_t none = 0xffffffffu;
  using key_type = typename Before::key_type;

  explicit cache_slot_heap(Before before = Before{}) : before_(std::move(before)) {}

  void reset(std::size_t n_slots) {
    heap_.clear();
    heap_.reserve(n_slots);
    stash_.clear();
    stash_.reserve(n_slots);
    pos_.assign(n_slots, none);
    deferred_.assign(n_slots, 0);
    deferred_list_.clear();
    deferred_list_.reserve(n_slots);
  }
  Before& order() noexcept { return before_; }
  const Before& order() const noexcept { return before_; }

  bool empty() const noexcept { return heap_.empty(); }
  std::size_t size() const noexcept { return heap_.size(); }
  bool contains(std::uint32_t s) const noexcept { return pos_[s] != none; }
  std::uint32_t top() const noexcept { return heap_.empty() ? none : heap_[0].slot; }

  void push(std::uint32_t s) noexcept {
    const auto i = static_cast<std::uint32_t>(heap_.size());
    heap_.push_back(node{before_.key_of(s), s});  // capacity reserved in reset(): never reallocates
    up(i);
  }
  void update(std::uint32_t s) noexcept {
    const std::uint32_t i = pos_[s];
    if (i == none) return;
    const key_type k = before_.key_of(s);
    // A key only moves one way per update: sift that way only.
    if (before_.before(k, heap_[i].key)) {
      heap_[i].key = k;
      up(i);
    } else {
      heap_[i].key = k;
      down(i);
    }
  }
  /// Adds s at the next restore() (see the header comment). Until then s is
  /// not in the heap: update() ignores it, erase() cancels it.
  void push_deferred(std::uint32_t s) noexcept {
    // deferred_: 0 not listed, 1 listed and due, 2 listed but cancelled. A
    // slot is listed at most once, so the list (capacity n_slots reserved)
    // never reallocates.
    if (deferred_[s] == 0) deferred_list_.push_back(s);
    deferred_[s] = 1;
  }
  void erase(std::uint32_t s) noexcept {
    if (deferred_[s] == 1) deferred_[s] = 2;
    const std::uint32_t i = pos_[s];
    if (i == none) return;
    const node last = heap_.back();
    heap_.pop_back();
    pos_[s] = none;
    if (last.slot != s) {
      heap_[i] = last;
      pos_[last.slot] = i;
      if (i > 0 && before_.before(last.key, heap_[(i - 1) / 2].key)) up(i);
      else down(i);
    }
  }
  /// Re-reads every member's key from the order and restores the heap (after
  /// the caller changed many keys at once, e.g. a uniform rescale).
  void rekey_all() noexcept {
    for (node& n : heap_) n.key = before_.key_of(n.slot);
    for (std::uint32_t i = static_cast<std::uint32_t>(heap_.size() / 2); i-- > 0;) down(i);
  }
  /// For keys that only ever move later in the order: a caller may change a
  /// member's key without update() (the node's copy is then a lower bound),
  /// and must call settle_top() before reading top(): it re-sifts the top
  /// until its copy is current. The settled top is the true first (its key is
  /// no later than every copy, hence every key), so decisions are those of an
  /// eagerly updated heap, with one sift per stale entry that reaches the top
  /// instead of one per change.
  void settle_top() noexcept {
    while (!heap_.empty()) {
      const key_type k = before_.key_of(heap_[0].slot);
      if (!before_.before(heap_[0].key, k)) return;
      heap_[0].key = k;
      down(0);
    }
  }
  void stash_top() noexcept {
    const std::uint32_t s = heap_[0].slot;
    erase(s);
    stash_.push_back(s);
  }
  void restore() noexcept {
    for (std::uint32_t s : stash_) push(s);
    stash_.clear();
    for (std::uint32_t s : deferred_list_) {
      if (deferred_[s] == 1) push(s);
      deferred_[s] = 0;
    }
    deferred_list_.clear();
  }

 private:
  struct node {
    key_type key;
    std::uint32_t slot;
  };

  void up(std::uint32_t i) noexcept {
    const node n = heap_[i];
    while (i > 0) {
      const std::uint32_t p = (i - 1) / 2;
      if (!before_.before(n.key, heap_[p].key)) break;
      heap_[i] = heap_[p];
      pos_[heap_[i].slot] = i;
      i = p;
    }
    heap_[i] = n;
    pos_[n.slot] = i;
  }
  void down(std::uint32_t i) noexcept {
    const auto n_nodes = static_cast<std::uint32_t>(heap_.size());
    const node n = heap_[i];
    for (;;) {
      std::uint32_t c = 2 * i + 1;
      if (c >= n_nodes) break;
      // The smaller child by arithmetic, not a branch: which child wins is
      // data-dependent and would mispredict half the time.
      if (c + 1 < n_nodes) c += static_cast<std::uint32_t>(before_.before(heap_[c + 1].key, heap_[c].key));
      if (!before_.before(heap_[c].key, n.key)) break;
      heap_[i] = heap_[c];
      pos_[heap_[i].slot] = i;
      i = c;
    }
    heap_[i] = n;
    pos_[n.slot] = i;
  }

  Before before_;
  std::vector<node> heap_;
  std::vector<std::uint32_t> stash_, pos_;
  std::vector<std::uint8_t> deferred_;
  std::vector<std::uint32_t> deferred_list_;
};

}  // namespace detail
}  // namespace moe_residency
