#pragma once
/// lru: evict the least recently used evictable entry (global, across
/// layers). Duplicates in a batch promote. O(1) per access; the victim walk
/// skips only touched and pinned entries. Collapses to 0% hit below one token
/// cycle: in a deterministic layer cycle the LRU entry is the soonest needed.

#include <cstdint>

#include "moe_residency/cache/expert_cache.hpp"
#include "moe_residency/detail/cache_list.hpp"

namespace moe_residency {

class lru_policy : public policy_base {
 public:
  static constexpr const char* name = "lru";
  static constexpr bool collapses_below_cycle = true;

  void init(const model_shape& shape, std::uint64_t /*budget*/) {
    lists_.reset(shape.n_layers() * shape.n_experts(), 1);
  }
  void on_hit(std::uint32_t s) noexcept { lists_.move_to_front(0, s); }
  void on_repeat(std::uint32_t s) noexcept { lists_.move_to_front(0, s); }
  void on_insert(std::uint32_t s) noexcept { lists_.push_front(0, s); }
  void on_evict(std::uint32_t s) noexcept { lists_.erase(s); }
  template <class View>
  std::uint32_t victim(const View& v, std::size_t /*layer*/) const noexcept {
    for (std::uint32_t s = lists_.tail(0); s != detail::cache_slot_lists::none; s = lists_.newer(s))
      if (v.evictable(s)) return s;
    return no_slot;
  }

 private:
  detail::cache_slot_lists lists_;
};

}  // namespace moe_residency
