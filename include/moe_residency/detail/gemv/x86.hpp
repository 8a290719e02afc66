#pragma once
/// The run-time dispatched x86 GEMV kernel's entry point, gemv_x86_impl, and
/// the CPU checks that guard it (CPUID and XGETBV: AVX2+FMA+F16C, AVX-512F).
/// Part of detail/gemv.hpp: `gemv` (router.hpp) calls gemv_x86_impl when the
/// CPU has AVX2+FMA+F16C and the TU is not built for them, gemv_simd_impl
/// (detail/gemv.hpp) when it is. The kernels are gemv/x86_avx2.hpp (256-bit)
/// and gemv/x86_avx512.hpp (512-bit, 16-bit weights).

#include "moe_residency/detail/gemv/config.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "moe_residency/detail/gemv/scalar.hpp"
#include "moe_residency/detail/gemv/x86_avx2.hpp"
#include "moe_residency/detail/gemv/x86_avx512.hpp"
#include "moe_residency/detail/gemv/x86_tune.hpp"
#include "moe_residency/element_type.hpp"

#if MOE_RESIDENCY_DETAIL_X86_KERNEL
namespace moe_residency {
namespace detail {
inline namespace MOE_RESIDENCY_GEMV_ABI {

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
      constexpr std::size_t D = Tune::prefetch_passes;
      if (t == element_type::f16)
        gemv_x86z_impl<Tag, Fused, element_type::f16, Tune::wide_rows, D, Tune::prefetch_locality>(data, rows, cols,
                                                                                                   stride, x, y, r);
      else
        gemv_x86z_impl<Tag, Fused, element_type::bf16, Tune::wide_rows, D, Tune::prefetch_locality>(data, rows, cols,
                                                                                                    stride, x, y, r);
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

}  // namespace MOE_RESIDENCY_GEMV_ABI
}  // namespace detail
}  // namespace moe_residency

#endif  // MOE_RESIDENCY_DETAIL_X86_KERNEL
