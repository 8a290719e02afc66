#pragma once
/// A route trace row's columns (numbered as in error messages), the domain
/// of each checked value and the words for a value outside it: shared by the
/// row checker (trace/validate.hpp), the CSV parser and the binary reader's
/// passes (trace/binary_scan.hpp checks weights on their bits).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "moe_residency/detail/trace_text.hpp"

namespace moe_residency {
namespace detail {

/// The columns of a row, numbered as in error messages (1-based).
enum class trace_column : std::uint8_t {
  turn = 1,
  phase,
  step,
  layer,
  slot,
  expert,
  weight,
  residency,
  expert_bytes,
  dropped
};

inline const char* column_name(trace_column c) noexcept {
  static const char* const names[] = {"",       "turn",   "phase",     "step",         "layer",  "slot",
                                      "expert", "weight", "residency", "expert_bytes", "dropped"};
  return names[static_cast<int>(c)];
}

struct trace_issue {
  trace_column column = trace_column::turn;
  std::string message;
};

inline std::string range_message(const char* what, std::uint64_t v, std::uint64_t end) {
  return std::string(what) + " " + std::to_string(v) + " out of range [0, " + std::to_string(end) + ")";
}
inline std::string phase_message(std::uint64_t v) {
  return "phase " + std::to_string(v) + " out of range; expected 0 (prefill) or 1 (decode)";
}
inline std::string residency_message(std::uint64_t v) {
  return "residency " + std::to_string(v) +
         " out of range; expected 0 (miss), 1 (hit) or 2 (hit thanks to a speculative read)";
}
/// A gate weight is the share of a token's output an expert carries: finite
/// and >= 0 (-0 included), or NaN for an engine that records no weights. A
/// negative or infinite one would flow into the drop policy's mass accounting.
inline bool weight_in_domain(float w) noexcept { return std::isnan(w) || (w >= 0.0f && w < HUGE_VALF); }
/// weight_in_domain on the weight's IEEE-754 bits (the binary scanner's form).
/// Below +inf with the sign clear, a NaN of either sign, or -0; three
/// compares without a branch, as the scanner's vector lanes do them.
inline bool weight_bits_in_domain(std::uint32_t bits) noexcept {
  return (bits < 0x7f800000u) | ((bits & 0x7fffffffu) > 0x7f800000u) | (bits == 0x80000000u);
}
inline std::string weight_message(float w) {
  char buf[32];
  const std::string text(buf, format_weight(w, buf));
  return "weight " + text + (std::isinf(w) ? " is not finite" : " is negative") +
         "; expected a finite weight >= 0 (or nan, an unrecorded weight)";
}
inline std::string dropped_message(std::uint64_t v) {
  return "dropped " + std::to_string(v) + " out of range; expected 0 or 1";
}
inline std::string slot_message(std::uint64_t v, std::size_t k) {
  return "slot " + std::to_string(v) + " out of range [0, " + std::to_string(k) +
         ") (n_expert_used=" + std::to_string(k) + ")";
}

}  // namespace detail
}  // namespace moe_residency
