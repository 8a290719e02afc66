// libFuzzer target: the storage lanes curve, in both of its text forms — the CSV
// file (storage_curve::parse_csv: shared/traces/flash-lanes.csv, the config's
// curve_file) and the lanes:MiB/s list (storage_curve::parse_list: the config's
// curve = ..., lab-predict --curve). The same bytes go through both parsers.
// Any input ends in moe_residency::error naming the input, or in a curve whose
// points hold the constructor's rules, whose bandwidth stays between its points'
// and which its list form writes and reads back exactly. An accepted CSV holds
// exactly the points a slow, strict twin reads from it (every field it took a
// number from is a whole number, as a person would read the file).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_check.hpp"
#include "moe_residency/timing.hpp"

namespace {

using moe_residency_fuzz::check;
using points = std::vector<std::pair<double, double>>;

void check_curve(const moe_residency::storage_curve& c) {
  const points& p = c.points();
  check(!p.empty(), "an accepted curve has no points");
  double lo = HUGE_VAL, hi = 0;
  for (std::size_t i = 0; i < p.size(); ++i) {
    check(p[i].first >= 1 && std::isfinite(p[i].first), "lanes below 1 or not finite");
    check(i == 0 || p[i].first > p[i - 1].first, "lanes not strictly increasing");
    check(p[i].second > 0 && std::isfinite(p[i].second), "MiB/s not finite and > 0");
    lo = std::min(lo, p[i].second);
    hi = std::max(hi, p[i].second);
  }
  for (double m : {0.0, 1.0, 1.5, 2.0, 3.0, 7.5, 64.0, 1e9, p.back().first, p.front().first}) {
    const double b = c.mib_per_s(m);
    check(std::isfinite(b) && b >= lo * (1 - 1e-12) && b <= hi * (1 + 1e-12), "mib_per_s outside the points' range",
          std::to_string(m) + " lanes: " + std::to_string(b));
  }
  // The list form is a fixed point and reads back exactly.
  const std::string list = c.to_list();
  moe_residency::storage_curve back;
  try {
    back = moe_residency::storage_curve::parse_list(list);
  } catch (const moe_residency::error& e) {
    moe_residency_fuzz::fail("to_list() does not parse back", list + ": " + e.what());
  }
  check(back.points() == p, "to_list() -> parse_list() changed a point", list);
  check(back.to_list() == list, "to_list() is not a fixed point", list);
}

// Every field, an empty last one included ("1,2," is three), blanks and a CR trimmed at its end.
std::vector<std::string> split_trimmed(const std::string& line) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = line.find(',', start);
    std::string f = line.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    while (!f.empty() && (f.back() == '\r' || f.back() == ' ')) f.pop_back();
    out.push_back(f);
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

bool whole_number(const std::string& s, double& v) {
  char* end = nullptr;
  v = std::strtod(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size();
}

/// The CSV read slowly and strictly: nullopt when a number field is not wholly a number.
std::optional<points> csv_twin(const std::string& text) {
  // A UTF-8 byte-order mark is not part of the first column's name.
  std::stringstream ss(text.rfind("\xef\xbb\xbf", 0) == 0 ? text.substr(3) : text);
  std::string line;
  if (!std::getline(ss, line)) return std::nullopt;
  const auto cols = split_trimmed(line);
  std::size_t lc = cols.size(), bc = cols.size();
  for (std::size_t i = cols.size(); i-- > 0;) {  // the first of each name, as std::find does
    if (cols[i] == "lanes") lc = i;
    if (cols[i] == "mib_per_s") bc = i;
  }
  if (lc == cols.size() || bc == cols.size()) return std::nullopt;
  points pts;
  while (std::getline(ss, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto f = split_trimmed(line);
    if (f.size() != cols.size()) return std::nullopt;
    double l = 0, b = 0;
    if (!whole_number(f[lc], l) || !whole_number(f[bc], b)) return std::nullopt;
    pts.emplace_back(l, b);
  }
  return pts;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace moe_residency;
  const std::string text = moe_residency_fuzz::text_of(data, size);
  std::optional<storage_curve> c;
  try {
    c = storage_curve::parse_csv(text, "fuzz-curve.csv");
  } catch (const error& e) {
    moe_residency_fuzz::check_message(e, "fuzz-curve.csv", text.size());
  }
  if (c) {
    check_curve(*c);
    const auto twin = csv_twin(text);
    check(twin.has_value(), "parse_csv accepted a file with a field that is not wholly a number");
    check(*twin == c->points(), "parse_csv's points differ from the strict twin's");
    // A CSV written from the points (17 digits) reads back exactly.
    std::string csv = "lanes,read_kib,mib_per_s\n";
    char buf[96];
    for (const auto& p : c->points()) {
      std::snprintf(buf, sizeof buf, "%.17g,4096,%.17g\n", p.first, p.second);
      csv += buf;
    }
    try {
      check(storage_curve::parse_csv(csv, "roundtrip.csv").points() == c->points(),
            "CSV write -> parse changed a point");
    } catch (const error& e) {
      moe_residency_fuzz::fail("the written CSV does not parse back", e.what());
    }
  }
  std::optional<storage_curve> l;
  try {
    l = storage_curve::parse_list(text);
  } catch (const error& e) {
    moe_residency_fuzz::check_message(e, "storage_curve", text.size());
  }
  if (l) check_curve(*l);
  return 0;
}
