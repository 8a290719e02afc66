#pragma once
/// Per-layer partition policies: each MoE layer owns a fixed number of
/// entries, `max(k, floor(budget / n_moe_layers / expert_bytes(l)))`, and a
/// batch of layer l evicts only inside layer l, until the layer is within its
/// share. `layer_lru_policy` ("layer") evicts the layer's LRU entry,
/// `layer_lfu_policy` ("layerlfu") its least frequently used one (frequencies
/// persist across evictions, ties to the least recent).
///
/// This is the rule the engine authors' replay used (reverse-engineered from
/// their curves, see docs/replay.md). Note the floor of k entries per layer:
/// below the token cycle the partition holds one token's worth of every layer
/// and therefore EXCEEDS the byte budget (Qwen3-30B at 250 MiB keeps ~785
/// MiB). That is why those curves are flat below the cycle; stats().peak_bytes
/// shows it.

#include <cstdint>
#include <vector>

#include "moe_residency/cache/expert_cache.hpp"
#include "moe_residency/cache/lfu.hpp"
#include "moe_residency/detail/cache_buckets.hpp"
#include "moe_residency/detail/cache_heap.hpp"
#include "moe_residency/detail/cache_list.hpp"

namespace moe_residency {
namespace detail {

/// Entries per layer of the reference partition.
inline std::vector<std::uint32_t> cache_layer_partition(const model_shape& shape, std::uint64_t budget) {
  std::vector<std::uint32_t> cap(shape.n_layers(), 0);
  const std::uint64_t n_moe = shape.n_moe_layers();
  for (std::size_t l = 0; l < shape.n_layers(); ++l) {
    const std::uint64_t b = shape.expert_bytes(layer_id(static_cast<std::uint16_t>(l)));
    if (b == 0) continue;
    const std::uint64_t share = budget / (n_moe * b);
    cap[l] = static_cast<std::uint32_t>(
        std::min<std::uint64_t>(shape.n_experts(), std::max<std::uint64_t>(shape.top_k(), share)));
  }
  return cap;
}

struct cache_partition_base : policy_base {
  template <class View>
  bool over_budget(const View& v, std::size_t layer) const noexcept {
    return v.layer_count(layer) > cap_[layer];
  }
  /// Entries layer l may hold.
  std::uint32_t layer_capacity(layer_id l) const noexcept { return to_index(l) < cap_.size() ? cap_[to_index(l)] : 0; }
  /// Bytes the partition holds when every layer is full (may exceed the budget).
  std::uint64_t partition_bytes(const model_shape& shape) const noexcept {
    std::uint64_t t = 0;
    for (std::size_t l = 0; l < cap_.size(); ++l)
      t += cap_[l] * shape.expert_bytes(layer_id(static_cast<std::uint16_t>(l)));
    return t;
  }

 protected:
  std::vector<std::uint32_t> cap_;
};

}  // namespace detail

class layer_lru_policy : public detail::cache_partition_base {
 public:
  static constexpr const char* name = "layer";
  static constexpr bool collapses_below_cycle = false;

  void init(const model_shape& shape, std::uint64_t budget) {
    cap_ = detail::cache_layer_partition(shape, budget);
    n_experts_ = static_cast<std::uint32_t>(shape.n_experts());
    lists_.reset(shape.n_layers() * shape.n_experts(), shape.n_layers());
  }
  void on_hit(std::uint32_t s) noexcept { lists_.move_to_front(s / n_experts_, s); }
  void on_repeat(std::uint32_t s) noexcept { lists_.move_to_front(s / n_experts_, s); }
  void on_insert(std::uint32_t s) noexcept { lists_.push_front(s / n_experts_, s); }
  void on_evict(std::uint32_t s) noexcept { lists_.erase(s); }
  template <class View>
  std::uint32_t victim(const View& v, std::size_t layer) const noexcept {
    const auto l = static_cast<std::uint32_t>(layer);
    for (std::uint32_t s = lists_.tail(l); s != detail::cache_slot_lists::none; s = lists_.newer(s))
      if (v.evictable(s)) return s;
    return no_slot;
  }

 private:
  std::uint32_t n_experts_ = 1;
  detail::cache_slot_lists lists_;
};

class layer_lfu_policy : public detail::cache_partition_base {
 public:
  static constexpr const char* name = "layerlfu";
  static constexpr bool collapses_below_cycle = false;
  /// Frequencies below this live in per-layer buckets (O(1)); from it on, in
  /// the layer's heap (see lfu_policy), where a hit costs two stores (the heap
  /// settles lazily) and a victim is rarely found. 128, not 512: the buckets'
  /// ends (layers × this × 8 bytes) then stay in L2, and on the synthetic
  /// benchmark 128 ran ahead of 16, 64 and 512 (bench_cache, one run each).
  static constexpr std::uint32_t bucket_frequencies = 128;

  void init(const model_shape& shape, std::uint64_t budget) {
    cap_ = detail::cache_layer_partition(shape, budget);
    n_experts_ = static_cast<std::uint32_t>(shape.n_experts());
    expert_shift_ = 0;
    while ((std::uint32_t{1} << expert_shift_) < n_experts_) ++expert_shift_;
    if ((std::uint32_t{1} << expert_shift_) != n_experts_) expert_shift_ = no_shift;
    heaps_.assign(shape.n_layers(), detail::cache_slot_heap<detail::cache_freq_order>{detail::cache_freq_order{}});
    for (auto& h : heaps_) {
      h.order().reset(n_experts_);
      h.reset(n_experts_);
    }
    freq_.assign(shape.n_layers() * shape.n_experts(), 0);
    // Bucket of (layer, frequency f): layer × bucket_frequencies + f.
    buckets_.reset(shape.n_layers() * shape.n_experts(), shape.n_layers() * std::size_t{bucket_frequencies});
    dirty_.assign(shape.n_layers(), 0);
    dirty_list_.clear();
    dirty_list_.reserve(shape.n_layers());
  }
  void on_hit(std::uint32_t s) noexcept { touch(s, true, false); }
  void on_repeat(std::uint32_t s) noexcept { touch(s, false, false); }
  void on_insert(std::uint32_t s) noexcept { touch(s, true, true); }
  void on_evict(std::uint32_t s) noexcept {
    if (buckets_.contains(s)) {
      buckets_.erase(s);
      return;
    }
    const std::uint32_t l = layer_of(s);  // in the layer's heap, or deferred to it
    heaps_[l].erase(s - l * n_experts_);
  }
  template <class View>
  std::uint32_t victim(const View& v, std::size_t layer) noexcept {
    // The layer's buckets first (every bucketed entry comes before every heap entry).
    const std::size_t lo = layer * bucket_frequencies, hi = lo + bucket_frequencies;
    for (std::uint32_t b = buckets_.first_from(lo + 1); b != detail::cache_slot_buckets::none && b < hi;
         b = buckets_.first_from(std::size_t{b} + 1))
      for (std::uint32_t s = buckets_.head(b); s != detail::cache_slot_buckets::none; s = buckets_.newer(s))
        if (v.evictable(s)) return s;
    auto& h = heaps_[layer];
    const auto base = static_cast<std::uint32_t>(layer) * n_experts_;
    mark(layer);
    h.settle_top();
    while (!h.empty() && !v.evictable(base + h.top())) {
      h.stash_top();
      h.settle_top();
    }
    return h.empty() ? no_slot : base + h.top();
  }
  void end_eviction() noexcept {  // only the heaps a stash or a deferred push touched
    for (std::uint32_t l : dirty_list_) {
      heaps_[l].restore();
      dirty_[l] = 0;
    }
    dirty_list_.clear();
  }

 private:
  /// s / n_experts, a shift when n_experts is a power of two (a division per
  /// access was a visible part of it).
  std::uint32_t layer_of(std::uint32_t s) const noexcept {
    return expert_shift_ != no_shift ? s >> expert_shift_ : s / n_experts_;
  }
  // Below bucket_frequencies an entry's order is its bucket and its place
  // there (appended at every touch: recency), so only its count is kept, in
  // one array over all slots. From there on it is ordered by the layer heap's
  // keys (frequency, tick), written only for those entries.
  void touch(std::uint32_t s, bool count, bool insert) noexcept {
    const std::uint32_t f = freq_[s] += count ? 1u : 0u;
    ++tick_;
    const std::uint32_t l = layer_of(s);
    if (f < bucket_frequencies) {
      buckets_.move_back(l * bucket_frequencies + f, s);  // newest of its bucket
      return;
    }
    auto& h = heaps_[l];
    const std::uint32_t e = s - l * n_experts_;
    auto& k = h.order();
    k.freq[e] = f;
    k.last[e] = tick_;
    if (insert || buckets_.contains(s)) {
      // Into the heap (from the buckets, or a new entry): not evictable before
      // this batch's eviction ends. A heap entry's hit or repeat only moves it
      // later: the heap settles lazily.
      buckets_.erase(s);
      h.push_deferred(e);
      mark(l);
    }
  }

  void mark(std::size_t l) noexcept {
    if (dirty_[l]) return;
    dirty_[l] = 1;
    dirty_list_.push_back(static_cast<std::uint32_t>(l));  // capacity n_layers: never reallocates
  }

  static constexpr std::uint32_t no_shift = 0xffffffffu;
  std::uint32_t n_experts_ = 1;
  std::uint32_t expert_shift_ = no_shift;  // log2(n_experts) when a power of two
  std::uint64_t tick_ = 0;
  std::vector<std::uint32_t> freq_;  // lookups of each slot so far (persisting across evictions)
  std::vector<detail::cache_slot_heap<detail::cache_freq_order>> heaps_;
  detail::cache_slot_buckets buckets_;
  std::vector<std::uint8_t> dirty_;
  std::vector<std::uint32_t> dirty_list_;
};

}  // namespace moe_residency
