#pragma once
// Intrusive doubly linked lists over dense slot indices, several lists sharing
// one array of links (a slot is in at most one list at a time). A slot's
// previous, next and list sit together, so a relink touches one cache line
// per slot instead of one per array. Allocates only in reset(); every other
// call is O(1) and noexcept.

#include <cstdint>
#include <vector>

namespace moe_residency {
namespace detail {

class cache_slot_lists {
 public:
  static constexpr std::uint32_t none = 0xffffffffu;

  /// `n_slots` slots, `n_lists` lists; all empty.
  void reset(std::size_t n_slots, std::size_t n_lists) {
    link_.assign(n_slots, link{});
    head_.assign(n_lists, none);
    tail_.assign(n_lists, none);
    bytes_.assign(n_lists, 0);
    count_.assign(n_lists, 0);
  }

  /// List the slot is in, or `none`.
  std::uint32_t owner(std::uint32_t s) const noexcept { return link_[s].owner; }
  bool contains(std::uint32_t list, std::uint32_t s) const noexcept { return link_[s].owner == list; }
  std::uint32_t head(std::uint32_t list) const noexcept { return head_[list]; }
  std::uint32_t tail(std::uint32_t list) const noexcept { return tail_[list]; }
  /// Towards the head (more recent) / towards the tail (older).
  std::uint32_t newer(std::uint32_t s) const noexcept { return link_[s].prev; }
  std::uint32_t older(std::uint32_t s) const noexcept { return link_[s].next; }
  std::uint64_t bytes(std::uint32_t list) const noexcept { return bytes_[list]; }
  std::uint32_t size(std::uint32_t list) const noexcept { return count_[list]; }

  void push_front(std::uint32_t list, std::uint32_t s, std::uint64_t b = 0) noexcept {
    link_[s].owner = list;
    link_[s].prev = none;
    link_[s].next = head_[list];
    if (head_[list] != none) link_[head_[list]].prev = s;
    head_[list] = s;
    if (tail_[list] == none) tail_[list] = s;
    bytes_[list] += b;
    ++count_[list];
  }

  void erase(std::uint32_t s, std::uint64_t b = 0) noexcept {
    const std::uint32_t list = link_[s].owner;
    if (list == none) return;
    if (link_[s].prev != none) link_[link_[s].prev].next = link_[s].next;
    else head_[list] = link_[s].next;
    if (link_[s].next != none) link_[link_[s].next].prev = link_[s].prev;
    else tail_[list] = link_[s].prev;
    link_[s].prev = link_[s].next = link_[s].owner = none;
    bytes_[list] -= b;
    --count_[list];
  }

  void move_to_front(std::uint32_t list, std::uint32_t s, std::uint64_t b = 0) noexcept {
    if (link_[s].owner != list) {
      erase(s, b);
      push_front(list, s, b);
      return;
    }
    // Already in this list (the common case, a hit): relink only; owner,
    // bytes and count are unchanged.
    const std::uint32_t p = link_[s].prev;
    if (p == none) return;  // already the head
    const std::uint32_t n = link_[s].next;
    link_[p].next = n;
    if (n != none) link_[n].prev = p;
    else tail_[list] = p;
    link_[s].prev = none;
    link_[s].next = head_[list];
    link_[head_[list]].prev = s;
    head_[list] = s;
  }

 private:
  struct link {
    std::uint32_t prev = none, next = none, owner = none;
  };
  std::vector<link> link_;
  std::vector<std::uint32_t> head_, tail_, count_;
  std::vector<std::uint64_t> bytes_;
};

}  // namespace detail
}  // namespace moe_residency
