#pragma once
/// 16-bit float conversions (IEEE binary16 "f16" and bfloat16 "bf16"), scalar
/// and branch-free, written so a compiler inlines and vectorises them. The
/// router's GEMV kernels use the platform's instructions where they exist
/// (F16C, AVX-512, NEON) and these functions everywhere else; all paths give
/// the same bits for every non-NaN input (tested exhaustively).
///
/// Every function is a template on an unused `Tag` (default void) so that the
/// GEMV kernels, which call them with their xsimd architecture as the tag,
/// get a copy per architecture under a distinct mangled name: an out-of-line
/// copy emitted by a TU built with -mavx512f (VEX/EVEX-encoded even for scalar
/// code) can then never be the one an SSE2 TU's kernel links to.

#include <cstdint>
#include <cstring>

namespace moe_residency {
namespace detail {

template <class Tag = void>
inline std::uint32_t float_bits(float f) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

template <class Tag = void>
inline float bits_float(std::uint32_t u) noexcept {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

/// binary16 bits -> float, exact. Subnormals are normalised; infinities keep
/// their sign; a NaN keeps sign and payload and is returned quiet (as F16C's
/// vcvtph2ps and NEON's fcvtl do).
template <class Tag = void>
inline float f16_to_f32(std::uint16_t h) noexcept {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  const std::uint32_t em = static_cast<std::uint32_t>(h) & 0x7fffu;
  // Normal numbers: shift into place and re-bias the exponent by 127 - 15.
  std::uint32_t normal = (em << 13) + 0x38000000u;
  normal += em >= 0x7c00u ? 0x38000000u : 0u;  // inf/NaN: exponent all ones
  normal |= em > 0x7c00u ? 0x00400000u : 0u;   // NaN: quiet bit
  // Subnormals: em units of 2^-24, exact in float.
  const std::uint32_t sub = float_bits<Tag>(static_cast<float>(em) * 0x1p-24f);
  return bits_float<Tag>(sign | (em < 0x0400u ? sub : normal));
}

/// float -> binary16 bits, IEEE round-to-nearest-even (what F16C's vcvtps2ph
/// with imm 0 and ggml's fallback do): overflow rounds to infinity, results
/// below 2^-14 become subnormals, a NaN becomes the canonical quiet NaN
/// 0x7e00 with the input's sign (ggml's fallback; F16C keeps payload bits).
template <class Tag = void>
inline std::uint16_t f32_to_f16_bits(float f) noexcept {
  const std::uint32_t u = float_bits<Tag>(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t a = u & 0x7fffffffu;
  // Normal half: re-bias, then round the 13 dropped bits to nearest even. A
  // carry out of the mantissa correctly bumps the exponent.
  std::uint32_t n = a - 0x38000000u;
  n = (n + 0x0fffu + ((n >> 13) & 1u)) >> 13;
  // Subnormal half: the value is m * 2^(e-150); in units of 2^-24 that is
  // m >> (126 - e), rounded to nearest even. Shifts beyond 31 give 0.
  const std::uint32_t e = a >> 23;
  const std::uint32_t m = (a & 0x7fffffu) | (e != 0 ? 0x800000u : 0u);
  std::uint32_t s = e >= 112u ? 14u : 126u - e;
  s = s > 31u ? 31u : s;
  std::uint32_t q = m >> s;
  const std::uint32_t rem = m & ((1u << s) - 1u);
  const std::uint32_t halfway = 1u << (s - 1u);
  q += static_cast<std::uint32_t>(rem > halfway) | (static_cast<std::uint32_t>(rem == halfway) & (q & 1u));
  std::uint32_t h = a >= 0x38800000u ? n : q;
  h = a >= 0x477ff000u ? 0x7c00u : h;  // >= 65520 rounds to infinity
  h = a > 0x7f800000u ? 0x7e00u : h;   // NaN
  return static_cast<std::uint16_t>(sign | h);
}

/// bfloat16 bits -> float: the upper half of the float, exact.
template <class Tag = void>
inline float bf16_to_f32(std::uint16_t b) noexcept {
  return bits_float<Tag>(static_cast<std::uint32_t>(b) << 16);
}

/// float -> bfloat16 bits as ggml's GGML_FP32_TO_BF16 does: round to nearest
/// even on the upper 16 bits (overflow to infinity, subnormals kept), and a
/// NaN truncated and forced quiet (bit 6 set), sign and high payload kept.
/// (ggml before mid-2024 flushed subnormal inputs to zero; AVX512-BF16 hosts
/// still do. Only |x| < 1.2e-38 is affected.)
template <class Tag = void>
inline std::uint16_t f32_to_bf16_bits(float f) noexcept {
  const std::uint32_t u = float_bits<Tag>(f);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (u >> 16) | 0x40u;
  return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

/// x rounded to the nearest binary16 value (as a float).
template <class Tag = void>
inline float round_to_f16(float x) noexcept {
  return f16_to_f32<Tag>(f32_to_f16_bits<Tag>(x));
}
/// x rounded to the nearest bfloat16 value (as a float), ggml's rule.
template <class Tag = void>
inline float round_to_bf16(float x) noexcept {
  return bf16_to_f32<Tag>(f32_to_bf16_bits<Tag>(x));
}

}  // namespace detail
}  // namespace moe_residency
