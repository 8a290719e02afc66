// test_gemv_abi's second translation unit (see tests/test_gemv_abi.cpp).
#include "other_tu.hpp"

// The opposite of the library's default for this target (detail/gemv.hpp).
#if defined(__FMA__) || defined(__AVX512F__) || defined(__aarch64__) || defined(__ARM_FEATURE_FMA)
#define MOE_RESIDENCY_FUSED_MADD 0
#else
#define MOE_RESIDENCY_FUSED_MADD 1
#endif

#include "moe_residency/router.hpp"

namespace gemv_abi_test {
bool other_tu_fused() { return MOE_RESIDENCY_FUSED_MADD != 0; }
float other_tu_gemv(const float* w, const float* x, std::size_t n) {
  float y = 0;
  moe_residency::gemv(moe_residency::matrix_view::f32(w, 1, n), x, &y);
  return y;
}
float other_tu_gemv_scalar(const float* w, const float* x, std::size_t n) {
  float y = 0;
  moe_residency::gemv_scalar(moe_residency::matrix_view::f32(w, 1, n), x, &y);
  return y;
}
const char* other_tu_abi_name() { return moe_residency::gemv_abi_name(); }
}  // namespace gemv_abi_test
