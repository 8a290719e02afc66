#pragma once
/// timing/recorded_runs.hpp: recorded runs of one device and model — their
/// metrics and configurations (timing/run_config.hpp) — replayed over one
/// route trace, calibrated together (timing/calibrate.hpp's
/// calibrate_timing_runs) and predicted: what `moe-residency calibrate` does
/// with one metrics file or several, and what judges the model on runs it was
/// not fitted on (an A/B campaign: the mean token time of each run, and its
/// ratio against a baseline run, predicted against measured).
///
/// Each run is replayed at its own configuration: its cache budget, its
/// top-k (timing/top_k.hpp: narrower replayed, wider modelled), its lanes and
/// overlap (timing/params.hpp). Its rows are paired with the replayed tokens
/// by step or by read volume (timing/pairing.hpp); the pairings weight the
/// trace's tokens for every prediction. Calibration fixes the compute's
/// reference top-k k_c to the trace's, so that a run at another top-k changes
/// the experts executed by e_l / k_c (equation 1). Includes Eigen (through
/// timing/calibrate.hpp).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/detail/format.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/replay.hpp"
#include "moe_residency/timing.hpp"
#include "moe_residency/timing/calibrate.hpp"
#include "moe_residency/timing/pairing.hpp"
#include "moe_residency/timing/run_config.hpp"
#include "moe_residency/timing/top_k.hpp"
#include "moe_residency/timing/verdict.hpp"

namespace moe_residency {

/// One recorded run: its per-token metrics and its configuration.
struct recorded_run {
  std::string source;  ///< the metrics file (names the run in messages and tables)
  token_metrics metrics;
  run_config config;
};

/// A metrics file's text as a run: its rows (parse_token_metrics) and the
/// configuration of its header completed by `given` (merge_run_config).
/// Throws like those, naming `source`.
inline recorded_run parse_recorded_run(const std::string& text, const std::string& source,
                                       const run_config& given = {}) {
  recorded_run r;
  r.source = source;
  r.metrics = parse_token_metrics(text, source);
  r.config = merge_run_config(parse_run_config(text, source), given, source);
  return r;
}

/// A run's configuration as the replay and the model take it.
struct run_setup {
  double budget_mib = 0;
  std::size_t lanes = 0;  ///< 0: the device config's
  std::size_t top_k = 0;  ///< experts routed per layer
  bool overlap = true;    ///< false: ω = 0 for this run
};

/// Throws `error` naming `source`: no cache budget (neither the header's
/// cache_mb nor one given), a cache the engine sized itself (cache_auto=1:
/// its budget is not known), or the engine's own prefetch (prefetch=1: what
/// it read ahead is not in the trace, so the run cannot be replayed).
inline run_setup resolve_run_setup(const run_config& c, std::size_t trace_k, const std::string& source) {
  if (c.cache_auto && *c.cache_auto)
    throw error(source +
                ": cache_auto=1: the engine sized its cache itself, so its budget is not known; expected a "
                "run with a fixed cache (cache_auto=0)");
  if (c.prefetch && *c.prefetch)
    throw error(source +
                ": prefetch=1: the engine read ahead with its own predictor, which the trace does not "
                "record, so the run cannot be replayed; expected a run with prefetch=0");
  if (!c.cache_mib)
    throw error(source +
                ": no cache budget: the file's header has no cache_mb and none was given; expected "
                "cache_mb in the header, or a budget on the command line");
  run_setup s;
  s.budget_mib = *c.cache_mib;
  s.lanes = c.lanes ? *c.lanes : 0;
  s.top_k = c.top_k ? *c.top_k : trace_k;
  s.overlap = c.overlap ? *c.overlap : true;
  return s;
}

/// One configuration replayed over the trace (no speculation: the runs here
/// had none).
struct replayed_config {
  run_setup setup;
  top_k_change top_k;  ///< from == to when the trace's own top-k
  model_shape shape;
  std::vector<load_event> loads;  ///< decode loads
  std::string warning;            ///< the replay's (a budget below the token cycle, ...)
};

/// Throws like with_top_k and replay_dynamic.
inline replayed_config replay_config(const route_trace& trace, const run_setup& s, const std::string& policy,
                                     std::uint64_t seed) {
  replayed_config out;
  out.setup = s;
  out.top_k.from = out.top_k.to = trace.header.n_expert_used;
  dynamic_replay_options o;
  o.policy = policy;
  o.budget_mib = s.budget_mib;
  o.seed = seed;
  dynamic_replay_result r;
  if (s.top_k != trace.header.n_expert_used) {
    const auto t = with_top_k(trace, s.top_k, seed, &out.top_k);
    const routed_replay_input in = routed_replay_input::from_trace(t.trace());
    out.shape = in.shape();
    r = replay_dynamic(in, o);
  } else {
    const routed_replay_input in = routed_replay_input::from_trace(trace);
    out.shape = in.shape();
    r = replay_dynamic(in, o);
  }
  out.loads = std::move(r.decode_loads);
  out.warning = r.warning;
  return out;
}

/// How calibrate_recorded_runs pairs a run's rows with the trace's tokens.
enum class pairing_choice {
  automatic,  ///< by step when the run has one row per decode token of the trace at the trace's top-k, else by volume
  step,
  volume,
};

struct runs_calibration {
  calibration_result result;             ///< params (noise_pct measured), per-run scores
  std::vector<replayed_config> replays;  ///< per run
  std::vector<paired_tokens> pairings;   ///< per run
  std::vector<double> weights;           ///< per trace decode token: rows of every run paired to it
  double noise_pct = std::nan("");       ///< the band measured (NaN: runs too short)
};

/// Calibrates `start` on the runs (see the header comment): each run replayed
/// at its configuration with `policy`, paired as `pairing` says, all fitted
/// together with `options`. k_c (compute_top_k) becomes the trace's top-k
/// unless `start` sets it; noise_pct becomes the band the runs measure
/// (timing/verdict.hpp), when they are long enough. Throws `error` naming the
/// run on a configuration that cannot be replayed (resolve_run_setup), a
/// pairing that cannot be made, and like calibrate_timing_runs.
inline runs_calibration calibrate_recorded_runs(const route_trace& trace, const std::vector<recorded_run>& runs,
                                                timing_params start, const calibration_options& options,
                                                const std::string& policy = "lru",
                                                pairing_choice pairing = pairing_choice::automatic,
                                                std::uint64_t seed = 0x5eed) {
  if (runs.empty()) throw error("calibrate: no recorded run; expected at least one metrics file");
  const std::size_t trace_k = trace.header.n_expert_used;
  if (start.compute_top_k == 0) start.compute_top_k = trace_k;
  runs_calibration out;
  std::vector<calibration_run> cal;
  std::size_t trace_tokens = 0;
  for (const recorded_run& r : runs) {
    const run_setup s = resolve_run_setup(r.config, trace_k, r.source);
    replayed_config rc = replay_config(trace, s, policy, seed);
    const std::size_t tokens = decode_tokens_of(rc.loads);
    trace_tokens = std::max(trace_tokens, tokens);
    const std::vector<std::uint64_t> bytes = demanded_bytes_per_token(rc.loads, tokens);
    const bool by_step = pairing == pairing_choice::step ||
                         (pairing == pairing_choice::automatic && r.metrics.size() == tokens && s.top_k == trace_k);
    // Chosen automatically, volume pairing is for a run that says what it is: a metrics
    // header (bmoe_metrics v1) or a --run-config. A bare file of another length is more
    // likely another model's run, or the wrong trace, than a longer run of this one.
    if (!by_step && pairing == pairing_choice::automatic && r.config.given.empty())
      throw error("calibrate_timing: the replay has " + std::to_string(tokens) + " decode tokens but the metrics " +
                  "have " + std::to_string(r.metrics.size()) + " rows; expected one row per decode token of the " +
                  "same run (a run of another length is paired by read volume when its header or --run-config " +
                  "names its configuration, or with --pair volume)");
    paired_tokens p = by_step ? pair_tokens_by_step(bytes, r.metrics.read_bytes, r.metrics.size(), r.source)
                              : pair_tokens_by_volume(bytes, r.metrics.read_bytes, r.source);
    // Chosen automatically, volume pairing must find the run's read volumes among the
    // trace's: rows a quarter of their volume away on average are another model's run, or
    // the wrong trace (the phone's A/B runs: 0.9%). `pairing_choice::volume` pairs anyway.
    if (!by_step && pairing == pairing_choice::automatic && p.recorded_mib_per_token > 0 &&
        p.mean_abs_diff_mib > 0.25 * p.recorded_mib_per_token)
      throw error(r.source + ": " + std::to_string(r.metrics.size()) + " rows, not the trace's " +
                  std::to_string(tokens) + " decode tokens, and paired by read volume they are " +
                  detail::format_printf("%.1f", p.mean_abs_diff_mib) + " MiB a token from the trace's (" +
                  detail::format_printf("%.0f", 100 * p.mean_abs_diff_mib / p.recorded_mib_per_token) + "% of its " +
                  detail::format_printf("%.1f", p.recorded_mib_per_token) +
                  " MiB a token); expected a run of the trace's model and routing (or pair by volume on purpose)");
    cal.push_back(calibration_run{r.source, rc.shape, paired_loads(rc.loads, p), r.metrics, s.lanes, s.overlap});
    out.pairings.push_back(std::move(p));
    out.replays.push_back(std::move(rc));
  }
  out.result = calibrate_timing_runs(cal, start, options);
  // The device's lanes for a what-if: the first run's, when it says.
  if (!out.replays.empty() && out.replays.front().setup.lanes)
    out.result.params.lanes = out.replays.front().setup.lanes;
  out.weights = token_weights(out.pairings, trace_tokens);
  for (const recorded_run& r : runs) {
    const double band = run_noise_pct(r.metrics.wall_ms);
    if (std::isfinite(band) && !(band <= out.noise_pct)) out.noise_pct = band;
  }
  if (std::isfinite(out.noise_pct)) out.result.params.noise_pct = out.noise_pct;
  return out;
}

/// A run predicted from a calibrated device.
struct run_prediction {
  std::string source;
  run_setup setup;
  top_k_change top_k;
  timing_summary summary;  ///< predicted, the trace's tokens weighted as the calibration paired them
  double predicted_ms = 0;
  double measured_ms = std::nan("");  ///< the run's mean wall_ms (NaN without metrics)
  std::string warning;
};

/// Predicts run `r`'s mean token time from `device` (a calibrated device:
/// its lanes are the run's when the run says), the trace's tokens weighted by
/// `weights` (runs_calibration::weights; empty: alike). Only the run's
/// configuration is used; its metrics give the measured mean printed beside
/// the prediction. Throws like resolve_run_setup and replay_config.
inline run_prediction predict_recorded_run(const route_trace& trace, const recorded_run& r, const timing_params& device,
                                           const std::vector<double>& weights, const std::string& policy = "lru",
                                           std::uint64_t seed = 0x5eed) {
  run_prediction out;
  out.source = r.source;
  out.setup = resolve_run_setup(r.config, trace.header.n_expert_used, r.source);
  const replayed_config rc = replay_config(trace, out.setup, policy, seed);
  out.top_k = rc.top_k;
  out.warning = rc.warning;
  timing_params p = device;
  if (out.setup.lanes) p.lanes = out.setup.lanes;
  if (!out.setup.overlap) p.overlap = 0;
  const auto ts = simulate_timing(rc.shape, p, rc.loads);
  out.summary = summarize_timing(ts, weights.size() == ts.size() ? weights : std::vector<double>());
  out.predicted_ms = out.summary.s_per_token * 1000.0;
  if (r.metrics.size()) {
    double w = 0;
    for (double x : r.metrics.wall_ms) w += x;
    out.measured_ms = w / static_cast<double>(r.metrics.size());
  }
  return out;
}

/// One run against the baseline run: measured and predicted means and
/// ratios, the verdicts both give, and whether the prediction is right.
struct ab_comparison {
  std::string run, baseline;
  double measured_ms = 0, predicted_ms = 0, err_pct = 0;  ///< the run's mean token time
  ratio_verdict measured, predicted;                      ///< against the baseline's measured / predicted mean
  double ratio_err_pct = 0;                               ///< predicted ratio / measured ratio − 1, %
  bool sign_right = false;  ///< both ratios on the same side of 1 (both exactly 1 counts as right)
};

/// Throws like judge_ratio (a mean not > 0).
inline ab_comparison compare_runs(const run_prediction& run, const run_prediction& baseline, double noise_pct) {
  ab_comparison c;
  c.run = run.source;
  c.baseline = baseline.source;
  c.measured_ms = run.measured_ms;
  c.predicted_ms = run.predicted_ms;
  c.err_pct = 100.0 * (run.predicted_ms / run.measured_ms - 1.0);
  c.measured = judge_ratio(run.measured_ms, baseline.measured_ms, noise_pct);
  c.predicted = judge_ratio(run.predicted_ms, baseline.predicted_ms, noise_pct);
  c.ratio_err_pct = 100.0 * (c.predicted.ratio / c.measured.ratio - 1.0);
  const auto side = [](double r) { return r > 1 ? 1 : r < 1 ? -1 : 0; };
  c.sign_right = side(c.predicted.ratio) == side(c.measured.ratio);
  return c;
}

}  // namespace moe_residency
