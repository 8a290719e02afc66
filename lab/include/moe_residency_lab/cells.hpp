#pragma once
/// moe_residency_lab/cells.hpp: the memory lab's cells file, which `moe-residency
/// lab-predict --cells` reads and scripts/memlab-predict.sh writes: one CSV line
/// per configuration × memory ratio of a scripts/memlab.sh run,
///
///   ratio,config,limit_mib,budget_mib,stale_gate_pct,metrics
///   2.5,exact,563,141,87.1,/runs/r2.5-exact.metrics.csv
///
/// A header line (`ratio,...`), '#' comments and empty lines are skipped; the
/// metrics field may be empty or missing (a run that did not finish), or list
/// several runs of the same cell separated by ';' (lab-predict appends them:
/// append_token_metrics). Two optional fields follow, for A/B campaigns whose
/// cells differ in more than configuration and ratio:
///
///   ratio,config,limit_mib,budget_mib,stale_gate_pct,metrics,lanes,label
///   2.5,exact,563,141,87.1,/runs/r2.5-exact-l4.metrics.csv,4,exact-l4
///
/// `lanes` (empty: lab-predict's --lanes) is the cell's own read lanes; `label`
/// (empty: CONFIG@RATIO) names the cell for --fit and --pairs, and must be
/// given to list one configuration twice at a ratio (lanes 1 vs 2 vs 4). Carriage
/// returns at the end of a line are dropped ("\r\n" files). Also the fault
/// walk's file (parse_fault_walk) and the inline walk's (parse_inline_walk).
/// Standard library only.

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "moe_residency/detail/numbers.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency_lab/lab.hpp"

namespace moe_residency::lab {

namespace cells_detail {
/// Calls f(line number, fields) for each data line of a small CSV text: the
/// fields split at ',', trailing '\r's dropped ("\r\n" files); empty lines,
/// '#' comments and lines starting with `header` (the header line) skipped.
template <class F>
void for_each_csv_row(const std::string& text, const char* header, F&& f) {
  std::size_t n = 0, pos = 0;
  std::vector<std::string> fields;
  while (pos < text.size()) {
    std::size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string line = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++n;
    while (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#' || line.rfind(header, 0) == 0) continue;
    fields.clear();
    for (std::size_t a = 0;;) {
      const std::size_t comma = line.find(',', a);
      fields.push_back(line.substr(a, comma == std::string::npos ? std::string::npos : comma - a));
      if (comma == std::string::npos) break;
      a = comma + 1;
    }
    f(n, fields);
  }
}
}  // namespace cells_detail

/// One run of the lab as the cells file lists it.
struct lab_cell {
  std::string ratio;  ///< the memory ratio as written (model size / limit, e.g. "2.5"); --fit names it
  lab_config config = lab_config::mmap;
  double limit_mib = 0;       ///< the cgroup's memory limit, MiB (0: none, the resident run)
  double budget_mib = 0;      ///< the pinned cache's budget, MiB
  double stale_gate_pct = 0;  ///< the stale-gate's slot accuracy an observer run measured, percent [0, 100]
  std::string metrics;        ///< the run's per-token metrics CSV; empty when the run did not finish
  std::size_t lanes = 0;      ///< the cell's read lanes; 0: lab-predict's --lanes
  std::string label;          ///< the cell's name; empty: CONFIG@RATIO
  /// How --fit and --pairs name the cell: its label, else CONFIG@RATIO.
  std::string id() const { return label.empty() ? std::string(to_string(config)) + "@" + ratio : label; }
};

/// Parses a cells file. Throws `error` starting with `source` and naming the
/// line, the field and its value and what was expected: a line without 5 to 8
/// fields, an unknown configuration, an empty ratio or one longer than 16, a ratio or metrics path
/// holding a control character, a number that is not a
/// finite number >= 0 (a percentage above 100), lanes outside 1 to 64, a label
/// longer than 64 or holding a character other than letters, digits and `._@+-`, a cell id (the
/// label, else CONFIG@RATIO) listed twice, or a file with no cells.
inline std::vector<lab_cell> parse_lab_cells(const std::string& text, const std::string& source) {
  std::vector<lab_cell> out;
  std::vector<std::size_t> first_line;  // of each cell, for the duplicate message
  cells_detail::for_each_csv_row(text, "ratio,", [&](std::size_t n, std::vector<std::string>& f) {
    const std::string where = source + ": line " + std::to_string(n);
    if (f.size() == 5) f.emplace_back();
    if (f.size() < 6 || f.size() > 8)
      throw error(where + ": " + std::to_string(f.size()) +
                  " fields; expected ratio,config,limit_mib,budget_mib,stale_gate_pct,metrics (and optionally "
                  "lanes,label)");
    f.resize(8);
    lab_cell c;
    if (f[0].empty()) throw error(where + ": ratio ''; expected the run's memory ratio, e.g. 2.5");
    // Bounded: with the configuration it names the cell in lab-predict's tables.
    if (f[0].size() > 16)
      throw error(where + ": ratio of " + std::to_string(f[0].size()) +
                  " characters; expected the run's memory ratio, e.g. 2.5 (at most 16 characters)");
    // A control character (a carriage return left inside a line, a tab) would
    // not survive a write and a read: "\r" at a line's end is dropped.
    for (int col : {0, 5})
      for (char ch : f[col])
        if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f)
          throw error(where + ", " + (col == 0 ? "ratio" : "metrics") + ": a control character (byte " +
                      std::to_string(static_cast<unsigned char>(ch)) + "); expected " +
                      (col == 0 ? "the run's memory ratio, e.g. 2.5" : "the path of the run's metrics CSV"));
    c.ratio = f[0];
    try {
      c.config = parse_lab_config(f[1]);
    } catch (const error& e) {
      throw error(where + ", config: " + e.what());
    }
    auto number = [&](const std::string& s, const char* col, double max) {
      return detail::parse_real(s, where + ", " + col, detail::real_domain::closed(0, max));
    };
    const double none = HUGE_VAL;
    c.limit_mib = number(f[2], "limit_mib", none);
    c.budget_mib = number(f[3], "budget_mib", none);
    c.stale_gate_pct = number(f[4], "stale_gate_pct", 100.0);
    c.metrics = f[5];
    if (!f[6].empty()) c.lanes = detail::parse_whole<std::size_t>(f[6], where + ", lanes", 1, 64);
    // Bounded: a label is a column of lab-predict's tables.
    if (f[7].size() > 64)
      throw error(where + ", label: " + std::to_string(f[7].size()) + " characters; expected at most 64");
    for (char ch : f[7])
      if (!std::isalnum(static_cast<unsigned char>(ch)) && std::string("._@+-").find(ch) == std::string::npos)
        throw error(where + ", label: '" + f[7] + "'; expected letters, digits and ._@+- only");
    c.label = f[7];
    for (std::size_t i = 0; i < out.size(); ++i)
      if (out[i].id() == c.id())
        throw error(where + ": cell " + c.id() + " again (first on line " + std::to_string(first_line[i]) +
                    "); expected each configuration once per ratio, or a label for each");
    out.push_back(std::move(c));
    first_line.push_back(n);
  });
  if (out.empty())
    throw error(source + ": no cells; expected lines ratio,config,limit_mib,budget_mib,stale_gate_pct,metrics");
  return out;
}

/// The cells file of `cells` (a header line, then one line each; numbers with
/// 17 significant digits), which parse_lab_cells reads back exactly.
/// The lanes and label fields only when a cell has one.
inline std::string format_lab_cells(const std::vector<lab_cell>& cells) {
  bool more = false;
  for (const lab_cell& c : cells) more = more || c.lanes || !c.label.empty();
  std::string s =
      std::string("ratio,config,limit_mib,budget_mib,stale_gate_pct,metrics") + (more ? ",lanes,label" : "") + "\n";
  char buf[128];
  for (const lab_cell& c : cells) {
    std::snprintf(buf, sizeof buf, ",%s,%.17g,%.17g,%.17g,", to_string(c.config), c.limit_mib, c.budget_mib,
                  c.stale_gate_pct);
    s += c.ratio + buf + c.metrics;
    if (more) s += "," + (c.lanes ? std::to_string(c.lanes) : std::string()) + "," + c.label;
    s += "\n";
  }
  return s;
}

/// One measurement of the fault path (`moe-disk-lanes --fault-walk`, which
/// scripts/memlab.sh runs in each ratio's limit before the cells and writes to
/// fault-walk.csv, the cell's limit first):
///
///   limit_mib,pinned_dense_mib,tokens,walked_mib_per_token,read_mib_per_token,wall_ms,cpu_ms,sys_ms,majflt,off_cpu_ms_per_mib,sys_ms_per_mib,mib_per_fault
///   563,110.2,14,309.4,1245.1,1572.10,607.11,603.54,104.5,0.7750,0.4847,11.91
struct fault_walk_row {
  double limit_mib = 0;         ///< the cell's cgroup limit the walk stands for (walked at it less the overhead)
  double pinned_dense_mib = 0;  ///< > 0: the dense pages were locked (the `dense` configuration's shape)
  double off_cpu_ms_per_mib = 0, sys_ms_per_mib = 0;
};

namespace cells_detail {
/// The numeric rows of a walk's CSV (fault-walk.csv, inline-walk.csv): every
/// field a finite number >= 0, `cols` of them; else `error` naming the line,
/// the field, its value and what was expected. `what` says whose lines they are.
template <std::size_t N>
std::vector<std::array<double, N>> parse_walk_rows(const std::string& text, const std::string& source,
                                                   const char* const (&cols)[N], const char* what) {
  std::string names;
  for (const char* c : cols) names += (names.empty() ? "" : ",") + std::string(c);
  std::vector<std::array<double, N>> out;
  for_each_csv_row(text, "limit_mib,", [&](std::size_t n, std::vector<std::string>& f) {
    const std::string where = source + ": line " + std::to_string(n);
    if (f.size() != N)
      throw error(where + ": " + std::to_string(f.size()) + " fields; expected " + std::to_string(N) + ": " + names);
    std::array<double, N> v{};
    for (std::size_t k = 0; k < N; ++k) {
      v[k] = detail::parse_real(f[k], where + ", " + cols[k], detail::real_domain::non_negative());
    }
    out.push_back(v);
  });
  if (out.empty()) throw error(source + ": no rows; expected lines of " + what + ", the limit first");
  return out;
}
}  // namespace cells_detail

/// Parses fault-walk.csv text: a header line (`limit_mib,...`), '#' comments
/// and empty lines are skipped. Throws `error` starting with `source` and
/// naming the line, the field and its value and what was expected: a line
/// without 12 fields, or a field that is not a finite number >= 0, or a file
/// with no rows.
inline std::vector<fault_walk_row> parse_fault_walk(const std::string& text, const std::string& source) {
  static const char* const cols[] = {
      "limit_mib", "pinned_dense_mib", "tokens", "walked_mib_per_token", "read_mib_per_token", "wall_ms",
      "cpu_ms",    "sys_ms",           "majflt", "off_cpu_ms_per_mib",   "sys_ms_per_mib",     "mib_per_fault"};
  std::vector<fault_walk_row> out;
  for (const auto& v : cells_detail::parse_walk_rows(text, source, cols, "moe-disk-lanes --fault-walk"))
    out.push_back(fault_walk_row{v[0], v[1], v[9], v[10]});
  return out;
}

/// The fault path's cost for a cell of limit `limit_mib` (within 0.5 MiB),
/// dense pinned or not: the mean of every matching row (rounds, pooled runs),
/// written into `s`. False, and `s` unchanged, when no row matches.
inline bool apply_fault_walk(const std::vector<fault_walk_row>& rows, double limit_mib, bool dense_pinned,
                             lab_setup& s) {
  double off = 0, sys = 0;  // running means: no sum to overflow
  std::size_t k = 0;
  for (const fault_walk_row& r : rows)
    if (std::abs(r.limit_mib - limit_mib) <= 0.5 && (r.pinned_dense_mib > 0) == dense_pinned) {
      ++k;
      off += (r.off_cpu_ms_per_mib - off) / static_cast<double>(k);
      sys += (r.sys_ms_per_mib - sys) / static_cast<double>(k);
    }
  if (k == 0) return false;
  s.fault_walk_off_cpu_ms_per_mib = off;
  s.fault_walk_sys_ms_per_mib = sys;
  return true;
}

/// One measurement of `cache`'s inline path (`moe-disk-lanes --inline-walk`,
/// which scripts/memlab.sh runs in each ratio's limit, at that ratio's budget,
/// before the cells and writes to inline-walk.csv, the cell's limit first):
///
///   limit_mib,budget_mib,tokens,pins_per_token,read_mib_per_token,wall_ms,cpu_ms,sys_ms,off_cpu_ms_per_mib,sys_ms_per_mib
///   563,141.0,22,89.7,58.4,90.71,80.89,64.80,0.1681,1.1097
struct inline_walk_row {
  double limit_mib = 0;   ///< the cell's cgroup limit the walk stands for
  double budget_mib = 0;  ///< the pinned cache's budget walked
  double off_cpu_ms_per_mib = 0, sys_ms_per_mib = 0;
};

/// Parses inline-walk.csv text as parse_fault_walk does fault-walk.csv: 10
/// fields a line.
inline std::vector<inline_walk_row> parse_inline_walk(const std::string& text, const std::string& source) {
  static const char* const cols[] = {"limit_mib", "budget_mib", "tokens", "pins_per_token",     "read_mib_per_token",
                                     "wall_ms",   "cpu_ms",     "sys_ms", "off_cpu_ms_per_mib", "sys_ms_per_mib"};
  std::vector<inline_walk_row> out;
  for (const auto& v : cells_detail::parse_walk_rows(text, source, cols, "moe-disk-lanes --inline-walk"))
    out.push_back(inline_walk_row{v[0], v[1], v[8], v[9]});
  return out;
}

/// The inline path's cost for a `cache` cell of limit `limit_mib` (within
/// 0.5 MiB): the median of every matching row, each column on its own (the
/// mean of the middle two for an even count), written into `s`. The median,
/// not the mean: one walk of 24 tokens can catch the device in a stall that
/// the cells do not see (docs/lab-predict.md, "The walks").
/// False, and `s` unchanged, when no row matches.
inline bool apply_inline_walk(const std::vector<inline_walk_row>& rows, double limit_mib, lab_setup& s) {
  std::vector<double> off, sys;
  for (const inline_walk_row& r : rows)
    if (std::abs(r.limit_mib - limit_mib) <= 0.5) {
      off.push_back(r.off_cpu_ms_per_mib);
      sys.push_back(r.sys_ms_per_mib);
    }
  if (off.empty()) return false;
  const auto median = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : v[n / 2 - 1] + (v[n / 2] - v[n / 2 - 1]) / 2;
  };
  s.inline_walk_off_cpu_ms_per_mib = median(off);
  s.inline_walk_sys_ms_per_mib = median(sys);
  return true;
}

}  // namespace moe_residency::lab
