#pragma once
/// lfu: evict the evictable entry with the fewest lookups, ties to the least
/// recently used. Frequencies persist across evictions (an entry that comes
/// back resumes its count) — the rule the engine authors' replay used, and
/// the one that keeps LFU alive below the token cycle. A lookup counts once
/// per batch; duplicates only refresh recency. O(log n) per access.

#include <cstdint>
#include <vector>

#include "moe_residency/cache/expert_cache.hpp"
#include "moe_residency/detail/cache_heap.hpp"

namespace moe_residency {
namespace detail {

/// Frequency then recency (a tick per routed id) of every slot; the heap's
/// order owns the keys so a policy stays copyable and movable.
struct cache_freq_order {
  std::vector<std::uint32_t> freq;
  std::vector<std::uint64_t> last;
  std::uint64_t tick = 0;
  void reset(std::size_t n) {
    freq.assign(n, 0);
    last.assign(n, 0);
    tick = 0;
  }
  bool operator()(std::uint32_t a, std::uint32_t b) const noexcept {
    return before(key_of(a), key_of(b));
  }
  /// Lower frequency first, then the older last access (ticks are unique).
  struct key_type {
    std::uint32_t freq;
    std::uint64_t last;
  };
  key_type key_of(std::uint32_t s) const noexcept { return key_type{freq[s], last[s]}; }
  static bool before(const key_type& a, const key_type& b) noexcept {
    return (a.freq < b.freq) | ((a.freq == b.freq) & (a.last < b.last));  // branch-free
  }
};

}  // namespace detail

class lfu_policy : public policy_base {
 public:
  static constexpr const char* name = "lfu";
  static constexpr bool collapses_below_cycle = false;

  void init(const model_shape& shape, std::uint64_t /*budget*/) {
    const std::size_t n = shape.n_layers() * shape.n_experts();
    heap_.order().reset(n);
    heap_.reset(n);
  }
  // A hit or repeat only moves an entry later (more uses, newer access), so
  // the heap is updated lazily: victim() settles its top (cache_slot_heap).
  void on_hit(std::uint32_t s) noexcept {
    ++k().freq[s];
    k().last[s] = ++k().tick;
  }
  void on_repeat(std::uint32_t s) noexcept { k().last[s] = ++k().tick; }
  void on_insert(std::uint32_t s) noexcept {
    ++k().freq[s];
    k().last[s] = ++k().tick;
    heap_.push_deferred(s);  // not evictable before this batch's eviction ends
  }
  void on_evict(std::uint32_t s) noexcept { heap_.erase(s); }
  template <class View>
  std::uint32_t victim(const View& v, std::size_t /*layer*/) noexcept {
    heap_.settle_top();
    while (!heap_.empty() && !v.evictable(heap_.top())) {
      heap_.stash_top();
      heap_.settle_top();
    }
    return heap_.empty() ? no_slot : heap_.top();
  }
  void end_eviction() noexcept { heap_.restore(); }
  /// Lookups of slot s so far (persisting across evictions).
  std::uint32_t frequency(std::uint32_t s) const noexcept { return k().freq[s]; }

 private:
  detail::cache_freq_order& k() noexcept { return heap_.order(); }
  const detail::cache_freq_order& k() const noexcept { return heap_.order(); }
  detail::cache_slot_heap<detail::cache_freq_order> heap_;
};

}  // namespace moe_residency
