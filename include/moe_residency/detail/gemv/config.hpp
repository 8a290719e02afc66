#pragma once
/// The GEMV kernels' configuration macros: MOE_RESIDENCY_FUSED_MADD, whether
/// the run-time dispatched x86 kernel is compiled and taken, the ABI tag
/// MOE_RESIDENCY_GEMV_ABI every kernel's inline namespace is named by, and
/// MOE_RESIDENCY_DETAIL_UNROLL. Part of detail/gemv.hpp; every piece under
/// detail/gemv/ includes it first. Standard predefined macros only.

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

// Asks the compiler to unroll the loop that follows completely (constant trip
// counts only), so small arrays of accumulators live in registers at -O2 too.
#if defined(__clang__)
#define MOE_RESIDENCY_DETAIL_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define MOE_RESIDENCY_DETAIL_UNROLL _Pragma("GCC unroll 16")
#else
#define MOE_RESIDENCY_DETAIL_UNROLL
#endif
