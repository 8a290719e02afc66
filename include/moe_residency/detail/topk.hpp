#pragma once
/// Partial top-k selection with a deterministic tie rule. Internal; use
/// moe_residency::top_k from router.hpp.

#include <cstddef>
#include <cstdint>

namespace moe_residency {
namespace detail {

/// True when candidate (score a, index ia) ranks before (score b, index ib):
/// higher score first, equal scores by lower index, NaN after everything.
inline bool ranks_before(float a, std::size_t ia, float b, std::size_t ib) noexcept {
  if (a != a) return b != b && ia < ib;
  if (b != b) return true;
  return a > b || (a == b && ia < ib);
}

/// Writes the indices of the k best of scores[0, n) to out, best first.
/// k <= n and k <= 32 (callers clamp). One pass with an insertion buffer of k:
/// O(n) compares when, as in routing, most candidates lose to the k-th. Once
/// the buffer is full, blocks of 8 scores are tested against the k-th score
/// with one branch-free comparison each and skipped together: a later index
/// loses a tie, so only a score strictly above a non-NaN k-th can enter.
template <class Index>
inline void top_k_indices(const float* scores, std::size_t n, std::size_t k,
                          Index* out) noexcept {
  if (k == 0) return;
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
