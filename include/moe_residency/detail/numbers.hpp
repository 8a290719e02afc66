#pragma once
// Checked number parsing, one rule for every number the library and its
// programs accept (command-line options, configuration files, lab cells,
// metrics): the text must be wholly a number (no trailing characters, no
// leading blanks), a real must be finite, decimal (strtod's hexadecimal form
// is refused, as it is for whole numbers) and inside its domain, checked in
// the type it is stored in (a float option is checked as a float), and a whole
// number is decimal digits only, so that "-1" can never wrap into a huge
// unsigned value and "1e30" or "99999999999999999999" never saturates
// silently. A refusal says what the text was and what was expected, with the
// limits written out.

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <type_traits>

#include "moe_residency/error.hpp"

namespace moe_residency {
namespace detail {

/// `v` in the fewest significant digits that read back as `v` (at most 17),
/// for messages: 0.1 prints as "0.1", not "0.100000".
inline std::string show_number(double v) {
  char buf[40];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v || std::isnan(v)) break;
  }
  return buf;
}

/// The domain of a real number: always finite, with optional lower and upper
/// bounds, each open or closed.
struct real_domain {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;
  bool hi_open = false;

  static real_domain any() { return {}; }
  /// > 0.
  static real_domain positive() { return {0.0, std::numeric_limits<double>::infinity(), true, false}; }
  /// >= 0.
  static real_domain non_negative() { return {0.0, std::numeric_limits<double>::infinity(), false, false}; }
  /// [lo, hi].
  static real_domain closed(double lo, double hi) { return {lo, hi, false, false}; }
  /// (lo, hi], as a drop fraction's (0, 1].
  static real_domain open_closed(double lo, double hi) { return {lo, hi, true, false}; }
  /// (lo, hi), as a decay's (0, 1).
  static real_domain open(double lo, double hi) { return {lo, hi, true, true}; }

  bool contains(double v) const {
    if (!std::isfinite(v)) return false;
    if (lo_open ? !(v > lo) : !(v >= lo)) return false;
    if (hi_open ? !(v < hi) : !(v <= hi)) return false;
    return true;
  }

  /// "a finite number > 0", "a number from 0 to 1", "a number in (0, 1]", ...
  std::string describe() const {
    const bool has_lo = std::isfinite(lo), has_hi = std::isfinite(hi);
    if (!has_lo && !has_hi) return "a finite number";
    if (!has_hi) return std::string("a finite number ") + (lo_open ? "> " : ">= ") + show_number(lo);
    if (!has_lo) return std::string("a number ") + (hi_open ? "< " : "<= ") + show_number(hi);
    if (!lo_open && !hi_open) return "a number from " + show_number(lo) + " to " + show_number(hi);
    return std::string("a number in ") + (lo_open ? "(" : "[") + show_number(lo) + ", " + show_number(hi) +
           (hi_open ? ")" : "]");
  }
};

/// "" when `text` is wholly a finite number inside `d` (stored in `*out`
/// when given); otherwise what is wrong and what was expected, e.g.
/// "'nan' is not finite; expected a number in (0, 1)".
inline std::string real_problem(const std::string& text, const real_domain& d, double* out = nullptr) {
  const std::string expected = "; expected " + d.describe();
  const std::string quoted = "'" + text + "'";
  if (text.empty()) return "empty" + expected;
  // strtod skips leading blanks and accepts a trailing remainder: refuse both.
  const char c0 = text[0];
  if (c0 == ' ' || c0 == '\t' || c0 == '\n' || c0 == '\r' || c0 == '\v' || c0 == '\f')
    return quoted + " starts with a blank" + expected;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || end != text.c_str() + text.size()) return quoted + " is not a number" + expected;
  // strtod also reads C99's hexadecimal form ("0x10", "0x1p-2"): reals are
  // decimal, as whole numbers are ("0x10" MiB is not 16 MiB by accident).
  if (text.find_first_of("xX") != std::string::npos) return quoted + " is not a decimal number" + expected;
  // ERANGE with a huge result: beyond a double (1e400). A tiny result
  // (underflow towards 0) is still the nearest double and is kept.
  if (!std::isfinite(v) || (errno == ERANGE && std::fabs(v) > 1.0)) return quoted + " is not finite" + expected;
  if (!d.contains(v)) return quoted + " is out of range" + expected;
  if (out) *out = v;
  return {};
}

/// real_problem for a value stored as a float: the text must also be a
/// finite float whose rounding stays inside `d` (1e-50 checked as a double is
/// in (0, 1], and becomes 0 as a float). "" when it is (the float stored in
/// `*out` when given); otherwise e.g.
/// "'1e-50' is 0 as a float (the value is stored as one); expected a number in (0, 1]".
inline std::string float_problem(const std::string& text, const real_domain& d, float* out = nullptr) {
  double v = 0;
  if (std::string p = real_problem(text, d, &v); !p.empty()) return p;
  const float f = static_cast<float>(v);
  const std::string expected = "; expected " + d.describe();
  if (!std::isfinite(f))
    return "'" + text + "' is beyond a float's range (the value is stored as one: at most about 3.4e+38)" + expected;
  if (!d.contains(static_cast<double>(f)))
    return "'" + text + "' is " + show_number(static_cast<double>(f)) + " as a float (the value is stored as one)" +
           expected;
  if (out) *out = f;
  return {};
}

/// "" when `text` is wholly decimal digits giving a value from `lo` to `hi`
/// (stored in `*out` when given); otherwise what is wrong and what was
/// expected, e.g. "'-1' is negative; expected a whole number from 1 to 64".
/// A sign, a fraction, an exponent and a value beyond 2^64 - 1 are refused,
/// never wrapped or rounded.
inline std::string whole_problem(const std::string& text, std::uint64_t lo, std::uint64_t hi,
                                 std::uint64_t* out = nullptr) {
  const std::string expected =
      hi == std::numeric_limits<std::uint64_t>::max()
          ? "; expected a whole number >= " + std::to_string(lo)
          : "; expected a whole number from " + std::to_string(lo) + " to " + std::to_string(hi);
  const std::string quoted = "'" + text + "'";
  if (text.empty()) return "empty" + expected;
  if (text[0] == '-') return quoted + " is negative" + expected;
  std::uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return quoted + " is not a whole number in decimal digits" + expected;
    const std::uint64_t digit = static_cast<std::uint64_t>(c - '0');
    if (v > (std::numeric_limits<std::uint64_t>::max() - digit) / 10) return quoted + " is too large" + expected;
    v = v * 10 + digit;
  }
  if (v < lo || v > hi) return quoted + " is out of range" + expected;
  if (out) *out = v;
  return {};
}

/// `text` as a finite real in `d`; throws moe_residency::error "<what>: <problem>".
inline double parse_real(const std::string& text, const std::string& what, const real_domain& d = {}) {
  double v = 0;
  const std::string p = real_problem(text, d, &v);
  if (!p.empty()) throw error(what + ": " + p);
  return v;
}

/// `text` as a finite float in `d` (checked as the float it is stored in);
/// throws moe_residency::error "<what>: <problem>".
inline float parse_float_value(const std::string& text, const std::string& what, const real_domain& d = {}) {
  float v = 0;
  const std::string p = float_problem(text, d, &v);
  if (!p.empty()) throw error(what + ": " + p);
  return v;
}

/// `text` as a whole number of type T from `lo` to `hi` (default: T's
/// range from 0); throws moe_residency::error "<what>: <problem>".
template <class T>
T parse_whole(const std::string& text, const std::string& what, T lo = 0, T hi = std::numeric_limits<T>::max()) {
  static_assert(std::is_integral<T>::value, "parse_whole: T must be an integer type");
  std::uint64_t l = 0, h = 0;  // a negative bound of a signed T is 0: the text has no sign
  if constexpr (std::is_signed<T>::value) {
    l = lo < 0 ? 0 : static_cast<std::uint64_t>(lo);
    h = hi < 0 ? 0 : static_cast<std::uint64_t>(hi);
  } else {
    l = static_cast<std::uint64_t>(lo);
    h = static_cast<std::uint64_t>(hi);
  }
  std::uint64_t v = 0;
  const std::string p = whole_problem(text, l, h, &v);
  if (!p.empty()) throw error(what + ": " + p);
  return static_cast<T>(v);
}

}  // namespace detail
}  // namespace moe_residency
