// Router math: 16-bit conversions, GEMV kernels, gating, groups, top-k,
// tie-aware comparison and validation. Every fast path is checked against a
// slow definition written here. Built twice: default flags (SSE2 / portable
// fallback) and -march=native (F16C, AVX2/AVX-512 paths), see router.cmake.
// test_router_native also links this file a second time, compiled with the
// default flags and MOE_RESIDENCY_TEST_SECOND_TU, which then holds only
// router_second_tu::run below: the xsimd::dispatch pattern (one TU per target,
// one program), checked by "gemv_simd from TUs built for different targets".
#include "moe_residency/router.hpp"

#include <string>

namespace router_second_tu {
/// In this TU's target (default flags): gemv_simd<default_arch, fused> into
/// simd and the scalar kernel into ref (both instantiated here, with this TU's
/// Arch). Returns default_arch's name and whether this TU has FMA macros.
std::string run(const moe_residency::matrix_view& w, const float* x, float* simd, float* ref, bool fused,
                moe_residency::activation_rounding r);
}  // namespace router_second_tu

#if defined(MOE_RESIDENCY_TEST_SECOND_TU)

namespace router_second_tu {
template <bool F>
static void run_impl(const moe_residency::matrix_view& w, const float* x, float* simd, float* ref,
                     moe_residency::activation_rounding r) {
  using namespace moe_residency;
  gemv_simd<detail::gemv_default_tag, F>(w, x, simd, r);
  detail::gemv_scalar_impl<detail::gemv_default_tag, F>(w.data, w.type, w.rows, w.cols, w.row_stride_bytes, x, ref, r);
}

std::string run(const moe_residency::matrix_view& w, const float* x, float* simd, float* ref, bool fused,
                moe_residency::activation_rounding r) {
  if (fused) run_impl<true>(w, x, simd, ref, r);
  else run_impl<false>(w, x, simd, ref, r);
#if defined(__FMA__) || defined(__AVX512F__)
  return std::string(xsimd::default_arch::name()) + " fma";
#else
  return std::string(xsimd::default_arch::name());
#endif
}
}  // namespace router_second_tu

#else  // the test suite

#include <doctest/doctest.h>

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace moe_residency;

namespace {

const float inf = std::numeric_limits<float>::infinity();
const float qnan = std::numeric_limits<float>::quiet_NaN();

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---- slow references from the IEEE 754 definitions -------------------------

// binary16: 1 sign, 5 exponent (bias 15), 10 fraction bits.
double ref_f16_value(std::uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, frac = h & 0x3ff;
  const double mag = exp == 0 ? std::ldexp(static_cast<double>(frac), -24) : std::ldexp(1024.0 + frac, exp - 25);
  return sign ? -mag : mag;
}

// Round |x| (finite, double) to a grid with `mant` fraction bits, minimum
// exponent emin, ties to even; returns the rounded magnitude (may be inf).
double ref_round(double ax, int mant, int emin, double overflow_at) {
  if (ax >= overflow_at) return std::numeric_limits<double>::infinity();
  if (ax == 0.0) return 0.0;
  int e = std::ilogb(ax);
  if (e < emin) e = emin;
  const double q = std::ldexp(1.0, e - mant);
  const double n = ax / q;  // exact: ax is a float, q a power of two
  double r = std::floor(n);
  const double frac = n - r;
  if (frac > 0.5 || (frac == 0.5 && std::fmod(r, 2.0) != 0.0)) r += 1.0;
  return r * q;
}

double ref_to_f16_value(float x) {  // IEEE binary16 RNE, as a double
  const double r = ref_round(std::fabs(static_cast<double>(x)), 10, -14, 65520.0);
  return std::signbit(x) ? -r : r;
}
double ref_to_bf16_value(float x) {  // bfloat16 RNE (float's exponent range)
  const double r = ref_round(std::fabs(static_cast<double>(x)), 7, -126, std::ldexp(2.0 - std::ldexp(1.0, -8), 127));
  return std::signbit(x) ? -r : r;
}

std::vector<float> edge_floats() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.0f,
                          65504.0f,
                          65519.99f,
                          65520.0f,
                          65536.0f,
                          -65520.0f,
                          1e10f,
                          -1e10f,
                          inf,
                          -inf,
                          6.103515625e-05f,
                          6.0975552e-05f /* largest f16 subnormal */,
                          5.9604645e-08f,
                          2.9802322e-08f /* half of the smallest: tie to 0 */,
                          2.9802326e-08f,
                          8.940697e-08f /* 1.5 units: tie to 2 */,
                          1e-30f,
                          -1e-30f,
                          1.17549435e-38f,
                          1e-40f /* f32 subnormal */,
                          3.4028235e38f,
                          -3.4028235e38f,
                          0.1f,
                          1.0009765625f,
                          1.00048828125f /* f16 tie, to even (1.0) */,
                          1.00146484375f /* f16 tie, to even (1.001953125) */,
                          1.00390625f /* bf16 tie to even */,
                          1.01171875f};
  // Every tie between consecutive f16 values across the exponent range.
  for (int e = -24; e <= 15; ++e) v.push_back(std::ldexp(3.0f, e - 1));
  return v;
}

}  // namespace

TEST_CASE("an f16 weight times an f16 activation is exact in float: fused and unfused multiply-add agree") {
  // The premise on which an unfused build's x86 kernel fuses its f16 rows
  // (gemv_x86_impl): for every finite f16 weight w, f16-valued x and float c,
  // fmaf(w, x, c) and (w * x) + c (the product rounded first) are one float.
  std::vector<float> xs = {1.0f, -1.0f, 65504.0f, -65504.0f, 0x1p-24f, -0x1p-24f, 0x1p-14f, 0.0f, -0.0f, 3.140625f};
  std::mt19937 rng(77);
  std::uniform_int_distribution<int> h16(0, 0x7bff);
  while (xs.size() < 24)
    xs.push_back(detail::f16_to_f32(static_cast<std::uint16_t>(h16(rng) | (xs.size() % 2 ? 0x8000 : 0))));
  const float cs[] = {0.0f, -0.0f, 1e-30f, -3.5f, 1e10f, 0x1.fffffep-1f};
  std::size_t checked = 0;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    if (((h >> 10) & 0x1f) == 0x1f) continue;  // inf and NaN
    const float w = detail::f16_to_f32(static_cast<std::uint16_t>(h));
    for (const float x : xs)
      for (const float c : cs) {
        volatile float p = w * x;  // rounded (exactly, as claimed)
        const float unfused = p + c;
        const float fused = ::fmaf(w, x, c);
        if (bits(fused) != bits(unfused)) {
          INFO("w " << w << " x " << x << " c " << c);
          REQUIRE(bits(fused) == bits(unfused));
        }
        ++checked;
      }
  }
  CHECK(checked == 63488u * xs.size() * 6);
}

TEST_CASE("f16 -> f32 is exact for all 65536 bit patterns") {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto hb = static_cast<std::uint16_t>(h);
    const float got = detail::f16_to_f32(hb);
    const int exp = (h >> 10) & 0x1f;
    if (exp == 0x1f && (h & 0x3ff) != 0) {
      // NaN: sign and payload kept, returned quiet.
      const std::uint32_t want = ((h & 0x8000u) << 16) | 0x7fc00000u | ((h & 0x3ffu) << 13);
      REQUIRE(bits(got) == want);
    } else if (exp == 0x1f) {
      REQUIRE(got == ((h & 0x8000u) ? -inf : inf));
    } else {
      REQUIRE(static_cast<double>(got) == ref_f16_value(hb));
      REQUIRE(std::signbit(got) == ((h & 0x8000u) != 0));
    }
  }
}

TEST_CASE("bf16 -> f32 is exact for all 65536 bit patterns") {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const float got = detail::bf16_to_f32(static_cast<std::uint16_t>(h));
    const int sign = h >> 15, exp = (h >> 7) & 0xff, frac = h & 0x7f;
    if (exp == 0xff) {
      REQUIRE(bits(got) == (h << 16));  // inf and NaN bits kept as they are
      continue;
    }
    const double mag = exp == 0 ? std::ldexp(static_cast<double>(frac), -133) : std::ldexp(128.0 + frac, exp - 134);
    REQUIRE(static_cast<double>(got) == (sign ? -mag : mag));
  }
}

TEST_CASE("f32 -> f16 rounds to nearest even (random and edge values)") {
  std::mt19937 rng(1234);
  std::vector<float> xs = edge_floats();
  std::uniform_int_distribution<std::uint32_t> any;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int i = 0; i < 200000; ++i) xs.push_back(from_bits(any(rng)));
  for (int i = 0; i < 200000; ++i) xs.push_back(normal(rng) * std::ldexp(1.0f, (i % 40) - 26));
  for (const float x : xs) {
    const std::uint16_t h = detail::f32_to_f16_bits(x);
    if (std::isnan(x)) {
      REQUIRE(h == static_cast<std::uint16_t>((bits(x) >> 16 & 0x8000u) | 0x7e00u));
      continue;
    }
    const double want = ref_to_f16_value(x);
    const float got = detail::f16_to_f32(h);
    INFO("x = " << x << " bits " << bits(x));
    REQUIRE(static_cast<double>(got) == want);
    REQUIRE(std::signbit(got) == std::signbit(x));
  }
}

TEST_CASE("f32 -> bf16 matches ggml's rule (random and edge values)") {
  std::mt19937 rng(99);
  std::vector<float> xs = edge_floats();
  std::uniform_int_distribution<std::uint32_t> any;
  for (int i = 0; i < 400000; ++i) xs.push_back(from_bits(any(rng)));
  xs.push_back(from_bits(0x7f800001u));  // signalling NaN
  xs.push_back(from_bits(0xffbfffffu));  // negative NaN with payload
  for (const float x : xs) {
    const std::uint16_t b = detail::f32_to_bf16_bits(x);
    if (std::isnan(x)) {
      REQUIRE(b == static_cast<std::uint16_t>((bits(x) >> 16) | 0x40u));
      continue;
    }
    INFO("x = " << x << " bits " << bits(x));
    REQUIRE(static_cast<double>(detail::bf16_to_f32(b)) == ref_to_bf16_value(x));
    REQUIRE(std::signbit(detail::bf16_to_f32(b)) == std::signbit(x));
  }
}

// ---- SIMD loaders over every architecture compiled in ----------------------

template <class Arch>
void check_loaders_exhaustive() {
  using B = xsimd::batch<float, Arch>;
  std::vector<std::uint16_t> all(65536);
  std::iota(all.begin(), all.end(), std::uint16_t{0});
  alignas(64) float out[B::size];
  for (std::size_t i = 0; i < all.size(); i += B::size) {
    detail::load_f16<Arch>(all.data() + i).store_aligned(out);
    for (std::size_t j = 0; j < B::size; ++j) REQUIRE(bits(out[j]) == bits(detail::f16_to_f32(all[i + j])));
    detail::load_bf16<Arch>(all.data() + i).store_aligned(out);
    for (std::size_t j = 0; j < B::size; ++j) REQUIRE(bits(out[j]) == bits(detail::bf16_to_f32(all[i + j])));
  }
}

template <class... Archs>
struct arch_list_t {};

using compiled_archs = arch_list_t<
#if XSIMD_WITH_AVX512BW
    xsimd::avx512bw,
#endif
#if XSIMD_WITH_AVX512F
    xsimd::avx512f,
#endif
#if XSIMD_WITH_FMA3_AVX2
    xsimd::fma3<xsimd::avx2>,
#endif
#if XSIMD_WITH_AVX2
    xsimd::avx2,
#endif
#if XSIMD_WITH_SSE4_2
    xsimd::sse4_2,
#endif
#if XSIMD_WITH_SSE2
    xsimd::sse2,
#endif
#if XSIMD_WITH_NEON64
    xsimd::neon64,
#endif
    void>;

template <class F, class A, class... Rest>
void for_each_arch(arch_list_t<A, Rest...>, F&& f) {
  if constexpr (!std::is_void<A>::value) {
    f(A{});
    for_each_arch(arch_list_t<Rest...>{}, f);
  }
}

TEST_CASE("SIMD f16/bf16 loads equal the scalar conversion for all 65536 patterns, every arch") {
  int n = 0;
  for_each_arch(compiled_archs{}, [&](auto arch) {
    using A = decltype(arch);
    INFO("arch " << A::name());
    check_loaders_exhaustive<A>();
    ++n;
  });
#if defined(__F16C__)
  const char* f16c = "yes";
#else
  const char* f16c = "no";
#endif
  MESSAGE("gemv() runs " << std::string(gemv_arch_name()) << "; F16C compiled: " << std::string(f16c)
                         << "; fused madd: " << MOE_RESIDENCY_FUSED_MADD << "; archs checked: " << n);
#if defined(MOE_RESIDENCY_TEST_NATIVE) && (defined(__x86_64__) || defined(_M_X64))
  // The -march=native twin exists to exercise the native conversion paths.
  CHECK(std::string(gemv_arch_name()) != "sse2");
#endif
}

TEST_CASE("the kernels' block rounding equals the scalar rounding, every arch") {
  // round_block<Arch> picks its instruction from Arch (AVX-512 / F16C / NEON /
  // software), so each arch compiled in is checked, not just the TU's best.
  std::vector<float> xs = edge_floats();
  std::mt19937 rng(5);
  std::uniform_int_distribution<std::uint32_t> any;
  while (xs.size() % 32 != 0 || xs.size() < 4096) xs.push_back(from_bits(any(rng)));
  xs[7] = qnan;
  std::vector<float> out(xs.size());
  for_each_arch(compiled_archs{}, [&](auto arch) {
    using A = decltype(arch);
    for (const element_type t : {element_type::f16, element_type::bf16}) {
      std::fill(out.begin(), out.end(), -1.0f);
      detail::round_block<A>(xs.data(), out.data(), xs.size(), t);
      for (std::size_t i = 0; i < xs.size(); ++i) {
        INFO(A::name() << " " << to_string(t) << " element " << i);
        const float want = t == element_type::f16 ? detail::round_to_f16(xs[i]) : detail::round_to_bf16(xs[i]);
        if (std::isnan(want)) {
          CHECK(std::isnan(out[i]));  // F16C keeps NaN payloads, the fallback does not
        } else {
          REQUIRE(bits(out[i]) == bits(want));
        }
      }
    }
  });
}

// ---- GEMV -------------------------------------------------------------------

namespace {

struct scalar_kernel {
  static constexpr const char* name = "scalar";
  static void run(const matrix_view& w, const float* x, float* y, activation_rounding r) { gemv_scalar(w, x, y, r); }
};
struct simd_kernel {
  static constexpr const char* name = "simd(default_arch)";
  static void run(const matrix_view& w, const float* x, float* y, activation_rounding r) { gemv(w, x, y, r); }
};

template <class Kernel, element_type T>
struct gemv_case {
  using kernel = Kernel;
  static constexpr element_type type = T;
};

/// A random router matrix with `pad` extra elements per row filled with NaN,
/// so reading past a row would poison the result.
struct test_matrix {
  element_type type;
  std::size_t rows, cols, pad;
  std::vector<float> f32;
  std::vector<std::uint16_t> h16;
  std::vector<double> value;  // the exact weight values, rows x cols

  test_matrix(element_type t, std::size_t r, std::size_t c, std::size_t p, std::uint32_t seed)
      : type(t), rows(r), cols(c), pad(p), value(r * c) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, 0.05f);
    const std::size_t ld = cols + pad;
    if (t == element_type::f32) f32.assign(rows * ld, qnan);
    else h16.assign(rows * ld, 0x7e00);  // NaN in both 16-bit formats' padding
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < cols; ++j) {
        const float v = d(rng);
        if (t == element_type::f32) {
          f32[i * ld + j] = v;
          value[i * cols + j] = v;
        } else if (t == element_type::f16) {
          h16[i * ld + j] = detail::f32_to_f16_bits(v);
          value[i * cols + j] = ref_f16_value(h16[i * ld + j]);
        } else {
          h16[i * ld + j] = detail::f32_to_bf16_bits(v);
          value[i * cols + j] = static_cast<double>(detail::bf16_to_f32(h16[i * ld + j]));
        }
      }
  }
  matrix_view view() const {
    const std::size_t stride = (cols + pad) * element_size(type);
    if (type == element_type::f32) return matrix_view::f32(f32.data(), rows, cols, stride);
    if (type == element_type::f16) return matrix_view::f16(h16.data(), rows, cols, stride);
    return matrix_view::bf16(h16.data(), rows, cols, stride);
  }
};

std::vector<float> random_activation(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = d(rng);
  return x;
}

const std::size_t shapes[][3] = {{128, 2048, 0}, {256, 2048, 8}, {13, 2880, 3}, {9, 100, 0}, {1, 7, 1}, {40, 33, 31}};

}  // namespace

TEST_CASE_TEMPLATE("gemv matches a double-precision loop", C, gemv_case<scalar_kernel, element_type::f32>,
                   gemv_case<scalar_kernel, element_type::f16>, gemv_case<scalar_kernel, element_type::bf16>,
                   gemv_case<simd_kernel, element_type::f32>, gemv_case<simd_kernel, element_type::f16>,
                   gemv_case<simd_kernel, element_type::bf16>) {
  // Bound: each output is a float sum of products formed in (n/32 + 6)
  // rounding steps per term at most (32-lane chain, 5 reduction adds, the
  // multiply), so |err| <= (n/32 + 6) * 2^-24 * sum|w x| (Higham's gamma_m,
  // first order). A wrong rounding of x (2^-11 relative for f16) or a
  // skipped/duplicated element is orders of magnitude larger.
  std::uint32_t seed = 7;
  for (const auto& s : shapes) {
    for (const activation_rounding r : {activation_rounding::engine, activation_rounding::none}) {
      const test_matrix m(C::type, s[0], s[1], s[2], seed++);
      const auto x = random_activation(s[1], seed++);
      std::vector<float> y(s[0]);
      C::kernel::run(m.view(), x.data(), y.data(), r);
      for (std::size_t i = 0; i < s[0]; ++i) {
        double want = 0.0, mag = 0.0;
        for (std::size_t j = 0; j < s[1]; ++j) {
          double xv = x[j];
          if (r == activation_rounding::engine && C::type == element_type::f16) xv = ref_to_f16_value(x[j]);
          if (r == activation_rounding::engine && C::type == element_type::bf16) xv = ref_to_bf16_value(x[j]);
          want += m.value[i * s[1] + j] * xv;
          mag += std::fabs(m.value[i * s[1] + j] * xv);
        }
        const double tol = (static_cast<double>(s[1]) / 32.0 + 6.0) * std::ldexp(1.0, -24) * mag;
        INFO(C::kernel::name << " " << to_string(C::type) << " " << s[0] << "x" << s[1] << " pad " << s[2] << " row "
                             << i);
        REQUIRE(std::fabs(static_cast<double>(y[i]) - want) <= tol);
      }
    }
  }
}

TEST_CASE("engine rounding changes f16/bf16 logits and not f32 ones") {
  for (const element_type t : {element_type::f32, element_type::f16, element_type::bf16}) {
    const test_matrix m(t, 64, 1024, 0, 11);
    const auto x = random_activation(1024, 12);
    std::vector<float> a(64), b(64);
    gemv(m.view(), x.data(), a.data(), activation_rounding::engine);
    gemv(m.view(), x.data(), b.data(), activation_rounding::none);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < 64; ++i) differ += a[i] != b[i];
    if (t == element_type::f32) CHECK(differ == 0);
    else CHECK(differ > 32);  // rounding x to 11 or 8 significant bits moves nearly every dot
  }
}

TEST_CASE("simd kernels are bit-identical to the scalar kernel, every arch compiled in") {
  // Same lane layout, same reduction, same fused-or-not multiply-add and the
  // same conversions, so equality is bitwise, not within an ulp bound.
  std::uint32_t seed = 100;
  for (const element_type t : {element_type::f32, element_type::f16, element_type::bf16})
    for (const auto& s : shapes)
      for (const activation_rounding r : {activation_rounding::engine, activation_rounding::none}) {
        const test_matrix m(t, s[0], s[1], s[2], seed++);
        const auto x = random_activation(s[1], seed++);
        std::vector<float> want(s[0]);
        gemv_scalar(m.view(), x.data(), want.data(), r);
        for_each_arch(compiled_archs{}, [&](auto arch) {
          using A = decltype(arch);
          std::vector<float> got(s[0], -1.0f);
          gemv_simd<A>(m.view(), x.data(), got.data(), r);
          for (std::size_t i = 0; i < s[0]; ++i) {
            INFO(A::name() << " " << to_string(t) << " " << s[0] << "x" << s[1] << " row " << i);
            REQUIRE(bits(got[i]) == bits(want[i]));
          }
        });
      }
}

TEST_CASE("the xsimd kernel itself is bit-identical to scalar, every arch compiled in") {
  // gemv_simd sends AVX2 and AVX-512 to the hand-written x86 kernel on GCC and
  // Clang, so the test above no longer reaches gemv_simd_generic for them; it
  // is what other compilers run for those architectures, and it keeps its
  // twin here.
  constexpr bool fused = MOE_RESIDENCY_FUSED_MADD != 0;
  std::uint32_t seed = 300;
  for (const element_type t : {element_type::f32, element_type::f16, element_type::bf16})
    for (const auto& s : shapes) {
      const activation_rounding r = seed % 2 ? activation_rounding::engine : activation_rounding::none;
      const test_matrix m(t, s[0], s[1], s[2], seed++);
      const auto x = random_activation(s[1], seed++);
      const auto w = m.view();
      std::vector<float> want(s[0]);
      gemv_scalar(w, x.data(), want.data(), r);
      for_each_arch(compiled_archs{}, [&](auto arch) {
        using A = decltype(arch);
        std::vector<float> got(s[0], -1.0f);
        detail::gemv_simd_generic<A, fused>(w.data, w.type, w.rows, w.cols, w.row_stride_bytes, x.data(), got.data(),
                                            r);
        for (std::size_t i = 0; i < s[0]; ++i) {
          INFO(A::name() << " " << to_string(t) << " " << s[0] << "x" << s[1] << " row " << i);
          REQUIRE(bits(got[i]) == bits(want[i]));
        }
      });
    }
}

TEST_CASE("interleaved rows: every row remainder and column chunk, bit-identical to scalar") {
  // The kernels run rows in passes of 2-4 (per architecture) with the rest
  // taken 2 or 1 at a time, inside blocks of 32 rows, and columns in chunks of
  // gemv_col_block: every remainder of rows and a column count on each side of
  // one and two chunks, with row padding (NaN) and both roundings, for every
  // architecture compiled in and for gemv() (the dispatched kernel on x86).
  const std::size_t row_counts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 31, 32, 33, 35, 64, 67};
  const std::size_t col_counts[] = {32,
                                    96,
                                    detail::gemv_col_block - 32,
                                    detail::gemv_col_block,
                                    detail::gemv_col_block + 32,
                                    detail::gemv_col_block + 40,
                                    2 * detail::gemv_col_block + 64};
  std::uint32_t seed = 7000;
  std::size_t checked = 0;
  for (const element_type t : {element_type::f32, element_type::f16, element_type::bf16})
    for (const std::size_t rows : row_counts)
      for (const std::size_t cols : col_counts) {
        // Keep the suite quick: big shapes only for a few row counts.
        if (rows * cols > 20000 && rows != 5 && rows != 67) continue;
        if (rows == 67 && cols > detail::gemv_col_block + 40) continue;
        const activation_rounding r = seed % 2 ? activation_rounding::engine : activation_rounding::none;
        const test_matrix m(t, rows, cols, seed % 3 == 0 ? 0 : 5, seed);
        const auto x = random_activation(cols, seed + 1);
        seed += 2;
        std::vector<float> want(rows), got(rows, -1.0f);
        gemv_scalar(m.view(), x.data(), want.data(), r);
        gemv(m.view(), x.data(), got.data(), r);
        for (std::size_t i = 0; i < rows; ++i) {
          INFO("gemv " << to_string(t) << " " << rows << "x" << cols << " row " << i);
          REQUIRE(bits(got[i]) == bits(want[i]));
        }
        for_each_arch(compiled_archs{}, [&](auto arch) {
          using A = decltype(arch);
          std::vector<float> simd(rows, -1.0f);
          gemv_simd<A>(m.view(), x.data(), simd.data(), r);
          for (std::size_t i = 0; i < rows; ++i) {
            INFO(A::name() << " " << to_string(t) << " " << rows << "x" << cols << " row " << i);
            REQUIRE(bits(simd[i]) == bits(want[i]));
          }
        });
        checked += rows;
      }
  CHECK(checked > 500);
}

TEST_CASE("gemv honours a row stride larger than the row") {
  // 4 rows of 40 f16 values inside rows of 64; the gap holds huge values.
  std::vector<std::uint16_t> buf(4 * 64, detail::f32_to_f16_bits(60000.0f));
  std::vector<float> x(40, 1.0f);
  for (std::size_t r = 0; r < 4; ++r)
    for (std::size_t c = 0; c < 40; ++c) buf[r * 64 + c] = detail::f32_to_f16_bits(float(r + 1));
  const auto w = matrix_view::f16(buf.data(), 4, 40, 64 * 2);
  CHECK_NOTHROW(w.validate("router"));
  std::vector<float> y(4), ys(4);
  gemv(w, x.data(), y.data());
  gemv_scalar(w, x.data(), ys.data());
  for (std::size_t r = 0; r < 4; ++r) {
    CHECK(y[r] == doctest::Approx(40.0 * double(r + 1)));
    CHECK(ys[r] == y[r]);
  }
}

// ---- run-time dispatch (x86-64 GCC/Clang) ---------------------------------

TEST_CASE("gemv reports the path it takes") {
  const std::string name = gemv_arch_name();
#ifndef XSIMD_NO_SUPPORTED_ARCHITECTURE
  const std::string compiled = xsimd::default_arch::name();
#else
  const std::string compiled = "scalar";
#endif
  MESSAGE("gemv() takes " << name << " (dispatch compiled into gemv: " << MOE_RESIDENCY_DETAIL_GEMV_DISPATCH
                          << ", fused madd: " << MOE_RESIDENCY_FUSED_MADD << ")");
#if MOE_RESIDENCY_DETAIL_X86_KERNEL
  const bool cpu = detail::x86_has_avx2_fma_f16c();
  MESSAGE("CPU has AVX2+FMA+F16C: " << std::string(cpu ? "yes" : "no"));
#else
  const bool cpu = false;
#endif
#if MOE_RESIDENCY_DETAIL_GEMV_DISPATCH
  CHECK(gemv_dispatched() == cpu);
#else
  (void)cpu;
  CHECK_FALSE(gemv_dispatched());
#endif
#if MOE_RESIDENCY_DETAIL_X86_KERNEL
  const std::string wide = detail::x86_has_avx512f() ? "+avx512f-16bit" : "";
  MESSAGE("CPU has AVX-512F (f16 and bf16 on the 512-bit kernel): " << std::string(wide.empty() ? "no" : "yes"));
#else
  const std::string wide;
#endif
  if (gemv_dispatched()) CHECK(name == compiled + "+avx2-fma-f16c-dispatch" + wide);
  else CHECK(name == compiled);
#if defined(__x86_64__) && defined(__GNUC__) && !defined(MOE_RESIDENCY_NO_RUNTIME_DISPATCH)
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  // Compiled for the features already (the -march=native twin): the xsimd
  // path, never the dispatch.
  CHECK(MOE_RESIDENCY_DETAIL_GEMV_DISPATCH == 0);
#else
  // A TU without them (the default build) is what the dispatch exists for.
  CHECK(MOE_RESIDENCY_DETAIL_GEMV_DISPATCH == 1);
#endif
#endif
}

#if MOE_RESIDENCY_DETAIL_X86_KERNEL

namespace {

bool skip_without_avx2_fma_f16c() {
  if (detail::x86_has_avx2_fma_f16c()) return false;
  MESSAGE("SKIPPED: this CPU lacks AVX2+FMA+F16C; the dispatched kernel cannot run here");
  return true;
}

// Odd sizes around the 32-lane, 32-row and 512-column blocks, with strides.
const std::size_t dispatch_shapes[][3] = {{1, 1, 0},     {1, 31, 0},     {1, 32, 0},    {2, 33, 5},    {31, 63, 1},
                                          {32, 64, 0},   {33, 95, 7},    {65, 511, 0},  {17, 512, 2},  {40, 513, 9},
                                          {3, 1055, 31}, {128, 2048, 0}, {64, 2880, 8}, {7, 4099, 13}, {300, 100, 0}};

// x86_gemv_rows with the multiply-add variant chosen at run time, x unrounded.
template <element_type T>
void rows_kernel(bool fused, const char* base, std::size_t rows, std::size_t cols, const matrix_view& w,
                 const std::vector<float>& x, float (*acc)[32]) {
  if (fused) detail::x86_gemv_rows<T, true>(base, rows, cols, w.row_stride_bytes, x.data(), false, acc);
  else detail::x86_gemv_rows<T, false>(base, rows, cols, w.row_stride_bytes, x.data(), false, acc);
}

}  // namespace

TEST_CASE("the dispatched AVX2 kernel is bit-identical to gemv_scalar") {
  if (skip_without_avx2_fma_f16c()) return;
  std::uint32_t seed = 500;
  std::size_t rows_checked = 0;
  for (const element_type t : {element_type::f32, element_type::f16, element_type::bf16})
    for (const auto& s : dispatch_shapes)
      for (const activation_rounding r : {activation_rounding::engine, activation_rounding::none}) {
        const test_matrix m(t, s[0], s[1], s[2], seed++);
        const auto x = random_activation(s[1], seed++);
        const auto w = m.view();
        std::vector<float> want(s[0]), got(s[0], -1.0f), via_gemv(s[0], -1.0f), narrow(s[0], -1.0f);
        gemv_scalar(w, x.data(), want.data(), r);
        detail::gemv_x86_impl<detail::gemv_default_tag, (MOE_RESIDENCY_FUSED_MADD != 0)>(
            w.data, w.type, w.rows, w.cols, w.row_stride_bytes, x.data(), got.data(), r);
        // The 256-bit kernel alone (the default takes the 512-bit one for 16-bit weights on AVX-512F).
        detail::gemv_x86_impl<detail::gemv_default_tag, (MOE_RESIDENCY_FUSED_MADD != 0), detail::x86_tune_narrow>(
            w.data, w.type, w.rows, w.cols, w.row_stride_bytes, x.data(), narrow.data(), r);
        gemv(w, x.data(), via_gemv.data(), r);
        for (std::size_t i = 0; i < s[0]; ++i) {
          INFO(to_string(t) << " " << s[0] << "x" << s[1] << " pad " << s[2] << " row " << i);
          REQUIRE(bits(got[i]) == bits(want[i]));
          REQUIRE(bits(narrow[i]) == bits(want[i]));
          REQUIRE(bits(via_gemv[i]) == bits(want[i]));
        }
        rows_checked += s[0];
      }
  CHECK(rows_checked > 3000);
}

TEST_CASE(
    "the 512-bit kernel for 16-bit weights is bit-identical to gemv_scalar, fused and unfused, every pass shape") {
  if (skip_without_avx2_fma_f16c()) return;
  if (!detail::x86_has_avx512f()) {
    MESSAGE("SKIPPED: this CPU lacks AVX-512F; the 512-bit kernel cannot run here (the 256-bit one is tested above)");
    return;
  }
  constexpr bool fused = MOE_RESIDENCY_FUSED_MADD != 0;
  using tag = detail::gemv_default_tag;
  using kernel =
      void (*)(const void*, std::size_t, std::size_t, std::size_t, const float*, float*, activation_rounding);
  using detail::gemv_x86z_impl;
  constexpr element_type f16 = element_type::f16, bf16 = element_type::bf16;
  // Rows per pass 4, 6 (two passes ahead, into L2), 3 and 1, prefetching or not (the default, 2, runs in the
  // test above through gemv_x86_impl); and the other multiply-add, whose twin is
  // the 256-bit kernel's (per-lane loop below).
  const kernel k16[] = {gemv_x86z_impl<tag, fused, f16, 4, 1>, gemv_x86z_impl<tag, fused, f16, 6, 2, 1>,
                        gemv_x86z_impl<tag, fused, f16, 3, 0>, gemv_x86z_impl<tag, fused, f16, 1, 1>,
                        gemv_x86z_impl<tag, !fused, f16, 4, 1>};
  const kernel kb16[] = {gemv_x86z_impl<tag, fused, bf16, 4, 1>, gemv_x86z_impl<tag, fused, bf16, 6, 2, 1>,
                         gemv_x86z_impl<tag, fused, bf16, 3, 0>, gemv_x86z_impl<tag, fused, bf16, 1, 1>,
                         gemv_x86z_impl<tag, !fused, bf16, 4, 1>};
  std::uint32_t seed = 2600;
  std::size_t compared = 0;
  for (const element_type t : {f16, bf16})
    for (std::size_t k = 0; k < 5; ++k)
      for (const auto& s : dispatch_shapes)
        for (const activation_rounding r : {activation_rounding::engine, activation_rounding::none}) {
          const test_matrix m(t, s[0], s[1], s[2], seed++);
          const auto x = random_activation(s[1], seed++);
          const auto w = m.view();
          std::vector<float> want(s[0]), got(s[0], -1.0f);
          if (k == 4)
            detail::gemv_x86_impl<tag, !fused, detail::x86_tune_narrow>(w.data, w.type, w.rows, w.cols,
                                                                        w.row_stride_bytes, x.data(), want.data(), r);
          else gemv_scalar(w, x.data(), want.data(), r);
          (t == f16 ? k16 : kb16)[k](w.data, w.rows, w.cols, w.row_stride_bytes, x.data(), got.data(), r);
          for (std::size_t i = 0; i < s[0]; ++i) {
            INFO(to_string(t) << " kernel " << k << " " << s[0] << "x" << s[1] << " pad " << s[2] << " row " << i);
            REQUIRE(bits(got[i]) == bits(want[i]));
          }
          compared += s[0];
        }
  CHECK(compared > 10000);
}

TEST_CASE("every x86_tune shape bench_router times is bit-identical to gemv_scalar") {
  // Rows per pass and prefetching change only the schedule, never a lane's
  // order: 2-4 rows (each remainder), no prefetch, whole next rows, a head,
  // every line a distance ahead in its row (in-row), other cache levels, and
  // f16 in sweeps of two lane groups.
  if (skip_without_avx2_fma_f16c()) return;
  constexpr bool fused = MOE_RESIDENCY_FUSED_MADD != 0;
  using tag = detail::gemv_default_tag;
  using kernel = void (*)(const void*, element_type, std::size_t, std::size_t, std::size_t, const float*, float*,
                          activation_rounding);
  const kernel kernels[] = {
      detail::gemv_x86_impl<tag, fused, detail::x86_tune<2, 2, 3, 0> >,
      detail::gemv_x86_impl<tag, fused, detail::x86_tune<3, 3, 3, 1> >,
      // the defaults before: f32 4 and 3 rows, 16-bit rows one pass ahead into L1
      detail::gemv_x86_impl<tag, fused, detail::x86_tune<4, 3, 3, 1, 0, 0, false, false, 3, 4, 2> >,
      detail::gemv_x86_impl<tag, !fused, detail::x86_tune<3, 3, 2, 1, 0, 0, false, false, 3, 4, 2> >,
      detail::gemv_x86_impl<tag, fused, detail::x86_tune<4, 4, 4, 1, 4, 4> >,
      detail::gemv_x86_impl<tag, fused, detail::x86_tune<3, 3, 2, 1, 32, 16> >,
      detail::gemv_x86_impl<tag, !fused, detail::x86_tune<4, 2, 2, 1> >,
      detail::gemv_x86_impl<tag, fused, detail::x86_tune<3, 3, 2, 1, 16, 16, true, true, 2> >,
      detail::gemv_x86_impl<tag, fused, detail::x86_tune<2, 3, 2, 1, 8, 32, false, true, 0> >,
      detail::gemv_x86_impl<tag, fused, detail::x86_tune<3, 2, 3, 1, 64, 1, true, true> >,
      // f16 in sweeps of 2 lane groups (x86_pass_split): 6 rows (5 + a 3-row and a 2-row
      // remainder in 32), 5 rows prefetched, 4 rows unfused
      detail::gemv_x86_impl<tag, fused, detail::x86_tune<3, 6, 2, 0, 0, 0, false, false, 3, 2> >,
      detail::gemv_x86_impl<tag, fused, detail::x86_tune<3, 5, 2, 1, 0, 0, false, false, 3, 2> >,
      detail::gemv_x86_impl<tag, !fused, detail::x86_tune<3, 4, 2, 1, 0, 0, false, false, 3, 2> >};
  std::uint32_t seed = 1700;
  std::size_t compared = 0;
  for (const element_type t : {element_type::f32, element_type::f16, element_type::bf16})
    for (std::size_t k = 0; k < std::size(kernels); ++k)
      for (const auto& s : {dispatch_shapes[5], dispatch_shapes[10], dispatch_shapes[11], dispatch_shapes[13]}) {
        const test_matrix m(t, s[0], s[1], s[2], seed++);
        const auto x = random_activation(s[1], seed++);
        const auto w = m.view();
        std::vector<float> want(s[0]), got(s[0], -1.0f);
        if (k == 3 || k == 6 || k == 12) {  // the other multiply-add: the per-lane loop of the next test is its twin
          detail::gemv_x86_impl<tag, !fused>(w.data, w.type, w.rows, w.cols, w.row_stride_bytes, x.data(), want.data(),
                                             activation_rounding::engine);
        } else {
          gemv_scalar(w, x.data(), want.data(), activation_rounding::engine);
        }
        kernels[k](w.data, w.type, w.rows, w.cols, w.row_stride_bytes, x.data(), got.data(),
                   activation_rounding::engine);
        for (std::size_t i = 0; i < s[0]; ++i) {
          INFO(to_string(t) << " tune " << k << " " << s[0] << "x" << s[1] << " row " << i);
          REQUIRE(bits(got[i]) == bits(want[i]));
        }
        compared += s[0];
      }
  CHECK(compared > 1000);
}

TEST_CASE("the dispatched kernel's lanes equal a per-lane loop, fused and unfused") {
  // x86_gemv_rows fills the 32 lanes; check both multiply-add variants in
  // every build (gemv uses the one MOE_RESIDENCY_FUSED_MADD names) against an
  // obvious loop: lane e%32 += w[e]*x[e], as one fma or as a rounded product
  // (volatile, so the compiler cannot contract it) then an add. x is not
  // rounded: with engine rounding an f16/bf16 product has <= 22 significant
  // bits, is exact in float, and fused and unfused agree.
  if (skip_without_avx2_fma_f16c()) return;
  std::uint32_t seed = 900;
  for (const element_type t : {element_type::f32, element_type::f16, element_type::bf16})
    for (const bool fused : {false, true}) {
      const std::size_t rows = 19, cols = 1056, pad = 3;  // 1056 = 2 col blocks + 32
      const test_matrix m(t, rows, cols, pad, seed++);
      const auto x = random_activation(cols, seed++);
      const auto& xr = x;
      const auto w = m.view();
      alignas(32) float acc[32][32];
      const char* base = static_cast<const char*>(w.data);
      switch (t) {
        case element_type::f32: rows_kernel<element_type::f32>(fused, base, rows, cols, w, x, acc); break;
        case element_type::f16: rows_kernel<element_type::f16>(fused, base, rows, cols, w, x, acc); break;
        case element_type::bf16: rows_kernel<element_type::bf16>(fused, base, rows, cols, w, x, acc); break;
      }
      std::size_t differ_from_other = 0;
      for (std::size_t rr = 0; rr < rows; ++rr) {
        float lane[32] = {}, other[32] = {};
        const void* p = base + rr * w.row_stride_bytes;
        for (std::size_t e = 0; e < cols; ++e) {
          const float wv = detail::load_scalar(p, t, e);
          volatile float prod = wv * xr[e];
          const float f = std::fma(wv, xr[e], fused ? lane[e % 32] : other[e % 32]);
          const float u = prod + (fused ? other[e % 32] : lane[e % 32]);
          (fused ? lane : other)[e % 32] = f;
          (fused ? other : lane)[e % 32] = u;
        }
        for (std::size_t i = 0; i < 32; ++i) {
          INFO(to_string(t) << (fused ? " fused" : " unfused") << " row " << rr << " lane " << i);
          REQUIRE(bits(acc[rr][i]) == bits(lane[i]));
          differ_from_other += bits(lane[i]) != bits(other[i]);
        }
      }
      CHECK(differ_from_other > 0);  // the two variants are told apart by this data
    }
}

TEST_CASE("the dispatched kernel's block rounding equals the scalar rounding") {
  if (skip_without_avx2_fma_f16c()) return;
  std::vector<float> xs = edge_floats();
  std::mt19937 rng(6);
  std::uniform_int_distribution<std::uint32_t> any;
  while (xs.size() % 32 != 0 || xs.size() < 8192) xs.push_back(from_bits(any(rng)));
  xs[3] = qnan;
  xs[4] = -qnan;
  xs[5] = from_bits(0x7fbfffffu);  // signalling NaN with a full payload
  xs[6] = from_bits(0xffff8001u);  // a NaN whose rounding carry would wrap
  std::vector<float> out(xs.size());
  for (const element_type t : {element_type::f16, element_type::bf16}) {
    detail::x86_round_block(xs.data(), out.data(), xs.size(), t);
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const float want = t == element_type::f16 ? detail::round_to_f16(xs[i]) : detail::round_to_bf16(xs[i]);
      INFO(to_string(t) << " input bits " << bits(xs[i]));
      if (t == element_type::f16 && std::isnan(want)) {
        CHECK(std::isnan(out[i]));  // F16C keeps NaN payloads, the fallback does not
      } else {
        REQUIRE(bits(out[i]) == bits(want));  // bf16: NaNs too, bit for bit
      }
    }
  }
}

#endif  // MOE_RESIDENCY_DETAIL_X86_KERNEL

TEST_CASE("matrix_view rejects views it cannot read") {
  std::vector<float> f(64);
  std::vector<std::uint16_t> h(64);
  SUBCASE("null data") {
    CHECK_THROWS_WITH_AS(matrix_view::f32(nullptr, 4, 8).validate("layer 3 router"),
                         "layer 3 router: data is null; expected a router matrix", error);
  }
  SUBCASE("zero rows") {
    CHECK_THROWS_WITH_AS(matrix_view::f32(f.data(), 0, 8).validate("router"),
                         "router: rows 0 out of range; expected [1, 65535] experts", error);
  }
  SUBCASE("zero cols") {
    CHECK_THROWS_WITH_AS(matrix_view::f32(f.data(), 4, 0, 16).validate("router"),
                         "router: cols 0; expected the embedding length (> 0)", error);
  }
  SUBCASE("stride shorter than a row") {
    CHECK_THROWS_WITH_AS(matrix_view::f16(h.data(), 4, 16, 30).validate("router"),
                         "router: row stride 30 bytes is shorter than a row (16 f16 = 32 bytes); "
                         "expected >= 32",
                         error);
  }
  SUBCASE("misaligned data") {
    const auto* p = reinterpret_cast<const std::uint16_t*>(reinterpret_cast<const char*>(h.data()) + 1);
    CHECK_THROWS_WITH_AS(matrix_view::bf16(p, 2, 8).validate("router"),
                         "router: data is not aligned to 2 bytes; expected bf16 elements at "
                         "aligned addresses",
                         error);
  }
  SUBCASE("stride not whole elements") {
    CHECK_THROWS_WITH_AS(matrix_view::f32(f.data(), 2, 8, 34).validate("router"),
                         "router: row stride 34 bytes is not a multiple of the element size 4; "
                         "expected whole elements",
                         error);
  }
  SUBCASE("too many experts") { CHECK_THROWS_AS(matrix_view::f32(f.data(), 70000, 1).validate("router"), error); }
  SUBCASE("packed default stride") {
    const auto v = matrix_view::bf16(h.data(), 4, 16);
    CHECK(v.row_stride_bytes == 32);
    CHECK(v.bytes() == 128);
    CHECK_NOTHROW(v.validate("router"));
  }
}

// ---- top-k ------------------------------------------------------------------

TEST_CASE("top_k equals a full sort with the tie rule") {
  std::mt19937 rng(42);
  for (int trial = 0; trial < 2000; ++trial) {
    // n past top_k_keys_max too: both of top_k_indices's paths (the insertion
    // buffer, and the rank keys from 16k >= n while n <= 512)
    const std::size_t n = 1 + rng() % 700;
    const std::size_t k = 1 + rng() % std::min<std::size_t>(n, 32);
    std::vector<float> s(n);
    const int levels = 1 + static_cast<int>(rng() % 20);  // few levels = many exact ties
    for (auto& v : s) v = static_cast<float>(static_cast<int>(rng() % levels)) * 0.25f - 1.0f;
    if (trial % 7 == 0) s[rng() % n] = qnan;
    if (trial % 5 == 0) s[rng() % n] = -inf;
    if (trial % 3 == 0)  // -0 ties +0 (the rank keys must not order them)
      for (auto& v : s)
        if (v == 0.0f && rng() % 2 == 0) v = -0.0f;
    if (trial % 11 == 0)  // mostly NaN: the k-th can be a NaN while blocks are skipped
      for (auto& v : s)
        if (rng() % 4 != 0) v = qnan;
    std::vector<std::size_t> order(n);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      const bool na = std::isnan(s[a]), nb = std::isnan(s[b]);
      if (na != nb) return nb;  // NaN last
      if (!na && s[a] != s[b]) return s[a] > s[b];
      return a < b;
    });
    std::vector<expert_id> got(k);
    top_k(s.data(), n, k, got.data());
    for (std::size_t i = 0; i < k; ++i) REQUIRE(to_index(got[i]) == order[i]);
  }
}

// ---- gating and selection ---------------------------------------------------

namespace {

std::vector<float> random_logits(std::size_t n, std::uint32_t seed, float sd = 2.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Brute-force selection from the definition in build_moe_ffn, in double where
// the engine does float math (so only the ids are compared exactly).
struct brute_result {
  std::vector<std::size_t> ids;
  std::vector<double> weights;
  std::vector<double> probs;
};

brute_result brute_select(const router_spec& sp, const std::vector<float>& logits) {
  const std::size_t n = sp.n_experts;
  std::vector<double> z(n), p(n), s(n);
  for (std::size_t i = 0; i < n; ++i)
    z[i] = static_cast<double>(logits[i]) + (sp.logit_bias.empty() ? 0.0 : sp.logit_bias[i]);
  if (sp.gating == gating_function::softmax) {
    const double mx = *std::max_element(z.begin(), z.end());
    double sum = 0;
    for (std::size_t i = 0; i < n; ++i) sum += std::exp(z[i] - mx);
    for (std::size_t i = 0; i < n; ++i) p[i] = std::exp(z[i] - mx) / sum;
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      if (sp.gating == gating_function::sigmoid) p[i] = 1.0 / (1.0 + std::exp(-z[i]));
      else if (sp.gating == gating_function::sqrt_softplus) p[i] = std::sqrt(std::log1p(std::exp(z[i])));
      else p[i] = z[i];
    }
  }
  for (std::size_t i = 0; i < n; ++i)
    s[i] = sp.select_on_logits ? z[i] : p[i] + (sp.selection_bias.empty() ? 0.0 : sp.selection_bias[i]);
  if (sp.n_groups > 1) {
    const std::size_t epg = n / sp.n_groups;
    std::vector<std::pair<double, std::size_t> > gs;
    for (std::size_t g = 0; g < sp.n_groups; ++g) {
      std::vector<double> v(s.begin() + g * epg, s.begin() + (g + 1) * epg);
      std::sort(v.rbegin(), v.rend());
      gs.push_back({v[0] + v[1], g});
    }
    std::sort(gs.begin(), gs.end(),
              [](auto a, auto b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
    std::vector<bool> keep(sp.n_groups, false);
    for (std::size_t j = 0; j < sp.n_group_used; ++j) keep[gs[j].second] = true;
    for (std::size_t i = 0; i < n; ++i)
      if (!keep[i / epg]) s[i] = -std::numeric_limits<double>::infinity();
  }
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return s[a] > s[b]; });
  brute_result r;
  r.probs = p;
  r.ids.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(sp.top_k));
  for (const auto i : r.ids) r.weights.push_back(p[i]);
  if (sp.gating == gating_function::softmax_weight) {
    const double mx = *std::max_element(r.weights.begin(), r.weights.end());
    double sum = 0;
    for (auto& w : r.weights) sum += std::exp(w - mx);
    for (auto& w : r.weights) w = std::exp(w - mx) / sum;
  }
  if (sp.normalize_weights) {
    double sum = std::accumulate(r.weights.begin(), r.weights.end(), 0.0);
    sum = std::max(sum, 6.103515625e-5);
    for (auto& w : r.weights) w /= sum;
  }
  if (sp.scale_weights)
    for (auto& w : r.weights) w *= sp.weight_scale;
  return r;
}

void check_against_brute(const router_spec& sp, const std::vector<float>& logits) {
  router_workspace ws(sp);
  routing out;
  REQUIRE(select_experts(sp, logits.data(), out, ws));
  const brute_result b = brute_select(sp, logits);
  REQUIRE(out.size() == sp.top_k);
  for (std::size_t i = 0; i < sp.top_k; ++i) {
    INFO(to_string(sp.gating) << " slot " << i);
    CHECK(to_index(out.id(i)) == b.ids[i]);
    CHECK(static_cast<double>(out.weight(i)) == doctest::Approx(b.weights[i]).epsilon(1e-5));
  }
  for (std::size_t i = 0; i < sp.n_experts; ++i)
    CHECK(static_cast<double>(ws.probs()[i]) == doctest::Approx(b.probs[i]).epsilon(1e-5));
}

}  // namespace

TEST_CASE("every gating function matches its definition") {
  std::uint32_t seed = 300;
  for (int trial = 0; trial < 50; ++trial) {
    const auto logits = random_logits(128, seed++);
    SUBCASE("softmax, normalised (qwen3moe)") { check_against_brute(router_spec::qwen3moe(128, 8), logits); }
    SUBCASE("softmax, raw weights") {
      router_spec sp = router_spec::qwen3moe(128, 6);
      sp.normalize_weights = false;
      check_against_brute(sp, logits);
    }
    SUBCASE("sigmoid, scaled") {
      router_spec sp;
      sp.gating = gating_function::sigmoid;
      sp.n_experts = 128;
      sp.top_k = 8;
      sp.normalize_weights = true;
      sp.scale_weights = true;
      sp.weight_scale = 2.5f;
      check_against_brute(sp, logits);
    }
    SUBCASE("softmax_weight with logit bias (gpt-oss)") {
      check_against_brute(router_spec::gpt_oss(random_logits(128, seed + 1000, 0.5f), 4), logits);
    }
    SUBCASE("sqrt_softplus") {
      router_spec sp;
      sp.gating = gating_function::sqrt_softplus;
      sp.n_experts = 128;
      sp.top_k = 6;
      sp.normalize_weights = true;
      check_against_brute(sp, logits);
    }
    SUBCASE("llama4: ranks logits, weights are sigmoid") { check_against_brute(router_spec::llama4(128, 1), logits); }
  }
}

TEST_CASE("softplus switches to identity above 20 like ggml") {
  CHECK(detail::gate_one(gating_function::sqrt_softplus, 25.0f) == std::sqrt(25.0f));
  CHECK(detail::gate_one(gating_function::sqrt_softplus, 0.0f) == doctest::Approx(std::sqrt(std::log(2.0))));
}

TEST_CASE("group masking matches a brute-force re-implementation") {
  std::mt19937 rng(77);
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t groups = trial % 2 ? 8 : 4;
    const std::size_t n = groups * (2 + rng() % 8);
    const std::size_t used = 1 + rng() % groups;
    const std::size_t k = 1 + rng() % std::min<std::size_t>(used * (n / groups), 8);
    auto logits = random_logits(n, 500 + static_cast<std::uint32_t>(trial));
    auto bias = random_logits(n, 900 + static_cast<std::uint32_t>(trial), 0.1f);
    const router_spec sp = router_spec::deepseek_v3(bias, n, k, groups, used, 2.5f);
    check_against_brute(sp, logits);
    // Masked experts are exactly those outside the kept groups.
    router_workspace ws(sp);
    routing out;
    REQUIRE(select_experts(sp, logits.data(), out, ws));
    std::size_t masked = 0;
    for (const float v : ws.selection_scores()) masked += v == -inf;
    CHECK(masked == (groups - used) * (n / groups));
  }
}

TEST_CASE("weights: normalisation sum is clamped like ggml") {
  router_spec sp;
  sp.gating = gating_function::sigmoid;
  sp.n_experts = 8;
  sp.top_k = 2;
  sp.normalize_weights = true;
  const std::vector<float> logits = {-30, -30, -31, -32, -33, -34, -35, -36};
  router_workspace ws(sp);
  routing out;
  REQUIRE(select_experts(sp, logits.data(), out, ws));
  const float p0 = 1.0f / (1.0f + std::exp(30.0f));
  CHECK(out.weight(0) == doctest::Approx(p0 / 6.103515625e-5f));  // not ~0.5
  CHECK(out.weight(0) < 0.01f);
}

TEST_CASE("select_experts refuses NaN instead of answering") {
  const router_spec sp = router_spec::qwen3moe(16, 4);
  router_workspace ws(sp);
  routing out;
  out.push_back(expert_id{3}, 1.0f);
  auto logits = random_logits(16, 1);
  logits[9] = qnan;
  CHECK_FALSE(select_experts(sp, logits.data(), out, ws));
  CHECK(out.empty());
  logits[9] = inf;  // softmax of +inf is NaN in float: also refused
  CHECK_FALSE(select_experts(sp, logits.data(), out, ws));
  router_workspace small(4);
  logits[9] = 0.0f;
  CHECK_FALSE(select_experts(sp, logits.data(), out, small));
  CHECK(select_experts(sp, logits.data(), out, ws));
  CHECK(out.size() == 4);
}

TEST_CASE("selection refuses specs validate() would reject instead of reading out of bounds") {
  // router_spec's fields are public, so a spec can reach the noexcept
  // functions unvalidated. Each broken shape must give false (out empty),
  // never a write past the 32-entry stack arrays or a read past a bias.
  // Under ASan/UBSan (or just -D_GLIBCXX_ASSERTIONS) the old code faulted here.
  const std::size_t n = 64;
  const auto logits = random_logits(n, 11);
  const test_matrix m(element_type::f32, n, 64, 0, 12);
  const auto x = random_activation(64, 13);
  router_workspace ws(256);
  const router_spec good = router_spec::deepseek_v3(std::vector<float>(n, 0.01f), n, 6, 8, 4, 2.5f);
  auto all_refuse = [&](const router_spec& sp) {
    routing out;
    out.push_back(expert_id{1}, 1.0f);
    ranking rk;
    rk.push_back(expert_id{1}, 1.0f, 1.0f);
    const expert_id ids[2] = {expert_id{0}, expert_id{1}};
    float w[2] = {-1.0f, -1.0f};
    bool any = compute_selection_scores(sp, logits.data(), ws);
    any |= ws.selection_scores().size() != 0;
    any |= select_experts(sp, logits.data(), out, ws) || !out.empty();
    any |= rank_experts(sp, logits.data(), rk, ws) || !rk.empty();
    any |= expert_weights(sp, logits.data(), span<const expert_id>(ids, 2), w, ws);
    any |= w[0] != -1.0f || w[1] != -1.0f;
    out.push_back(expert_id{1}, 1.0f);
    any |= route_token(m.view(), x.data(), sp, out, ws) || !out.empty();
    bool threw = false;
    try {
      sp.validate();
    } catch (const error&) {
      threw = true;
    }
    CHECK(threw);  // the same specs validate() rejects
    return !any;
  };
  // The good spec is accepted by all of them (so the refusals below are not vacuous).
  {
    routing out;
    ranking rk;
    const expert_id ids[2] = {expert_id{0}, expert_id{1}};
    float w[2];
    CHECK(select_experts(good, logits.data(), out, ws));
    CHECK(out.size() == 6);
    CHECK(rank_experts(good, logits.data(), rk, ws));
    CHECK(expert_weights(good, logits.data(), span<const expert_id>(ids, 2), w, ws));
    CHECK(route_token(m.view(), x.data(), good, out, ws));
  }
  auto broken = [&](auto&& mutate) {
    router_spec sp = good;
    mutate(sp);
    return sp;
  };
  CHECK(all_refuse(broken([](router_spec& s) { s.top_k = 0; })));
  CHECK(all_refuse(broken([](router_spec& s) { s.top_k = 33; })));  // > max_top_k: stack overflow before
  CHECK(all_refuse(broken([](router_spec& s) { s.top_k = 1000; })));
  CHECK(all_refuse(broken([](router_spec& s) {  // top_k > n_experts (<= 32)
    s = router_spec::qwen3moe(8, 4);
    s.top_k = 9;
  })));
  CHECK(all_refuse(broken([](router_spec& s) { s.n_experts = 0; })));
  CHECK(all_refuse(broken([](router_spec& s) { s.selection_bias.resize(n / 2); })));  // read past end before
  CHECK(all_refuse(broken([](router_spec& s) { s.selection_bias.resize(n + 1); })));
  CHECK(all_refuse(broken([](router_spec& s) { s.logit_bias.resize(n / 2, 0.0f); })));
  CHECK(all_refuse(broken([](router_spec& s) { s.logit_bias.resize(n + 1, 0.0f); })));
  CHECK(all_refuse(broken([](router_spec& s) { s.n_groups = 0; })));
  CHECK(all_refuse(broken([](router_spec& s) { s.n_groups = 7; })));  // does not divide 64
  CHECK(all_refuse(broken([](router_spec& s) {                        // 1 expert per group: top2[1] unset before
    s.n_groups = n;
    s.n_group_used = n;
  })));
  CHECK(all_refuse(broken([](router_spec& s) { s.n_group_used = 0; })));
  CHECK(all_refuse(broken([](router_spec& s) { s.n_group_used = 9; })));  // > n_groups
  CHECK(all_refuse(broken([](router_spec& s) {                            // groups off, n_group_used > 1
    s.n_groups = 1;
    s.n_group_used = 2;
  })));
  CHECK(all_refuse(broken([](router_spec& s) {
    s.n_group_used = 1;
    s.top_k = 9;
  })));  // 8 kept < 9
  // Boundaries that are valid stay accepted.
  routing out;
  router_spec k32 = router_spec::qwen3moe(32, 32);
  CHECK(select_experts(k32, logits.data(), out, ws));
  CHECK(out.size() == 32);
  router_spec pairs = good;
  pairs.n_groups = 32;  // 2 experts per group: the minimum
  pairs.n_group_used = 3;
  CHECK(select_experts(pairs, logits.data(), out, ws));
  CHECK(out.size() == 6);
}

TEST_CASE("rank_experts, expert_weights and route_token agree with select_experts") {
  const router_spec sp = router_spec::qwen3moe(64, 8);
  const test_matrix m(element_type::bf16, 64, 256, 0, 3);
  const auto x = random_activation(256, 4);
  router_workspace ws(sp);
  routing direct;
  REQUIRE(route_token(m.view(), x.data(), sp, direct, ws));
  std::vector<float> logits(64);
  gemv(m.view(), x.data(), logits.data());
  for (std::size_t i = 0; i < 64; ++i) CHECK(bits(ws.logits()[i]) == bits(logits[i]));
  routing sel;
  REQUIRE(select_experts(sp, logits.data(), sel, ws));
  ranking rk;
  REQUIRE(rank_experts(sp, logits.data(), rk, ws, 12));
  CHECK(rk.size() == 12);
  float w[8];
  REQUIRE(expert_weights(sp, logits.data(), sel.ids(), w, ws));
  for (std::size_t i = 0; i < 8; ++i) {
    CHECK(direct.id(i) == sel.id(i));
    CHECK(rk.id(i) == sel.id(i));
    CHECK(bits(rk.weight(i)) == bits(sel.weight(i)));
    CHECK(bits(w[i]) == bits(sel.weight(i)));
    CHECK(rk.score(i) == ws.selection_scores()[to_index(sel.id(i))]);
  }
  CHECK(std::isnan(rk.weight(8)));
  const expert_id bad[] = {expert_id{64}};
  CHECK_FALSE(expert_weights(sp, logits.data(), span<const expert_id>(bad, 1), w, ws));
  routing out;
  const test_matrix wrong(element_type::f32, 63, 256, 0, 3);
  CHECK_FALSE(route_token(wrong.view(), x.data(), sp, out, ws));
}

TEST_CASE("tie-aware comparison: ties match, real misses do not") {
  const std::vector<float> s = {0.5f, 0.25f, 0.25f, 0.1f, from_bits(bits(0.25f) + 2), 0.05f};  // 2.4e-7 apart
  const expert_id a[] = {expert_id{0}, expert_id{1}};
  const expert_id b[] = {expert_id{0}, expert_id{2}};  // exact tie swapped
  const expert_id c[] = {expert_id{4}, expert_id{0}};  // within 1e-6, other order
  const expert_id d[] = {expert_id{0}, expert_id{3}};  // a different score: a miss
  const expert_id e[] = {expert_id{0}};
  CHECK(same_selection_tie_aware(span<const expert_id>(a, 2), span<const expert_id>(b, 2), s.data()));
  CHECK(same_selection_tie_aware(span<const expert_id>(a, 2), span<const expert_id>(c, 2), s.data()));
  CHECK_FALSE(same_selection_tie_aware(span<const expert_id>(a, 2), span<const expert_id>(d, 2), s.data()));
  CHECK_FALSE(same_selection_tie_aware(span<const expert_id>(a, 2), span<const expert_id>(e, 1), s.data()));
  CHECK_FALSE(same_selection_tie_aware(span<const expert_id>(a, 2), span<const expert_id>(c, 2), s.data(), 0.0f));
  const expert_id out_of_range[] = {expert_id{0}, expert_id{9}};
  CHECK_FALSE(same_selection_tie_aware(span<const expert_id>(a, 2), span<const expert_id>(out_of_range, 2),
                                       span<const float>(s.data(), s.size())));
}

TEST_CASE("router_spec validates its configuration") {
  auto base = [] {
    router_spec s;
    s.n_experts = 8;
    s.top_k = 2;
    return s;
  };
  SUBCASE("k above 32") {
    router_spec s = base();
    s.n_experts = 64;
    s.top_k = 33;
    CHECK_THROWS_WITH_AS(s.validate(), "router_spec: top_k 33 out of range; expected [1, 32]", error);
  }
  SUBCASE("k of zero") {
    router_spec s = base();
    s.top_k = 0;
    CHECK_THROWS_WITH_AS(s.validate(), "router_spec: top_k 0 out of range; expected [1, 32]", error);
  }
  SUBCASE("k above experts") {
    CHECK_THROWS_WITH_AS(router_spec::qwen3moe(4, 6),
                         "router_spec: top_k 6 exceeds n_experts 4; expected top_k <= n_experts", error);
  }
  SUBCASE("no experts") {
    CHECK_THROWS_WITH_AS(router_spec::qwen3moe(0, 1), "router_spec: n_experts 0 out of range; expected [1, 65535]",
                         error);
  }
  SUBCASE("groups not dividing experts") {
    CHECK_THROWS_WITH_AS(router_spec::deepseek_v3({}, 10, 2, 4, 2, 1.0f),
                         "router_spec: n_groups 4 does not divide n_experts 10; expected a divisor", error);
  }
  SUBCASE("one expert per group") {
    CHECK_THROWS_WITH_AS(router_spec::deepseek_v3({}, 8, 2, 8, 4, 1.0f),
                         "router_spec: n_groups 8 leaves 1 expert per group; expected at least 2 "
                         "(groups are scored by their top-2)",
                         error);
  }
  SUBCASE("more groups used than exist") {
    CHECK_THROWS_WITH_AS(router_spec::deepseek_v3({}, 16, 2, 4, 5, 1.0f),
                         "router_spec: n_group_used 5 out of range; expected [1, 4]", error);
  }
  SUBCASE("too few experts left for k") {
    CHECK_THROWS_WITH_AS(router_spec::deepseek_v3({}, 16, 6, 4, 1, 1.0f),
                         "router_spec: n_group_used 1 keeps 4 experts, fewer than top_k 6; expected "
                         "n_group_used * experts_per_group >= top_k",
                         error);
  }
  SUBCASE("n_group_used without groups") {
    router_spec s = base();
    s.n_group_used = 2;
    CHECK_THROWS_WITH_AS(s.validate(), "router_spec: n_group_used 2 with n_groups 1; expected 1 when groups are off",
                         error);
  }
  SUBCASE("zero groups") {
    router_spec s = base();
    s.n_groups = 0;
    CHECK_THROWS_WITH_AS(s.validate(), "router_spec: n_groups 0; expected >= 1 (1 = groups off)", error);
  }
  SUBCASE("bias size") {
    router_spec s = base();
    s.selection_bias = {1, 2, 3};
    CHECK_THROWS_WITH_AS(s.validate(), "router_spec: selection_bias has 3 entries; expected 0 or n_experts (8)", error);
  }
  SUBCASE("NaN in a bias") {
    std::vector<float> b(8, 0.0f);
    b[2] = qnan;
    CHECK_THROWS_WITH_AS(router_spec::gpt_oss(b, 2), "router_spec: logit_bias[2] is nan; expected a finite value",
                         error);
  }
  SUBCASE("inf in a bias") {
    router_spec s = base();
    s.selection_bias.assign(8, 0.0f);
    s.selection_bias[7] = -inf;
    CHECK_THROWS_WITH_AS(s.validate(), "router_spec: selection_bias[7] is -inf; expected a finite value", error);
  }
  SUBCASE("non-finite scale") {
    router_spec s = base();
    s.weight_scale = inf;
    CHECK_THROWS_WITH_AS(s.validate(), "router_spec: weight_scale inf; expected a finite value", error);
  }
  SUBCASE("valid presets") {
    CHECK_NOTHROW(router_spec::qwen3moe(128, 8));
    CHECK_NOTHROW(router_spec::deepseek_v3(std::vector<float>(256, 0.0f), 256, 8, 8, 4, 2.5f));
    CHECK(router_spec::deepseek_v3({}, 256, 8, 8, 4, 2.5f).scale_weights);
    CHECK_FALSE(router_spec::deepseek_v3({}, 256, 8, 8, 4, 1.0f).scale_weights);
    CHECK(router_spec::gpt_oss(std::vector<float>(128, 0.0f), 4).n_experts == 128);
  }
}

#if defined(MOE_RESIDENCY_TEST_NATIVE) && defined(MOE_RESIDENCY_TEST_HAS_SECOND_TU)
TEST_CASE("gemv_simd from TUs built for different targets, linked into one program") {
  // This TU is -march=native; router_second_tu::run is in a TU with default
  // flags. Both instantiate the whole kernel call graph (round_block,
  // madd_scalar, finish_dot, the half.hpp conversions, ...). Those used to be
  // plain inline functions whose bodies depended on __AVX512F__/__F16C__ and
  // MOE_RESIDENCY_FUSED_MADD, so the linker kept one copy for both TUs: AVX-512
  // code reachable from the SSE2 path, and (at -O0, where nothing inlines) the
  // fused scalar multiply-add of this TU answering for the unfused one there,
  // which broke the bit-identity checked here. Now every helper is a template
  // on <Arch, Fused> and each TU keeps its own.
  std::uint32_t seed = 7000;
  std::string other;
  for (const element_type t : {element_type::f32, element_type::f16, element_type::bf16})
    for (const auto& s : shapes)
      for (const activation_rounding r : {activation_rounding::engine, activation_rounding::none})
        for (const bool fused : {false, true}) {
          const test_matrix m(t, s[0], s[1], s[2], seed++);
          const auto x = random_activation(s[1], seed++);
          std::vector<float> simd2(s[0], -1.0f), ref2(s[0], -2.0f), here(s[0], -3.0f);
          other = router_second_tu::run(m.view(), x.data(), simd2.data(), ref2.data(), fused, r);
          for (std::size_t i = 0; i < s[0]; ++i) {
            INFO(other << " " << to_string(t) << " " << s[0] << "x" << s[1] << (fused ? " fused" : " unfused")
                       << " row " << i);
            REQUIRE(bits(simd2[i]) == bits(ref2[i]));  // other TU: its SIMD == its scalar
          }
          if (fused) {
            // A fused multiply-add rounds once on every target, so this TU's
            // kernels (other Arch, other instructions) give the same bits.
            gemv_simd<xsimd::default_arch, true>(m.view(), x.data(), here.data(), r);
            for (std::size_t i = 0; i < s[0]; ++i) {
              INFO(xsimd::default_arch::name() << " vs " << other << " " << to_string(t) << " row " << i);
              REQUIRE(bits(here[i]) == bits(simd2[i]));
            }
          }
        }
  MESSAGE("this TU: " << std::string(xsimd::default_arch::name()) << ", other TU: " << other);
  CHECK(other != std::string(xsimd::default_arch::name()));  // really two targets
}
#endif

TEST_CASE("router_spec: validate and selection apply the same shape rules (one implementation)") {
  // For random shapes, validate() throws exactly when selection refuses the
  // spec (bias values and weight_scale aside: selection does not read those).
  std::mt19937_64 gen(20261130);
  std::uniform_int_distribution<int> small(0, 12);
  std::size_t refused = 0, accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    router_spec s;
    s.n_experts = static_cast<std::size_t>(small(gen) * small(gen));
    s.top_k = static_cast<std::size_t>(small(gen) * 3);
    s.n_groups = static_cast<std::size_t>(small(gen) % 5);
    s.n_group_used = static_cast<std::size_t>(small(gen) % 5);
    if (small(gen) == 0) s.logit_bias.assign(static_cast<std::size_t>(small(gen)), 0.5f);
    if (small(gen) == 0) s.selection_bias.assign(s.n_experts + static_cast<std::size_t>(small(gen) % 2), 0.5f);
    bool threw = false;
    try {
      s.validate();
    } catch (const error&) {
      threw = true;
    }
    std::vector<float> logits(s.n_experts, 0.25f);
    router_workspace ws(s.n_experts);
    routing out;
    const bool selected = select_experts(s, logits.data(), out, ws);
    CHECK(threw == !selected);
    refused += threw;
    accepted += !threw;
  }
  CHECK(refused > 1000);  // both sides of every rule are exercised
  CHECK(accepted > 1000);
}

#endif  // MOE_RESIDENCY_TEST_SECOND_TU
