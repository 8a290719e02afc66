// The checked number parsers every option, configuration file and metrics
// file goes through (detail/numbers.hpp): each refusal class with its exact
// message, and random texts against slow obvious twins (decimal arithmetic on
// strings for whole numbers, an istringstream for reals).
#include "moe_residency/detail/numbers.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <locale>
#include <random>
#include <sstream>
#include <string>

using namespace moe_residency;
using detail::real_domain;
using detail::real_problem;
using detail::whole_problem;

TEST_CASE("numbers: a whole number is decimal digits, never wrapped, rounded or signed") {
  std::uint64_t v = 0;
  CHECK(whole_problem("0", 0, 10, &v).empty());
  CHECK(v == 0);
  CHECK(whole_problem("007", 0, 10, &v).empty());
  CHECK(v == 7);
  CHECK(whole_problem("18446744073709551615", 0, UINT64_MAX, &v).empty());
  CHECK(v == UINT64_MAX);
  CHECK(whole_problem("-1", 1, 64) == "'-1' is negative; expected a whole number from 1 to 64");
  CHECK(whole_problem("18446744073709551616", 0, UINT64_MAX) ==
        "'18446744073709551616' is too large; expected a whole number >= 0");
  CHECK(whole_problem("99999999999999999999", 1, 64) ==
        "'99999999999999999999' is too large; expected a whole number from 1 to 64");
  CHECK(whole_problem("65", 1, 64) == "'65' is out of range; expected a whole number from 1 to 64");
  CHECK(whole_problem("0", 1, 64) == "'0' is out of range; expected a whole number from 1 to 64");
  for (const char* t : {"1.5", "2.0", "1e3", "+3", " 3", "3 ", "nan", "inf", "0x10", "3k"})
    CHECK(whole_problem(t, 0, 100) ==
          "'" + std::string(t) + "' is not a whole number in decimal digits; expected a whole number from 0 to 100");
  CHECK(whole_problem("", 0, 100) == "empty; expected a whole number from 0 to 100");
  // Nothing is stored on a refusal.
  v = 42;
  CHECK_FALSE(whole_problem("-1", 0, 100, &v).empty());
  CHECK(v == 42);
}

TEST_CASE("numbers: parse_whole throws naming the input, in the target type's range") {
  CHECK(detail::parse_whole<int>("1024", "--threads", 1, 1024) == 1024);
  CHECK_THROWS_WITH_AS(detail::parse_whole<int>("-1", "--threads", 1, 1024),
                       "--threads: '-1' is negative; expected a whole number from 1 to 1024", error);
  // The default upper bound is the type's: an int cannot take 2^31.
  CHECK_THROWS_WITH_AS(detail::parse_whole<int>("2147483648", "x"),
                       "x: '2147483648' is out of range; expected a whole number from 0 to 2147483647", error);
  CHECK(detail::parse_whole<std::uint8_t>("255", "x") == 255);
}

TEST_CASE("numbers: a real is wholly a finite number inside its domain") {
  double v = 0;
  CHECK(real_problem("0.5", real_domain::open(0, 1), &v).empty());
  CHECK(v == 0.5);
  CHECK(real_problem("1e-320", real_domain::non_negative(), &v).empty());  // a subnormal is the nearest double
  CHECK(v > 0);
  // strtod's hexadecimal form is refused, as whole numbers refuse it: "0x10" MiB is no decimal number.
  v = 7;
  CHECK(real_problem("0x1p-2", real_domain::any(), &v) == "'0x1p-2' is not a decimal number; expected a finite number");
  CHECK(real_problem("0x10", real_domain::positive(), &v) ==
        "'0x10' is not a decimal number; expected a finite number > 0");
  CHECK(real_problem("-0X8", real_domain::any(), &v) == "'-0X8' is not a decimal number; expected a finite number");
  CHECK(v == 7);
  CHECK(real_problem("nan", real_domain::any()) == "'nan' is not finite; expected a finite number");
  CHECK(real_problem("-inf", real_domain::any()) == "'-inf' is not finite; expected a finite number");
  CHECK(real_problem("1e400", real_domain::positive()) == "'1e400' is not finite; expected a finite number > 0");
  CHECK(real_problem("-1e400", real_domain::any()) == "'-1e400' is not finite; expected a finite number");
  CHECK(real_problem("0", real_domain::positive()) == "'0' is out of range; expected a finite number > 0");
  CHECK(real_problem("-0.1", real_domain::non_negative()) == "'-0.1' is out of range; expected a finite number >= 0");
  CHECK(real_problem("1", real_domain::open(0, 1)) == "'1' is out of range; expected a number in (0, 1)");
  CHECK(real_problem("0", real_domain::open_closed(0, 1)) == "'0' is out of range; expected a number in (0, 1]");
  CHECK(real_problem("1", real_domain::open_closed(0, 1)).empty());
  CHECK(real_problem("1.01", real_domain::closed(0, 1)) == "'1.01' is out of range; expected a number from 0 to 1");
  CHECK(real_problem("5", real_domain{-1e300, 4, false, true}) ==
        "'5' is out of range; expected a number in [-1e+300, 4)");
  CHECK(real_problem("5", real_domain{-std::numeric_limits<double>::infinity(), 4, false, false}) ==
        "'5' is out of range; expected a number <= 4");
  CHECK(real_problem("2459.8MiB/s", real_domain::any()) == "'2459.8MiB/s' is not a number; expected a finite number");
  CHECK(real_problem(" 1", real_domain::any()) == "' 1' starts with a blank; expected a finite number");
  CHECK(real_problem("1 ", real_domain::any()) == "'1 ' is not a number; expected a finite number");
  CHECK(real_problem("", real_domain::any()) == "empty; expected a finite number");
  CHECK_THROWS_WITH_AS(detail::parse_real("nan", "--decay", real_domain::open(0, 1)),
                       "--decay: 'nan' is not finite; expected a number in (0, 1)", error);
}

TEST_CASE("numbers: a float value is checked as the float it is stored in") {
  float f = 7;
  CHECK(detail::float_problem("0.5", real_domain::open_closed(0, 1), &f).empty());
  CHECK(f == 0.5f);
  // In (0, 1] as a double, 0 as a float: refused, not stored as 0.
  CHECK(detail::float_problem("1e-50", real_domain::open_closed(0, 1), &f) ==
        "'1e-50' is 0 as a float (the value is stored as one); expected a number in (0, 1]");
  CHECK(detail::float_problem("1e39", real_domain::positive(), &f) ==
        "'1e39' is beyond a float's range (the value is stored as one: at most about 3.4e+38); expected a finite "
        "number > 0");
  // Rounded up to the bound, and past an open one.
  CHECK(detail::float_problem("0.99999999999", real_domain::open(0, 1), &f) ==
        "'0.99999999999' is 1 as a float (the value is stored as one); expected a number in (0, 1)");
  CHECK(detail::float_problem("0.99999999999", real_domain::open_closed(0, 1), &f).empty());
  CHECK(f == 1.0f);
  // The double's own refusals come first, worded as for a double.
  CHECK(detail::float_problem("0x1", real_domain::any(), &f) ==
        "'0x1' is not a decimal number; expected a finite number");
  CHECK(detail::float_problem("", real_domain::any(), &f) == "empty; expected a finite number");
  CHECK(f == 1.0f);
  CHECK_THROWS_WITH_AS(detail::parse_float_value("1e-46", "--decay", real_domain::open_closed(0, 1)),
                       "--decay: '1e-46' is 0 as a float (the value is stored as one); expected a number in (0, 1]",
                       error);
  // Every float a random double text rounds to is accepted or refused as the float test says.
  std::mt19937_64 gen(99);
  for (int i = 0; i < 20000; ++i) {
    const double x = std::ldexp(static_cast<double>(gen() % 1000000 + 1) / 1e6, static_cast<int>(gen() % 400) - 200);
    const std::string t = detail::show_number(x);
    const float want = static_cast<float>(std::strtod(t.c_str(), nullptr));
    const bool ok = std::isfinite(want) && want > 0 && want <= 1;
    CHECK_MESSAGE(detail::float_problem(t, real_domain::open_closed(0, 1), &f).empty() == ok, t);
    if (ok) CHECK(f == want);
  }
}

TEST_CASE("numbers: show_number prints the fewest digits that read back") {
  CHECK(detail::show_number(0.1) == "0.1");
  CHECK(detail::show_number(1e12) == "1e+12");
  CHECK(detail::show_number(1809.9) == "1809.9");
  std::mt19937_64 gen(7);
  for (int i = 0; i < 20000; ++i) {
    double x;
    const std::uint64_t bits = gen();
    std::memcpy(&x, &bits, sizeof x);
    if (!std::isfinite(x)) continue;
    const std::string s = detail::show_number(x);
    CHECK(std::strtod(s.c_str(), nullptr) == x);
  }
}

namespace {

// The slow twins. Whole: the value in decimal arithmetic on the digit string.
// Real: the C++ stream reader in the classic locale, which shares no code
// with strtod's whole-text and finiteness checks above.
std::string twin_whole(const std::string& t, std::uint64_t lo, std::uint64_t hi, std::uint64_t* out) {
  if (t.empty()) return "empty";
  if (t[0] == '-') return "negative";
  for (char c : t)
    if (c < '0' || c > '9') return "not digits";
  std::string d = t.substr(std::min(t.find_first_not_of('0'), t.size() - 1));
  const std::string max = "18446744073709551615";
  if (d.size() > max.size() || (d.size() == max.size() && d > max)) return "too large";
  std::uint64_t v = 0;
  for (char c : d) v = v * 10 + static_cast<std::uint64_t>(c - '0');
  if (v < lo || v > hi) return "range";
  *out = v;
  return {};
}

bool twin_real(const std::string& t, double* out) {
  if (t.empty() || t[0] == ' ') return false;
  std::istringstream in(t);
  in.imbue(std::locale::classic());
  double v = 0;
  in >> v;
  if (in.fail()) return false;
  in.peek();
  if (!in.eof()) return false;  // something after the number
  *out = v;
  return std::isfinite(v);
}

}  // namespace

TEST_CASE("numbers: random texts, the fast parsers against their slow twins") {
  std::mt19937_64 gen(2026);
  const std::string digits = "0123456789";
  SUBCASE("whole numbers") {
    const std::string alphabet = "0123456789-+. e";
    for (int i = 0; i < 200000; ++i) {
      const std::size_t len = gen() % 24;
      std::string t;
      for (std::size_t k = 0; k < len; ++k)
        t += (gen() % 8 ? digits[gen() % digits.size()] : alphabet[gen() % alphabet.size()]);
      const std::uint64_t lo = gen() % 4 ? 0 : gen() % 1000, hi = gen() % 3 ? UINT64_MAX : lo + gen() % 100000;
      std::uint64_t fast = 1, slow = 2;
      const std::string p = whole_problem(t, lo, hi, &fast), q = twin_whole(t, lo, hi, &slow);
      REQUIRE_MESSAGE(p.empty() == q.empty(), "'", t, "' [", lo, ", ", hi, "]: ", p, " / ", q);
      if (p.empty()) REQUIRE(fast == slow);
    }
  }
  SUBCASE("reals") {
    // Exponents of at most two digits: no overflow or underflow, where the
    // stream reader's conventions differ from strtod's (those are the table's).
    for (int i = 0; i < 200000; ++i) {
      std::string t;
      if (gen() % 4 == 0) t += "-+"[gen() % 2];
      for (std::size_t k = gen() % 8; k > 0; --k) t += digits[gen() % 10];
      if (gen() % 2) t += '.';
      for (std::size_t k = gen() % 8; k > 0; --k) t += digits[gen() % 10];
      if (gen() % 3 == 0) {
        t += "eE"[gen() % 2];
        if (gen() % 2) t += "-+"[gen() % 2];
        for (std::size_t k = gen() % 3; k > 0; --k) t += digits[gen() % 10];
      }
      if (gen() % 10 == 0) t.insert(gen() % (t.size() + 1), 1, " x.e-"[gen() % 5]);
      if (gen() % 20 == 0) t.insert(t[0] == '-' || t[0] == '+' ? 1 : 0, gen() % 2 ? "0x" : "0X");
      // A hexadecimal form ("0x1p3": strtod reads it, the stream reader does not) is refused by both.
      double fast = 1, slow = 2;
      const bool ok = real_problem(t, real_domain::any(), &fast).empty();
      REQUIRE_MESSAGE(ok == twin_real(t, &slow), "'", t, "': ", real_problem(t, real_domain::any()));
      if (ok) REQUIRE(fast == slow);
    }
  }
}
