#pragma once
/// Partial top-k selection with a deterministic tie rule. Internal; use
/// moe_residency::top_k from router.hpp.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

namespace moe_residency {
namespace detail {

/// True when candidate (score a, index ia) ranks before (score b, index ib):
/// higher score first, equal scores by lower index, NaN after everything.
inline bool ranks_before(float a, std::size_t ia, float b, std::size_t ib) noexcept {
  if (a != a) return b != b && ia < ib;
  if (b != b) return true;
  return a > b || (a == b && ia < ib);
}

/// The rank of (score, index) as one integer, larger first, in ranks_before's
/// order: the score's bits made to order as its value (-0 as +0, so the two
/// tie; every NaN as 0, below -inf), then the index inverted, so that of equal
/// scores the lower index is the larger key. Every key is distinct.
inline std::uint64_t rank_key(float s, std::size_t i) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &s, sizeof u);
  if (u == 0x80000000u) u = 0;  // -0 ties +0
  std::uint32_t ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  if (s != s) ord = 0;
  return (static_cast<std::uint64_t>(ord) << 32) | (0xffffffffu - static_cast<std::uint32_t>(i));
}

/// The largest n top_k_by_keys takes (its keys live on the stack).
constexpr std::size_t top_k_keys_max = 512;

/// top_k_indices for a k that is a large share of n: the n rank keys, the k
/// largest by selection, those k sorted: O(n) expected plus O(k log k), where
/// the insertion buffer's O(k) shifts per entry cost more from k ~ 16
/// (bench_topk BM_topk_pair). n <= top_k_keys_max and n < 2^32.
template <class Index>
inline void top_k_by_keys(const float* scores, std::size_t n, std::size_t k, Index* out) noexcept {
  std::uint64_t key[top_k_keys_max];
  for (std::size_t i = 0; i < n; ++i) key[i] = rank_key(scores[i], i);
  if (k < n) std::nth_element(key, key + (k - 1), key + n, std::greater<std::uint64_t>());
  std::sort(key, key + k, std::greater<std::uint64_t>());
  for (std::size_t j = 0; j < k; ++j)
    out[j] = static_cast<Index>(0xffffffffu - static_cast<std::uint32_t>(key[j] & 0xffffffffu));
}

/// Writes the indices of the k best of scores[0, n) to out, best first.
/// k <= n and k <= 32 (callers clamp). One pass with an insertion buffer of k:
/// O(n) compares when, as in routing, most candidates lose to the k-th. Once
/// the buffer is full, blocks of 8 scores are tested against the k-th score
/// with one branch-free comparison each and skipped together: a later index
/// loses a tie, so only a score strictly above a non-NaN k-th can enter.
/// From 16k >= n (top-8 of 128, top-16 of 256, a predictor's top-32) it takes
/// top_k_by_keys instead: top-32 of 128 in 0.48 against 1.22 µs, top-8 of 128
/// in 0.28 against 0.33; top-8 of 256 stays here, 0.47 against 0.53.
template <class Index>
inline void top_k_indices(const float* scores, std::size_t n, std::size_t k, Index* out) noexcept {
  if (k == 0) return;
  if (k * 16 >= n && n <= top_k_keys_max) {
    top_k_by_keys(scores, n, k, out);
    return;
  }
  float best[32];
  std::size_t idx[32];
  std::size_t have = 0;
  auto offer = [&](std::size_t i) {
    const float s = scores[i];
    if (have == k && !ranks_before(s, i, best[k - 1], idx[k - 1])) return;
    std::size_t pos = have == k ? k - 1 : have;
    // Indices arrive in increasing order, so among equal scores the earlier
    // one already ranks first: shift while the new one strictly ranks before.
    while (pos > 0 && ranks_before(s, i, best[pos - 1], idx[pos - 1])) {
      best[pos] = best[pos - 1];
      idx[pos] = idx[pos - 1];
      --pos;
    }
    best[pos] = s;
    idx[pos] = i;
    if (have < k) ++have;
  };
  std::size_t i = 0;
  for (; i < n && have < k; ++i) offer(i);
  constexpr std::size_t block = 8;
  for (; i + block <= n; i += block) {
    const float kth = best[k - 1];
    if (kth == kth) {
      unsigned any = 0;
      for (std::size_t j = 0; j < block; ++j) any |= static_cast<unsigned>(scores[i + j] > kth);
      if (any == 0) continue;
    }
    for (std::size_t j = 0; j < block; ++j) offer(i + j);
  }
  for (; i < n; ++i) offer(i);
  for (std::size_t j = 0; j < have; ++j) out[j] = static_cast<Index>(idx[j]);
}

}  // namespace detail
}  // namespace moe_residency
