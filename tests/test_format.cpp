// detail/format.hpp, the library's one number formatter, against its slow
// obvious twins: std::snprintf into a large buffer, and the formatters it
// replaced (plan.hpp's ostringstream, router.hpp's float %g), on many values.

#include "moe_residency/detail/format.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

using namespace moe_residency;

namespace {

std::string twin_printf(const char* fmt, double v) {
  std::vector<char> buf(4096);
  const int n = std::snprintf(buf.data(), buf.size(), fmt, v);
  REQUIRE(n >= 0);
  REQUIRE(static_cast<std::size_t>(n) < buf.size());
  return std::string(buf.data(), static_cast<std::size_t>(n));
}

// What plan.hpp's plan_format_number printed (NaN aside: it printed "-nan" for a negative one).
std::string twin_ostream(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// What router.hpp's format_float printed.
std::string twin_float(float v) {
  if (v != v) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v));
  return buf;
}

std::vector<double> values() {
  std::vector<double> v = {0.0,
                           -0.0,
                           1.0,
                           -1.0,
                           0.5,
                           0.125,
                           1e-300,
                           4.9e-324,
                           1e300,
                           1e6,
                           1e-5,
                           123456,
                           1234567,
                           99.95,
                           0.886,
                           100.0 - 1e-12,
                           std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::max(),
                           std::numeric_limits<double>::denorm_min()};
  std::mt19937_64 gen(11);
  for (int i = 0; i < 20000; ++i) {
    std::uint64_t bits = gen();
    double d;
    std::memcpy(&d, &bits, sizeof d);
    if (std::isnan(d)) continue;
    v.push_back(d);                                                       // every exponent
    v.push_back(static_cast<double>(gen() % 2000001) / 1000.0 - 1000.0);  // figures a report prints
  }
  return v;
}

}  // namespace

TEST_CASE("format_printf equals snprintf, on every value and format, short and long") {
  const char* formats[] = {"%g", "%.1f", "%.3f", "%.4f", "%.0f", "%e", "%10.2f", "%-9g", "%6.1f", "%.17g"};
  std::size_t compared = 0;
  for (double v : values())
    for (const char* f : formats) {
      const std::string want = twin_printf(f, v);
      CAPTURE(f);
      CAPTURE(want);
      const std::string got = detail::format_printf(f, v);
      if (got != want) CHECK(got == want);
      ++compared;
    }
  CHECK(compared > 400000);
  // Longer than the formatter's stack buffer: the heap path.
  CHECK(detail::format_printf("%.250f", 1.0) == twin_printf("%.250f", 1.0));
  CHECK(detail::format_printf("%.0f", 1e300) == twin_printf("%.0f", 1e300));
  CHECK(detail::format_printf("%.0f", 1e300).size() == 301);
  const std::string wide(1000, 'x');
  CHECK(detail::format_printf("%s,%d", wide.c_str(), 7) == wide + ",7");
  CHECK(detail::format_printf("%s", "") == "");
}

TEST_CASE("format_number and format_fixed print what the formatters they replaced printed") {
  for (double v : values()) {
    CAPTURE(v);
    const std::string a = detail::format_number(v), b = twin_ostream(v);
    if (a != b) CHECK(a == b);
    const std::string c = detail::format_fixed(v, 1), d = twin_printf("%.1f", v);
    if (c != d) CHECK(c == d);
    const float f = static_cast<float>(v);
    const std::string e = detail::format_number(f), g = twin_float(f);
    if (e != g) CHECK(e == g);
  }
  // Every NaN prints "nan", whatever its sign bit.
  CHECK(detail::format_number(std::nan("")) == "nan");
  CHECK(detail::format_number(-std::nan("")) == "nan");
  CHECK(detail::format_number(std::numeric_limits<float>::quiet_NaN()) == "nan");
  CHECK(detail::format_number(0.886) == "0.886");
  CHECK(detail::format_fixed(99.95, 1) == twin_printf("%.1f", 99.95));
}
