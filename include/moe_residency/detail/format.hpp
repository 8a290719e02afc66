#pragma once
/// The library's one number formatter: printf into a std::string, of any
/// length. Every report line and error message that prints a number goes
/// through it, so they all follow one rule (the C locale's printf, as the
/// reference tools' output does) and print the same bytes.

#include <cmath>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <string>

namespace moe_residency {
namespace detail {

#if defined(__GNUC__) || defined(__clang__)
inline std::string format_printf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
#endif
/// std::snprintf(fmt, ...) as a std::string, however long the result; empty
/// on an encoding error.
inline std::string format_printf(const char* fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  const int n = std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < 0) return {};
  if (static_cast<std::size_t>(n) < sizeof buf) return std::string(buf, static_cast<std::size_t>(n));
  std::string big(static_cast<std::size_t>(n) + 1, '\0');
  va_start(ap, fmt);
  std::vsnprintf(&big[0], big.size(), fmt, ap);
  va_end(ap);
  big.resize(static_cast<std::size_t>(n));
  return big;
}

/// A value in an error message or a setting: `%g`, and "nan" for every NaN
/// (printf may print a negative one as "-nan").
inline std::string format_number(double v) { return std::isnan(v) ? std::string("nan") : format_printf("%g", v); }

/// `%.Nf`: a figure in a report line, N decimals.
inline std::string format_fixed(double v, int decimals) { return format_printf("%.*f", decimals, v); }

}  // namespace detail
}  // namespace moe_residency
