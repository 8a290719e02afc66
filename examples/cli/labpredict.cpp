// `moe-residency lab-predict`: the timing model against the memory lab.
// Calibrates the model's free parameters on ONE lab run (one configuration at
// one ratio, all its decode tokens), then predicts the decode tok/s of every
// other cell from what is known before that cell runs (moe_residency_lab/lab.hpp): the
// route trace, the memory limit, the budget, the configuration's levers and
// the disk's lanes curve. The other cells' metrics are read only to print the
// measured tok/s next to the prediction. A cell measured in several runs
// lists their metrics files separated by ';': the fit sees every run's tokens,
// and the measured tok/s is over all of them; so does a cell that several
// --cells files (several runs of the lab) list. --pairs names A/B pairs of
// cells: each pair's measured and predicted time ratio, the verdicts and
// whether the prediction has the sign and is within 10% (docs/lab-predict.md).

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "checked_options.hpp"
#include "command.hpp"
#include "moe_residency/timing.hpp"
#include "moe_residency/timing/calibrate.hpp"
#include "moe_residency/timing/verdict.hpp"
#include "moe_residency_lab/lab.hpp"
#include "moe_residency_lab/calibrate.hpp"
#include "moe_residency_lab/manager.hpp"
#include "moe_residency_lab/cells.hpp"

namespace {

using namespace moe_residency;
using namespace moe_residency::lab;

struct lab_args {
  std::string trace, curve, fit, format = "table";
  std::vector<std::string> cells;  // one file per lab run; a cell in several is measured in each
  std::string pairs;               // A:B,C:D (cell ids)
  double noise = -1;               // the verdicts' band, %; < 0: measured, else 5 assumed
  double overhead_mib = 64, readaround_mib = 16;
  double dense_mib = 0;  // the model file's dense bytes; 0: the trace header's
  std::size_t lanes = 2, spec_cap = 2;
  std::string free = "compute,bandwidth,kernel";
  double overlap = 0;
  double bandwidth_scale = 1;        // β where not fitted
  double fault_bandwidth_scale = 0;  // β_f where not fitted; 0: tied to β
  std::string manager_runs;   // BASELINE,EXACT,CACHE metrics (memlab's resident-all, manager-exact, manager-cache)
  double manager_budget = 0;  // the manager-cache run's budget, MiB
  std::string fault_walk;     // fault-walk.csv files, ';' between them (memlab's moe-disk-lanes --fault-walk)
  std::string inline_walk;    // inline-walk.csv files, the same (moe-disk-lanes --inline-walk)
};

struct cell {
  std::string id;  ///< label, else CONFIG@RATIO (--fit, --pairs)
  std::string ratio;
  lab_config config;
  lab_setup setup;
  std::string metrics;  // may be empty: a run that did not finish; ';' between the runs of a cell measured again
};

/// The metrics of one cell: one file, or several runs of it separated by ';'
/// and appended in that order (calibrate_lab fits them whole). `runs` gets
/// how many.
// The text of a file a lab parser reads (moe_residency_lab/ does not skip a
// UTF-8 byte-order mark itself; the library's parsers do).
std::string read_lab_text(const std::string& path, const char* option) {
  return std::string(detail::strip_utf8_bom(moe_residency_cli::read_whole_file(path, option)));
}

// FILE or FILE;FILE;...: every name, an empty one refused (also at either end).
std::vector<std::string> file_list(const std::string& list, const std::string& what) {
  std::vector<std::string> out;
  for (std::size_t start = 0;;) {
    const std::size_t semi = list.find(';', start);
    out.push_back(list.substr(start, semi == std::string::npos ? std::string::npos : semi - start));
    if (out.back().empty())
      throw error(what + ": '" + list + "' has an empty file name; expected FILE or FILE;FILE;...");
    if (semi == std::string::npos) return out;
    start = semi + 1;
  }
}

token_metrics read_metrics_list(const std::string& list, const char* what, std::size_t* runs = nullptr) {
  token_metrics m;
  std::size_t k = 0;
  for (const std::string& path : file_list(list, what)) {
    append_token_metrics(m, parse_token_metrics(moe_residency_cli::read_whole_file(path, what), path));
    ++k;
  }
  if (k == 0) throw error(std::string(what) + ": no metrics file; expected FILE or FILE;FILE;...");
  if (runs) *runs = k;
  return m;
}

/// --cells: CSV `ratio,config,limit_mib,budget_mib,stale_gate_pct,metrics[,lanes,label]`
/// (moe_residency_lab/cells.hpp parses it); the levers every cell shares come from the options.
/// Several files: a cell (by id) in more than one is the same cell measured in each run — its
/// metrics are joined (';') and its setup must agree, else an error names both files.
std::vector<cell> read_cells(const std::vector<std::string>& paths, const lab_args& a) {
  std::vector<cell> out;
  std::vector<std::string> from;  // the file each cell was first listed in
  for (const std::string& path : paths)
    for (const lab_cell& l : parse_lab_cells(read_lab_text(path, "--cells"), "--cells: " + path)) {
      cell c;
      c.id = l.id();
      c.ratio = l.ratio;
      c.config = l.config;
      c.setup.limit_mib = l.limit_mib;
      c.setup.budget_mib = l.budget_mib;
      c.setup.stale_gate_pct = l.stale_gate_pct;
      c.setup.overhead_mib = a.overhead_mib;
      c.setup.readaround_mib = a.readaround_mib;
      c.setup.lanes = l.lanes ? l.lanes : a.lanes;
      c.setup.spec_cap = a.spec_cap;
      c.metrics = l.metrics;
      const auto same = std::find_if(out.begin(), out.end(), [&](const cell& o) { return o.id == c.id; });
      if (same == out.end()) {
        out.push_back(c);
        from.push_back(path);
        continue;
      }
      const std::string first = from[static_cast<std::size_t>(same - out.begin())];
      if (same->config != c.config || same->setup.limit_mib != c.setup.limit_mib ||
          same->setup.budget_mib != c.setup.budget_mib || same->setup.lanes != c.setup.lanes)
        throw error("--cells: cell " + c.id + " in " + path + " is not the cell " + c.id + " of " + first +
                    " (configuration, limit, budget or lanes differ); expected the same cell in every run, or a label "
                    "for each");
      if (!c.metrics.empty()) same->metrics += (same->metrics.empty() ? "" : ";") + c.metrics;
    }
  return out;
}

/// A cell measured in several runs: each run's tok/s by its run, the
/// directory of its metrics file (memlab writes one directory a run), with
/// the occurrence of that directory in the cell's list (a run listed twice).
using run_tok = std::map<std::string, double>;

/// A pair's ratio in each run that measured both of its cells (matched by
/// run): the smallest and the largest, the spread a repetition of the lab shows.
struct run_spread {
  std::size_t runs = 0;
  double lo = NAN, hi = NAN;
};

run_spread pair_spread(const run_tok& x, const run_tok& y) {
  run_spread r;
  for (const auto& [run, tx] : x) {
    const auto other = y.find(run);
    if (other == y.end() || !(tx > 0) || !(other->second > 0)) continue;
    const double ratio = tx / other->second;  // B's time over A's: A's tok/s over B's
    r.lo = r.runs ? std::min(r.lo, ratio) : ratio;
    r.hi = r.runs ? std::max(r.hi, ratio) : ratio;
    ++r.runs;
  }
  return r.runs >= 2 ? r : run_spread{};
}

/// The A/B table: B's decode time over A's (> 1: B slower), measured (the
/// cells' metrics) and predicted, the verdict each gives with the band (the
/// larger of the two cells' measured bands, timing/verdict.hpp; else --noise,
/// else 5% assumed), whether the prediction has the sign and is within 10%,
/// and where both cells were measured in several runs, the pair's ratio in
/// each (run_spread) and whether the prediction falls inside it.
void print_pairs(const std::vector<std::pair<std::string, std::string>>& pairs,
                 const std::map<std::string, std::pair<double, double>>& tok, const std::map<std::string, double>& band,
                 const std::map<std::string, run_tok>& runs_tok, const lab_args& a) {
  char buf[400];
  // The ids' columns as wide as the longest id (all-oracle-pool@1.5 is 19), at least 12.
  int w = 12;
  for (const auto& [x, y] : pairs) w = std::max({w, static_cast<int>(x.size()), static_cast<int>(y.size())});
  w = std::min(w, 64);  // ids are the cells file's labels: bounded for the buffer
  if (a.format == "csv")
    std::cout << "\npair_a,pair_b,measured_ratio,predicted_ratio,ratio_err_pct,sign_right,within_10,"
                 "measured_verdict,predicted_verdict,noise_pct,runs,runs_min_ratio,runs_max_ratio,within_runs\n";
  else {
    std::snprintf(buf, sizeof buf, "%-*s %-*s %8s %7s %8s  %-4s  %-4s  %-12s  %-12s  %5s  %-15s  %s\n", w, "A", w, "B",
                  "meas x", "pred x", "x err %", "sign", "<=10", "measured", "predicted", "band %", "runs: x from-to",
                  "in runs");
    std::cout << "\nA/B pairs: B's decode time over A's (> 1: B slower), measured and predicted\n" << buf;
  }
  std::size_t right = 0, within = 0, judged = 0, in_runs = 0, spread_judged = 0;
  const run_tok none;
  const auto runs_of = [&](const std::string& id) -> const run_tok& {
    const auto it = runs_tok.find(id);
    return it == runs_tok.end() ? none : it->second;
  };
  for (const auto& [x, y] : pairs) {
    const auto& [mx, px] = tok.at(x);
    const auto& [my, py] = tok.at(y);
    double noise = a.noise;
    if (noise < 0) {
      noise = -1;
      for (const std::string& id : {x, y})
        if (band.count(id) && std::isfinite(band.at(id))) noise = std::max(noise, band.at(id));
      if (noise < 0) noise = 5.0;
    }
    // Time ratio from tok/s: B's time over A's = A's tok/s over B's.
    const bool measured = std::isfinite(mx) && std::isfinite(my) && mx > 0 && my > 0;
    const ratio_verdict pv = judge_ratio(1000.0 / py, 1000.0 / px, noise);
    const ratio_verdict mv = measured ? judge_ratio(1000.0 / my, 1000.0 / mx, noise) : ratio_verdict{NAN, noise};
    const double err = measured ? 100.0 * (pv.ratio / mv.ratio - 1.0) : NAN;
    const auto side = [](double r) { return r > 1 ? 1 : r < 1 ? -1 : 0; };
    const bool sign = measured && side(pv.ratio) == side(mv.ratio);
    const bool close = measured && std::abs(err) <= 10;
    if (measured) ++judged, right += sign, within += close;
    const char* ms = measured ? to_string(mv.verdict) : "-";
    // The runs' spread: is the prediction inside what repeating the lab measured?
    const run_spread sp = pair_spread(runs_of(x), runs_of(y));
    const bool inside = sp.runs > 0 && pv.ratio >= sp.lo && pv.ratio <= sp.hi;
    if (sp.runs > 0) ++spread_judged, in_runs += inside;
    char runs_col[64] = "-", runs_csv[64] = "0,,";  // the table's column; the CSV's runs,min,max (empty: none)
    if (sp.runs > 0) {
      std::snprintf(runs_col, sizeof runs_col, "%zu: %.3f-%.3f", sp.runs, sp.lo, sp.hi);
      std::snprintf(runs_csv, sizeof runs_csv, "%zu,%.4f,%.4f", sp.runs, sp.lo, sp.hi);
    }
    if (a.format == "csv")
      std::snprintf(buf, sizeof buf, "%s,%s,%.4f,%.4f,%.2f,%s,%s,%s,%s,%.2f,%s,%s\n", x.c_str(), y.c_str(), mv.ratio,
                    pv.ratio, err, measured ? (sign ? "yes" : "no") : "-", measured ? (close ? "yes" : "no") : "-", ms,
                    to_string(pv.verdict), noise, runs_csv, sp.runs ? (inside ? "yes" : "no") : "-");
    else
      std::snprintf(buf, sizeof buf, "%-*s %-*s %8.3f %7.3f %+8.1f  %-4s  %-4s  %-12s  %-12s  %5.1f  %-15s  %s\n", w,
                    x.c_str(), w, y.c_str(), mv.ratio, pv.ratio, err, measured ? (sign ? "yes" : "NO") : "-",
                    measured ? (close ? "yes" : "no") : "-", ms, to_string(pv.verdict), noise, runs_col,
                    sp.runs ? (inside ? "yes" : "no") : "-");
    std::cout << buf;
  }
  if (a.format != "csv") {
    std::snprintf(buf, sizeof buf, "%zu of %zu measured pairs with the right sign, %zu within 10%% (the band: %s)\n",
                  right, judged, within,
                  a.noise >= 0 ? "--noise" : "each pair's larger measured band, 16-token blocks, else 5% assumed");
    std::cout << buf;
    if (spread_judged > 0) {
      std::snprintf(buf, sizeof buf,
                    "%zu of %zu pairs measured in several runs predicted inside the runs' spread (runs: how many, and "
                    "each run's ratio, smallest to largest)\n",
                    in_runs, spread_judged);
      std::cout << buf;
    }
  }
}

void run(const lab_args& a) {
  const route_trace trace = moe_residency_cli::read_trace(a.trace);
  double dense = 0;
  for (std::uint64_t b : trace.header.dense_bytes) dense += to_mib(b);
  std::vector<cell> cells = read_cells(a.cells, a);
  // The file's dense bytes: the trace's layers', or what a run of the model says the manager locks.
  const double laid = dense;
  if (a.dense_mib > 0) {
    if (a.dense_mib < laid)
      throw error("--dense-mib: " + std::to_string(a.dense_mib) + " MiB is below the trace's own dense bytes (" +
                  std::to_string(laid) + " MiB); expected the model file's dense bytes, the trace's layers included");
    dense = a.dense_mib;
  }
  for (cell& c : cells) c.setup.dense_mib = dense, c.setup.unlaid_dense_mib = dense - laid;
  // --pairs, checked against the cells before the work.
  std::vector<std::pair<std::string, std::string>> pairs;
  if (!a.pairs.empty())
    for (const std::string& item : moe_residency_cli::split_list(a.pairs, "--pairs")) {
      const auto colon = item.find(':');
      const std::string x = item.substr(0, colon), y = colon == std::string::npos ? "" : item.substr(colon + 1);
      if (colon == std::string::npos || x.empty() || y.empty() || x == y)
        throw error("--pairs: '" + item + "' in '" + a.pairs +
                    "'; expected A:B, two different cells' ids (CONFIG@RATIO or a label), e.g. exact@2.5:all@2.5");
      for (const std::string& id : {x, y})
        if (std::none_of(cells.begin(), cells.end(), [&](const cell& c) { return c.id == id; }))
          throw error("--pairs: '" + item + "': no cell " + id + " in --cells; expected the ids of listed cells");
      pairs.emplace_back(x, y);
    }

  // The manager's own cost, measured with every expert resident (moe_residency_lab/lab.hpp).
  lab_manager_cost mc;
  const bool have_mc = !a.manager_runs.empty();
  if (!have_mc && a.manager_budget != 0)  // the option refuses 0, so non-zero means given
    throw error("--manager-budget has no effect without --manager-runs; give both, or neither");
  if (have_mc) {
    const std::vector<std::string> f = moe_residency_cli::split_list(a.manager_runs, "--manager-runs");
    if (f.size() != 3)
      throw error("--manager-runs: '" + a.manager_runs +
                  "'; expected three metrics files BASELINE,EXACT,CACHE (memlab's resident-all, manager-exact and "
                  "manager-cache runs)");
    if (!(a.manager_budget > 0) || !std::isfinite(a.manager_budget))
      throw error("--manager-budget: " + std::to_string(a.manager_budget) +
                  "; expected the manager-cache run's budget in MiB (> 0) with --manager-runs");
    const auto metrics = [](const std::string& path) { return read_metrics_list(path, "--manager-runs"); };
    mc = measure_manager_cost(trace, metrics(f[0]), metrics(f[1]), metrics(f[2]), a.manager_budget);
    for (cell& c : cells) {
      c.setup.request_ms = mc.request_ms;
      c.setup.request_sys_ms = mc.request_sys_ms;
      c.setup.pin_ms = mc.pin_ms;
      c.setup.pin_sys_ms = mc.pin_sys_ms;
      c.setup.request_user_ms = mc.request_user_ms;
      c.setup.pin_user_ms = mc.pin_user_ms;
    }
  }

  timing_params start;
  try {
    start.curve = storage_curve::parse_list(a.curve);
  } catch (const error& e) {
    throw error(std::string("--curve: ") + e.what());
  }
  start.lanes = a.lanes;
  start.overlap = a.overlap;
  start.bandwidth_scale = a.bandwidth_scale;
  start.fault_bandwidth_scale = a.fault_bandwidth_scale;
  start.validate();
  unsigned free = 0;
  for (const std::string& p : moe_residency_cli::split_list(a.free, "--free")) {
    if (p == "compute") free |= static_cast<unsigned>(timing_param::compute_ms_per_token);
    else if (p == "latency") free |= static_cast<unsigned>(timing_param::read_latency_ms);
    else if (p == "overlap") free |= static_cast<unsigned>(timing_param::overlap);
    else if (p == "mgmt") free |= static_cast<unsigned>(timing_param::mgmt_ms_per_read);
    else if (p == "bandwidth") free |= static_cast<unsigned>(timing_param::bandwidth_scale);
    else if (p == "kernel") free |= static_cast<unsigned>(timing_param::read_cpu_ms_per_mib);
    else
      throw error("--free: '" + p + "' in '" + a.free +
                  "'; expected compute, latency, overlap, mgmt, bandwidth, kernel");
  }

  const cell* fit = nullptr;
  for (const cell& c : cells)
    if (c.id == a.fit) fit = &c;
  // The fault path measured in each fault cell's shape, before the runs. Not
  // for a fault calibration cell: its fit is what would set the fault path.
  // Every row of FILE;FILE;... (one walk's file per run), parsed by `parse`.
  const auto walk_rows = [](const std::string& list, const char* flag, auto parse) {
    decltype(parse(std::string(), std::string())) rows;
    for (const std::string& path : file_list(list, flag)) {
      const auto r = parse(read_lab_text(path, flag), std::string(flag) + ": " + path);
      rows.insert(rows.end(), r.begin(), r.end());
    }
    return rows;
  };
  std::size_t walked = 0, fault_cells = 0;
  if (!a.fault_walk.empty()) {
    const std::vector<fault_walk_row> rows = walk_rows(a.fault_walk, "--fault-walk", parse_fault_walk);
    for (cell& c : cells) {
      const lab_mapping m = map_lab_config(c.config, c.setup);
      // Not mmap-128k: the walk runs at the device's own read-ahead.
      if (m.kind != lab_model_kind::faults || !m.walk_applies || &c == fit) continue;
      ++fault_cells;
      if (apply_fault_walk(rows, c.setup.limit_mib, m.dense_pinned, c.setup)) ++walked;
    }
  }
  // The same for `cache`'s inline path (not for a `cache` calibration cell).
  std::size_t inline_walked = 0, inline_cells = 0;
  if (!a.inline_walk.empty()) {
    const std::vector<inline_walk_row> rows = walk_rows(a.inline_walk, "--inline-walk", parse_inline_walk);
    for (cell& c : cells) {
      if (!map_lab_config(c.config, c.setup).reads_inline || &c == fit) continue;
      ++inline_cells;
      if (apply_inline_walk(rows, c.setup.limit_mib, c.setup)) ++inline_walked;
    }
  }
  if (!fit) {
    std::string ids;
    for (const cell& c : cells) ids += (ids.empty() ? "" : ", ") + c.id;
    throw error("--fit: no cell " + a.fit + " in --cells; expected one of " + ids +
                " (CONFIG@RATIO like exact@2.5, or a cell's label)");
  }
  if (fit->metrics.empty()) throw error("--fit: the cell " + a.fit + " has no metrics (the run did not finish)");
  std::size_t fit_runs = 1;
  const token_metrics fm = read_metrics_list(fit->metrics, "--cells metrics", &fit_runs);

  // Calibrate on the fit cell's loads, its wall times only (moe_residency_lab/calibrate.hpp).
  const calibration_result cr = calibrate_lab(trace, fit->config, fit->setup, fm, start, free);
  const timing_params& fitted = cr.params;

  char buf[512];
  // A cell's name in the table: its configuration, or its label where it has one (one
  // configuration may then appear twice at a ratio); the column as wide as the longest (at most 40).
  const auto table_name = [](const cell& c) {
    return c.id == std::string(to_string(c.config)) + "@" + c.ratio ? std::string(to_string(c.config)) : c.id;
  };
  int name_w = 10;
  for (const cell& c : cells)
    name_w = std::max(name_w, static_cast<int>(std::min<std::size_t>(40, table_name(c).size())));
  if (a.format == "csv")
    std::cout << "ratio,config,model,measured_tok_s,predicted_tok_s,err_pct,within_15,predicted_mib_per_token,"
                 "measured_mib_per_token,fit,cell\n";
  else {
    std::cout << "lab-predict: calibrated on " << a.fit << " (" << fm.size() << " decode tokens"
              << (fit_runs > 1 ? " of " + std::to_string(fit_runs) + " runs" : std::string()) << ", all fitted; "
              << cr.iterations << " iterations, rms " << cr.rms_ms << " ms); fitted:\n"
              << format_timing_config(cr.params);
    for (const std::string& b : params_on_bound(cr))
      std::cout << "lab-predict: warning: " << b << " ended on a bound of its range: " << a.fit
                << " does not determine it (its tokens read too alike); try another --fit or --free\n";
    if (a.dense_mib > 0)
      std::snprintf(buf, sizeof buf,
                    "overhead %.0f MiB, read-around %.0f MiB, dense %.1f MiB (--dense-mib; the trace's layers %.1f)\n",
                    a.overhead_mib, a.readaround_mib, dense, laid);
    else
      std::snprintf(buf, sizeof buf, "overhead %.0f MiB, read-around %.0f MiB, dense %.1f MiB (from the trace)\n",
                    a.overhead_mib, a.readaround_mib, dense);
    std::cout << buf;
    if (!a.fault_walk.empty()) {
      std::snprintf(buf, sizeof buf,
                    "the fault path measured before the runs (--fault-walk): %zu of %zu fault cells, their reads at "
                    "the walk's off-CPU and kernel ms per MiB (not the curve's top x beta_f and kappa)\n",
                    walked, fault_cells);
      std::cout << buf;
    }
    if (!a.inline_walk.empty()) {
      std::snprintf(buf, sizeof buf,
                    "cache's inline path measured before the runs (--inline-walk): %zu of %zu cache cells, their "
                    "reads at the walk's off-CPU and kernel ms per MiB, pins included (not the curve x beta, kappa "
                    "and psi = 1)\n",
                    inline_walked, inline_cells);
      std::cout << buf;
    }
    if (have_mc) {
      std::snprintf(
          buf, sizeof buf,
          "the manager's own cost, every expert resident: exact +%.1f ms/token over %.1f requests "
          "(%.3f ms each, %.3f in the kernel, %.3f in user time), cache +%.1f ms/token over %.1f pins at %.0f MiB "
          "(%.3f ms each, %.3f in the kernel, %.3f in user time)\n",
          mc.exact_extra_ms, mc.requests_per_token, mc.request_ms, mc.request_sys_ms, mc.request_user_ms,
          mc.cache_extra_ms, mc.pins_per_token, a.manager_budget, mc.pin_ms, mc.pin_sys_ms, mc.pin_user_ms);
      std::cout << buf;
    }
    std::snprintf(buf, sizeof buf, "%-6s %-*s %-8s %9s %9s %8s %4s %10s %10s\n", "ratio", name_w, "config", "model",
                  "meas_tok/s", "pred_tok/s", "err%", "<=15", "pred_MiB/t", "meas_MiB/t");
    std::cout << buf;
  }
  // Per cell: measured and predicted tok/s, and the cell's own noise band (for --pairs).
  std::map<std::string, std::pair<double, double>> tok;
  std::map<std::string, double> band;
  std::map<std::string, run_tok> runs_tok;  // a cell measured in several runs: each run's tok/s
  for (const cell& c : cells) {
    const lab_prediction p = predict_lab(trace, c.config, c.setup, fitted);
    double meas = NAN, meas_mib = NAN;
    if (!c.metrics.empty()) {
      // Each run's metrics read once: appended for the cell, and each run's
      // tok/s where it was measured in several (the pairs' spread).
      token_metrics m;
      run_tok per_run;
      for (const std::string& path : file_list(c.metrics, "--cells metrics")) {
        const token_metrics one = read_metrics_list(path, "--cells metrics");
        const std::size_t slash = path.find_last_of('/');
        const std::string run = slash == std::string::npos ? std::string() : path.substr(0, slash);
        std::size_t seen = 0;
        while (per_run.count(run + "#" + std::to_string(seen))) ++seen;
        per_run[run + "#" + std::to_string(seen)] = metrics_tok_per_s(one);
        append_token_metrics(m, one);
      }
      if (per_run.size() > 1) runs_tok[c.id] = std::move(per_run);
      meas = metrics_tok_per_s(m);
      band[c.id] = run_noise_pct(m.wall_ms);
      double rb = 0;
      for (double b : m.read_bytes) rb += b;
      meas_mib = to_mib(static_cast<std::uint64_t>(rb)) / static_cast<double>(m.size());
    }
    const double pred = p.summary.tok_per_s;
    tok[c.id] = {meas, pred};
    const double err = 100.0 * (pred - meas) / meas;
    const bool is_fit = &c == fit;
    const double pmib = p.summary.demanded_mib_per_token + p.summary.speculative_mib_per_token;
    const std::string name = table_name(c);
    if (a.format == "csv") {
      std::snprintf(buf, sizeof buf, "%s,%s,%s,%.3f,%.3f,%.1f,%s,%.2f,%.2f,%s,%s\n", c.ratio.c_str(),
                    to_string(c.config), to_string(p.mapping.kind), meas, pred, err,
                    std::isfinite(err) ? (std::abs(err) <= 15 ? "yes" : "no") : "-", pmib, meas_mib,
                    is_fit ? "yes" : "no", c.id.c_str());
    } else {
      std::snprintf(buf, sizeof buf, "%-6s %-*s %-8s %9.3f %9.3f %+8.1f %4s %10.1f %10.1f%s\n", c.ratio.c_str(), name_w,
                    name.c_str(), to_string(p.mapping.kind), meas, pred, err,
                    std::isfinite(err) ? (std::abs(err) <= 15 ? "yes" : "no") : "-", pmib, meas_mib,
                    is_fit ? "  (the calibration run)" : "");
    }
    std::cout << buf;
  }
  if (!pairs.empty()) print_pairs(pairs, tok, band, runs_tok, a);
}

const moe_residency_cli::command_registrar reg{
    "lab-predict",
    "Calibrate the timing model on one memory-lab run; predict every other configuration x ratio (docs/lab-predict.md)",
    [](CLI::App& sub) {
      auto a = std::make_shared<lab_args>();
      moe_residency_cli::add_trace_option(sub, a->trace,
                                          "route trace of a lab run with the observer (routing is the same in every "
                                          "run)");
      sub.add_option("--curve", a->curve, "the disk's lanes curve, lanes:MiB/s list (moe-disk-lanes)")->required();
      sub.add_option("--cells", a->cells,
                     "CSV ratio,config,limit_mib,budget_mib,stale_gate_pct,metrics[,lanes,label] (metrics: FILE, or "
                     "FILE;FILE;... for a cell measured in several runs); several --cells: one per lab run, a cell "
                     "listed in several measured in each")
          ->required();
      sub.add_option("--fit", a->fit, "the calibration cell, CONFIG@RATIO (e.g. exact@2.5) or its label")->required();
      sub.add_option("--pairs", a->pairs,
                     "A/B pairs of cells, A:B,... (ids: CONFIG@RATIO or labels): B's time over A's, measured and "
                     "predicted, verdicts, sign and 10% (docs/lab-predict.md)");
      sub.add_option("--noise", a->noise,
                     "the pairs' noise band, % (default: each pair's larger measured band, else 5 assumed)")
          ->check(moe_residency_cli::non_negative());
      sub.add_option("--overhead-mib", a->overhead_mib, "the cgroup's memory besides the model's pages (assumed)")
          ->check(moe_residency_cli::non_negative())
          ->capture_default_str();
      sub.add_option("--dense-mib", a->dense_mib,
                     "the model file's dense bytes, MiB, where a run says them (the manager's 'dense N MiB'): the "
                     "token embedding and output besides the trace's layers (default: the trace header's)")
          ->check(moe_residency_cli::positive());
      sub.add_option("--readaround-mib", a->readaround_mib, "a fault's read-around window")
          ->check(moe_residency_cli::non_negative())
          ->capture_default_str();
      sub.add_option("--lanes", a->lanes, "the manager's read lanes")
          ->check(moe_residency_cli::whole(1, 64))
          ->capture_default_str();
      sub.add_option("--spec-cap", a->spec_cap, "predicted reads per layer at most")
          ->check(moe_residency_cli::whole(0, 32))
          ->capture_default_str();
      sub.add_option("--free", a->free,
                     "parameters fitted: compute,latency,overlap,mgmt,bandwidth,kernel (read_cpu_ms_per_mib: fitted "
                     "only when the cell's metrics record sys_ms)")
          ->capture_default_str();
      sub.add_option(
             "--overlap", a->overlap,
             "ω when not fitted: the share of a layer's compute its demanded reads hide behind (the lab waits: 0)")
          ->check(moe_residency_cli::real(moe_residency::detail::real_domain::closed(0, 1)))
          ->capture_default_str();
      sub.add_option("--bandwidth-scale", a->bandwidth_scale,
                     "β when not fitted (a fault cell calibrates β_f): the lanes curve's share the manager's reads get")
          ->check(moe_residency_cli::positive())
          ->capture_default_str();
      sub.add_option("--fault-bandwidth-scale", a->fault_bandwidth_scale,
                     "β_f when not fitted (a lanes cell calibrates β, a fault cell β_f): the curve top's share the "
                     "page faults' read-around gets (1: as measured); 0: tied to β, one scale for both paths, "
                     "whichever cell calibrates")
          ->check(moe_residency_cli::non_negative())
          ->capture_default_str();
      sub.add_option("--manager-runs", a->manager_runs,
                     "BASELINE,EXACT,CACHE: metrics of runs without a limit, page cache warm (memlab's resident-all, "
                     "manager-exact, manager-cache): the manager's own cost per requested expert and per pin, "
                     "equation (6)'s ν_q and ν_p (default: none, both 0); each may be FILE;FILE;... (repeated runs, "
                     "means over all)");
      sub.add_option("--manager-budget", a->manager_budget, "the manager-cache run's cache budget, MiB")
          ->check(moe_residency_cli::positive());
      sub.add_option("--fault-walk", a->fault_walk,
                     "fault-walk.csv (memlab's moe-disk-lanes --fault-walk in each ratio's limit; FILE;FILE;... "
                     "for several runs, means over all): the fault cells' reads cost what the walk measured in "
                     "their shape, in place of the curve's top x beta_f and kappa (default: none)");
      sub.add_option("--inline-walk", a->inline_walk,
                     "inline-walk.csv (memlab's moe-disk-lanes --inline-walk in each ratio's limit at its budget; "
                     "FILE;FILE;... for several runs, the median of each limit's rows): the cache cells' inline reads "
                     "and pins cost "
                     "what the walk measured in their shape, in place of the curve x beta, kappa, psi = 1 and the "
                     "pins' kernel time (default: none)");
      moe_residency_cli::add_format_option(sub, a->format, {"table", "csv"});
      sub.callback([a] { run(*a); });
    }};

}  // namespace
