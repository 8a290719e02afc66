#pragma once
/// The generic SIMD GEMV kernel (gemv_simd_generic) for any xsimd
/// architecture, and its building blocks per batch width: the fused
/// multiply-add, f16/bf16 loads, activation rounding (x86, NEON or portable,
/// chosen by Arch's width). Part of detail/gemv.hpp, which chooses between
/// this kernel and the hand-written x86 one (gemv/x86.hpp).

#include "moe_residency/detail/gemv/config.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <math.h>  // ::fmaf

#include "moe_residency/detail/gemv/intrinsics.hpp"
#include "moe_residency/detail/gemv/scalar.hpp"
#include "moe_residency/detail/half.hpp"
#include "moe_residency/element_type.hpp"

namespace moe_residency {
namespace detail {
inline namespace MOE_RESIDENCY_GEMV_ABI {

// ---- SIMD building blocks, per xsimd architecture --------------------------

// Which native register a batch is, told apart by width on each platform
// (comparing the vector types themselves trips -Wignored-attributes): on x86
// every 4/8/16-float batch is __m128/__m256/__m512, on aarch64 a 4-float one
// is float32x4_t.
template <class Arch>
constexpr std::size_t batch_width() noexcept {
  return xsimd::batch<float, Arch>::size;
}

/// a*b + c in one rounding, with the instruction Arch's batch width selects.
template <class Arch>
inline xsimd::batch<float, Arch> madd_fused(const xsimd::batch<float, Arch>& a, const xsimd::batch<float, Arch>& b,
                                            const xsimd::batch<float, Arch>& c) noexcept {
  using B = xsimd::batch<float, Arch>;
  using R = typename B::register_type;
  (void)sizeof(R);
#if defined(__AVX512F__)
  if constexpr (batch_width<Arch>() == 16)
    return B(_mm512_fmadd_ps(static_cast<R>(a), static_cast<R>(b), static_cast<R>(c)));
  else
#endif
#if defined(__FMA__)
      if constexpr (batch_width<Arch>() == 8)
    return B(_mm256_fmadd_ps(static_cast<R>(a), static_cast<R>(b), static_cast<R>(c)));
  else if constexpr (batch_width<Arch>() == 4)
    return B(_mm_fmadd_ps(static_cast<R>(a), static_cast<R>(b), static_cast<R>(c)));
  else
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
      if constexpr (batch_width<Arch>() == 4)
    return B(vfmaq_f32(static_cast<R>(c), static_cast<R>(a), static_cast<R>(b)));
  else
#endif
  {
    // An architecture without a fused instruction we know of: fuse per lane.
    alignas(64) float va[B::size], vb[B::size], vc[B::size];
    a.store_aligned(va);
    b.store_aligned(vb);
    c.store_aligned(vc);
    for (std::size_t i = 0; i < B::size; ++i) va[i] = ::fmaf(va[i], vb[i], vc[i]);
    return B::load_aligned(va);
  }
}

/// a*b + c, one rounding iff Fused.
template <class Arch, bool Fused>
inline xsimd::batch<float, Arch> madd(const xsimd::batch<float, Arch>& a, const xsimd::batch<float, Arch>& b,
                                      const xsimd::batch<float, Arch>& c) noexcept {
  if constexpr (Fused) return madd_fused<Arch>(a, b, c);
  else return a * b + c;
}

/// B::size binary16 values from p, converted natively where possible.
template <class Arch>
inline xsimd::batch<float, Arch> load_f16(const std::uint16_t* p) noexcept {
  using B = xsimd::batch<float, Arch>;
#if defined(__AVX512F__)
  if constexpr (batch_width<Arch>() == 16)
    return B(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
  else
#endif
#if defined(__F16C__)
      if constexpr (batch_width<Arch>() == 8)
    return B(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  else if constexpr (batch_width<Arch>() == 4)
    return B(_mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  else
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
      if constexpr (batch_width<Arch>() == 4)
    return B(vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))));
  else
#endif
#if (defined(__SSE2__) || defined(_M_X64)) && !defined(__F16C__)
      if constexpr (batch_width<Arch>() == 4) {
    // SSE2 without F16C (the default x86-64 build): f16_to_f32 in 4 lanes.
    const __m128i h = _mm_unpacklo_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)), _mm_setzero_si128());
    const __m128i sign = _mm_slli_epi32(_mm_and_si128(h, _mm_set1_epi32(0x8000)), 16);
    const __m128i em = _mm_and_si128(h, _mm_set1_epi32(0x7fff));
    __m128i normal = _mm_add_epi32(_mm_slli_epi32(em, 13), _mm_set1_epi32(0x38000000));
    const __m128i infnan = _mm_cmpgt_epi32(em, _mm_set1_epi32(0x7bff));
    const __m128i nan = _mm_cmpgt_epi32(em, _mm_set1_epi32(0x7c00));
    normal = _mm_add_epi32(normal, _mm_and_si128(infnan, _mm_set1_epi32(0x38000000)));
    normal = _mm_or_si128(normal, _mm_and_si128(nan, _mm_set1_epi32(0x00400000)));
    const __m128i sub = _mm_castps_si128(_mm_mul_ps(_mm_cvtepi32_ps(em), _mm_set1_ps(0x1p-24f)));
    const __m128i is_sub = _mm_cmplt_epi32(em, _mm_set1_epi32(0x0400));
    const __m128i mag = _mm_or_si128(_mm_and_si128(is_sub, sub), _mm_andnot_si128(is_sub, normal));
    return B(_mm_castsi128_ps(_mm_or_si128(sign, mag)));
  } else
#endif
  {
    // Portable: branch-free integer conversion the compiler vectorises.
    alignas(64) float tmp[B::size];
    for (std::size_t i = 0; i < B::size; ++i) tmp[i] = f16_to_f32<Arch>(p[i]);
    return B::load_aligned(tmp);
  }
}

/// B::size bfloat16 values from p (a shift into the upper half).
template <class Arch>
inline xsimd::batch<float, Arch> load_bf16(const std::uint16_t* p) noexcept {
  using B = xsimd::batch<float, Arch>;
#if defined(__AVX512F__)
  if constexpr (batch_width<Arch>() == 16)
    return B(_mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16)));
  else
#endif
#if defined(__AVX2__)
      if constexpr (batch_width<Arch>() == 8)
    return B(_mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16)));
  else
#endif
#if defined(__SSE2__) || defined(_M_X64)
      if constexpr (batch_width<Arch>() == 4)
    return B(_mm_castsi128_ps(
        _mm_unpacklo_epi16(_mm_setzero_si128(), _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))));
  else
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
      if constexpr (batch_width<Arch>() == 4)
    return B(vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p), 16)));
  else
#endif
  {
    alignas(64) float tmp[B::size];
    for (std::size_t i = 0; i < B::size; ++i) tmp[i] = bf16_to_f32<Arch>(p[i]);
    return B::load_aligned(tmp);
  }
}

/// n (a multiple of 32) activations rounded to the weight's 16-bit type, with
/// the instruction Arch's batch width selects (as load_f16 does): 16 wide
/// AVX-512, 8 wide F16C (AVX/AVX2), 4 wide NEON; SSE2 and the rest round in
/// software. Arch chooses, the TU's macros only say what is compilable, so an
/// SSE2 instantiation never contains AVX instructions.
template <class Arch>
inline void round_block(const float* x, float* out, std::size_t n, element_type t) noexcept {
  [[maybe_unused]] constexpr std::size_t W = batch_width<Arch>();
  if (t == element_type::f16) {
#if defined(__AVX512F__)
    if constexpr (W == 16) {
      for (std::size_t i = 0; i < n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT)));
      return;
    }
#endif
#if defined(__F16C__)
    if constexpr (W == 8) {
      for (std::size_t i = 0; i < n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT)));
      return;
    }
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
    if constexpr (W == 4) {
      for (std::size_t i = 0; i < n; i += 4) vst1q_f32(out + i, vcvt_f32_f16(vcvt_f16_f32(vld1q_f32(x + i))));
      return;
    }
#endif
    for (std::size_t i = 0; i < n; ++i) out[i] = round_to_f16<Arch>(x[i]);
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] = round_to_bf16<Arch>(x[i]);
  }
}

template <class Arch>
inline xsimd::batch<float, Arch> load_weights(const void* row, element_type t, std::size_t i) noexcept {
  using B = xsimd::batch<float, Arch>;
  if (t == element_type::f16) return load_f16<Arch>(static_cast<const std::uint16_t*>(row) + i);
  if (t == element_type::bf16) return load_bf16<Arch>(static_cast<const std::uint16_t*>(row) + i);
  return B::load_unaligned(static_cast<const float*>(row) + i);
}

template <class Arch, element_type T>
inline xsimd::batch<float, Arch> load_weights_t(const void* row, std::size_t i) noexcept {
  using B = xsimd::batch<float, Arch>;
  if constexpr (T == element_type::f16) return load_f16<Arch>(static_cast<const std::uint16_t*>(row) + i);
  else if constexpr (T == element_type::bf16) return load_bf16<Arch>(static_cast<const std::uint16_t*>(row) + i);
  else return B::load_unaligned(static_cast<const float*>(row) + i);
}

/// Rows interleaved per pass of the SIMD kernel. One row alone is NA = 32 / W
/// dependent multiply-add chains (ggml's order), which leaves a superscalar
/// core's FMA units idle (latency 4, two per cycle: 8 chains in flight are
/// needed); R rows give R * NA independent chains, each row keeping its own
/// order exactly. Bounded by the register file: 16 vector registers on
/// SSE/AVX2 (W = 8: 3 rows = 12 accumulators), 32 on AVX-512 and NEON.
template <class Arch>
constexpr std::size_t gemv_simd_rows_per_pass() noexcept {
  constexpr std::size_t W = batch_width<Arch>();
  if constexpr (W >= 16) return 4;
  else if constexpr (W == 8) return 3;
#if defined(__aarch64__)
  else if constexpr (W == 4) return 2;
#endif
  else return 1;
}

/// The 32-lane part of R rows (p, p + stride, ...) over columns [c0, c0 + cn)
/// (cn a multiple of 32): acc[r][lane] += w[r][e] * xs[e - c0] lane by lane in
/// element order. xs is the chunk of x, already rounded.
template <class Arch, bool Fused, element_type T, std::size_t R>
inline void gemv_simd_pass(const char* p, std::size_t stride, std::size_t c0, std::size_t cn, const float* xs,
                           float (*acc)[gemv_lanes]) noexcept {
  using B = xsimd::batch<float, Arch>;
  constexpr std::size_t W = B::size;
  constexpr std::size_t NA = gemv_lanes / W;
  B a[R][NA];
  MOE_RESIDENCY_DETAIL_UNROLL
  for (std::size_t r = 0; r < R; ++r) {
    MOE_RESIDENCY_DETAIL_UNROLL
    for (std::size_t j = 0; j < NA; ++j) a[r][j] = B::load_aligned(acc[r] + j * W);
  }
  for (std::size_t e = 0; e < cn; e += gemv_lanes) {
    MOE_RESIDENCY_DETAIL_UNROLL
    for (std::size_t j = 0; j < NA; ++j) {
      const B xv = B::load_unaligned(xs + e + j * W);
      MOE_RESIDENCY_DETAIL_UNROLL
      for (std::size_t r = 0; r < R; ++r)
        a[r][j] = madd<Arch, Fused>(load_weights_t<Arch, T>(p + r * stride, c0 + e + j * W), xv, a[r][j]);
    }
  }
  MOE_RESIDENCY_DETAIL_UNROLL
  for (std::size_t r = 0; r < R; ++r) {
    MOE_RESIDENCY_DETAIL_UNROLL
    for (std::size_t j = 0; j < NA; ++j) a[r][j].store_aligned(acc[r] + j * W);
  }
}

/// gemv_simd_pass over nr rows: passes of R rows, then the 2 or 1 left over.
template <class Arch, bool Fused, element_type T>
inline void gemv_simd_rows(const char* p, std::size_t nr, std::size_t stride, std::size_t c0, std::size_t cn,
                           const float* xs, float (*acc)[gemv_lanes]) noexcept {
  constexpr std::size_t R = gemv_simd_rows_per_pass<Arch>();
  std::size_t rr = 0;
  for (; rr + R <= nr; rr += R) gemv_simd_pass<Arch, Fused, T, R>(p + rr * stride, stride, c0, cn, xs, acc + rr);
  if constexpr (R > 2) {
    if (rr + 2 <= nr) {
      gemv_simd_pass<Arch, Fused, T, 2>(p + rr * stride, stride, c0, cn, xs, acc + rr);
      rr += 2;
    }
  }
  for (; rr < nr; ++rr) gemv_simd_pass<Arch, Fused, T, 1>(p + rr * stride, stride, c0, cn, xs, acc + rr);
}

/// The SIMD kernel: rows in blocks of 32, each block's rows interleaved R at a
/// time (gemv_simd_rows_per_pass); x is rounded once per call when it fits
/// the stack chunk of gemv_col_block floats (else once per chunk and row
/// block). The 32 lanes of each row live in NA = 32 / W batches exactly as in
/// the scalar kernel. No allocation; 12 KiB of stack.
template <class Arch, bool Fused>
inline void gemv_simd_generic(const void* data, element_type t, std::size_t rows, std::size_t cols, std::size_t stride,
                              const float* x, float* y, activation_rounding r) noexcept {
  using B = xsimd::batch<float, Arch>;
  constexpr std::size_t W = B::size;
  if constexpr (gemv_lanes % W != 0) {
    gemv_scalar_impl<Arch, Fused>(data, t, rows, cols, stride, x, y, r);
  } else {
    const bool round = r == activation_rounding::engine && t != element_type::f32;
    const std::size_t np = cols - cols % gemv_lanes;
    alignas(64) float xbuf[gemv_col_block];
    alignas(64) float acc[gemv_row_block][gemv_lanes];
    for (std::size_t r0 = 0; r0 < rows; r0 += gemv_row_block) {
      const std::size_t nr = std::min(gemv_row_block, rows - r0);
      const char* block = static_cast<const char*>(data) + r0 * stride;
      std::memset(acc, 0, sizeof acc);
      for (std::size_t c0 = 0; c0 < np; c0 += gemv_col_block) {
        const std::size_t cn = std::min(gemv_col_block, np - c0);
        const float* xs = x + c0;
        if (round) {
          if (r0 == 0 || np > gemv_col_block) round_block<Arch>(x + c0, xbuf, cn, t);
          xs = xbuf;
        }
        switch (t) {
          case element_type::f16:
            gemv_simd_rows<Arch, Fused, element_type::f16>(block, nr, stride, c0, cn, xs, acc);
            break;
          case element_type::bf16:
            gemv_simd_rows<Arch, Fused, element_type::bf16>(block, nr, stride, c0, cn, xs, acc);
            break;
          case element_type::f32:
            gemv_simd_rows<Arch, Fused, element_type::f32>(block, nr, stride, c0, cn, xs, acc);
            break;
        }
      }
      for (std::size_t rr = 0; rr < nr; ++rr)
        y[r0 + rr] = finish_dot<Arch, Fused>(reduce_lanes<Arch>(acc[rr], t), block + rr * stride, x, np, cols, t, r);
    }
  }
}

}  // namespace MOE_RESIDENCY_GEMV_ABI
}  // namespace detail
}  // namespace moe_residency
