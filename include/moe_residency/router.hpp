#pragma once
/// Router math: views of dense router matrices (f32, f16, bf16), GEMV kernels
/// (xsimd, templated on the architecture, plus a scalar reference that is
/// always built) that round like ggml's CPU path, and `router_spec`: each
/// architecture's gating and selection rule, reproducing llama.cpp's
/// `build_moe_ffn` (logits -> probabilities -> optional selection bias and
/// expert-group masking -> top-k -> weights). See docs/router.md.
///
/// The SIMD-free part (matrix views, router_spec, selection, matching) is
/// router/select.hpp; this header adds the GEMV kernels and route_token.

#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "moe_residency/core.hpp"
#include "moe_residency/detail/gemv.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/router/select.hpp"

namespace moe_residency {

namespace detail {
/// The tag gemv/gemv_scalar pass down so their helpers are per-target copies.
#ifndef XSIMD_NO_SUPPORTED_ARCHITECTURE
using gemv_default_tag = xsimd::default_arch;
#else
using gemv_default_tag = void;
#endif
}  // namespace detail

inline namespace MOE_RESIDENCY_GEMV_ABI {  // see detail/gemv.hpp

/// Scalar reference GEMV: y[r] = dot(row r, x) for r < w.rows; x has w.cols
/// floats. Same accumulation order and rounding as the SIMD kernels (see
/// detail/gemv.hpp), so results are bit-identical. noexcept, allocation-free;
/// the view must be valid (matrix_view::validate).
inline void gemv_scalar(const matrix_view& w, const float* x, float* y,
                        activation_rounding rounding = activation_rounding::engine) noexcept {
  MOE_RESIDENCY_ASSERT(w.data != nullptr && w.row_stride_bytes >= w.cols * element_size(w.type));
  detail::gemv_scalar_impl<detail::gemv_default_tag, (MOE_RESIDENCY_FUSED_MADD != 0)>(
      w.data, w.type, w.rows, w.cols, w.row_stride_bytes, x, y, rounding);
}

/// SIMD GEMV for the xsimd architecture Arch (xsimd::batch<float, Arch>), for
/// users who dispatch at run time with xsimd::dispatch from their own
/// translation units. F16 weights convert with F16C / AVX-512 / NEON
/// instructions where the TU is compiled for them, else with an inlined
/// branch-free fallback. noexcept, allocation-free (6 KiB of stack). Fused:
/// whether the multiply-add rounds once; the default is the TU's
/// MOE_RESIDENCY_FUSED_MADD. Everything it calls is instantiated per
/// <Arch, Fused>, so TUs built for different architectures may each call it
/// (see docs/router.md, Limits).
template <class Arch, bool Fused = (MOE_RESIDENCY_FUSED_MADD != 0)>
inline void gemv_simd(const matrix_view& w, const float* x, float* y,
                      activation_rounding rounding = activation_rounding::engine) noexcept {
  MOE_RESIDENCY_ASSERT(w.data != nullptr && w.row_stride_bytes >= w.cols * element_size(w.type));
  detail::gemv_simd_impl<Arch, Fused>(w.data, w.type, w.rows, w.cols, w.row_stride_bytes, x, y, rounding);
}

/// True when `gemv` in this translation unit takes the run-time dispatched
/// AVX2+FMA+F16C kernel: x86-64 GCC/Clang, the TU not compiled for all three
/// (e.g. no -march flags), MOE_RESIDENCY_NO_RUNTIME_DISPATCH not defined, and
/// the CPU (and OS) supporting them. Checked once per process.
inline bool gemv_dispatched() noexcept {
#if MOE_RESIDENCY_DETAIL_GEMV_DISPATCH
  return detail::x86_has_avx2_fma_f16c();
#else
  return false;
#endif
}

/// Name of the kernel `gemv` runs in this translation unit: "scalar", the
/// xsimd architecture's name (e.g. "sse2", "avx512bw"), or, when dispatched,
/// that name + "+avx2-fma-f16c-dispatch" (e.g. "sse2+avx2-fma-f16c-dispatch"),
/// + "+avx512f-16bit" when the CPU also has AVX-512F (f16 and bf16 then run
/// the 512-bit kernel, detail/gemv.hpp).
inline const char* gemv_arch_name() noexcept {
#if MOE_RESIDENCY_DETAIL_GEMV_DISPATCH
  if (gemv_dispatched()) {
    static char name[80] = {};
    static const bool once =
        (std::snprintf(name, sizeof name, "%s+avx2-fma-f16c-dispatch%s", xsimd::default_arch::name(),
                       detail::x86_has_avx512f() ? "+avx512f-16bit" : ""),
         true);
    (void)once;
    return name;
  }
#endif
#ifndef XSIMD_NO_SUPPORTED_ARCHITECTURE
  return xsimd::default_arch::name();
#else
  return "scalar";
#endif
}

/// GEMV with the fastest kernel available: on x86-64 (GCC/Clang) an
/// AVX2+FMA+F16C kernel chosen at run time when the TU is not compiled for
/// those and the CPU has them (see gemv_dispatched), else the best
/// architecture this TU is compiled for (xsimd::default_arch), else the
/// scalar kernel. Bit-identical to gemv_scalar in the same TU (one exception:
/// MOE_RESIDENCY_FUSED_MADD=0 in a TU built with FMA, see docs/router.md).
inline void gemv(const matrix_view& w, const float* x, float* y,
                 activation_rounding rounding = activation_rounding::engine) noexcept {
  MOE_RESIDENCY_ASSERT(w.data != nullptr && w.row_stride_bytes >= w.cols * element_size(w.type));
#if MOE_RESIDENCY_DETAIL_GEMV_DISPATCH
  if (detail::x86_has_avx2_fma_f16c()) {
    detail::gemv_x86_impl<detail::gemv_default_tag, (MOE_RESIDENCY_FUSED_MADD != 0)>(
        w.data, w.type, w.rows, w.cols, w.row_stride_bytes, x, y, rounding);
    return;
  }
#endif
#ifndef XSIMD_NO_SUPPORTED_ARCHITECTURE
  gemv_simd<xsimd::default_arch>(w, x, y, rounding);
#else
  gemv_scalar(w, x, y, rounding);
#endif
}

/// The ABI tag of this TU's GEMV kernels, e.g. "gemv_abi_sse2_nofma_nof16c_unfused_dispatch".
inline const char* gemv_abi_name() noexcept { return MOE_RESIDENCY_GEMV_ABI_STRING(MOE_RESIDENCY_GEMV_ABI); }

}  // namespace MOE_RESIDENCY_GEMV_ABI

inline namespace MOE_RESIDENCY_GEMV_ABI {  // calls gemv: see detail/gemv.hpp

/// Route one token: logits = W·x (gemv, engine rounding by default) into the
/// workspace, then select_experts. False when w.rows != spec.n_experts, on
/// NaN, when the workspace is too small, or on an invalid spec shape.
inline bool route_token(const matrix_view& w, const float* x, const router_spec& spec, routing& out,
                        router_workspace& ws, activation_rounding rounding = activation_rounding::engine) noexcept {
  out.clear();
  if (!detail::spec_usable(spec)) return false;
  if (w.rows != spec.n_experts || ws.capacity() < spec.n_experts) return false;
  float* logits = router_workspace_access::logits(ws).data();
  gemv(w, x, logits, rounding);
  return detail::select_from_usable(spec, logits, out, ws);
}

}  // namespace MOE_RESIDENCY_GEMV_ABI

}  // namespace moe_residency
