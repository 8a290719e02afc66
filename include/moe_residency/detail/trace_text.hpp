#pragma once
// Text primitives of the route_trace v1 CSV: strict unsigned integers, the
// weight's float text (the engine's printf "%g": 6 significant digits), and
// quoting of offending values in error messages. Locale-independent.

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>

namespace moe_residency {
namespace detail {

/// Outcome of parsing one numeric field.
enum class number_status : std::uint8_t { ok, empty, negative, invalid, too_large };

/// Parses the unsigned decimal integer at the start of [first, last).
/// `*end` receives where it stopped (the caller checks that a separator
/// follows). No sign, no spaces, no hex.
inline number_status parse_u64(const char* first, const char* last, std::uint64_t& value, const char** end) noexcept {
  const auto r = std::from_chars(first, last, value, 10);
  *end = r.ptr;
  if (r.ec == std::errc()) return number_status::ok;
  if (first == last || *first == ',' || *first == '\n') return number_status::empty;
  if (*first == '-') return number_status::negative;
  if (r.ec == std::errc::result_out_of_range) return number_status::too_large;
  return number_status::invalid;
}

/// Whether this build parses and formats floats with std::from_chars /
/// std::to_chars (exact, locale-independent; libstdc++ >= 11, MSVC). The
/// fallback uses strtof / snprintf, which follow the C locale's decimal point;
/// define MOE_RESIDENCY_TRACE_NO_FLOAT_CHARCONV to force it (for testing).
#if defined(__cpp_lib_to_chars) && __cpp_lib_to_chars >= 201611L && !defined(MOE_RESIDENCY_TRACE_NO_FLOAT_CHARCONV)
#define MOE_RESIDENCY_DETAIL_FLOAT_CHARCONV 1
#else
#define MOE_RESIDENCY_DETAIL_FLOAT_CHARCONV 0
#endif
#if MOE_RESIDENCY_DETAIL_FLOAT_CHARCONV
inline constexpr bool float_charconv = true;
#else
inline constexpr bool float_charconv = false;
#endif

/// Parses the float at the start of [first, last) as the engine wrote it
/// ("%g": "0.221297", "1e-05", "nan", "-inf"). `*end` receives where it
/// stopped. A value outside float's range is `too_large`.
inline number_status parse_float(const char* first, const char* last, float& value, const char** end) noexcept {
  if (first == last || *first == ',' || *first == '\n') {
    *end = first;
    return number_status::empty;
  }
#if MOE_RESIDENCY_DETAIL_FLOAT_CHARCONV
  const auto r = std::from_chars(first, last, value, std::chars_format::general);
  *end = r.ptr;
  if (r.ec == std::errc()) return number_status::ok;
  if (r.ec == std::errc::result_out_of_range) return number_status::too_large;
  return number_status::invalid;
#else
  // strtof needs a NUL-terminated string and accepts more than the engine
  // writes (leading spaces, '+', hex); copy the field and reject those.
  const char* stop = first;
  while (stop != last && *stop != ',' && *stop != '\n') ++stop;
  char buf[64];
  const std::size_t n = static_cast<std::size_t>(stop - first);
  *end = first;
  if (n >= sizeof buf) return number_status::invalid;
  std::memcpy(buf, first, n);
  buf[n] = '\0';
  const char c0 = buf[buf[0] == '-' ? 1 : 0];
  if (!((c0 >= '0' && c0 <= '9') || c0 == '.' || c0 == 'n' || c0 == 'i')) return number_status::invalid;
  for (std::size_t i = 0; i + 1 < n; ++i)
    if (buf[i] == '0' && (buf[i + 1] == 'x' || buf[i + 1] == 'X')) return number_status::invalid;
  char* e = nullptr;
  errno = 0;
  value = std::strtof(buf, &e);
  *end = first + (e - buf);
  if (e == buf) return number_status::invalid;
  // glibc flags subnormal results with ERANGE too; only overflow to infinity
  // and underflow to zero are out of range (as std::from_chars reports them).
  if (errno == ERANGE && (std::isinf(value) || value == 0.0f)) return number_status::too_large;
  return number_status::ok;
#endif
}

/// Writes `w` as printf("%g", w) does (6 significant digits, trailing zeros
/// removed, "nan" / "-nan" / "inf"); returns the length. `buf` holds >= 32.
inline std::size_t format_weight(float w, char* buf) noexcept {
#if MOE_RESIDENCY_DETAIL_FLOAT_CHARCONV
  const auto r = std::to_chars(buf, buf + 32, w, std::chars_format::general, 6);
  return static_cast<std::size_t>(r.ptr - buf);
#else
  const int n = std::snprintf(buf, 32, "%g", static_cast<double>(w));
  return n > 0 ? static_cast<std::size_t>(n) : 0;
#endif
}

/// Writes an unsigned integer in decimal; returns the length. `buf` holds >= 20.
inline std::size_t format_u64(std::uint64_t v, char* buf) noexcept {
  const auto r = std::to_chars(buf, buf + 20, v);
  return static_cast<std::size_t>(r.ptr - buf);
}

/// `'value'` for an error message: at most 40 characters, control and
/// non-ASCII bytes as \xNN, a CR shown as \r.
inline std::string quote_field(std::string_view v) {
  std::string out = "'";
  const std::size_t n = v.size() < 40 ? v.size() : 40;
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(v[i]);
    if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c >= 0x7f) {
      static const char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (v.size() > n) out += "...";
  out += "'";
  return out;
}

/// A hint appended when a field ends in CR: the file has CRLF line endings.
inline std::string crlf_hint(std::string_view v) {
  return !v.empty() && v.back() == '\r' ? " (the file has CRLF line endings; expected LF)" : "";
}

}  // namespace detail
}  // namespace moe_residency
