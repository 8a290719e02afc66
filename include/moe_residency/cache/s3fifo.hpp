#pragma once
/// s3fifo (Yang et al., SOSP '23, as libCacheSim's S3FIFO.c defines it): a
/// small FIFO (10% of the budget), a main FIFO (90%) run as a 2-bit clock, and
/// a ghost FIFO of ids recently evicted from the small queue (90% of the
/// budget in bytes). New entries go to the small queue (to main when found in
/// the ghost, or while the small queue is full before the first eviction).
/// Evicting from small: an entry accessed at least twice (libCacheSim's
/// move-to-main threshold) moves to main, else it is evicted into the ghost.
/// Evicting from main: an accessed entry is reinserted with its count
/// decremented (capped at 3), else evicted. Main is evicted from when it is
/// over its share or small is empty.
///
/// Batch adaptation: touched and pinned entries are stepped over; an entry
/// is always admitted (the engine must read it), even one larger than the
/// small queue. O(1) amortised.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "moe_residency/cache/expert_cache.hpp"
#include "moe_residency/detail/cache_list.hpp"

namespace moe_residency {

class s3fifo_policy : public policy_base {
 public:
  static constexpr const char* name = "s3fifo";
  static constexpr bool collapses_below_cycle = true;

  void init(const model_shape& shape, std::uint64_t budget) {
    n_experts_ = static_cast<std::uint32_t>(shape.n_experts());
    layer_bytes_ = shape.all_expert_bytes();
    const std::size_t n = shape.n_layers() * shape.n_experts();
    q_.reset(n, 3);
    freq_.assign(n, 0);
    small_cap_ = budget / 10;
    main_cap_ = budget - small_cap_;
    ghost_cap_ = budget / 10 * 9;
    has_evicted_ = false;
  }
  void on_hit(std::uint32_t s) noexcept { freq_[s] = static_cast<std::uint8_t>(std::min(freq_[s] + 1, 255)); }
  void on_insert(std::uint32_t s) noexcept {
    const std::uint64_t b = bytes(s);
    if (q_.owner(s) == ghost) {
      q_.erase(s, b);
      q_.push_front(main, s, b);
    } else if (!has_evicted_ && q_.bytes(small) >= small_cap_) {
      q_.push_front(main, s, b);
    } else {
      q_.push_front(small, s, b);
    }
    freq_[s] = 0;
  }
  void on_evict(std::uint32_t s) noexcept {
    const std::uint64_t b = bytes(s);
    const bool from_small = q_.owner(s) == small;
    q_.erase(s, b);
    if (from_small && ghost_cap_ > 0) {
      q_.push_front(ghost, s, b);
      while (q_.bytes(ghost) > ghost_cap_) q_.erase(q_.tail(ghost), bytes(q_.tail(ghost)));
    }
  }
  template <class View>
  std::uint32_t victim(const View& v, std::size_t /*layer*/) noexcept {
    has_evicted_ = true;
    const bool main_first = q_.bytes(main) > main_cap_ || q_.size(small) == 0;
    std::uint32_t s = main_first ? from_main(v) : from_small(v);
    if (s == no_slot) s = main_first ? from_small(v) : from_main(v);
    return s;
  }

 private:
  static constexpr std::uint32_t small = 0, main = 1, ghost = 2;
  static constexpr std::uint32_t none = detail::cache_slot_lists::none;
  std::uint64_t bytes(std::uint32_t s) const noexcept { return layer_bytes_[s / n_experts_]; }

  template <class View>
  std::uint32_t from_small(const View& v) noexcept {
    std::uint32_t p = q_.tail(small);
    while (p != none) {
      const std::uint32_t nxt = q_.newer(p);
      if (v.evictable(p)) {
        if (freq_[p] < 2) return p;
        q_.erase(p, bytes(p));  // accessed: promote to main
        q_.push_front(main, p, bytes(p));
      }
      p = nxt;
    }
    return no_slot;
  }
  template <class View>
  std::uint32_t from_main(const View& v) noexcept {
    std::uint32_t p = q_.tail(main);
    for (std::uint64_t steps = 4ull * q_.size(main) + 1; steps > 0 && p != none; --steps) {
      std::uint32_t nxt = q_.newer(p);
      if (v.evictable(p)) {
        if (freq_[p] == 0) return p;
        freq_[p] = static_cast<std::uint8_t>(std::min<int>(freq_[p], 3) - 1);
        q_.move_to_front(main, p, bytes(p));
      }
      p = nxt == none ? q_.tail(main) : nxt;
    }
    return no_slot;
  }

  std::uint32_t n_experts_ = 1;
  std::vector<std::uint64_t> layer_bytes_;
  detail::cache_slot_lists q_;
  std::vector<std::uint8_t> freq_;
  std::uint64_t small_cap_ = 0, main_cap_ = 0, ghost_cap_ = 0;
  bool has_evicted_ = false;
};

}  // namespace moe_residency
