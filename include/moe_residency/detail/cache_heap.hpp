#pragma once
// An indexed binary heap over dense slot indices: push, update (after the
// caller changed a slot's key), erase and top, all O(log n), no allocation
// after reset(). `Before(a, b)` is true when slot a must come out before b.
// A stash holds slots popped temporarily (e.g. not evictable right now) and
// puts them back with restore().

#include <cstdint>
#include <utility>
#include <vector>

namespace moe_residency {
namespace detail {

template <class Before>
class cache_slot_heap {
 public:
  static constexpr std::uint32_t none = 0xffffffffu;

  explicit cache_slot_heap(Before before = Before{}) : before_(std::move(before)) {}

  void reset(std::size_t n_slots) {
    heap_.clear();
    heap_.reserve(n_slots);
    stash_.clear();
    stash_.reserve(n_slots);
    pos_.assign(n_slots, none);
  }
  Before& order() noexcept { return before_; }
  const Before& order() const noexcept { return before_; }

  bool empty() const noexcept { return heap_.empty(); }
  std::size_t size() const noexcept { return heap_.size(); }
  bool contains(std::uint32_t s) const noexcept { return pos_[s] != none; }
  std::uint32_t top() const noexcept { return heap_.empty() ? none : heap_[0]; }

  void push(std::uint32_t s) noexcept {
    pos_[s] = static_cast<std::uint32_t>(heap_.size());
    heap_.push_back(s);  // capacity reserved in reset(): never reallocates
    up(pos_[s]);
  }
  /// Re-establishes order after s's key changed (either direction).
  void update(std::uint32_t s) noexcept {
    const std::uint32_t i = pos_[s];
    if (i == none) return;
    up(i);
    down(pos_[s]);
  }
  void erase(std::uint32_t s) noexcept {
    const std::uint32_t i = pos_[s];
    if (i == none) return;
    const std::uint32_t last = heap_.back();
    heap_.pop_back();
    pos_[s] = none;
    if (last != s) {
      heap_[i] = last;
      pos_[last] = i;
      up(i);
      down(pos_[last]);
    }
  }
  /// Removes the top into the stash (it comes back with restore()).
  void stash_top() noexcept {
    const std::uint32_t s = heap_[0];
    erase(s);
    stash_.push_back(s);
  }
  void restore() noexcept {
    for (std::uint32_t s : stash_) push(s);
    stash_.clear();
  }

 private:
  void up(std::uint32_t i) noexcept {
    const std::uint32_t s = heap_[i];
    while (i > 0) {
      const std::uint32_t p = (i - 1) / 2;
      if (!before_(s, heap_[p])) break;
      heap_[i] = heap_[p];
      pos_[heap_[i]] = i;
      i = p;
    }
    heap_[i] = s;
    pos_[s] = i;
  }
  void down(std::uint32_t i) noexcept {
    const std::uint32_t n = static_cast<std::uint32_t>(heap_.size());
    const std::uint32_t s = heap_[i];
    for (;;) {
      std::uint32_t c = 2 * i + 1;
      if (c >= n) break;
      if (c + 1 < n && before_(heap_[c + 1], heap_[c])) ++c;
      if (!before_(heap_[c], s)) break;
      heap_[i] = heap_[c];
      pos_[heap_[i]] = i;
      i = c;
    }
    heap_[i] = s;
    pos_[s] = i;
  }

  Before before_;
  std::vector<std::uint32_t> heap_, stash_, pos_;
};

}  // namespace detail
}  // namespace moe_residency
