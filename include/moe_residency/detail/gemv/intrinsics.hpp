#pragma once
/// xsimd and the target's intrinsic headers (<immintrin.h>, <arm_neon.h>), as
/// the GEMV kernels include them: first, under the pragma below. Part of
/// detail/gemv.hpp.

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
