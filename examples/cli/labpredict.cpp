// `moe-residency lab-predict`: the timing model against the memory lab.
// Calibrates the model's free parameters on ONE lab run (one configuration at
// one ratio, all its decode tokens), then predicts the decode tok/s of every
// other cell from what is known before that cell runs (moe_residency_lab/lab.hpp): the
// route trace, the memory limit, the budget, the configuration's levers and
// the disk's lanes curve. The other cells' metrics are read only to print the
// measured tok/s next to the prediction. A cell measured in several runs
// lists their metrics files separated by ';': the fit sees every run's tokens,
// and the measured tok/s is over all of them.

#include <cmath>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "checked_options.hpp"
#include "command.hpp"
#include "moe_residency/timing.hpp"
#include "moe_residency/timing/calibrate.hpp"
#include "moe_residency_lab/lab.hpp"
#include "moe_residency_lab/calibrate.hpp"
#include "moe_residency_lab/manager.hpp"
#include "moe_residency_lab/cells.hpp"

namespace {

using namespace moe_residency;
using namespace moe_residency::lab;

struct lab_args {
  std::string trace, curve, cells, fit, format = "table";
  double overhead_mib = 64, readaround_mib = 16;
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

/// --cells: CSV `ratio,config,limit_mib,budget_mib,stale_gate_pct,metrics`
/// (moe_residency_lab/cells.hpp parses it); the levers every cell shares come from the options.
std::vector<cell> read_cells(const std::string& path, const lab_args& a) {
  std::vector<cell> out;
  for (const lab_cell& l : parse_lab_cells(read_lab_text(path, "--cells"), "--cells: " + path)) {
    cell c;
    c.ratio = l.ratio;
    c.config = l.config;
    c.setup.limit_mib = l.limit_mib;
    c.setup.budget_mib = l.budget_mib;
    c.setup.stale_gate_pct = l.stale_gate_pct;
    c.setup.overhead_mib = a.overhead_mib;
    c.setup.readaround_mib = a.readaround_mib;
    c.setup.lanes = a.lanes;
    c.setup.spec_cap = a.spec_cap;
    c.metrics = l.metrics;
    out.push_back(c);
  }
  return out;
}

void run(const lab_args& a) {
  const auto at = a.fit.find('@');
  if (at == std::string::npos || at + 1 == a.fit.size())
    throw error("--fit: '" + a.fit + "'; expected CONFIG@RATIO like exact@2.5");
  const lab_config fit_config = parse_lab_config(a.fit.substr(0, at));
  const std::string fit_ratio = a.fit.substr(at + 1);

  const route_trace trace = moe_residency_cli::read_trace(a.trace);
  double dense = 0;
  for (std::uint64_t b : trace.header.dense_bytes) dense += to_mib(b);
  std::vector<cell> cells = read_cells(a.cells, a);
  for (cell& c : cells) c.setup.dense_mib = dense;

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
    if (c.config == fit_config && c.ratio == fit_ratio) fit = &c;
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
      if (m.kind != lab_model_kind::faults || &c == fit) continue;
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
  if (!fit) throw error("--fit: no cell " + a.fit + " in " + a.cells);
  if (fit->metrics.empty()) throw error("--fit: the cell " + a.fit + " has no metrics (the run did not finish)");
  std::size_t fit_runs = 1;
  const token_metrics fm = read_metrics_list(fit->metrics, "--cells metrics", &fit_runs);

  // Calibrate on the fit cell's loads, its wall times only (moe_residency_lab/calibrate.hpp).
  const calibration_result cr = calibrate_lab(trace, fit->config, fit->setup, fm, start, free);
  const timing_params& fitted = cr.params;

  char buf[512];
  if (a.format == "csv")
    std::cout << "ratio,config,model,measured_tok_s,predicted_tok_s,err_pct,within_15,predicted_mib_per_token,"
                 "measured_mib_per_token,fit\n";
  else {
    std::cout << "lab-predict: calibrated on " << a.fit << " (" << fm.size() << " decode tokens"
              << (fit_runs > 1 ? " of " + std::to_string(fit_runs) + " runs" : std::string()) << ", all fitted; "
              << cr.iterations << " iterations, rms " << cr.rms_ms << " ms); fitted:\n"
              << format_timing_config(cr.params);
    for (const std::string& b : params_on_bound(cr))
      std::cout << "lab-predict: warning: " << b << " ended on a bound of its range: " << a.fit
                << " does not determine it (its tokens read too alike); try another --fit or --free\n";
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
    std::snprintf(buf, sizeof buf, "%-6s %-10s %-8s %9s %9s %8s %4s %10s %10s\n", "ratio", "config", "model",
                  "meas_tok/s", "pred_tok/s", "err%", "<=15", "pred_MiB/t", "meas_MiB/t");
    std::cout << buf;
  }
  for (const cell& c : cells) {
    const lab_prediction p = predict_lab(trace, c.config, c.setup, fitted);
    double meas = NAN, meas_mib = NAN;
    if (!c.metrics.empty()) {
      const token_metrics m = read_metrics_list(c.metrics, "--cells metrics");
      meas = metrics_tok_per_s(m);
      double rb = 0;
      for (double b : m.read_bytes) rb += b;
      meas_mib = to_mib(static_cast<std::uint64_t>(rb)) / static_cast<double>(m.size());
    }
    const double pred = p.summary.tok_per_s;
    const double err = 100.0 * (pred - meas) / meas;
    const bool is_fit = &c == fit;
    const double pmib = p.summary.demanded_mib_per_token + p.summary.speculative_mib_per_token;
    if (a.format == "csv") {
      std::snprintf(buf, sizeof buf, "%s,%s,%s,%.3f,%.3f,%.1f,%s,%.2f,%.2f,%s\n", c.ratio.c_str(), to_string(c.config),
                    to_string(p.mapping.kind), meas, pred, err,
                    std::isfinite(err) ? (std::abs(err) <= 15 ? "yes" : "no") : "-", pmib, meas_mib,
                    is_fit ? "yes" : "no");
    } else {
      std::snprintf(buf, sizeof buf, "%-6s %-10s %-8s %9.3f %9.3f %+8.1f %4s %10.1f %10.1f%s\n", c.ratio.c_str(),
                    to_string(c.config), to_string(p.mapping.kind), meas, pred, err,
                    std::isfinite(err) ? (std::abs(err) <= 15 ? "yes" : "no") : "-", pmib, meas_mib,
                    is_fit ? "  (the calibration run)" : "");
    }
    std::cout << buf;
  }
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
                     "CSV ratio,config,limit_mib,budget_mib,stale_gate_pct,metrics (metrics: FILE, or "
                     "FILE;FILE;... for a cell measured in several runs)")
          ->required();
      sub.add_option("--fit", a->fit, "the calibration cell, CONFIG@RATIO (e.g. exact@2.5)")->required();
      sub.add_option("--overhead-mib", a->overhead_mib, "the cgroup's memory besides the model's pages (assumed)")
          ->check(moe_residency_cli::non_negative())
          ->capture_default_str();
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
