#pragma once
// Buckets of slots for policies whose order is (small integer key, recency):
// LFU's frequency, Belady's next-use batch. Each bucket is an intrusive list
// in the order its members were last appended (oldest at the head), and a
// hierarchical bitmap finds the first non-empty bucket at or after any index
// in a few word operations. A policy that appends a slot whenever it stamps
// the slot with a new tick (ticks increase) keeps every bucket sorted by that
// tick, so "first evictable slot of the first non-empty bucket" is exactly
// the heap's "smallest (key, tick)" — in O(1) per update instead of a sift
// of O(log n) through memory the heap's nodes are spread over.
//
// Allocates only in reset(); every other call is noexcept.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace moe_residency {
namespace detail {

inline unsigned cache_ctz64(std::uint64_t x) noexcept {  // x != 0
#if defined(__GNUC__) || defined(__clang__)
  return static_cast<unsigned>(__builtin_ctzll(x));
#else
  unsigned n = 0;
  while (!(x & 1u)) {
    x >>= 1;
    ++n;
  }
  return n;
#endif
}

class cache_slot_buckets {
 public:
  static constexpr std::uint32_t none = 0xffffffffu;

  /// `n_slots` slots, `n_buckets` buckets (< 2^32 − 1); all empty.
  void reset(std::size_t n_slots, std::size_t n_buckets) {
    prev_.assign(n_slots, none);
    next_.assign(n_slots, none);
    bucket_.assign(n_slots, none);
    head_.assign(n_buckets, none);
    tail_.assign(n_buckets, none);
    levels_.clear();
    std::size_t n = n_buckets;
    do {
      const std::size_t words = (n + 63) / 64;
      levels_.emplace_back(words, 0);
      n = words;
    } while (n > 1);
  }

  std::size_t n_buckets() const noexcept { return head_.size(); }
  bool contains(std::uint32_t s) const noexcept { return bucket_[s] != none; }
  std::uint32_t bucket_of(std::uint32_t s) const noexcept { return bucket_[s]; }
  /// Oldest member of bucket b, or none; then newer(s) towards the newest.
  std::uint32_t head(std::uint32_t b) const noexcept { return head_[b]; }
  std::uint32_t newer(std::uint32_t s) const noexcept { return next_[s]; }

  /// Appends s (not a member) as the newest of bucket b.
  void push_back(std::uint32_t b, std::uint32_t s) noexcept {
    bucket_[s] = b;
    next_[s] = none;
    const std::uint32_t t = tail_[b];
    prev_[s] = t;
    if (t != none) {
      next_[t] = s;
    } else {
      head_[b] = s;
      mark(b);
    }
    tail_[b] = s;
  }
  /// Removes s from its bucket; nothing when it is in none.
  void erase(std::uint32_t s) noexcept {
    const std::uint32_t b = bucket_[s];
    if (b == none) return;
    const std::uint32_t p = prev_[s], n = next_[s];
    if (p != none) next_[p] = n; else head_[b] = n;
    if (n != none) prev_[n] = p; else tail_[b] = p;
    bucket_[s] = none;
    if (head_[b] == none) unmark(b);
  }
  /// Makes s (a member or not) the newest of bucket b.
  void move_back(std::uint32_t b, std::uint32_t s) noexcept {
    if (bucket_[s] == b && tail_[b] == s) return;
    erase(s);
    push_back(b, s);
  }

  /// The first non-empty bucket with index >= b, or none.
  std::uint32_t first_from(std::size_t b) const noexcept {
    std::size_t level = 0, i = b;
    for (;;) {
      const std::vector<std::uint64_t>& words = levels_[level];
      const std::size_t w = i >> 6;
      if (w >= words.size()) return none;
      const std::uint64_t m = words[w] & (~std::uint64_t{0} << (i & 63));
      if (m) {
        std::size_t idx = (w << 6) | cache_ctz64(m);
        while (level > 0) {
          --level;
          idx = (idx << 6) | cache_ctz64(levels_[level][idx]);
        }
        return static_cast<std::uint32_t>(idx);
      }
      if (level + 1 == levels_.size()) return none;
      i = w + 1;
      ++level;
    }
  }

 private:
  void mark(std::size_t b) noexcept {
    for (std::size_t level = 0; level < levels_.size(); ++level) {
      std::uint64_t& w = levels_[level][b >> 6];
      const bool was_empty = w == 0;
      w |= std::uint64_t{1} << (b & 63);
      if (!was_empty) return;
      b >>= 6;
    }
  }
  void unmark(std::size_t b) noexcept {
    for (std::size_t level = 0; level < levels_.size(); ++level) {
      std::uint64_t& w = levels_[level][b >> 6];
      w &= ~(std::uint64_t{1} << (b & 63));
      if (w != 0) return;
      b >>= 6;
    }
  }

  std::vector<std::uint32_t> prev_, next_, bucket_, head_, tail_;
  std::vector<std::vector<std::uint64_t>> levels_;  // levels_[0]: one bit per bucket
};

}  // namespace detail
}  // namespace moe_residency
