// The GEMV kernels' ABI tag (detail/gemv.hpp): two translation units of one
// program built with different GEMV settings each run their own kernels.
// tests/gemv_abi/other_tu.cpp is compiled with the opposite
// MOE_RESIDENCY_FUSED_MADD (tests/gemv_abi.cmake). Without the tag, `gemv` and
// `gemv_scalar` are one inline symbol for both TUs and the linker keeps one
// copy, so one TU silently gets the other's rounding: this test then fails.

#include "moe_residency/router.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "gemv_abi/other_tu.hpp"

using namespace moe_residency;

namespace {

// One row whose dot product rounds differently fused and unfused: elements 0
// and 32 share a lane; (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 needs 25 bits, so the
// unfused second product rounds to cancel the first exactly (0) while the
// fused one keeps -2^-24.
struct fixture {
  std::vector<float> w, x;
  fixture() : w(64, 0.0f), x(64, 0.0f) {
    const float a = 1.0f + std::ldexp(1.0f, -12);
    w[0] = a;
    x[0] = a;
    w[32] = -a;
    x[32] = a;
  }
  matrix_view view() const { return matrix_view::f32(w.data(), 1, 64); }
};

}  // namespace

TEST_CASE("two TUs with different MOE_RESIDENCY_FUSED_MADD keep their own GEMV kernels") {
  const fixture f;
  const matrix_view v = f.view();
  float here_fused = 0, here_unfused = 0;
  // The twin: the kernels with Fused given explicitly (templates: distinct symbols regardless).
  detail::gemv_scalar_impl<detail::gemv_default_tag, true>(v.data, v.type, v.rows, v.cols, v.row_stride_bytes,
                                                           f.x.data(), &here_fused, activation_rounding::engine);
  detail::gemv_scalar_impl<detail::gemv_default_tag, false>(v.data, v.type, v.rows, v.cols, v.row_stride_bytes,
                                                            f.x.data(), &here_unfused, activation_rounding::engine);
  const bool fused_here = MOE_RESIDENCY_FUSED_MADD != 0;
  REQUIRE(gemv_abi_test::other_tu_fused() == !fused_here);
  if (here_fused == here_unfused) {
    // The compiler contracted the unfused multiply-add (docs/router.md, Limits:
    // GCC with FMA in the target): the roundings cannot be told apart here,
    // only the names below.
    MESSAGE("this target contracts the unfused multiply-add; checking the kernels' names only");
  } else {
    const float want_here = fused_here ? here_fused : here_unfused;
    const float want_other = fused_here ? here_unfused : here_fused;
    float y = 0;
    gemv_scalar(v, f.x.data(), &y);
    CHECK(y == want_here);
    gemv(v, f.x.data(), &y);
    CHECK(y == want_here);
    CHECK(gemv_abi_test::other_tu_gemv_scalar(f.w.data(), f.x.data(), 64) == want_other);
    CHECK(gemv_abi_test::other_tu_gemv(f.w.data(), f.x.data(), 64) == want_other);
  }
  // Named apart: the tags differ in exactly the fused part.
  const std::string here = gemv_abi_name(), other = gemv_abi_test::other_tu_abi_name();
  CHECK(here != other);
  CHECK(here.find(fused_here ? "_fused_" : "_unfused_") != std::string::npos);
  CHECK(other.find(fused_here ? "_unfused_" : "_fused_") != std::string::npos);
}
