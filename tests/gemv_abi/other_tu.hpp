#pragma once
// The second translation unit of test_gemv_abi, compiled with the opposite
// MOE_RESIDENCY_FUSED_MADD. Plain types only across the boundary.
#include <cstddef>

namespace gemv_abi_test {
bool other_tu_fused();
float other_tu_gemv(const float* w, const float* x, std::size_t n);
float other_tu_gemv_scalar(const float* w, const float* x, std::size_t n);
const char* other_tu_abi_name();
}  // namespace gemv_abi_test
