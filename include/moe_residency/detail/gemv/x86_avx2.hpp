#pragma once
/// The run-time dispatched x86 GEMV kernel's 256-bit building blocks (AVX2,
/// FMA and F16C by target attribute): the multiply-add, loads, activation
/// rounding, the bf16 split, the lane reduction, prefetching and the passes
/// over interleaved rows (x86_pass, x86_rows_chunk, x86_gemv_rows). Part of
/// detail/gemv.hpp; gemv/x86.hpp runs them (gemv_x86_impl), gemv/x86_tune.hpp
/// gives their shape.

#include "moe_residency/detail/gemv/config.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "moe_residency/detail/gemv/intrinsics.hpp"
#include "moe_residency/detail/gemv/scalar.hpp"
#include "moe_residency/detail/gemv/x86_tune.hpp"
#include "moe_residency/element_type.hpp"

// ---- Run-time dispatch on x86-64 (GCC/Clang) -------------------------------
//
// A TU built without -march flags gets SSE2 only: no F16C, so f16 weights
// convert in software, far below the memory roofline. The kernel below is
// compiled for AVX2+FMA+F16C with a function-level target attribute, whatever
// the TU's flags, and `gemv` picks it once per process (CPUID, cached) when
// the CPU has all three. It is written with raw intrinsics: xsimd's arch types
// exist only for the ISAs the TU is compiled for (xsimd::batch<float,
// xsimd::avx2> is a static_assert in an SSE2 TU, even inside a target function).
//
// Same order as every kernel (gemv/scalar.hpp): 32 lanes as four 8-float
// accumulators, reduced and tail-summed by reduce_lanes/finish_dot in the caller (compiled
// for the TU's own target, so the f32 tail rounds exactly as gemv_scalar's).
// The multiply-add is fused iff Fused (MOE_RESIDENCY_FUSED_MADD at `gemv`): in the default build
// (0) it is a multiply then an add, with an empty asm between them because
// GCC otherwise contracts _mm256_add_ps(_mm256_mul_ps()) into vfmadd inside an
// FMA-enabled function (even with -std=c++17). Hence bit-identical to
// gemv_scalar in the same TU, on every CPU.
//
// MOE_RESIDENCY_DETAIL_X86_KERNEL: the kernel is compiled (x86-64, GCC or
// Clang, not disabled by MOE_RESIDENCY_NO_RUNTIME_DISPATCH).
// MOE_RESIDENCY_DETAIL_GEMV_DISPATCH: `gemv` may take it, i.e. the TU is not
// already compiled for AVX2+FMA+F16C (then the xsimd path is as fast).

#if MOE_RESIDENCY_DETAIL_X86_KERNEL
#define MOE_RESIDENCY_DETAIL_X86_TARGET __attribute__((target("avx2,fma,f16c")))

namespace moe_residency {
namespace detail {
inline namespace MOE_RESIDENCY_GEMV_ABI {

template <bool Fused>
MOE_RESIDENCY_DETAIL_X86_TARGET inline __m256 x86_madd(__m256 a, __m256 b, __m256 c) noexcept {
  if constexpr (Fused) {
    return _mm256_fmadd_ps(a, b, c);
  } else {
    __m256 p = _mm256_mul_ps(a, b);
    __asm__("" : "+x"(p));  // p is rounded: no contraction into an FMA
    return _mm256_add_ps(p, c);
  }
}

template <element_type T>
MOE_RESIDENCY_DETAIL_X86_TARGET inline __m256 x86_load8(const void* row, std::size_t i) noexcept {
  if constexpr (T == element_type::f32) {
    return _mm256_loadu_ps(static_cast<const float*>(row) + i);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(row) + i));
    if constexpr (T == element_type::f16) return _mm256_cvtph_ps(h);
    else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

/// round_block with F16C (f16) and AVX2 integer ops (bf16: ggml's rule,
/// exactly as f32_to_bf16_bits). n is a multiple of 8.
MOE_RESIDENCY_DETAIL_X86_TARGET inline void x86_round_block(const float* x, float* out, std::size_t n,
                                                            element_type t) noexcept {
  if (t == element_type::f16) {
    for (std::size_t i = 0; i < n; i += 8)
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT)));
    return;
  }
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff), quiet = _mm256_set1_epi32(0x40),
                abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  for (std::size_t i = 0; i < n; i += 8) {
    const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i));
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, bias), _mm256_and_si256(hi, one)), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
    const __m256i h = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, quiet), nan);
    _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
  }
}

/// bf16 in the dispatched kernel: 16 weights from one 32-byte load, split
/// into the even elements (shifted into the upper half of each 32-bit lane)
/// and the odd ones (masked in place) instead of widening 8 at a time: half
/// the loads and no cross-lane shuffles. The 32 lanes of a block are then held
/// in the order {0, 2, ..., 14}, {1, 3, ..., 15}, {16, 18, ..., 30},
/// {17, ..., 31} (x permuted alike, by x86_split_x); every lane still sums its
/// own elements in element order, and x86_unsplit_lanes restores the natural
/// order before the reduction.
MOE_RESIDENCY_DETAIL_X86_TARGET inline void x86_split_x(const float* x, float* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    // per 128-bit half: [a0 a2 b0 b2 | a4 a6 b4 b6], then 64-bit pairs 0 2 1 3
    const __m256 even = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
    const __m256 odd = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
    _mm256_storeu_ps(out + i, _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(even), _MM_SHUFFLE(3, 1, 2, 0))));
    _mm256_storeu_ps(out + i + 8,
                     _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(odd), _MM_SHUFFLE(3, 1, 2, 0))));
  }
}

MOE_RESIDENCY_DETAIL_X86_TARGET inline void x86_unsplit_lanes(float* lane) noexcept {
  float t[gemv_lanes];
  for (std::size_t h = 0; h < 2; ++h)
    for (std::size_t k = 0; k < 8; ++k) {
      t[16 * h + 2 * k] = lane[16 * h + k];
      t[16 * h + 2 * k + 1] = lane[16 * h + 8 + k];
    }
  std::memcpy(lane, t, sizeof t);
}

/// reduce_lanes with AVX: the same additions in the same order (IEEE single
/// adds give the same bits in any instruction set), 4 vector adds instead of
/// 31 scalar ones. `split`: lane holds the bf16 split order (unsplit first).
MOE_RESIDENCY_DETAIL_X86_TARGET inline float x86_reduce_lanes(const float* lane, element_type t, bool split) noexcept {
  __m256 l0 = _mm256_load_ps(lane), l1 = _mm256_load_ps(lane + 8), l2 = _mm256_load_ps(lane + 16),
         l3 = _mm256_load_ps(lane + 24);
  if (split) {  // {0,2,..,14} {1,3,..,15} {16,..,30} {17,..,31} -> 0..7, 8..15, ...
    const __m256 lo01 = _mm256_unpacklo_ps(l0, l1), hi01 = _mm256_unpackhi_ps(l0, l1);
    const __m256 lo23 = _mm256_unpacklo_ps(l2, l3), hi23 = _mm256_unpackhi_ps(l2, l3);
    l0 = _mm256_permute2f128_ps(lo01, hi01, 0x20);
    l1 = _mm256_permute2f128_ps(lo01, hi01, 0x31);
    l2 = _mm256_permute2f128_ps(lo23, hi23, 0x20);
    l3 = _mm256_permute2f128_ps(lo23, hi23, 0x31);
  }
  // a[i] = (lane[i] + lane[16+i]) + (lane[8+i] + lane[24+i]); h[i] = a[i] + a[i+4]
  const __m256 a = _mm256_add_ps(_mm256_add_ps(l0, l2), _mm256_add_ps(l1, l3));
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  if (t == element_type::bf16) {  // (h0 + h2) + (h1 + h3)
    const __m128 u = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));
  }
  const __m128 u = _mm_hadd_ps(h, h);  // (h0 + h1), (h2 + h3)
  return _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));
}

/// Prefetches the 32 columns at c of the R rows D passes after this one (D =
/// 0: this pass's own rows) into the cache level Loc names (__builtin_prefetch's
/// locality: 3 = prefetcht0 ... 0 = prefetchnta). Each row is a short stream
/// (4 KiB of f16 for 2048 columns) that the hardware prefetcher only catches
/// after it has started, and the interleaved rows would otherwise each pay
/// that start from memory. Only for 16-bit weights (f32 routers run one row a
/// pass, one stream the hardware prefetcher follows; prefetching their next
/// rows measured slower in cache) and when the prefetched rows fit
/// (x86_prefetch_fits): into L1 (Loc 3) next to this pass's rows in three
/// quarters of a 32 KiB L1, into L2 (Loc < 3) in 64 KiB. A prefetch never
/// faults, so past the matrix's end it is only wasted. x86_tune_default
/// prefetches the whole rows two passes ahead, one line per row per step, with
/// prefetcht2: into L1, the next rows and x fill a 32 KiB L1 and evict each
/// other, which measured slower per token than into L2
/// (docs/benchmarks.md, "What the kernels do").
template <element_type T, std::size_t R, std::size_t D, int Loc = 3>
MOE_RESIDENCY_DETAIL_X86_TARGET inline void x86_prefetch_next(const char* p, std::size_t stride,
                                                              std::size_t c) noexcept {
  MOE_RESIDENCY_DETAIL_UNROLL
  for (std::size_t r = D * R; r < (D + 1) * R; ++r) __builtin_prefetch(p + r * stride + c * 2, 0, Loc);
}

/// D: how many passes ahead to prefetch (0: none; 1: the next pass). Head:
/// how many 64-byte lines at the start of each of those rows (0: all of them),
/// during the pass's last Head steps; with InRow, the steps before also
/// prefetch this pass's rows Head lines ahead (one stream per row, Head lines
/// ahead throughout).
template <element_type T, std::size_t R, std::size_t D, std::size_t Head, int Loc = 3>
inline bool x86_prefetch_fits(std::size_t cn) noexcept {
  const std::size_t ahead = Head == 0 ? cn * 2 : std::min(cn * 2, Head * 64);
  const bool fits = Loc < 3 ? D * R * ahead <= 65536 : R * cn * 2 + D * R * ahead <= 24576;
  return D > 0 && T != element_type::f32 && fits;
}

/// R rows (p, p + stride, ...) over columns [c0, c0 + cn), cn a multiple of
/// 32: the lanes in acc[r] (bf16: in split order) += w * xs, element order per
/// lane. Interleaving R rows gives 4R independent multiply-add chains (one
/// row's 4 chains leave the FMA units idle: latency 4, two per cycle) and
/// loads each x vector once for all R rows.
template <element_type T, bool Fused, std::size_t R, std::size_t D, std::size_t Head = 0, bool InRow = false,
          int Loc = 3>
MOE_RESIDENCY_DETAIL_X86_TARGET inline void x86_pass(const char* p, std::size_t stride, std::size_t c0, std::size_t cn,
                                                     const float* xs, float (*acc)[gemv_lanes]) noexcept {
  __m256 a[R][4];
  MOE_RESIDENCY_DETAIL_UNROLL
  for (std::size_t r = 0; r < R; ++r) {
    MOE_RESIDENCY_DETAIL_UNROLL
    for (std::size_t j = 0; j < 4; ++j) a[r][j] = _mm256_load_ps(acc[r] + 8 * j);
  }
  if constexpr (T == element_type::bf16) {
    const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    const bool prefetch = x86_prefetch_fits<T, R, D, Head, Loc>(cn);
    const std::size_t pf_from = Head == 0 || cn <= gemv_lanes * Head ? 0 : cn - gemv_lanes * Head;
    for (std::size_t e = 0; e < cn; e += gemv_lanes) {
      const std::size_t c = c0 + e;
      if (prefetch) {
        if (e >= pf_from) x86_prefetch_next<T, R, D, Loc>(p, stride, c0 + (e - pf_from));
        else if (InRow) x86_prefetch_next<T, R, 0, Loc>(p, stride, c + (cn - pf_from));
      }
      MOE_RESIDENCY_DETAIL_UNROLL
      for (std::size_t h = 0; h < 2; ++h) {  // elements c + 16h .. c + 16h + 15
        __m256 xe = _mm256_loadu_ps(xs + e + 16 * h), xo = _mm256_loadu_ps(xs + e + 16 * h + 8);
        __asm__("" : "+x"(xe), "+x"(xo));  // see below: one load for R rows
        MOE_RESIDENCY_DETAIL_UNROLL
        for (std::size_t r = 0; r < R; ++r) {
          const auto* q = reinterpret_cast<const std::uint16_t*>(p + r * stride) + c + 16 * h;
          __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
          __asm__("" : "+x"(v));  // loaded once, used twice
          a[r][2 * h] = x86_madd<Fused>(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), xe, a[r][2 * h]);
          a[r][2 * h + 1] = x86_madd<Fused>(_mm256_castsi256_ps(_mm256_and_si256(v, hi)), xo, a[r][2 * h + 1]);
        }
      }
    }
  } else {
    const bool prefetch = x86_prefetch_fits<T, R, D, Head, Loc>(cn);
    const std::size_t pf_from = Head == 0 || cn <= gemv_lanes * Head ? 0 : cn - gemv_lanes * Head;
    for (std::size_t e = 0; e < cn; e += gemv_lanes) {
      const std::size_t c = c0 + e;
      if constexpr (T != element_type::f32) {
        if (prefetch) {
          if (e >= pf_from) x86_prefetch_next<T, R, D, Loc>(p, stride, c0 + (e - pf_from));
          else if (InRow) x86_prefetch_next<T, R, 0, Loc>(p, stride, c + (cn - pf_from));
        }
      }
      MOE_RESIDENCY_DETAIL_UNROLL
      for (std::size_t j = 0; j < 4; ++j) {
        __m256 xv = _mm256_loadu_ps(xs + e + 8 * j);
        // One load in a register for the R rows: the compiler would fold it
        // into each multiply-add, R loads, and the loads then limit the loop.
        __asm__("" : "+x"(xv));
        MOE_RESIDENCY_DETAIL_UNROLL
        for (std::size_t r = 0; r < R; ++r)
          a[r][j] = x86_madd<Fused>(x86_load8<T>(p + r * stride, c + 8 * j), xv, a[r][j]);
      }
    }
  }
  MOE_RESIDENCY_DETAIL_UNROLL
  for (std::size_t r = 0; r < R; ++r) {
    MOE_RESIDENCY_DETAIL_UNROLL
    for (std::size_t j = 0; j < 4; ++j) _mm256_store_ps(acc[r] + 8 * j, a[r][j]);
  }
}

/// x86_pass for f16/f32 in sweeps of G lane groups (G = 2: lanes 0-15 of
/// every 32-column step of the R rows, then lanes 16-31): 2R accumulators, so
/// twice the rows per pass for the same registers and half the x loads per
/// weight; the second sweep reads the rows' other half lines from L1. Each
/// lane's order is unchanged. The next rows are prefetched in the first sweep.
template <element_type T, bool Fused, std::size_t R, std::size_t G, std::size_t D>
MOE_RESIDENCY_DETAIL_X86_TARGET inline void x86_pass_split(const char* p, std::size_t stride, std::size_t c0,
                                                           std::size_t cn, const float* xs,
                                                           float (*acc)[gemv_lanes]) noexcept {
  const bool prefetch = x86_prefetch_fits<T, R, D, 0>(cn);
  for (std::size_t g0 = 0; g0 < 4; g0 += G) {
    __m256 a[R][G];
    MOE_RESIDENCY_DETAIL_UNROLL
    for (std::size_t r = 0; r < R; ++r) {
      MOE_RESIDENCY_DETAIL_UNROLL
      for (std::size_t j = 0; j < G; ++j) a[r][j] = _mm256_load_ps(acc[r] + 8 * (g0 + j));
    }
    for (std::size_t e = 0; e < cn; e += gemv_lanes) {
      const std::size_t c = c0 + e;
      if (T != element_type::f32 && prefetch && g0 == 0) x86_prefetch_next<T, R, D>(p, stride, c);
      MOE_RESIDENCY_DETAIL_UNROLL
      for (std::size_t j = 0; j < G; ++j) {
        __m256 xv = _mm256_loadu_ps(xs + e + 8 * (g0 + j));
        __asm__("" : "+x"(xv));  // one load for the R rows (see x86_pass)
        MOE_RESIDENCY_DETAIL_UNROLL
        for (std::size_t r = 0; r < R; ++r)
          a[r][j] = x86_madd<Fused>(x86_load8<T>(p + r * stride, c + 8 * (g0 + j)), xv, a[r][j]);
      }
    }
    MOE_RESIDENCY_DETAIL_UNROLL
    for (std::size_t r = 0; r < R; ++r) {
      MOE_RESIDENCY_DETAIL_UNROLL
      for (std::size_t j = 0; j < G; ++j) _mm256_store_ps(acc[r] + 8 * (g0 + j), a[r][j]);
    }
  }
}

/// x86_pass over nr rows from `data`: passes of R rows, then the rest.
template <element_type T, bool Fused, class Tune = x86_tune_default>
MOE_RESIDENCY_DETAIL_X86_TARGET void x86_rows_chunk(const char* data, std::size_t nr, std::size_t stride,
                                                    std::size_t c0, std::size_t cn, const float* xs,
                                                    float (*acc)[gemv_lanes]) noexcept {
  constexpr std::size_t R = x86_tune_rows<Tune, T>();
  constexpr std::size_t D = Tune::prefetch_passes;
  constexpr std::size_t H = x86_tune_head_lines<Tune, T>();
  constexpr bool IR = x86_tune_in_row<Tune, T>();
  constexpr int L = Tune::prefetch_locality;
  constexpr std::size_t G = x86_tune_lane_groups<Tune, T>();
  std::size_t rr = 0;
  if constexpr (G < 4) {
    for (; rr + R <= nr; rr += R) x86_pass_split<T, Fused, R, G, D>(data + rr * stride, stride, c0, cn, xs, acc + rr);
    if constexpr (R > 3) {
      if (rr + 3 <= nr) {
        x86_pass<T, Fused, 3, D, H, IR, L>(data + rr * stride, stride, c0, cn, xs, acc + rr);
        rr += 3;
      }
    }
  } else {
    for (; rr + R <= nr; rr += R) x86_pass<T, Fused, R, D, H, IR, L>(data + rr * stride, stride, c0, cn, xs, acc + rr);
  }
  if constexpr (R > 2) {
    if (rr + 2 <= nr) {
      x86_pass<T, Fused, 2, D, H, IR, L>(data + rr * stride, stride, c0, cn, xs, acc + rr);
      rr += 2;
    }
  }
  for (; rr < nr; ++rr) x86_pass<T, Fused, 1, D, H, IR, L>(data + rr * stride, stride, c0, cn, xs, acc + rr);
}

/// x's chunk [c0, c0 + cn) as the kernel reads it: rounded when `round`,
/// split-ordered for bf16; else x itself.
template <element_type T>
MOE_RESIDENCY_DETAIL_X86_TARGET inline const float* x86_prepare_x(const float* x, std::size_t c0, std::size_t cn,
                                                                  bool round, float* buf) noexcept {
  if (T == element_type::f32) return x + c0;
  if (round) x86_round_block(x + c0, buf, cn, T);
  if (T == element_type::bf16) x86_split_x(round ? buf : x + c0, buf, cn);
  return round || T == element_type::bf16 ? buf : x + c0;
}

/// The 32-lane part of nr (<= 32) rows starting at `data`: acc[rr][lane] for
/// columns [0, np), np a multiple of 32, in natural lane order.
template <element_type T, bool Fused, class Tune = x86_tune_default>
MOE_RESIDENCY_DETAIL_X86_TARGET void x86_gemv_rows(const char* data, std::size_t nr, std::size_t np, std::size_t stride,
                                                   const float* x, bool round, float (*acc)[gemv_lanes]) noexcept {
  alignas(32) float xbuf[gemv_col_block];
  for (std::size_t rr = 0; rr < nr; ++rr)
    for (std::size_t j = 0; j < gemv_lanes; j += 8) _mm256_store_ps(acc[rr] + j, _mm256_setzero_ps());
  for (std::size_t c0 = 0; c0 < np; c0 += gemv_col_block) {
    const std::size_t cn = std::min(gemv_col_block, np - c0);
    x86_rows_chunk<T, Fused, Tune>(data, nr, stride, c0, cn, x86_prepare_x<T>(x, c0, cn, round, xbuf), acc);
  }
  if (T == element_type::bf16)
    for (std::size_t rr = 0; rr < nr; ++rr) x86_unsplit_lanes(acc[rr]);
}

}  // namespace MOE_RESIDENCY_GEMV_ABI
}  // namespace detail
}  // namespace moe_residency

#endif  // MOE_RESIDENCY_DETAIL_X86_KERNEL
