#pragma once
/// sieve (Zhang et al., NSDI '24, as libCacheSim's Sieve.c defines it): one
/// FIFO queue, new entries at the head with visited = 0, a hit sets
/// visited = 1 without moving. A hand walks from the tail towards the head
/// (wrapping), clearing visited bits, and evicts the first unvisited entry;
/// it then rests on that entry's newer neighbour. Adapted to batches: an entry
/// the batch touched or a pinned one is stepped over without clearing its
/// bit. O(1) amortised.

#include <cstdint>
#include <vector>

#include "moe_residency/cache/expert_cache.hpp"
#include "moe_residency/detail/cache_list.hpp"

namespace moe_residency {

class sieve_policy : public policy_base {
 public:
  static constexpr const char* name = "sieve";
  static constexpr bool collapses_below_cycle = true;

  void init(const model_shape& shape, std::uint64_t /*budget*/) {
    const std::size_t n = shape.n_layers() * shape.n_experts();
    q_.reset(n, 1);
    visited_.assign(n, 0);
    hand_ = none;
  }
  void on_hit(std::uint32_t s) noexcept { visited_[s] = 1; }
  void on_insert(std::uint32_t s) noexcept {
    visited_[s] = 0;
    q_.push_front(0, s);
  }
  void on_evict(std::uint32_t s) noexcept {
    if (hand_ == s) hand_ = q_.newer(s);
    q_.erase(s);
  }
  template <class View>
  std::uint32_t victim(const View& v, std::size_t /*layer*/) noexcept {
    const std::uint32_t n = q_.size(0);
    std::uint32_t p = hand_ == none ? q_.tail(0) : hand_;
    // Two full sweeps clear every bit; a third finds nothing only when every
    // entry is touched or pinned.
    for (std::uint64_t steps = 0; steps < 3ull * n + 1 && p != none; ++steps) {
      if (v.evictable(p)) {
        if (!visited_[p]) {
          hand_ = p;  // on_evict moves the hand to the newer neighbour
          return p;
        }
        visited_[p] = 0;
      }
      p = q_.newer(p) == none ? q_.tail(0) : q_.newer(p);
    }
    return no_slot;
  }

 private:
  static constexpr std::uint32_t none = detail::cache_slot_lists::none;
  detail::cache_slot_lists q_;
  std::vector<std::uint8_t> visited_;
  std::uint32_t hand_ = none;
};

}  // namespace moe_residency
