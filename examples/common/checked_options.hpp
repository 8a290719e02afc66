#pragma once
// CLI11 validators built on the library's checked number parsers
// (moe_residency/detail/numbers.hpp), so every numeric option of every
// program refuses a negative, non-finite, fractional or wrapped value the
// same way, naming the option, the text and the limits:
//   --threads: '-1' is negative; expected a whole number from 0 to 4096
// the named choices an option takes (one_of), worded the same way:
//   --format: 'xml' is not a choice; expected table, csv or json
// and the comma lists every program's list options share (split_list).

#include <CLI/CLI.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "moe_residency/detail/numbers.hpp"
#include "moe_residency/error.hpp"

namespace moe_residency_cli {

/// A whole number from `lo` to `hi`, in decimal digits.
inline CLI::Validator whole(std::uint64_t lo = 0, std::uint64_t hi = std::numeric_limits<std::uint64_t>::max()) {
  const std::string desc = hi == std::numeric_limits<std::uint64_t>::max()
                               ? "WHOLE >= " + std::to_string(lo)
                               : "WHOLE " + std::to_string(lo) + ".." + std::to_string(hi);
  return CLI::Validator([lo, hi](std::string& s) { return moe_residency::detail::whole_problem(s, lo, hi); }, desc);
}

/// A finite real in `d`.
inline CLI::Validator real(const moe_residency::detail::real_domain& d) {
  return CLI::Validator([d](std::string& s) { return moe_residency::detail::real_problem(s, d); },
                        "REAL: " + d.describe());
}

/// A finite real in `d`, for an option stored as a float: checked as that
/// float (1e-50 is in (0, 1] as a double and 0 as a float).
inline CLI::Validator real_float(const moe_residency::detail::real_domain& d) {
  return CLI::Validator([d](std::string& s) { return moe_residency::detail::float_problem(s, d); },
                        "REAL: " + d.describe());
}

/// A finite real > 0.
inline CLI::Validator positive() { return real(moe_residency::detail::real_domain::positive()); }

/// A finite real >= 0.
inline CLI::Validator non_negative() { return real(moe_residency::detail::real_domain::non_negative()); }

/// Anything but the empty string: an empty value is an error, never "not
/// given" (`--plot ''` would otherwise draw nothing and say nothing):
///   --plot: empty; expected a file to write the SVG to
inline CLI::Validator non_empty(const std::string& expected) {
  return CLI::Validator(
      [expected](std::string& s) { return s.empty() ? "empty; expected " + expected : std::string(); }, "");
}

/// "a, b or c": the names an option takes, as its refusals and its help list them.
inline std::string either(const std::vector<std::string>& names) {
  std::string s;
  for (std::size_t i = 0; i < names.size(); ++i) s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return s;
}

/// One of `names`, spelled exactly:
///   --format: 'xml' is not a choice; expected table, csv or json
inline CLI::Validator one_of(std::vector<std::string> names) {
  std::string desc;
  for (const std::string& n : names) desc += (desc.empty() ? "" : "|") + n;
  return CLI::Validator(
      [names](std::string& s) {
        for (const std::string& n : names)
          if (s == n) return std::string();
        return "'" + s + "' is not a choice; expected " + either(names);
      },
      desc);
}

/// The comma-separated items of `option`'s value `s`. An empty value or an
/// empty item (",," or a comma at either end) is an error naming the option:
/// a skipped item would silently leave a cell out of the run.
inline std::vector<std::string> split_list(const std::string& s, const std::string& option) {
  if (s.empty()) throw moe_residency::error(option + ": empty; expected a comma-separated list");
  std::vector<std::string> out;
  for (std::size_t start = 0;;) {
    const std::size_t comma = s.find(',', start);
    std::string item = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item.empty())
      throw moe_residency::error(option + ": item " + std::to_string(out.size() + 1) + " of '" + s +
                                 "' is empty; expected items separated by single commas");
    out.push_back(std::move(item));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

}  // namespace moe_residency_cli
