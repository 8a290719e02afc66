// `moe-residency calibrate`: fits the timing model's free parameters to
// recorded per-token metrics over the replay of the same runs (decode
// tokens), on one set of tokens, and scores it on the other. Several metrics
// files of one device and model are fitted at once, each replayed at the
// configuration its header (or --run-config) gives; --predict runs are not
// fitted: their mean token time and their ratio against the baseline run are
// predicted and printed beside what they measured (docs/wall-clock.md).

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "checked_options.hpp"
#include "command.hpp"
#include "output.hpp"
#include "moe_residency/timing.hpp"
#include "moe_residency/timing/calibrate.hpp"
#include "moe_residency/timing/recorded_runs.hpp"

namespace {

using namespace moe_residency;

struct calibrate_args {
  std::string trace, config, write_config;
  std::vector<std::string> metrics, run_configs, predict, predict_configs;
  double budget = 0;
  std::string policy = "lru";
  std::string format = "table";
  std::string split = "halves";
  std::string pair = "auto";
  std::string free;  // empty: the default set
  std::string expert_share;
  std::string baseline;
  std::size_t requests_per_read = 0;  // 0: the config's
  double noise = -1;                  // < 0: measured by the calibration
  std::uint64_t seed = 0x5eed;
  bool fit_io = false;
  bool pipelined_mgmt = false;
};

/// --free: parameter names → timing_param mask.
unsigned parse_free(const std::string& list) {
  static const std::pair<const char*, timing_param> names[] = {{"compute", timing_param::compute_ms_per_token},
                                                               {"latency", timing_param::read_latency_ms},
                                                               {"overlap", timing_param::overlap},
                                                               {"mgmt", timing_param::mgmt_ms_per_read},
                                                               {"eviction", timing_param::mgmt_ms_per_eviction},
                                                               {"bandwidth", timing_param::bandwidth_scale},
                                                               {"kernel", timing_param::read_cpu_ms_per_mib},
                                                               {"share", timing_param::expert_compute_share},
                                                               {"faults", timing_param::compute_ms_per_fault},
                                                               {"contention", timing_param::compute_ms_per_read_mib},
                                                               {"lookup", timing_param::mgmt_ms_per_lookup}};
  unsigned mask = 0;
  for (const std::string& p : moe_residency_cli::split_list(list, "--free")) {
    bool found = false;
    for (const auto& [name, id] : names)
      if (p == name) mask |= static_cast<unsigned>(id), found = true;
    if (!found)
      throw error("--free: '" + p + "' in '" + list +
                  "'; expected compute, latency, overlap, mgmt, eviction, bandwidth, kernel, share, faults, "
                  "contention or lookup");
  }
  return mask;
}

/// The runs of `files`, each with the --run-config list of the same place (or none).
std::vector<recorded_run> read_runs(const std::vector<std::string>& files, const std::vector<std::string>& configs,
                                    const char* files_option, const char* configs_option, double budget) {
  if (!configs.empty() && configs.size() != files.size())
    throw error(std::string(configs_option) + ": given " + std::to_string(configs.size()) +
                (configs.size() == 1 ? " time for " : " times for ") + std::to_string(files.size()) + " " +
                files_option + " files; expected one per file, in order, or none");
  std::vector<recorded_run> runs;
  for (std::size_t i = 0; i < files.size(); ++i) {
    run_config given;
    if (!configs.empty()) given = parse_run_config_list(configs[i], configs_option);
    // --budget: the cache budget of a run that says none (its header, or its --run-config).
    const std::string text = moe_residency_cli::read_whole_file(files[i], files_option);
    const run_config header = merge_run_config(parse_run_config(text, files[i]), given, files[i]);
    if (budget > 0 && header.cache_mib && *header.cache_mib != budget)
      throw error("--budget " + detail::show_number(budget) + ": " + files[i] + " says cache_mb=" +
                  detail::show_number(*header.cache_mib) + "; expected the run's own budget, or no --budget");
    if (!header.cache_mib && budget > 0) given.cache_mib = budget;
    runs.push_back(parse_recorded_run(text, files[i], given));
  }
  return runs;
}

std::string describe(const run_setup& s, const top_k_change& k, std::size_t device_lanes) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "cache %g MiB, %zu lanes, top-%zu%s%s", s.budget_mib, s.lanes ? s.lanes : device_lanes,
                s.top_k, k.modelled ? " (modelled: wider than the trace)" : "", s.overlap ? "" : ", overlap off");
  return buf;
}

void run(const CLI::App& sub, const calibrate_args& a) {
  std::vector<moe_residency_cli::named_input> inputs{{"--trace", a.trace}, {"--config", a.config}};
  for (const auto& m : a.metrics) inputs.push_back({"--metrics", m});
  for (const auto& m : a.predict) inputs.push_back({"--predict", m});
  if (!a.write_config.empty())  // before the work, not after it
    moe_residency_cli::check_output_path(a.write_config, "--write-config", inputs);
  if (!a.baseline.empty() && std::find(a.metrics.begin(), a.metrics.end(), a.baseline) == a.metrics.end() &&
      std::find(a.predict.begin(), a.predict.end(), a.baseline) == a.predict.end())
    throw error("--baseline: '" + a.baseline + "' is none of the --metrics and --predict files; expected one of them");
  timing_params start;
  if (!a.config.empty())
    start = parse_timing_config(moe_residency_cli::read_whole_file(a.config, "--config"), a.config);
  if (a.requests_per_read) start.requests_per_read = a.requests_per_read;
  if (a.pipelined_mgmt) start.pipelined_mgmt = true;
  const route_trace trace = moe_residency_cli::read_trace(a.trace);
  if (!a.expert_share.empty()) {
    if (a.expert_share == "bytes") {
      start.expert_compute_share = expert_share_from_bytes(trace.header);
    } else if (a.expert_share != "fit") {
      start.expert_compute_share = detail::parse_real(
          a.expert_share, "--expert-share (bytes, fit or a share in [0, 1])", detail::real_domain::closed(0, 1));
    }
  }
  const std::vector<recorded_run> runs = read_runs(a.metrics, a.run_configs, "--metrics", "--run-config", a.budget);
  const std::vector<recorded_run> held = read_runs(a.predict, a.predict_configs, "--predict", "--predict-config", 0);

  calibration_options co;
  co.split = a.split == "halves" ? calibration_split::halves
             : a.split == "all"  ? calibration_split::all
                                 : calibration_split::interleaved;
  if (!a.free.empty()) co.free = parse_free(a.free);
  if (a.fit_io) {
    co.fit_io = true;
    co.free |= static_cast<unsigned>(timing_param::bandwidth_scale);
  }
  if (a.expert_share == "fit") co.free |= static_cast<unsigned>(timing_param::expert_compute_share);
  const pairing_choice pc = a.pair == "step"     ? pairing_choice::step
                            : a.pair == "volume" ? pairing_choice::volume
                                                 : pairing_choice::automatic;
  runs_calibration rc;
  try {
    rc = calibrate_recorded_runs(trace, runs, start, co, a.policy, pc, a.seed);
  } catch (const error& e) {  // name the files it paired
    std::string files;
    for (const auto& m : a.metrics) files += (files.empty() ? "" : ", ") + m;
    throw error("--metrics " + files + " with --trace " + a.trace + ": " + e.what());
  }
  const calibration_result& c = rc.result;
  const double noise = a.noise >= 0 ? a.noise : c.params.noise_pct;

  if (!a.write_config.empty())
    moe_residency_cli::write_output_file(a.write_config, "--write-config", inputs, [&](std::ostream& f) {
      f << "# moe-residency calibrate --trace " << a.trace;
      for (const auto& m : a.metrics) f << " --metrics " << m;
      if (sub.get_option("--budget")->count()) f << " --budget " << a.budget;
      f << " --policy " << a.policy << " --split " << a.split << "\n" << format_timing_config(c.params);
    });
  std::string fitted;
  for (const auto& n : c.free) fitted += (fitted.empty() ? "" : ", ") + n;

  // Predictions: every run, fitted or not, from the fitted device; ratios against the baseline.
  std::vector<run_prediction> preds;
  std::vector<bool> is_fit;
  for (const recorded_run& r : runs) {
    preds.push_back(predict_recorded_run(trace, r, c.params, rc.weights, a.policy, a.seed));
    is_fit.push_back(true);
  }
  for (const recorded_run& r : held) {
    preds.push_back(predict_recorded_run(trace, r, c.params, rc.weights, a.policy, a.seed));
    is_fit.push_back(false);
  }
  std::size_t base = 0;
  if (!a.baseline.empty()) {
    base = preds.size();
    for (std::size_t i = 0; i < preds.size(); ++i)
      if (preds[i].source == a.baseline) base = i;
    if (base == preds.size())
      throw error("--baseline: '" + a.baseline +
                  "' is none of the --metrics and --predict files; expected one of them");
  }
  const bool legacy = runs.size() == 1 && held.empty();

  if (a.format == "csv") {
    if (legacy) {
      std::cout << calibration_csv(c);
    } else {
      std::cout << "run,role,budget_mib,lanes,top_k,top_k_modelled,tokens,measured_ms,predicted_ms,err_pct,"
                   "measured_ratio,predicted_ratio,ratio_err_pct,sign_right,measured_verdict,predicted_verdict,"
                   "noise_pct\n";
      for (std::size_t i = 0; i < preds.size(); ++i) {
        const run_prediction& p = preds[i];
        const ab_comparison ab = compare_runs(p, preds[base], std::isfinite(noise) ? noise : 0.0);
        const std::size_t tokens = i < runs.size() ? runs[i].metrics.size() : held[i - runs.size()].metrics.size();
        std::printf("%s,%s,%g,%zu,%zu,%s,%zu,%.3f,%.3f,%.2f,%.4f,%.4f,%.2f,%s,%s,%s,%.2f\n", p.source.c_str(),
                    i == base   ? "baseline"
                    : is_fit[i] ? "fit"
                                : "predicted",
                    p.setup.budget_mib, p.setup.lanes ? p.setup.lanes : c.params.lanes, p.setup.top_k,
                    p.top_k.modelled ? "yes" : "no", tokens, p.measured_ms, p.predicted_ms, ab.err_pct,
                    ab.measured.ratio, ab.predicted.ratio, ab.ratio_err_pct, ab.sign_right ? "yes" : "no",
                    to_string(ab.measured.verdict), to_string(ab.predicted.verdict), noise);
      }
      std::fflush(stdout);
    }
    std::cerr << "fitted (" << fitted << "), " << c.iterations << " iterations, rms " << c.rms_ms << " ms:\n"
              << format_timing_config(c.params);
    return;
  }
  char buf[512];
  const model_shape shape = trace.shape();
  if (legacy) {
    std::cout << shape.name() << " (" << a.trace << "), " << a.policy << " at " << preds[0].setup.budget_mib
              << " MiB: " << runs[0].metrics.size() << " decode tokens; ";
  } else {
    std::cout << shape.name() << " (" << a.trace << ", " << rc.weights.size() << " decode tokens), " << a.policy << ": "
              << runs.size() << " run" << (runs.size() > 1 ? "s" : "") << " fitted together; ";
  }
  std::cout << (co.split == calibration_split::halves ? "fitted on the first half, scored on the second"
                : co.split == calibration_split::all  ? "every token fitted, none held out"
                                                      : "fitted on even tokens, scored on odd ones")
            << "\n";
  if (!legacy)
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const paired_tokens& p = rc.pairings[i];
      std::snprintf(buf, sizeof buf,
                    "  %s: %s; %zu rows paired by %s (recorded %.1f MiB/token, paired replay %.1f, mean |diff| "
                    "%.1f)\n",
                    runs[i].source.c_str(), describe(preds[i].setup, preds[i].top_k, c.params.lanes).c_str(),
                    runs[i].metrics.size(), to_string(p.how), p.recorded_mib_per_token, p.paired_mib_per_token,
                    p.mean_abs_diff_mib);
      std::cout << buf;
    }
  std::cout << "set        tokens  mean recorded ms  mean predicted ms  median |err| %\n";
  for (const calibration_score* s : {&c.fit, &c.held_out}) {
    std::snprintf(buf, sizeof buf, "%-9s  %6zu  %16.1f  %17.1f  %14.1f\n", s->set.c_str(), s->tokens,
                  s->mean_recorded_ms, s->mean_predicted_ms, s->median_abs_err_pct);
    std::cout << buf;
  }
  if (c.held_out.tokens) {
    std::snprintf(buf, sizeof buf, "held-out mean s/token: predicted %.3f, recorded %.3f (%+.1f%%)\n",
                  c.held_out.mean_predicted_ms / 1000, c.held_out.mean_recorded_ms / 1000,
                  100.0 * (c.held_out.mean_predicted_ms / c.held_out.mean_recorded_ms - 1.0));
    std::cout << buf;
  }
  if (c.compute_floor_pct == c.compute_floor_pct) {
    std::snprintf(buf, sizeof buf,
                  "recorded compute alone: held-out median |compute - mean fitted compute| / wall = %.1f%% "
                  "(the compute time's own variation, which a routing trace cannot explain)\n",
                  c.compute_floor_pct);
    std::cout << buf;
  }
  std::cout << "fitted (" << fitted << "), " << c.iterations << " iterations, rms residual " << c.rms_ms
            << " ms (wall, stall, management" << (a.fit_io ? ", io" : "") << " residuals of the fitted tokens):\n"
            << format_timing_config(c.params);
  if (legacy) return;
  // The campaign: every run's mean token time and its ratio against the baseline, predicted against measured.
  std::snprintf(buf, sizeof buf,
                "\nmean token time against %s (ratio > 1: slower); verdicts with a noise band of +-%.1f%% (%s)\n",
                preds[base].source.c_str(), noise,
                a.noise >= 0 ? "given" : "twice the standard error of the fitted runs' mean, 16-token blocks");
  std::cout << buf;
  std::cout << "run                          role       meas ms  pred ms   err %  meas x  pred x  x err %  sign  "
               "measured      predicted\n";
  for (std::size_t i = 0; i < preds.size(); ++i) {
    const ab_comparison ab = compare_runs(preds[i], preds[base], std::isfinite(noise) ? noise : 0.0);
    std::string name = preds[i].source;
    if (const auto slash = name.rfind('/'); slash != std::string::npos) name = name.substr(slash + 1);
    std::snprintf(buf, sizeof buf, "%-28s %-9s %8.1f %8.1f %+7.1f %7.3f %7.3f %+8.1f  %-4s  %-12s  %s%s\n",
                  name.c_str(),
                  i == base   ? "baseline"
                  : is_fit[i] ? "fit"
                              : "predicted",
                  ab.measured_ms, ab.predicted_ms, ab.err_pct, ab.measured.ratio, ab.predicted.ratio, ab.ratio_err_pct,
                  i == base       ? "-"
                  : ab.sign_right ? "yes"
                                  : "NO",
                  to_string(ab.measured.verdict), to_string(ab.predicted.verdict),
                  preds[i].top_k.modelled ? "  (top-k modelled)" : "");
    std::cout << buf;
  }
  // Each run's parts, predicted and (where its metrics record them) measured.
  std::cout << "per token, predicted / measured: compute (of it faults, contention), management, stall, io (summed "
               "over lanes), MiB read, major faults\n";
  for (std::size_t i = 0; i < preds.size(); ++i) {
    const timing_summary& s = preds[i].summary;
    const token_metrics& m = i < runs.size() ? runs[i].metrics : held[i - runs.size()].metrics;
    auto mean = [&m](const std::vector<double>& v) {
      if (v.size() != m.size() || v.empty()) return std::nan("");
      double x = 0;
      for (double y : v) x += y;
      return x / static_cast<double>(v.size());
    };
    std::snprintf(buf, sizeof buf,
                  "  %s\n    compute %.1f / %.1f (%.1f, %.1f)  management %.1f / %.1f  stall %.1f / %.1f  io %.1f / "
                  "%.1f  MiB %.1f / %.1f  faults %.0f / %.0f\n",
                  preds[i].source.c_str(), s.compute_ms_per_token, mean(m.compute_ms), s.fault_ms_per_token,
                  s.contention_ms_per_token, s.mgmt_ms_per_token, mean(m.mgmt_ms), s.stall_ms_per_token,
                  mean(m.stall_ms), s.io_ms_per_token, mean(m.io_ms), s.demanded_mib_per_token,
                  mean(m.read_bytes) / 1048576.0, s.faults_per_token, mean(m.majflt));
    std::cout << buf;
  }
}

const moe_residency_cli::command_registrar reg{
    "calibrate", "Fit the timing model to recorded per-token metrics; score it on held-out tokens and runs",
    [](CLI::App& sub) {
      auto a = std::make_shared<calibrate_args>();
      moe_residency_cli::add_trace_option(sub, a->trace, "route trace of the run");
      sub.add_option("--metrics", a->metrics,
                     "a run's per-token metrics CSV (wall_ms, stall_ms, mgmt_ms, ...); several: one device profile "
                     "fitted to all of them, each replayed at the configuration its header or --run-config gives")
          ->required();
      sub.add_option("--run-config", a->run_configs,
                     "a --metrics file's configuration, key=value,... (cache_mb, io_threads, n_expert_used, prefetch, "
                     "overlap): one per --metrics, in order, completing its header");
      sub.add_option("--budget", a->budget,
                     "the cache budget, MiB, of every run whose header and --run-config give none")
          ->check(moe_residency_cli::budget_mib());
      sub.add_option("--predict", a->predict,
                     "a run not fitted: its mean token time and ratio against the baseline are predicted and shown "
                     "beside what it measured (its configuration from its header or --predict-config)");
      sub.add_option("--predict-config", a->predict_configs, "a --predict file's configuration, as --run-config");
      sub.add_option("--baseline", a->baseline,
                     "the run (a --metrics or --predict file) the ratios are against (default: the first --metrics)");
      sub.add_option("--pair", a->pair,
                     "how rows are paired with the trace's decode tokens: step, volume (nearest read volume: a run "
                     "of another prompt or length), or auto (step when the run has the trace's tokens and top-k)")
          ->check(moe_residency_cli::one_of({"auto", "step", "volume"}))
          ->capture_default_str();
      sub.add_option("--policy", a->policy, "the runs' cache policy")->capture_default_str();
      sub.add_option("--config", a->config, "timing config (key = value) with the fixed parameters: lanes, curve, ...");
      sub.add_option("--split", a->split,
                     "halves (first half fitted, second held out), interleaved, or all (every token fitted)")
          ->check(moe_residency_cli::one_of({"halves", "interleaved", "all"}))
          ->capture_default_str();
      sub.add_option("--free", a->free,
                     "parameters fitted (default compute,latency,overlap,mgmt,eviction): compute, latency, overlap, "
                     "mgmt, eviction, bandwidth, kernel, share, faults (needs majflt), contention, lookup");
      sub.add_option("--requests-per-read", a->requests_per_read,
                     "requests one expert read is split into on the lanes (the phone's engine: 3, its tensors)")
          ->check(moe_residency_cli::whole(1, 16));
      sub.add_option("--expert-share", a->expert_share,
                     "sigma, the compute share that scales with experts executed: bytes (the trace's expert bytes "
                     "over expert and dense bytes at its top-k), fit, or a share (default: the config's)");
      sub.add_option("--noise", a->noise, "the verdicts' noise band, % (default: measured from the fitted runs)")
          ->check(moe_residency_cli::non_negative());
      sub.add_option("--seed", a->seed, "seed of the experts a wider top-k adds")
          ->check(moe_residency_cli::whole())
          ->capture_default_str();
      sub.add_flag("--pipelined-mgmt", a->pipelined_mgmt,
                   "the engine makes each demanded read resident as soon as it ends, behind the layer's later waves "
                   "(equation 5')");
      sub.add_flag("--fit-io", a->fit_io, "also fit the recorded io_ms, and the bandwidth scale with it");
      sub.add_option("--write-config", a->write_config, "write the fitted parameters as a timing config");
      moe_residency_cli::add_format_option(sub, a->format, {"table", "csv"});
      sub.callback([a, &sub] { run(sub, *a); });
    }};

}  // namespace
