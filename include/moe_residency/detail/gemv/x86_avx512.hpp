#pragma once
/// The run-time dispatched x86 GEMV kernel for 16-bit weights on 512-bit
/// registers (AVX-512F by target attribute): x86z_pass and gemv_x86z_impl.
/// Part of detail/gemv.hpp; gemv_x86_impl (gemv/x86.hpp) takes it on AVX-512F
/// CPUs. Shares the 256-bit kernel's rounding, prefetch and reduction
/// (gemv/x86_avx2.hpp).

#include "moe_residency/detail/gemv/config.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "moe_residency/detail/gemv/intrinsics.hpp"
#include "moe_residency/detail/gemv/scalar.hpp"
#include "moe_residency/detail/gemv/x86_avx2.hpp"
#include "moe_residency/element_type.hpp"

#if MOE_RESIDENCY_DETAIL_X86_KERNEL
// ---- The 512-bit kernel for 16-bit weights (x86-64 with AVX-512F) ----------
//
// The same 32 lanes per row as every kernel here, held in two 16-float zmm
// accumulators instead of four 8-float ones: lane l of the first is ggml's
// lane l (elements c + l of each 32-column step), of the second lane 16 + l,
// so each lane sums its own elements in element order and the result is the
// same bits. Half the instructions per weight of the 256-bit kernel: one
// 16-wide conversion (f16) or one shift and one mask per 32 weights (bf16),
// and one multiply-add per 16. Compiled with a target attribute like the
// 256-bit kernel, so a default build dispatches to it at run time; taken for
// f16 and bf16 when x86_tune::wide_rows > 0 and the CPU (and OS) have
// AVX-512F. f32 stays on the 256-bit kernel, whose 32-byte loads never split
// a cache line on 32-byte aligned rows (see gemv_simd_impl).

#define MOE_RESIDENCY_DETAIL_X86Z_TARGET __attribute__((target("avx512f,avx2,fma,f16c")))

namespace moe_residency {
namespace detail {
inline namespace MOE_RESIDENCY_GEMV_ABI {

template <bool Fused>
MOE_RESIDENCY_DETAIL_X86Z_TARGET inline __m512 x86z_madd(__m512 a, __m512 b, __m512 c) noexcept {
  if constexpr (Fused) {
    return _mm512_fmadd_ps(a, b, c);
  } else {
    __m512 p = _mm512_mul_ps(a, b);
    __asm__("" : "+v"(p));  // p is rounded: no contraction into an FMA (see x86_madd)
    return _mm512_add_ps(p, c);
  }
}

/// bf16 in the 512-bit kernel: 32 weights from one 64-byte load, the even
/// elements shifted into the upper half of each 32-bit lane and the odd ones
/// masked in place, so the first accumulator holds lanes {0, 2, ..., 30} and
/// the second {1, 3, ..., 31}. x is permuted alike (each 32 floats: the even
/// ones, then the odd ones), and x86z_unsplit_lanes restores ggml's order.
MOE_RESIDENCY_DETAIL_X86Z_TARGET inline void x86z_split_x(const float* x, float* out, std::size_t n) noexcept {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  for (std::size_t i = 0; i < n; i += gemv_lanes) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    const __m512 e = _mm512_permutex2var_ps(a, even, b), o = _mm512_permutex2var_ps(a, odd, b);
    _mm512_storeu_ps(out + i, e);
    _mm512_storeu_ps(out + i + 16, o);
  }
}

inline void x86z_unsplit_lanes(float* lane) noexcept {
  float t[gemv_lanes];
  for (std::size_t k = 0; k < 16; ++k) {
    t[2 * k] = lane[k];
    t[2 * k + 1] = lane[16 + k];
  }
  std::memcpy(lane, t, sizeof t);
}

/// R rows (p, p + stride, ...) of 16-bit weights over columns [c0, c0 + cn),
/// cn a multiple of 32: acc[r] (bf16: in split order) += w * xs, element
/// order per lane, 2R independent multiply-add chains. The next D passes'
/// rows are prefetched one line per row per step, as the 256-bit kernel does
/// (x86_prefetch_fits).
template <element_type T, bool Fused, std::size_t R, std::size_t D, int Loc = 3>
MOE_RESIDENCY_DETAIL_X86Z_TARGET inline void x86z_pass(const char* p, std::size_t stride, std::size_t c0,
                                                       std::size_t cn, const float* xs,
                                                       float (*acc)[gemv_lanes]) noexcept {
  static_assert(T != element_type::f32, "the 512-bit kernel is for 16-bit weights");
  __m512 a[R][2];
  MOE_RESIDENCY_DETAIL_UNROLL
  for (std::size_t r = 0; r < R; ++r) {
    a[r][0] = _mm512_loadu_ps(acc[r]);
    a[r][1] = _mm512_loadu_ps(acc[r] + 16);
  }
  const bool prefetch = x86_prefetch_fits<T, R, D, 0, Loc>(cn);
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (std::size_t e = 0; e < cn; e += gemv_lanes) {
    const std::size_t c = c0 + e;
    if (prefetch) x86_prefetch_next<T, R, D, Loc>(p, stride, c);
    __m512 x0 = _mm512_loadu_ps(xs + e), x1 = _mm512_loadu_ps(xs + e + 16);
    __asm__("" : "+v"(x0), "+v"(x1));  // one load for the R rows (see x86_pass)
    MOE_RESIDENCY_DETAIL_UNROLL
    for (std::size_t r = 0; r < R; ++r) {
      const auto* q = reinterpret_cast<const std::uint16_t*>(p + r * stride) + c;
      __m512 w0, w1;
      if constexpr (T == element_type::f16) {
        w0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
        w1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 16)));
      } else {
        __m512i v = _mm512_loadu_si512(q);
        __asm__("" : "+v"(v));  // loaded once, used twice
        w0 = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        w1 = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
      }
      a[r][0] = x86z_madd<Fused>(w0, x0, a[r][0]);
      a[r][1] = x86z_madd<Fused>(w1, x1, a[r][1]);
    }
  }
  MOE_RESIDENCY_DETAIL_UNROLL
  for (std::size_t r = 0; r < R; ++r) {
    _mm512_storeu_ps(acc[r], a[r][0]);
    _mm512_storeu_ps(acc[r] + 16, a[r][1]);
  }
}

/// x86z_pass over nr rows: passes of R rows, then 2 and 1.
template <element_type T, bool Fused, std::size_t R, std::size_t D, int Loc = 3>
MOE_RESIDENCY_DETAIL_X86Z_TARGET void x86z_rows_chunk(const char* data, std::size_t nr, std::size_t stride,
                                                      std::size_t c0, std::size_t cn, const float* xs,
                                                      float (*acc)[gemv_lanes]) noexcept {
  std::size_t rr = 0;
  for (; rr + R <= nr; rr += R) x86z_pass<T, Fused, R, D, Loc>(data + rr * stride, stride, c0, cn, xs, acc + rr);
  if constexpr (R > 2) {
    if (rr + 2 <= nr) {
      x86z_pass<T, Fused, 2, D, Loc>(data + rr * stride, stride, c0, cn, xs, acc + rr);
      rr += 2;
    }
  }
  for (; rr < nr; ++rr) x86z_pass<T, Fused, 1, D, Loc>(data + rr * stride, stride, c0, cn, xs, acc + rr);
}

/// x's chunk [c0, c0 + cn) as the 512-bit kernel reads it: rounded when
/// `round`, split-ordered for bf16 (x86z_split_x).
template <element_type T>
MOE_RESIDENCY_DETAIL_X86Z_TARGET inline const float* x86z_prepare_x(const float* x, std::size_t c0, std::size_t cn,
                                                                    bool round, float* buf) noexcept {
  if (round) x86_round_block(x + c0, buf, cn, T);
  if (T == element_type::bf16) x86z_split_x(round ? buf : x + c0, buf, cn);
  return round || T == element_type::bf16 ? buf : x + c0;
}

/// The 16-bit GEMV on the 512-bit kernel, R rows a pass, the next pass
/// prefetched when D > 0. Call only when x86_has_avx512f(). Reduction and
/// tail as gemv_x86_impl's (lanes back in natural order first).
template <class Tag, bool Fused, element_type T, std::size_t R, std::size_t D, int Loc = 3>
inline void gemv_x86z_impl(const void* data, std::size_t rows, std::size_t cols, std::size_t stride, const float* x,
                           float* y, activation_rounding r) noexcept {
  const bool round = r == activation_rounding::engine;
  const std::size_t np = cols - cols % gemv_lanes;
  alignas(64) float acc[gemv_row_block][gemv_lanes];
  alignas(64) float xbuf[gemv_col_block];
  const bool once = np <= gemv_col_block;  // x prepared once for every row block
  const float* xs = nullptr;
  for (std::size_t r0 = 0; r0 < rows; r0 += gemv_row_block) {
    const std::size_t nr = std::min(gemv_row_block, rows - r0);
    const char* block = static_cast<const char*>(data) + r0 * stride;
    std::memset(acc, 0, sizeof acc);
    for (std::size_t c0 = 0; c0 < np; c0 += gemv_col_block) {
      const std::size_t cn = std::min(gemv_col_block, np - c0);
      if (!once || xs == nullptr) xs = x86z_prepare_x<T>(x, c0, cn, round, xbuf);
      x86z_rows_chunk<T, Fused, R, D, Loc>(block, nr, stride, c0, cn, xs, acc);
    }
    for (std::size_t rr = 0; rr < nr; ++rr) {
      if (T == element_type::bf16) x86z_unsplit_lanes(acc[rr]);
      const float red = x86_reduce_lanes(acc[rr], T, false);
      y[r0 + rr] = np == cols ? red : finish_dot<Tag, Fused>(red, block + rr * stride, x, np, cols, T, r);
    }
  }
}

}  // namespace MOE_RESIDENCY_GEMV_ABI
}  // namespace detail
}  // namespace moe_residency

#endif  // MOE_RESIDENCY_DETAIL_X86_KERNEL
