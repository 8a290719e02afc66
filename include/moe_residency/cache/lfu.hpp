#pragma once
/// lfu: evict the evictable entry with the fewest lookups, ties to the least
/// recently used. Frequencies persist across evictions (an entry that comes
/// back resumes its count) — the rule the engine authors' replay used, and
/// the one that keeps LFU alive below the token cycle. A lookup counts once
/// per batch; duplicates only refresh recency. O(1) per access for entries
/// with fewer than `bucket_frequencies` lookups (a bucket per frequency, each
/// in recency order), O(log n) above (a heap, rarely a victim there).

#include <cstdint>
#include <vector>

#include "moe_residency/cache/expert_cache.hpp"
#include "moe_residency/detail/cache_buckets.hpp"
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
  bool operator()(std::uint32_t a, std::uint32_t b) const noexcept { return before(key_of(a), key_of(b)); }
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
  /// Frequencies below this live in buckets (O(1)); from it on, in a heap.
  static constexpr std::uint32_t bucket_frequencies = 4096;

  void init(const model_shape& shape, std::uint64_t /*budget*/) {
    const std::size_t n = shape.n_layers() * shape.n_experts();
    heap_.order().reset(n);
    heap_.reset(n);
    buckets_.reset(n, bucket_frequencies);
  }
  // Every resident entry is in the bucket of its frequency (appended at each
  // new tick, so a bucket is in recency order) or, at bucket_frequencies
  // lookups and more, in the heap. Every bucketed entry comes before every
  // heap entry. A hit or repeat only moves a heap entry later, so the heap is
  // updated lazily: victim() settles its top (cache_slot_heap).
  void on_hit(std::uint32_t s) noexcept {
    const std::uint32_t f = ++k().freq[s];
    k().last[s] = ++k().tick;
    if (f < bucket_frequencies) {
      buckets_.move_back(f, s);
    } else if (buckets_.contains(s)) {
      buckets_.erase(s);
      heap_.push_deferred(s);  // not evictable before this batch's eviction ends
    }
  }
  void on_repeat(std::uint32_t s) noexcept {
    k().last[s] = ++k().tick;
    if (buckets_.contains(s)) buckets_.move_back(buckets_.bucket_of(s), s);
  }
  void on_insert(std::uint32_t s) noexcept {
    const std::uint32_t f = ++k().freq[s];
    k().last[s] = ++k().tick;
    if (f < bucket_frequencies) buckets_.push_back(f, s);
    else heap_.push_deferred(s);  // not evictable before this batch's eviction ends
  }
  void on_evict(std::uint32_t s) noexcept {
    buckets_.erase(s);
    heap_.erase(s);
  }
  template <class View>
  std::uint32_t victim(const View& v, std::size_t /*layer*/) noexcept {
    for (std::uint32_t b = buckets_.first_from(1); b != detail::cache_slot_buckets::none;
         b = buckets_.first_from(std::size_t{b} + 1))
      for (std::uint32_t s = buckets_.head(b); s != detail::cache_slot_buckets::none; s = buckets_.newer(s))
        if (v.evictable(s)) return s;
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
  detail::cache_slot_buckets buckets_;
};

}  // namespace moe_residency
