#pragma once
/// arc (Megiddo & Modha, FAST '03, as libCacheSim's ARC.c defines it): T1
/// (seen once) and T2 (seen again) LRU lists of resident entries, ghosts B1
/// and B2 of entries recently evicted from each, and a target p for T1's
/// bytes. A miss found in B1 grows p (by max(|B2|/|B1|, 1) entries' bytes),
/// one found in B2 shrinks it; both enter T2, other misses enter T1. A hit
/// moves to T2's head. The victim is T1's LRU when T1 holds more than p
/// bytes, else T2's; it moves to its ghost. Ghosts are trimmed so that
/// T1 + B1 <= budget and T1 + T2 + B1 + B2 <= 2 × budget (bytes).
///
/// Batch adaptation: p adapts in entries scaled by the entry's bytes (the
/// paper's page unit) rather than libCacheSim's raw-byte delta; a duplicate
/// in a batch refreshes recency in its own list (it is not a second hit);
/// touched and pinned entries are stepped over. O(1) amortised.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "moe_residency/cache/expert_cache.hpp"
#include "moe_residency/detail/cache_list.hpp"

namespace moe_residency {

class arc_policy : public policy_base {
 public:
  static constexpr const char* name = "arc";
  static constexpr bool collapses_below_cycle = true;

  void init(const model_shape& shape, std::uint64_t budget) {
    n_experts_ = static_cast<std::uint32_t>(shape.n_experts());
    layer_bytes_ = shape.all_expert_bytes();
    q_.reset(shape.n_layers() * shape.n_experts(), 4);
    c_ = budget;
    p_ = 0;
  }
  void on_hit(std::uint32_t s) noexcept { q_.move_to_front(t2, s, bytes(s)); }
  void on_repeat(std::uint32_t s) noexcept { q_.move_to_front(q_.owner(s), s, bytes(s)); }
  void on_insert(std::uint32_t s) noexcept {
    const std::uint64_t b = bytes(s);
    const std::uint32_t o = q_.owner(s);
    if (o == b1) {
      const std::uint64_t r = std::max<std::uint64_t>(q_.size(b2) / std::max<std::uint32_t>(q_.size(b1), 1), 1);
      p_ = std::min(p_ + r * b, c_);
      q_.erase(s, b);
      q_.push_front(t2, s, b);
    } else if (o == b2) {
      const std::uint64_t r = std::max<std::uint64_t>(q_.size(b1) / std::max<std::uint32_t>(q_.size(b2), 1), 1);
      p_ = p_ > r * b ? p_ - r * b : 0;
      q_.erase(s, b);
      q_.push_front(t2, s, b);
    } else {
      q_.push_front(t1, s, b);
    }
    trim();
  }
  void on_evict(std::uint32_t s) noexcept {
    const std::uint64_t b = bytes(s);
    const std::uint32_t o = q_.owner(s);
    q_.erase(s, b);
    q_.push_front(o == t1 ? b1 : b2, s, b);
    trim();
  }
  template <class View>
  std::uint32_t victim(const View& v, std::size_t /*layer*/) const noexcept {
    const bool t1_first = q_.size(t1) > 0 && q_.bytes(t1) > p_;
    std::uint32_t s = lru_of(v, t1_first ? t1 : t2);
    if (s == no_slot) s = lru_of(v, t1_first ? t2 : t1);
    return s;
  }
  /// The adaptive target for T1, in bytes.
  std::uint64_t target_bytes() const noexcept { return p_; }

 private:
  static constexpr std::uint32_t t1 = 0, t2 = 1, b1 = 2, b2 = 3;
  std::uint64_t bytes(std::uint32_t s) const noexcept { return layer_bytes_[s / n_experts_]; }
  template <class View>
  std::uint32_t lru_of(const View& v, std::uint32_t list) const noexcept {
    for (std::uint32_t s = q_.tail(list); s != detail::cache_slot_lists::none; s = q_.newer(s))
      if (v.evictable(s)) return s;
    return no_slot;
  }
  void trim() noexcept {
    while (q_.size(b1) > 0 && q_.bytes(t1) + q_.bytes(b1) > c_) drop(b1);
    while (q_.size(b2) > 0 && q_.bytes(t1) + q_.bytes(t2) + q_.bytes(b1) + q_.bytes(b2) > 2 * c_) drop(b2);
  }
  void drop(std::uint32_t ghost) noexcept {
    const std::uint32_t s = q_.tail(ghost);
    q_.erase(s, bytes(s));
  }

  std::uint32_t n_experts_ = 1;
  std::vector<std::uint64_t> layer_bytes_;
  detail::cache_slot_lists q_;
  std::uint64_t c_ = 0, p_ = 0;
};

}  // namespace moe_residency
