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
    link_.assign(n_slots, link{});
    ends_.assign(n_buckets, bucket_ends{});
    // The levels of the bitmap, level 0 (one bit per bucket) first, in one array.
    n_levels_ = 0;
    std::size_t n = n_buckets, words_total = 0;
    do {
      const std::size_t words = (n + 63) / 64;
      level_at_[n_levels_] = words_total;
      level_words_[n_levels_] = words;
      words_total += words;
      ++n_levels_;
      n = words;
    } while (n > 1);
    bits_.assign(words_total, 0);
  }

  std::size_t n_buckets() const noexcept { return ends_.size(); }
  bool contains(std::uint32_t s) const noexcept { return link_[s].bucket != none; }
  std::uint32_t bucket_of(std::uint32_t s) const noexcept { return link_[s].bucket; }
  /// Oldest member of bucket b, or none; then newer(s) towards the newest.
  std::uint32_t head(std::uint32_t b) const noexcept { return ends_[b].head; }
  std::uint32_t newer(std::uint32_t s) const noexcept { return link_[s].next; }

  /// Appends s (not a member) as the newest of bucket b.
  void push_back(std::uint32_t b, std::uint32_t s) noexcept {
    link& ls = link_[s];
    bucket_ends& e = ends_[b];
    const std::uint32_t t = e.tail;
    ls.bucket = b;
    ls.next = none;
    ls.prev = t;
    if (t != none) {
      link_[t].next = s;
    } else {
      e.head = s;
      mark(b);
    }
    e.tail = s;
  }
  /// Removes s from its bucket; nothing when it is in none.
  void erase(std::uint32_t s) noexcept {
    link& ls = link_[s];
    const std::uint32_t b = ls.bucket;
    if (b == none) return;
    const std::uint32_t p = ls.prev, n = ls.next;
    bucket_ends& e = ends_[b];
    if (p != none) link_[p].next = n;
    else e.head = n;
    if (n != none) link_[n].prev = p;
    else e.tail = p;
    ls.bucket = none;
    if (e.head == none) unmark(b);
  }
  /// Makes s (a member or not) the newest of bucket b.
  void move_back(std::uint32_t b, std::uint32_t s) noexcept {
    if (link_[s].bucket == b && ends_[b].tail == s) return;
    erase(s);
    push_back(b, s);
  }

  /// The first non-empty bucket with index >= b, or none.
  std::uint32_t first_from(std::size_t b) const noexcept {
    std::size_t level = 0, i = b;
    const std::uint64_t* const bits = bits_.data();
    for (;;) {
      const std::size_t w = i >> 6;
      if (w >= level_words_[level]) return none;
      const std::uint64_t m = bits[level_at_[level] + w] & (~std::uint64_t{0} << (i & 63));
      if (m) {
        std::size_t idx = (w << 6) | cache_ctz64(m);
        while (level > 0) {
          --level;
          idx = (idx << 6) | cache_ctz64(bits[level_at_[level] + idx]);
        }
        return static_cast<std::uint32_t>(idx);
      }
      if (level + 1 == n_levels_) return none;
      i = w + 1;
      ++level;
    }
  }

 private:
  void mark(std::size_t b) noexcept {
    for (std::size_t level = 0; level < n_levels_; ++level) {
      std::uint64_t& w = bits_[level_at_[level] + (b >> 6)];
      const bool was_empty = w == 0;
      w |= std::uint64_t{1} << (b & 63);
      if (!was_empty) return;
      b >>= 6;
    }
  }
  void unmark(std::size_t b) noexcept {
    for (std::size_t level = 0; level < n_levels_; ++level) {
      std::uint64_t& w = bits_[level_at_[level] + (b >> 6)];
      w &= ~(std::uint64_t{1} << (b & 63));
      if (w != 0) return;
      b >>= 6;
    }
  }

  // A slot's links and bucket together, a bucket's ends together: a relink
  // touches one line per slot and per bucket instead of one per array.
  struct link {
    std::uint32_t prev = none, next = none, bucket = none;
  };
  struct bucket_ends {
    std::uint32_t head = none, tail = none;
  };
  std::vector<link> link_;
  std::vector<bucket_ends> ends_;
  // 2^32 buckets need 6 levels of 64-bit words.
  static constexpr std::size_t max_levels = 6;
  std::vector<std::uint64_t> bits_;  // every level's words, level 0 (one bit per bucket) first
  std::size_t level_at_[max_levels] = {}, level_words_[max_levels] = {};
  std::size_t n_levels_ = 0;
};

}  // namespace detail
}  // namespace moe_residency
