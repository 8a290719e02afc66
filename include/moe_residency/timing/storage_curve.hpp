#pragma once
/// timing/storage_curve.hpp: the storage curve of the timing model
/// (timing.hpp), B(m) of equation (2): a device's aggregate random-read
/// bandwidth against concurrent read lanes, from measured points, and its two
/// text forms (a lanes:MiB/s list, a CSV like shared/traces/flash-lanes.csv).
/// Standard library only.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/detail/numbers.hpp"
#include "moe_residency/detail/text_encoding.hpp"
#include "moe_residency/error.hpp"

namespace moe_residency {

/// Aggregate random-read bandwidth of a storage device against concurrent
/// read lanes, from measured points; linear between points, flat beyond them.
class storage_curve {
 public:
  /// The phone of shared/traces/flash-lanes.csv (4 MiB random reads, cold).
  storage_curve()
      : points_{{1, 1809.9},  {2, 2459.8},  {4, 2457.9},  {8, 2420.0},
                {12, 2360.1}, {16, 2243.9}, {24, 2308.6}, {32, 2254.8}} {}
  /// Points (lanes, MiB/s): lanes >= 1 and strictly increasing, MiB/s finite
  /// and > 0. Throws `error` naming the point (numbered from 1, as
  /// parse_list numbers them) otherwise.
  explicit storage_curve(std::vector<std::pair<double, double>> points) : points_(std::move(points)) {
    if (points_.empty()) throw error("storage_curve: no points; expected (lanes, MiB/s) pairs");
    for (std::size_t i = 0; i < points_.size(); ++i) {
      const auto& p = points_[i];
      if (!(p.first >= 1) || !std::isfinite(p.first) || (i && !(p.first > points_[i - 1].first)))
        throw error("storage_curve: point " + std::to_string(i + 1) + ": lanes " + fmt(p.first) +
                    "; expected lanes >= 1, strictly increasing");
      if (!(p.second > 0) || !std::isfinite(p.second))
        throw error("storage_curve: point " + std::to_string(i + 1) + ": " + fmt(p.second) +
                    " MiB/s; expected a finite bandwidth > 0");
    }
  }

  /// Parses "1:1809.9,2:2459.8" (lanes:MiB/s, comma-separated).
  static storage_curve parse_list(const std::string& text) {
    std::vector<std::pair<double, double>> pts;
    std::stringstream ss(text);
    const std::string example = "; expected lanes:MiB/s pairs like 1:1809.9,2:2459.8";
    std::size_t start = 0;
    for (std::size_t i = 1;; ++i) {
      const std::size_t comma = text.find(',', start);
      const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      const std::string where = "storage_curve: point " + std::to_string(i) + " of '" + text + "'";
      if (item.empty()) throw error(where + " is empty" + example);
      const auto colon = item.find(':');
      if (colon == std::string::npos) throw error(where + ": '" + item + "' has no ':'" + example);
      pts.emplace_back(detail::parse_real(item.substr(0, colon), where + ", lanes"),
                       detail::parse_real(item.substr(colon + 1), where + ", MiB/s"));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return storage_curve(std::move(pts));
  }

  /// Parses a CSV with a header naming the columns `lanes` and `mib_per_s`
  /// (as shared/traces/flash-lanes.csv). `source` prefixes errors. A header
  /// that names a column twice or leaves one unnamed is refused; a UTF-8
  /// byte-order mark is skipped, compressed or UTF-16 data refused naming it.
  static storage_curve parse_csv(const std::string& text, const std::string& source) {
    detail::check_text_encoding(text, source, "a lanes CSV (a header with lanes and mib_per_s)");
    std::stringstream ss(std::string(detail::strip_utf8_bom(text)));
    std::string line;
    if (!std::getline(ss, line)) throw error(source + ": empty; expected a header with lanes and mib_per_s");
    const auto cols = split(line);
    for (std::size_t c = 0; c < cols.size(); ++c) {
      if (cols[c].empty())
        throw error(source + ": line 1, column " + std::to_string(c + 1) +
                    ": the header names no column here; expected a name in every field");
      for (std::size_t d = 0; d < c; ++d)
        if (cols[d] == cols[c])
          throw error(source + ": line 1: column '" + cols[c] + "' named twice (columns " + std::to_string(d + 1) +
                      " and " + std::to_string(c + 1) + "); expected each column once");
    }
    const auto lanes_col = std::find(cols.begin(), cols.end(), "lanes") - cols.begin();
    const auto bw_col = std::find(cols.begin(), cols.end(), "mib_per_s") - cols.begin();
    if (static_cast<std::size_t>(lanes_col) == cols.size() || static_cast<std::size_t>(bw_col) == cols.size())
      throw error(source + ": header '" + line + "'; expected columns lanes and mib_per_s");
    std::vector<std::pair<double, double>> pts;
    std::size_t n = 1;
    while (std::getline(ss, line)) {
      ++n;
      if (line.empty() || line[0] == '#') continue;
      const auto f = split(line);
      if (f.size() != cols.size())
        throw error(source + ": line " + std::to_string(n) + ": " + std::to_string(f.size()) + " fields; expected " +
                    std::to_string(cols.size()));
      // Each field wholly a finite number: a bare strtod would read "1:1809.9" as 1.
      auto number = [&](std::ptrdiff_t col) {
        return detail::parse_real(
            f[static_cast<std::size_t>(col)],
            source + ": line " + std::to_string(n) + ", column " + cols[static_cast<std::size_t>(col)]);
      };
      const double lanes = number(lanes_col);
      pts.emplace_back(lanes, number(bw_col));
    }
    try {
      return storage_curve(std::move(pts));
    } catch (const error& e) {
      throw error(source + ": " + e.what());
    }
  }

  /// Aggregate MiB/s with `lanes` concurrent reads.
  double mib_per_s(double lanes) const noexcept {
    if (lanes <= points_.front().first) return points_.front().second;
    for (std::size_t i = 1; i < points_.size(); ++i)
      if (lanes <= points_[i].first) {
        const auto& a = points_[i - 1];
        const auto& b = points_[i];
        // Weighted, not a + (b - a)·t: that cancels to 0 at t = 1 when b is
        // negligible next to a; this is b there and stays between a and b.
        const double t = (lanes - a.first) / (b.first - a.first);
        return (1 - t) * a.second + t * b.second;
      }
    return points_.back().second;
  }
  const std::vector<std::pair<double, double>>& points() const noexcept { return points_; }
  /// "1:1809.9,2:2459.8,..." (parse_list's form, which reads it back exactly).
  std::string to_list() const {
    std::string s;
    for (const auto& p : points_) s += (s.empty() ? "" : ",") + fmt(p.first) + ":" + fmt(p.second);
    return s;
  }

 private:
  /// "%g" when it reads back as `v`, else 17 digits: to_list() must parse back
  /// to the same points (two lanes "%g" prints alike would not even parse).
  static std::string fmt(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", v);
    if (std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof buf, "%.17g", v);
    return buf;
  }
  // Every field, an empty last one included ("1,2," is three fields).
  static std::vector<std::string> split(const std::string& line) {
    std::vector<std::string> out;
    std::string l = line;
    if (!l.empty() && l.back() == '\r') l.pop_back();
    for (std::size_t start = 0;;) {
      const std::size_t comma = l.find(',', start);
      std::string f = l.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      while (!f.empty() && f.back() == ' ') f.pop_back();
      out.push_back(f);
      if (comma == std::string::npos) return out;
      start = comma + 1;
    }
  }
  std::vector<std::pair<double, double>> points_;
};

}  // namespace moe_residency
