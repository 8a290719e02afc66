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
/// entry points in router.hpp are kept apart by the ABI tag (gemv/config.hpp;
/// see docs/router.md, Limits).
///
/// The kernels are divided by architecture, each piece under detail/gemv/:
/// config.hpp (MOE_RESIDENCY_FUSED_MADD, the dispatch switches, the ABI
/// tag), intrinsics.hpp (xsimd and the intrinsic headers), scalar.hpp (the
/// reference and the scalar helpers all share), simd.hpp (the generic xsimd
/// kernel, with its x86 and NEON building blocks), x86.hpp (the run-time
/// dispatched x86 kernels: x86_avx2.hpp, x86_avx512.hpp, their shape in
/// x86_tune.hpp). This header includes them all and chooses between the
/// xsimd and x86 kernels (gemv_simd_impl).

#include "moe_residency/detail/gemv/config.hpp"

#include <cstddef>

#include "moe_residency/detail/gemv/intrinsics.hpp"
#include "moe_residency/detail/gemv/scalar.hpp"
#include "moe_residency/detail/gemv/simd.hpp"
#include "moe_residency/detail/gemv/x86.hpp"
#include "moe_residency/element_type.hpp"

namespace moe_residency {
namespace detail {
inline namespace MOE_RESIDENCY_GEMV_ABI {

/// gemv_simd's kernel. In a TU compiled for AVX2 and F16C (and FMA when the
/// multiply-add is fused) on x86-64 GCC/Clang, the 8- and 16-wide
/// architectures (AVX2, AVX-512) take the hand-written kernel (gemv/x86.hpp):
/// the same instructions as the xsimd kernel, plus the bf16 split and the
/// prefetch, and the same kernel the default build dispatches to, so both
/// builds run at the same speed. AVX-512 takes it too: for a token of 16-bit
/// routers from the last-level cache or DRAM it prefetches the next rows,
/// which the xsimd kernel does not (per token its bf16 ran close to the
/// read's time, xsimd's 16-wide kernel well above, in bench_router's
/// BM_token_tunes), and for f32 its 32-byte loads
/// never split a cache line where xsimd's 64-byte ones split two whenever the
/// rows start 32 bytes past a line (ggml aligns tensor data to 32 bytes). With
/// one 16-bit router in cache xsimd's 16-wide conversions were faster
/// (bench_router); the 512-bit kernel for 16-bit
/// weights (gemv_x86z_impl, taken by x86_tune_default on AVX-512F CPUs) now is
/// faster still, and prefetches. Every other architecture, and
/// every other compiler, takes the xsimd kernel (gemv_simd_generic). Same
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
