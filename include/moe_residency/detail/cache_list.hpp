#pragma once
// Intrusive doubly linked lists over dense slot indices, several lists sharing
// one pair of link arrays (a slot is in at most one list at a time). Allocates
// only in reset(); every other call is O(1) and noexcept.

#include <cstdint>
#include <vector>

namespace moe_residency {
namespace detail {

class cache_slot_lists {
 public:
  static constexpr std::uint32_t none = 0xffffffffu;

  /// `n_slots` slots, `n_lists` lists; all empty.
  void reset(std::size_t n_slots, std::size_t n_lists) {
    prev_.assign(n_slots, none);
    next_.assign(n_slots, none);
    owner_.assign(n_slots, none);
    head_.assign(n_lists, none);
    tail_.assign(n_lists, none);
    bytes_.assign(n_lists, 0);
    count_.assign(n_lists, 0);
  }

  /// List the slot is in, or `none`.
  std::uint32_t owner(std::uint32_t s) const noexcept { return owner_[s]; }
  bool contains(std::uint32_t list, std::uint32_t s) const noexcept { return owner_[s] == list; }
  std::uint32_t head(std::uint32_t list) const noexcept { return head_[list]; }
  std::uint32_t tail(std::uint32_t list) const noexcept { return tail_[list]; }
  /// Towards the head (more recent) / towards the tail (older).
  std::uint32_t newer(std::uint32_t s) const noexcept { return prev_[s]; }
  std::uint32_t older(std::uint32_t s) const noexcept { return next_[s]; }
  std::uint64_t bytes(std::uint32_t list) const noexcept { return bytes_[list]; }
  std::uint32_t size(std::uint32_t list) const noexcept { return count_[list]; }

  void push_front(std::uint32_t list, std::uint32_t s, std::uint64_t b = 0) noexcept {
    owner_[s] = list;
    prev_[s] = none;
    next_[s] = head_[list];
    if (head_[list] != none) prev_[head_[list]] = s;
    head_[list] = s;
    if (tail_[list] == none) tail_[list] = s;
    bytes_[list] += b;
    ++count_[list];
  }

  void erase(std::uint32_t s, std::uint64_t b = 0) noexcept {
    const std::uint32_t list = owner_[s];
    if (list == none) return;
    if (prev_[s] != none) next_[prev_[s]] = next_[s]; else head_[list] = next_[s];
    if (next_[s] != none) prev_[next_[s]] = prev_[s]; else tail_[list] = prev_[s];
    prev_[s] = next_[s] = owner_[s] = none;
    bytes_[list] -= b;
    --count_[list];
  }

  void move_to_front(std::uint32_t list, std::uint32_t s, std::uint64_t b = 0) noexcept {
    if (owner_[s] != list) {
      erase(s, b);
      push_front(list, s, b);
      return;
    }
    // Already in this list (the common case, a hit): relink only; owner,
    // bytes and count are unchanged.
    const std::uint32_t p = prev_[s];
    if (p == none) return;  // already the head
    const std::uint32_t n = next_[s];
    next_[p] = n;
    if (n != none) prev_[n] = p; else tail_[list] = p;
    prev_[s] = none;
    next_[s] = head_[list];
    prev_[head_[list]] = s;
    head_[list] = s;
  }

 private:
  std::vector<std::uint32_t> prev_, next_, owner_, head_, tail_, count_;
  std::vector<std::uint64_t> bytes_;
};

}  // namespace detail
}  // namespace moe_residency
