#pragma once
/// timing/metrics.hpp: recorded per-decode-token metrics (the engine's and
/// the memory lab probe's *.metrics.csv), what the timing model is calibrated
/// on (timing/calibrate.hpp) and compared with: the parser, the lab's tok/s
/// and the merge of repeated runs. Standard library only.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/detail/numbers.hpp"
#include "moe_residency/detail/text_encoding.hpp"
#include "moe_residency/error.hpp"

namespace moe_residency {

/// Recorded per-decode-token metrics (the engine's *.metrics.csv): columns by
/// header name; wall_ms is required, stall_ms, mgmt_ms, compute_ms,
/// read_bytes, io_ms, cpu_ms, sys_ms and majflt are kept when present (NaN
/// otherwise). '#' lines are skipped (a run's configuration in them:
/// timing/run_config.hpp). cpu_ms and sys_ms are the memory lab
/// probe's: the eval thread's CPU time and the part of it in the kernel;
/// majflt the major page faults the token took (the phone's engine and the probe).
///
/// Rows are paired with decode tokens by the `step` they carry, not by their
/// place in the file: step s is the run's s-th decode token (from 1), rows are
/// put in step order, and a step missing, repeated or not from 1 is an error
/// naming the line; a `steps` column (the run's decode tokens) must agree with
/// the rows there are, so a cut file is refused. A file without a `step`
/// column is paired by position.
struct token_metrics {
  std::vector<double> wall_ms, stall_ms, mgmt_ms, compute_ms, read_bytes, io_ms, cpu_ms, sys_ms;
  std::vector<double> majflt;  ///< major page faults per token
  std::size_t size() const noexcept { return wall_ms.size(); }
};

/// Throws `error` naming the source, line and column on a malformed file:
/// a header that names a column twice or leaves one unnamed, a row whose
/// fields do not match it, a value that is not a finite number >= 0 (an
/// empty one included), steps that do not pair. A UTF-8 byte-order mark is
/// skipped; compressed or UTF-16 data is refused naming it.
inline token_metrics parse_token_metrics(const std::string& text, const std::string& source) {
  detail::check_text_encoding(text, source, "a metrics CSV (a header like step,steps,wall_ms,...)");
  std::stringstream ss(std::string(detail::strip_utf8_bom(text)));
  std::string line;
  std::size_t n = 0;
  std::vector<std::string> cols;
  while (std::getline(ss, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    // Every field, an empty last one included ("a,b," names three columns).
    for (std::size_t start = 0;;) {
      const std::size_t comma = line.find(',', start);
      cols.push_back(line.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    // A column named twice would pair one copy by name and drop the other
    // silently; an unnamed one holds values nothing reads.
    for (std::size_t c = 0; c < cols.size(); ++c) {
      if (cols[c].empty())
        throw error(source + ": line " + std::to_string(n) + ", column " + std::to_string(c + 1) +
                    ": the header names no column here; expected a name in every field of '" + line + "'");
      for (std::size_t d = 0; d < c; ++d)
        if (cols[d] == cols[c])
          throw error(source + ": line " + std::to_string(n) + ": column '" + cols[c] + "' named twice (columns " +
                      std::to_string(d + 1) + " and " + std::to_string(c + 1) + "); expected each column once");
    }
    break;
  }
  auto col = [&](const char* name) -> std::ptrdiff_t {
    const auto it = std::find(cols.begin(), cols.end(), name);
    return it == cols.end() ? -1 : it - cols.begin();
  };
  const std::ptrdiff_t wall = col("wall_ms");
  if (wall < 0)
    throw error(source + ": line " + std::to_string(n) +
                ": no wall_ms column; expected a metrics header like step,steps,wall_ms,...");
  constexpr int kept = 9;
  const std::ptrdiff_t idx[kept] = {wall,         col("stall_ms"), col("mgmt_ms"), col("compute_ms"), col("read_bytes"),
                                    col("io_ms"), col("cpu_ms"),   col("sys_ms"),  col("majflt")};
  token_metrics m;
  std::vector<double>* dst[kept] = {&m.wall_ms, &m.stall_ms, &m.mgmt_ms, &m.compute_ms, &m.read_bytes,
                                    &m.io_ms,   &m.cpu_ms,   &m.sys_ms,  &m.majflt};
  const std::ptrdiff_t step_col = col("step"), steps_col = col("steps");
  struct row_step {
    std::uint64_t step, steps;
    std::size_t line;
  };
  std::vector<row_step> steps;  // per row, when the file has a step column
  auto whole = [&](const std::vector<std::string>& f, std::ptrdiff_t c, std::size_t line_no) -> std::uint64_t {
    // Decode tokens count from 1.
    return detail::parse_whole<std::uint64_t>(
        f[static_cast<std::size_t>(c)],
        source + ": line " + std::to_string(line_no) + ", column " + cols[static_cast<std::size_t>(c)], 1);
  };
  while (std::getline(ss, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f;
    for (std::size_t start = 0;;) {  // an empty last field counts: "1,2," is three fields
      const std::size_t comma = line.find(',', start);
      f.push_back(line.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    if (f.size() != cols.size())
      throw error(source + ": line " + std::to_string(n) + ": " + std::to_string(f.size()) + " fields; expected " +
                  std::to_string(cols.size()));
    for (int k = 0; k < kept; ++k) {
      double v = std::numeric_limits<double>::quiet_NaN();
      if (idx[k] >= 0) {
        v = detail::parse_real(
            f[static_cast<std::size_t>(idx[k])],
            source + ": line " + std::to_string(n) + ", column " + cols[static_cast<std::size_t>(idx[k])],
            detail::real_domain::non_negative());
      }
      dst[k]->push_back(v);
    }
    if (step_col >= 0) steps.push_back({whole(f, step_col, n), steps_col >= 0 ? whole(f, steps_col, n) : 0, n});
  }
  if (m.wall_ms.empty()) throw error(source + ": no token rows");
  if (steps.empty()) return m;
  // Pair by step: rows in step order, each step 1..N exactly once.
  std::vector<std::size_t> order(steps.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return steps[a].step < steps[b].step; });
  for (std::size_t i = 0; i < order.size(); ++i) {
    const row_step& r = steps[order[i]];
    if (r.step == i + 1) continue;
    if (i > 0 && r.step == steps[order[i - 1]].step)
      throw error(source + ": line " + std::to_string(r.line) + ": step " + std::to_string(r.step) + " again (line " +
                  std::to_string(steps[order[i - 1]].line) + " has it); expected each decode token's step once");
    throw error(source + ": line " + std::to_string(r.line) + ": step " + std::to_string(r.step) + ", but step " +
                std::to_string(i + 1) + " is missing; expected steps 1 to " + std::to_string(steps.size()) +
                ", one row per decode token");
  }
  for (const row_step& r : steps)
    if (steps_col >= 0 && r.steps != steps.size())
      throw error(source + ": line " + std::to_string(r.line) + ": steps " + std::to_string(r.steps) +
                  " (the run's decode tokens), but the file has " + std::to_string(steps.size()) +
                  " rows; expected one row per decode token (a cut or merged file?)");
  bool sorted = true;
  for (std::size_t i = 0; i < order.size(); ++i) sorted = sorted && order[i] == i;
  if (!sorted)
    for (int k = 0; k < kept; ++k) {
      std::vector<double> v(order.size());
      for (std::size_t i = 0; i < order.size(); ++i) v[i] = (*dst[k])[order[i]];
      *dst[k] = std::move(v);
    }
  return m;
}

/// Decode tok/s of a metrics file as the memory lab counts it: tokens / Σ wall.
inline double metrics_tok_per_s(const token_metrics& m) {
  double wall = 0;
  for (double w : m.wall_ms) wall += w;
  return wall > 0 ? 1000.0 * static_cast<double>(m.size()) / wall : 0.0;
}

/// Appends `more`'s rows to `into`: one cell measured again (the lab's
/// repeated runs), for a fit or a mean over every run. A column one of the
/// two lacks is NaN for its rows.
inline void append_token_metrics(token_metrics& into, const token_metrics& more) {
  const std::size_t n = into.size();
  std::vector<double> token_metrics::*cols[] = {
      &token_metrics::wall_ms,    &token_metrics::stall_ms,   &token_metrics::mgmt_ms,
      &token_metrics::compute_ms, &token_metrics::read_bytes, &token_metrics::io_ms,
      &token_metrics::cpu_ms,     &token_metrics::sys_ms,     &token_metrics::majflt};
  for (auto c : cols) {
    std::vector<double>& a = into.*c;
    const std::vector<double>& b = more.*c;
    a.resize(n, std::numeric_limits<double>::quiet_NaN());
    if (b.size() == more.size()) a.insert(a.end(), b.begin(), b.end());
    else a.resize(n + more.size(), std::numeric_limits<double>::quiet_NaN());
  }
}

}  // namespace moe_residency
