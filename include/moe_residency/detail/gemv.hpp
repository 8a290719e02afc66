#pragma once
/// GEMV kernels for router matrices: y[r] = dot(row r, x). Internal; the
/// public entry points are in moe_residency/router.hpp.
///
/// Accumulation order. Every kernel here (SIMD for any xsimd architecture, and
/// the scalar reference) reproduces the order of ggml's CPU dot products as
/// built for x86 AVX/AVX2 (ggml_vec_dot_f32 / _f16 / _bf16, the path
/// llama.cpp takes for a one-token router MUL_MAT): element e of the first
/// n - n % 32 accumulates into lane e % 32 (four 8-lane accumulators),
/// multiply-add fused iff `Fused` (default MOE_RESIDENCY_FUSED_MADD), then a fixed pairwise
/// reduction, then the n % 32 tail sequentially (f32: in float; f16/bf16: in
/// double). The SIMD kernels are therefore bit-identical to the scalar one.
///
/// One definition per target. Every function here whose machine code depends
/// on the TU's target is a template on the xsimd architecture (`Arch`, or
/// `Tag` where no batch is formed) and on `Fused`, and the kernels pass their
/// own Arch down the whole call graph (half.hpp's conversions included). A
/// program that instantiates gemv_simd<Arch> in one TU per architecture, each
/// built with that architecture's flags (the xsimd::dispatch pattern), thus
/// gets distinct symbols per architecture: the linker cannot substitute an
/// AVX-512 TU's copy of a helper for an SSE2 TU's. MOE_RESIDENCY_FUSED_MADD is
/// read only for the default of `Fused` at the entry points. The non-template
/// entry points in router.hpp are kept apart by the ABI tag below (see
/// docs/router.md, Limits).
///
/// Why this header is long: it holds one accumulation order, written out
/// for three element types (f32, f16, bf16), for the generic xsimd batch,
/// for the hand-interleaved x86 rows (256-bit, and 512-bit for 16-bit
/// weights) and for NEON, beside the scalar
/// reference every one of them must equal bit for bit. Kept together so a
/// change to the order is made, and reviewed, in every kernel at once.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include <math.h>  // ::fmaf

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*() and trip
// -Wmaybe-uninitialized once inlined (GCC bug 105593, fixed in GCC 13). The
// warning is located in the intrinsic headers, so it is silenced for them by
// including them here, first, under the pragma.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <xsimd/xsimd.hpp>

#if defined(__F16C__) || defined(__AVX2__) || defined(__AVX512F__) || defined(__FMA__) || defined(__SSE2__) || \
    defined(_M_X64) || defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#endif

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include "moe_residency/detail/half.hpp"
#include "moe_residency/element_type.hpp"

/// 1 when the GEMV multiply-add is fused (one rounding), as ggml's is when
/// built with FMA (x86 -mfma/-march=native, every aarch64). Defaults to what
/// the translation unit is compiled for; override to model a different engine
/// build. Bit-identity of the SIMD and scalar kernels assumes the target can
/// fuse when this is 1.
#ifndef MOE_RESIDENCY_FUSED_MADD
#if defined(__FMA__) || defined(__AVX512F__) || defined(__aarch64__) || defined(__ARM_FEATURE_FMA)
#define MOE_RESIDENCY_FUSED_MADD 1
#else
#define MOE_RESIDENCY_FUSED_MADD 0
#endif
#endif

// MOE_RESIDENCY_DETAIL_X86_KERNEL: the run-time dispatched kernel is compiled
// (x86-64, GCC or Clang, not disabled by MOE_RESIDENCY_NO_RUNTIME_DISPATCH).
// MOE_RESIDENCY_DETAIL_GEMV_DISPATCH: `gemv` may take it (see gemv_x86_impl).
#if !defined(MOE_RESIDENCY_NO_RUNTIME_DISPATCH) && defined(__x86_64__) && defined(__GNUC__) && !defined(_MSC_VER)
#define MOE_RESIDENCY_DETAIL_X86_KERNEL 1
#else
#define MOE_RESIDENCY_DETAIL_X86_KERNEL 0
#endif
#if MOE_RESIDENCY_DETAIL_X86_KERNEL && !(defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#define MOE_RESIDENCY_DETAIL_GEMV_DISPATCH 1
#else
#define MOE_RESIDENCY_DETAIL_GEMV_DISPATCH 0
#endif

// The ABI tag: every GEMV kernel here, and router.hpp's GEMV entry points, sit
// in an inline namespace named after what their machine code depends on (the
// TU's SIMD target, MOE_RESIDENCY_FUSED_MADD, whether `gemv` dispatches at run
// time), as nlohmann/json tags its ABI. Two TUs built with different settings
// thus get differently named copies, and the linker cannot keep one TU's
// copy for the other's calls (an ODR violation before). Types are not tagged:
// a matrix_view still passes between such TUs.
#if defined(__AVX512F__)
#define MOE_RESIDENCY_DETAIL_ABI_ARCH avx512f
#elif defined(__AVX2__)
#define MOE_RESIDENCY_DETAIL_ABI_ARCH avx2
#elif defined(__AVX__)
#define MOE_RESIDENCY_DETAIL_ABI_ARCH avx
#elif defined(__SSE4_2__)
#define MOE_RESIDENCY_DETAIL_ABI_ARCH sse4_2
#elif defined(__SSE2__) || defined(_M_X64)
#define MOE_RESIDENCY_DETAIL_ABI_ARCH sse2
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define MOE_RESIDENCY_DETAIL_ABI_ARCH neon64
#elif defined(__ARM_NEON)
#define MOE_RESIDENCY_DETAIL_ABI_ARCH neon
#else
#define MOE_RESIDENCY_DETAIL_ABI_ARCH generic
#endif
#if defined(__FMA__)
#define MOE_RESIDENCY_DETAIL_ABI_FMA fma
#else
#define MOE_RESIDENCY_DETAIL_ABI_FMA nofma
#endif
#if defined(__F16C__)
#define MOE_RESIDENCY_DETAIL_ABI_F16C f16c
#else
#define MOE_RESIDENCY_DETAIL_ABI_F16C nof16c
#endif
#if MOE_RESIDENCY_FUSED_MADD
#define MOE_RESIDENCY_DETAIL_ABI_FUSED fused
#else
#define MOE_RESIDENCY_DETAIL_ABI_FUSED unfused
#endif
#if MOE_RESIDENCY_DETAIL_GEMV_DISPATCH
#define MOE_RESIDENCY_DETAIL_ABI_DISPATCH dispatch
#else
#define MOE_RESIDENCY_DETAIL_ABI_DISPATCH nodispatch
#endif
#define MOE_RESIDENCY_DETAIL_ABI_CAT2(a, b, c, d, e) gemv_abi_##a##_##b##_##c##_##d##_##e
#define MOE_RESIDENCY_DETAIL_ABI_CAT(a, b, c, d, e) MOE_RESIDENCY_DETAIL_ABI_CAT2(a, b, c, d, e)
/// The inline namespace of the GEMV kernels in this TU, e.g.
/// gemv_abi_sse2_nofma_nof16c_unfused_dispatch (see above).
#define MOE_RESIDENCY_GEMV_ABI                                                                \
  MOE_RESIDENCY_DETAIL_ABI_CAT(MOE_RESIDENCY_DETAIL_ABI_ARCH, MOE_RESIDENCY_DETAIL_ABI_FMA,   \
                               MOE_RESIDENCY_DETAIL_ABI_F16C, MOE_RESIDENCY_DETAIL_ABI_FUSED, \
                               MOE_RESIDENCY_DETAIL_ABI_DISPATCH)
#define MOE_RESIDENCY_GEMV_ABI_STRING2(x) #x
#define MOE_RESIDENCY_GEMV_ABI_STRING(x) MOE_RESIDENCY_GEMV_ABI_STRING2(x)

namespace moe_residency {

namespace detail {
inline namespace MOE_RESIDENCY_GEMV_ABI {

inline constexpr std::size_t gemv_lanes = 32;        // ggml AVX2: 4 accumulators x 8 lanes
inline constexpr std::size_t gemv_row_block = 32;    // rows sharing one rounded x block
inline constexpr std::size_t gemv_col_block = 2048;  // floats of rounded x kept on the stack

/// a*b + c, one rounding iff Fused. (::fmaf, not std::fma: libstdc++'s
/// std::fma(float, float, float) is an inline function, whose out-of-line
/// copy from an FMA TU the linker could pick for every TU.)
template <class Tag, bool Fused>
inline float madd_scalar(float a, float b, float c) noexcept {
  if constexpr (Fused) return ::fmaf(a, b, c);
  else return a * b + c;
}

/// ggml's reduction of the 32 lanes (GGML_F32x8_REDUCE for f32/f16; the
/// hand-written movehl/movehdup sum of ggml_vec_dot_bf16 for bf16).
template <class Tag>
inline float reduce_lanes(const float* lane, element_type t) noexcept {
  float a[8];
  for (std::size_t i = 0; i < 8; ++i) a[i] = (lane[i] + lane[16 + i]) + (lane[8 + i] + lane[24 + i]);
  float h[4];
  for (std::size_t i = 0; i < 4; ++i) h[i] = a[i] + a[i + 4];
  if (t == element_type::bf16) return (h[0] + h[2]) + (h[1] + h[3]);
  return (h[0] + h[1]) + (h[2] + h[3]);
}

template <class Tag = void>
inline float load_scalar(const void* row, element_type t, std::size_t i) noexcept {
  switch (t) {
    case element_type::f16: return f16_to_f32<Tag>(static_cast<const std::uint16_t*>(row)[i]);
    case element_type::bf16: return bf16_to_f32<Tag>(static_cast<const std::uint16_t*>(row)[i]);
    case element_type::f32: break;
  }
  return static_cast<const float*>(row)[i];
}

template <class Tag>
inline float round_activation(float x, element_type t, activation_rounding r) noexcept {
  if (r == activation_rounding::none) return x;
  if (t == element_type::f16) return round_to_f16<Tag>(x);
  if (t == element_type::bf16) return round_to_bf16<Tag>(x);
  return x;
}

/// The tail after the 32-lane part, and the final value, as ggml forms it.
template <class Tag, bool Fused>
inline float finish_dot(float reduced, const void* row, const float* x, std::size_t from, std::size_t to,
                        element_type t, activation_rounding r) noexcept {
  if (t == element_type::f32) {
    float s = reduced;
    for (std::size_t i = from; i < to; ++i) s = madd_scalar<Tag, Fused>(load_scalar<Tag>(row, t, i), x[i], s);
    return s;
  }
  double s = static_cast<double>(reduced);
  for (std::size_t i = from; i < to; ++i)
    s += static_cast<double>(load_scalar<Tag>(row, t, i) * round_activation<Tag>(x[i], t, r));
  return static_cast<float>(s);
}

/// Scalar reference kernel (always built). rows x cols at `data` with
/// `stride` bytes between rows. Tag: the caller's architecture (only to keep
/// per-target copies apart).
template <class Tag, bool Fused>
inline void gemv_scalar_impl(const void* data, element_type t, std::size_t rows, std::size_t cols, std::size_t stride,
                             const float* x, float* y, activation_rounding r) noexcept {
  const std::size_t np = cols - cols % gemv_lanes;
  for (std::size_t row = 0; row < rows; ++row) {
    const void* p = static_cast<const char*>(data) + row * stride;
    float lane[gemv_lanes] = {};
    for (std::size_t i = 0; i < np; ++i)
      lane[i % gemv_lanes] =
          madd_scalar<Tag, Fused>(load_scalar<Tag>(p, t, i), round_activation<Tag>(x[i], t, r), lane[i % gemv_lanes]);
    y[row] = finish_dot<Tag, Fused>(reduce_lanes<Tag>(lane, t), p, x, np, cols, t, r);
  }
}

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

// Asks the compiler to unroll the loop that follows completely (constant trip
// counts only), so small arrays of accumulators live in registers at -O2 too.
#if defined(__clang__)
#define MOE_RESIDENCY_DETAIL_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define MOE_RESIDENCY_DETAIL_UNROLL _Pragma("GCC unroll 16")
#else
#define MOE_RESIDENCY_DETAIL_UNROLL
#endif

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

// ---- Run-time dispatch on x86-64 (GCC/Clang) -------------------------------
//
// A TU built without -march flags gets SSE2 only: no F16C, so f16 weights
// convert in software (~10x below the memory roofline). The kernel below is
// compiled for AVX2+FMA+F16C with a function-level target attribute, whatever
// the TU's flags, and `gemv` picks it once per process (CPUID, cached) when
// the CPU has all three. It is written with raw intrinsics: xsimd's arch types
// exist only for the ISAs the TU is compiled for (xsimd::batch<float,
// xsimd::avx2> is a static_assert in an SSE2 TU, even inside a target function).
//
// Same order as every kernel above: 32 lanes as four 8-float accumulators,
// reduced and tail-summed by reduce_lanes/finish_dot in the caller (compiled
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

/// CPUID leaf/subleaf into r (EAX, EBX, ECX, EDX), and XCR0's low half (the
/// state the OS saves; call only when CPUID reports OSXSAVE).
inline void x86_cpuid(std::uint32_t leaf, std::uint32_t sub, std::uint32_t (&r)[4]) noexcept {
  __asm__ __volatile__("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
}
inline std::uint32_t x86_xcr0() noexcept {
  std::uint32_t lo, hi;
  __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0u));
  (void)hi;
  return lo;
}

/// True when the CPU and OS support AVX2, FMA and F16C (CPUID + XGETBV,
/// checked once). Written with cpuid/xgetbv directly: clang 14's
/// __builtin_cpu_supports does not know "f16c", and this also works before
/// static constructors have run.
inline bool x86_has_avx2_fma_f16c() noexcept {
  static const bool ok = [] {
    std::uint32_t r[4];
    x86_cpuid(0, 0, r);
    if (r[0] < 7) return false;
    x86_cpuid(1, 0, r);
    const std::uint32_t ecx1 = r[2];
    const bool fma = (ecx1 >> 12) & 1u, osxsave = (ecx1 >> 27) & 1u, avx = (ecx1 >> 28) & 1u, f16c = (ecx1 >> 29) & 1u;
    if (!(fma && osxsave && avx && f16c)) return false;
    if ((x86_xcr0() & 0x6u) != 0x6u) return false;  // OS saves XMM and YMM state
    x86_cpuid(7, 0, r);
    return ((r[1] >> 5) & 1u) != 0;  // AVX2
  }();
  return ok;
}

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
/// rows measured 15-20% slower in cache) and when the prefetched rows fit
/// (x86_prefetch_fits): into L1 (Loc 3) next to this pass's rows in three
/// quarters of a 32 KiB L1, into L2 (Loc < 3) in 64 KiB. A prefetch never
/// faults, so past the matrix's end it is only wasted. x86_tune_default
/// prefetches the whole rows two passes ahead, one line per row per step, with
/// prefetcht2: into L1, the next rows and x fill a 32 KiB L1 and evict each
/// other (Zen 4: a token's f16 routers at 1.87-2.03x the read's time, against
/// 0.98-1.12 into L2; docs/benchmarks.md, "On Zen 4: prefetching into L2, and f32
/// one row a pass").
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

/// The kernel's shape: rows per x86_pass for f32, f16 and bf16, how many
/// passes ahead the 16-bit rows are prefetched (0: not at all), how many
/// 64-byte lines of each such row for f16 and bf16 (0: the whole row), whether
/// the rows being read are also prefetched that far ahead (InRow, see
/// x86_prefetch_fits), the prefetch's locality and the f16 lane groups per
/// sweep (G16 < 4: x86_pass_split, whole rows prefetched, Head16/InRow16 and
/// Loc unused). A parameter
/// so that bench_router can measure the alternatives in one run; `gemv` runs
/// x86_tune_default. 3 rows are 12 accumulators of the 16 AVX2 registers;
/// bf16 also keeps 4 x vectors, a mask and 2 loads live, so 2 rows. 6 f16 rows
/// in two sweeps (G16 = 2) measured no faster (docs/benchmarks.md, 2026-12-01).
/// f32 takes one row a pass: interleaved f32 rows are R streams of 8 KiB that
/// the hardware prefetcher keeps losing (Zen 4, a token's routers: 1 row 0.93-0.97
/// of the read's time, 2 rows 1.5, 4 rows 1.26-1.37), and in cache all
/// measured within 10% of each other (the 1 MiB router streams from L2).
template <std::size_t R32, std::size_t R16, std::size_t RB16, std::size_t PF, std::size_t Head16 = 0,
          std::size_t HeadB16 = 0, bool InRow16 = false, bool InRowB16 = false, int Loc = 3, std::size_t G16 = 4,
          std::size_t Z = 0>
struct x86_tune {
  /// Rows per pass of the 512-bit kernel for f16 and bf16 when the CPU has
  /// AVX-512F (x86z_pass); 0: never, the 256-bit kernel on every CPU.
  static constexpr std::size_t wide_rows = Z;
  template <element_type T>
  static constexpr std::size_t groups() noexcept {
    return T == element_type::f16 ? G16 : 4;
  }
  template <element_type T>
  static constexpr bool in_row() noexcept {
    return T == element_type::bf16 ? InRowB16 : InRow16;
  }
  static constexpr int locality = Loc;
  template <element_type T>
  static constexpr std::size_t rows() noexcept {
    return T == element_type::f32 ? R32 : T == element_type::f16 ? R16 : RB16;
  }
  static constexpr std::size_t prefetch = PF;
  template <element_type T>
  static constexpr std::size_t head() noexcept {
    return T == element_type::bf16 ? HeadB16 : Head16;
  }
};
#if defined(__AVX512F__)
// A TU built for AVX-512 (e.g. -march=native on such a host) compiles the
// kernel with 32 vector registers: 3 bf16 rows fit without spilling, and
// measured faster there (bf16 per token and in cache; docs/benchmarks.md,
// 2026-12-01). f16 keeps 3 rows: 4 or 5 per token cost more than they gain in
// cache.
using x86_tune_default = x86_tune<1, 3, 3, 2, 0, 0, false, false, 1, 4, 2>;
using x86_tune_narrow = x86_tune<1, 3, 3, 2, 0, 0, false, false, 1>;
#else
using x86_tune_default = x86_tune<1, 3, 2, 2, 0, 0, false, false, 1, 4, 2>;
using x86_tune_narrow = x86_tune<1, 3, 2, 2, 0, 0, false, false, 1>;
#endif
// x86_tune_default takes the 512-bit kernel for f16 and bf16 where the CPU
// has AVX-512F, 2 rows a pass (x86z_pass; 4 measured as fast in cache but
// unprefetched per token took twice the read's time), two passes prefetched
// into L2 (Zen 4, a token's f16 routers: 0.98-1.12 of the read's time,
// against 1.35-1.57 one pass ahead and 1.87-2.03 into L1); x86_tune_narrow is the same
// shape on the 256-bit kernel only (for comparison, and the tests of that
// kernel).

/// x86_pass over nr rows from `data`: passes of R rows, then the rest.
template <element_type T, bool Fused, class Tune = x86_tune_default>
MOE_RESIDENCY_DETAIL_X86_TARGET void x86_rows_chunk(const char* data, std::size_t nr, std::size_t stride,
                                                    std::size_t c0, std::size_t cn, const float* xs,
                                                    float (*acc)[gemv_lanes]) noexcept {
  constexpr std::size_t R = Tune::template rows<T>();
  constexpr std::size_t D = Tune::prefetch;
  constexpr std::size_t H = Tune::template head<T>();
  constexpr bool IR = Tune::template in_row<T>();
  constexpr int L = Tune::locality;
  constexpr std::size_t G = Tune::template groups<T>();
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

/// True when the CPU and OS support AVX-512F besides AVX2, FMA and F16C
/// (CPUID leaf 7 EBX bit 16; XCR0 saving opmask and the upper ZMM state).
/// Checked once.
inline bool x86_has_avx512f() noexcept {
  static const bool ok = [] {
    if (!x86_has_avx2_fma_f16c()) return false;
    std::uint32_t r[4];
    x86_cpuid(7, 0, r);
    if (((r[1] >> 16) & 1u) == 0) return false;
    return (x86_xcr0() & 0xe6u) == 0xe6u;  // XMM, YMM, opmask, ZMM_Hi256, Hi16_ZMM
  }();
  return ok;
}

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

/// The AVX2+FMA+F16C GEMV. Call only when x86_has_avx2_fma_f16c(). The
/// reduction and tail run here, in the caller's target: Tag names it (`gemv`
/// passes xsimd::default_arch) so each target keeps its own copy. With
/// Tune::wide_rows > 0, f16 and bf16 take the 512-bit kernel when the CPU has
/// AVX-512F (gemv_x86z_impl; same bits).
template <class Tag, bool Fused, class Tune = x86_tune_default>
inline void gemv_x86_impl(const void* data, element_type t, std::size_t rows, std::size_t cols, std::size_t stride,
                          const float* x, float* y, activation_rounding r) noexcept {
  if constexpr (!Fused) {
    // f16 weights times f16-rounded activations: each product has at most 22
    // significant bits and is never below 2^-48, so it is exact in float, and
    // a*b + c rounded once (fused) or twice (a*b, then + c) is the same float.
    // The unfused build's f16 kernel therefore fuses: half the floating-point
    // instructions, the same bits (tests/test_router.cpp checks the premise
    // for every f16 value). Not bf16 (a product can fall below 2^-126 and
    // round) and not unrounded activations.
    if (t == element_type::f16 && r == activation_rounding::engine) {
      gemv_x86_impl<Tag, true, Tune>(data, t, rows, cols, stride, x, y, r);
      return;
    }
  }
  if constexpr (Tune::wide_rows > 0) {
    if (t != element_type::f32 && x86_has_avx512f()) {
      constexpr std::size_t D = Tune::prefetch;
      if (t == element_type::f16)
        gemv_x86z_impl<Tag, Fused, element_type::f16, Tune::wide_rows, D, Tune::locality>(data, rows, cols, stride, x,
                                                                                          y, r);
      else
        gemv_x86z_impl<Tag, Fused, element_type::bf16, Tune::wide_rows, D, Tune::locality>(data, rows, cols, stride, x,
                                                                                           y, r);
      return;
    }
  }
  const bool round = r == activation_rounding::engine && t != element_type::f32;
  const std::size_t np = cols - cols % gemv_lanes;
  alignas(32) float acc[gemv_row_block][gemv_lanes];
  alignas(32) float xbuf[gemv_col_block];
  const float* xs = nullptr;  // x prepared once, when one chunk holds it
  for (std::size_t r0 = 0; r0 < rows; r0 += gemv_row_block) {
    const std::size_t nr = std::min(gemv_row_block, rows - r0);
    const char* block = static_cast<const char*>(data) + r0 * stride;
    if (np <= gemv_col_block && np > 0) {
      if (xs == nullptr) {
        switch (t) {
          case element_type::f16: xs = x86_prepare_x<element_type::f16>(x, 0, np, round, xbuf); break;
          case element_type::bf16: xs = x86_prepare_x<element_type::bf16>(x, 0, np, round, xbuf); break;
          case element_type::f32: xs = x; break;
        }
      }
      std::memset(acc, 0, sizeof acc);
      switch (t) {
        case element_type::f16:
          x86_rows_chunk<element_type::f16, Fused, Tune>(block, nr, stride, 0, np, xs, acc);
          break;
        case element_type::bf16:
          x86_rows_chunk<element_type::bf16, Fused, Tune>(block, nr, stride, 0, np, xs, acc);
          break;
        case element_type::f32:
          x86_rows_chunk<element_type::f32, Fused, Tune>(block, nr, stride, 0, np, xs, acc);
          break;
      }
    } else {
      switch (t) {
        case element_type::f16:
          x86_gemv_rows<element_type::f16, Fused, Tune>(block, nr, np, stride, x, round, acc);
          break;
        case element_type::bf16:
          x86_gemv_rows<element_type::bf16, Fused, Tune>(block, nr, np, stride, x, round, acc);
          break;
        case element_type::f32:
          x86_gemv_rows<element_type::f32, Fused, Tune>(block, nr, np, stride, x, round, acc);
          break;
      }
    }
    // One chunk leaves bf16 lanes in split order; x86_gemv_rows unsplits.
    const bool split = t == element_type::bf16 && np <= gemv_col_block && np > 0;
    if (np == cols) {
      for (std::size_t rr = 0; rr < nr; ++rr) y[r0 + rr] = x86_reduce_lanes(acc[rr], t, split);
    } else {
      for (std::size_t rr = 0; rr < nr; ++rr)
        y[r0 + rr] =
            finish_dot<Tag, Fused>(x86_reduce_lanes(acc[rr], t, split), block + rr * stride, x, np, cols, t, r);
    }
  }
}
#endif  // MOE_RESIDENCY_DETAIL_X86_KERNEL

/// gemv_simd's kernel. In a TU compiled for AVX2 and F16C (and FMA when the
/// multiply-add is fused) on x86-64 GCC/Clang, the 8- and 16-wide
/// architectures (AVX2, AVX-512) take the hand-written kernel above: the same
/// instructions as the xsimd kernel, plus the bf16 split and the prefetch, and
/// the same kernel the default build dispatches to, so both builds run at the
/// same speed. AVX-512 takes it too: for a token of 16-bit routers from the
/// last-level cache or DRAM it prefetches the next rows, which the xsimd
/// kernel does not (bf16 per token 1.21-1.69x the read's time with xsimd's
/// 16-wide kernel, 0.98-1.07x with this one), and for f32 its 32-byte loads
/// never split a cache line where xsimd's 64-byte ones split two whenever the
/// rows start 32 bytes past a line (ggml aligns tensor data to 32 bytes).
/// With one 16-bit router in cache xsimd's 16-wide conversions were ~20%
/// faster (docs/benchmarks.md, 2026-12-01); the 512-bit kernel for 16-bit
/// weights (gemv_x86z_impl, taken by x86_tune_default on AVX-512F CPUs) now
/// is faster still, and prefetches. Every other architecture,
/// and every other compiler, takes the xsimd kernel (gemv_simd_generic). Same
/// bits.
template <class Arch, bool Fused>
inline void gemv_simd_impl(const void* data, element_type t, std::size_t rows, std::size_t cols, std::size_t stride,
                           const float* x, float* y, activation_rounding r) noexcept {
#if MOE_RESIDENCY_DETAIL_X86_KERNEL && defined(__AVX2__) && defined(__F16C__)
#if defined(__FMA__)
  constexpr bool can_fuse = true;
#else
  constexpr bool can_fuse = false;
#endif
  if constexpr ((batch_width<Arch>() == 8 || batch_width<Arch>() == 16) && (can_fuse || !Fused)) {
    gemv_x86_impl<Arch, Fused>(data, t, rows, cols, stride, x, y, r);
    return;
  }
#endif
  gemv_simd_generic<Arch, Fused>(data, t, rows, cols, stride, x, y, r);
}

}  // namespace MOE_RESIDENCY_GEMV_ABI
}  // namespace detail
}  // namespace moe_residency
