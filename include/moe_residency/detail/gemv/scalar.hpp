#pragma once
/// The scalar GEMV reference kernel (gemv_scalar_impl) and the scalar pieces
/// every kernel shares: the lane and block sizes, ggml's lane reduction and
/// the tail after the 32-lane part (finish_dot). Part of detail/gemv.hpp,
/// whose comment gives the accumulation order all kernels follow.

#include "moe_residency/detail/gemv/config.hpp"

#include <cstddef>
#include <cstdint>

#include <math.h>  // ::fmaf

#include "moe_residency/detail/half.hpp"
#include "moe_residency/element_type.hpp"

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

}  // namespace MOE_RESIDENCY_GEMV_ABI
}  // namespace detail
}  // namespace moe_residency
