#pragma once
/// Calibration of the timing model from recorded per-token metrics: a
/// bounded Levenberg-Marquardt least-squares fit of the free parameters on one
/// set of decode tokens, scored on the other. The only header of the library
/// that includes Eigen (trace-, cache- and timing-only users do not need it).
///
/// Residuals, per fitted token t (all in ms): predicted − recorded wall time,
/// and, when the metrics file has them, predicted − recorded stall and
/// management time (the engine records wall = compute + management + stall,
/// so the components pin down parameters the wall alone cannot separate).
/// With `fit_compute`, also predicted − recorded compute_ms.
/// With `fit_io`, also predicted − recorded io_ms (read durations summed over
/// lanes): off by default, because io_ms is not a part of the wall time and
/// its exact definition in the engine is not documented; with it on, the
/// bandwidth scale becomes identifiable (add it to `free`).
/// Several runs of one device and model (calibrate_timing_runs) are fitted at
/// once: each run replays its own configuration (lanes, top-k, overlap), all
/// share one set of parameters, and the residuals of every run's fitted tokens
/// are pooled.
///
/// Major faults (equation 1's φ × f): where the metrics record `majflt`, a
/// fitted token is charged its measured faults; a held-out token the model's
/// F_0 + χ × evicted MiB, with F_0 and χ fitted (least squares, both >= 0) to
/// the fitted tokens' `majflt` against the replay's evicted MiB — only when φ
/// is free or set, since without φ faults cost nothing.
/// Cost = Σ residual². Jacobian by forward differences; each step solves
/// (JᵀJ + μ·diag(JᵀJ) + ε·I) δ = −Jᵀr (Eigen LDLT) and is projected onto
/// the parameters' bounds; μ adapts (÷3 on an accepted step, ×4 otherwise).

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "moe_residency/error.hpp"
#include "moe_residency/timing.hpp"
#include "moe_residency/timing/fault_line.hpp"

namespace moe_residency {

/// Which decode tokens are fitted and which are held out.
enum class calibration_split {
  /// First half of the decode tokens fitted, second half held out (the
  /// default): the held-out tokens come later in the run, as every real use
  /// of a fitted model does, and neighbouring tokens — which share cache
  /// state and the device's thermal state — never straddle the two sets.
  halves,
  /// Even-indexed tokens fitted, odd ones held out: interpolation only;
  /// optimistic, because neighbours leak into each other.
  interleaved,
  /// Every token fitted, none held out: one run calibrates a model that is
  /// then scored on *other* runs (the memory lab, moe_residency_lab/lab.hpp).
  all,
};

/// The parameters calibration may fit.
enum class timing_param : unsigned {
  compute_ms_per_token = 1u << 0,
  read_latency_ms = 1u << 1,
  overlap = 1u << 2,
  mgmt_ms_per_read = 1u << 3,
  mgmt_ms_per_eviction = 1u << 4,
  bandwidth_scale = 1u << 5,
  read_cpu_ms_per_mib = 1u << 6,
  expert_compute_share = 1u << 7,     ///< σ: identifiable only from runs at different top-k (or drops)
  compute_ms_per_fault = 1u << 8,     ///< φ: from the compute the measured faults add
  compute_ms_per_read_mib = 1u << 9,  ///< ρ: from the compute that grows with the MiB a token reads
  mgmt_ms_per_lookup = 1u << 10,      ///< ν_l: from management that grows with lookups (runs at different top-k)
};

struct calibration_options {
  calibration_split split = calibration_split::halves;
  /// Bitmask of timing_param; the default fits all but bandwidth_scale
  /// (which the wall decomposition cannot tell from latency and overlap).
  unsigned free = 0x1f;
  /// Add io_ms residuals (see the header comment).
  bool fit_io = false;
  /// Add compute residuals: predicted compute − recorded compute_ms, on
  /// tokens that record it. Off by default: the phone's compute_ms is the
  /// engine's own split of the wall; the memory lab (moe_residency_lab/calibrate.hpp)
  /// turns it on with the eval thread's user CPU time, which is compute alone.
  bool fit_compute = false;
  std::size_t max_iterations = 200;
  /// Start the free parameters from the fitted tokens' data (compute: mean
  /// recorded compute_ms with `fit_compute`, else mean recorded wall − stall −
  /// management; management per read: mean
  /// management / mean reads; latency 1 ms; overlap 0.5) instead of `start`.
  bool start_from_data = true;
};

/// Prediction error over one set of tokens.
struct calibration_score {
  std::string set;  ///< "fit" or "held_out"
  std::size_t tokens = 0;
  double mean_recorded_ms = 0, mean_predicted_ms = 0;
  double median_abs_err_pct = 0;  ///< median over tokens of |predicted − recorded| / recorded, %
};

/// One recorded run for calibrate_timing_runs.
struct calibration_run {
  std::string name;               ///< for messages and the per-run scores (the metrics file)
  model_shape shape;              ///< the run's shape (its top-k)
  std::vector<load_event> loads;  ///< its replay's decode loads, token t for metrics row t
  token_metrics metrics;          ///< its recorded per-token metrics
  std::size_t lanes = 0;          ///< its read lanes; 0: the start parameters'
  bool overlap = true;            ///< false: its engine did not compute while misses loaded (ω = 0 for it)
};

/// A run's own scores and predictions (calibrate_timing_runs).
struct calibration_run_score {
  std::string name;
  calibration_score fit, held_out;
  std::vector<double> predicted_ms;  ///< per metrics row
  std::vector<bool> in_fit;
};

struct calibration_result {
  timing_params params;                     ///< the fitted parameters (the others as given)
  std::vector<std::string> free;            ///< names of the fitted parameters
  calibration_score fit, held_out;          ///< over every run's tokens
  std::vector<calibration_run_score> runs;  ///< per run, in the order given
  std::vector<double> predicted_ms;         ///< every decode token's predicted wall time
  std::vector<bool> in_fit;                 ///< per token: in the fitted set
  std::size_t iterations = 0;
  double rms_ms = 0;  ///< root mean square residual on the fitted set at the optimum
  /// When the metrics record compute_ms: the held-out median of
  /// |compute_t − mean fitted compute| / wall_t, %: the error a model with a
  /// constant compute time per token cannot go below even with every stall
  /// and management time exact. NaN without compute_ms.
  double compute_floor_pct = std::numeric_limits<double>::quiet_NaN();
};

namespace detail {

struct calib_param {
  timing_param id;
  const char* name;
  double lo, hi;
  double timing_params::*field;
};

inline const std::vector<calib_param>& calib_params() {
  static const std::vector<calib_param> all = {
      {timing_param::compute_ms_per_token, "compute_ms_per_token", 0.0, 1e7, &timing_params::compute_ms_per_token},
      {timing_param::read_latency_ms, "read_latency_ms", 0.0, 1e5, &timing_params::read_latency_ms},
      {timing_param::overlap, "overlap", 0.0, 1.0, &timing_params::overlap},
      {timing_param::mgmt_ms_per_read, "mgmt_ms_per_read", 0.0, 1e5, &timing_params::mgmt_ms_per_read},
      {timing_param::mgmt_ms_per_eviction, "mgmt_ms_per_eviction", 0.0, 1e5, &timing_params::mgmt_ms_per_eviction},
      {timing_param::bandwidth_scale, "bandwidth_scale", 0.01, 4.0, &timing_params::bandwidth_scale},
      {timing_param::read_cpu_ms_per_mib, "read_cpu_ms_per_mib", 0.0, 1e5, &timing_params::read_cpu_ms_per_mib},
      {timing_param::expert_compute_share, "expert_compute_share", 0.0, 1.0, &timing_params::expert_compute_share},
      {timing_param::compute_ms_per_fault, "compute_ms_per_fault", 0.0, 1e3, &timing_params::compute_ms_per_fault},
      {timing_param::compute_ms_per_read_mib, "compute_ms_per_read_mib", 0.0, 1e3,
       &timing_params::compute_ms_per_read_mib},
      {timing_param::mgmt_ms_per_lookup, "mgmt_ms_per_lookup", 0.0, 1e5, &timing_params::mgmt_ms_per_lookup},
  };
  return all;
}

inline double calib_median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline calibration_score calib_score(const char* name, const std::vector<double>& pred, const token_metrics& m,
                                     const std::vector<bool>& in_fit, bool want_fit) {
  calibration_score s;
  s.set = name;
  std::vector<double> err;
  double rec = 0, pr = 0;
  for (std::size_t t = 0; t < pred.size(); ++t) {
    if (in_fit[t] != want_fit) continue;
    ++s.tokens;
    rec += m.wall_ms[t];
    pr += pred[t];
    err.push_back(100.0 * std::abs(pred[t] - m.wall_ms[t]) / m.wall_ms[t]);
  }
  if (s.tokens) {
    s.mean_recorded_ms = rec / static_cast<double>(s.tokens);
    s.mean_predicted_ms = pr / static_cast<double>(s.tokens);
  }
  s.median_abs_err_pct = calib_median(err);
  return s;
}

}  // namespace detail

/// Fits the free parameters of `start` to several recorded runs of one
/// device and model at once (see the header comment): each run's loads
/// (one token per metrics row, in order) are timed with the run's lanes and
/// overlap, and every run's tokens that `options.split` selects (within each
/// run) are fitted; each run and all of them together are scored. Throws
/// `error` naming the run when its token counts differ or a recorded wall time
/// is not > 0, and when there is no run or no parameter is free.
inline calibration_result calibrate_timing_runs(const std::vector<calibration_run>& runs, const timing_params& start,
                                                const calibration_options& options = {}) {
  start.validate();
  if (runs.empty()) throw error("calibrate_timing: no run; expected at least one recorded run");
  std::vector<detail::calib_param> free;
  for (const auto& p : detail::calib_params())
    if (options.free & static_cast<unsigned>(p.id)) free.push_back(p);
  if (free.empty()) throw error("calibrate_timing: no free parameter; expected at least one");
  const std::size_t n_runs = runs.size();
  // Per run: the parameters it runs with, its tokens, which are fitted, its evicted MiB per token.
  auto run_params = [&](const timing_params& p, std::size_t r) {
    timing_params q = p;
    if (runs[r].lanes) q.lanes = runs[r].lanes;
    if (!runs[r].overlap) q.overlap = 0;
    return q;
  };
  std::vector<std::vector<bool>> in_fit(n_runs);
  std::vector<std::vector<double>> evicted(n_runs);
  for (std::size_t r = 0; r < n_runs; ++r) {
    const calibration_run& run = runs[r];
    const std::string who = n_runs > 1 ? " (run " + run.name + ")" : "";
    const std::size_t tokens = simulate_timing(run.shape, run_params(start, r), run.loads).size();
    if (tokens != run.metrics.size())
      throw error("calibrate_timing" + who + ": the replay has " + std::to_string(tokens) +
                  " decode tokens but the metrics have " + std::to_string(run.metrics.size()) +
                  " rows; expected one row per decode token of the same run");
    for (std::size_t t = 0; t < tokens; ++t)
      if (!(run.metrics.wall_ms[t] > 0))
        throw error("calibrate_timing" + who + ": metrics row " + std::to_string(t + 1) + ": wall_ms " +
                    std::to_string(run.metrics.wall_ms[t]) + "; expected > 0");
    in_fit[r].resize(tokens);
    for (std::size_t t = 0; t < tokens; ++t)
      in_fit[r][t] = options.split == calibration_split::halves ? t < tokens / 2
                     : options.split == calibration_split::all  ? true
                                                                : t % 2 == 0;
    evicted[r] = detail::evicted_mib_per_token(run.loads, tokens);
  }
  // Faults: measured on the fitted tokens that record them; the model's line elsewhere.
  const bool faults_matter =
      (options.free & static_cast<unsigned>(timing_param::compute_ms_per_fault)) || start.compute_ms_per_fault > 0;
  timing_params base = start;
  std::vector<std::vector<double>> measured(n_runs);
  if (faults_matter) {
    std::vector<double> fx, fy;
    for (std::size_t r = 0; r < n_runs; ++r) {
      const token_metrics& m = runs[r].metrics;
      if (m.majflt.size() != m.size()) continue;
      measured[r].assign(m.size(), std::numeric_limits<double>::quiet_NaN());
      for (std::size_t t = 0; t < m.size(); ++t)
        if (in_fit[r][t] && std::isfinite(m.majflt[t])) {
          measured[r][t] = m.majflt[t];
          fx.push_back(evicted[r][t]);
          fy.push_back(m.majflt[t]);
        }
    }
    if (!fx.empty()) std::tie(base.faults_per_token, base.faults_per_evicted_mib) = detail::fit_faults_line(fx, fy);
  }

  const Eigen::Index n = static_cast<Eigen::Index>(free.size());
  auto to_params = [&](const Eigen::VectorXd& x) {
    timing_params p = base;
    for (Eigen::Index i = 0; i < n; ++i) p.*(free[static_cast<std::size_t>(i)].field) = x[i];
    return p;
  };
  auto simulate = [&](const timing_params& p, std::size_t r) {
    return simulate_timing(runs[r].shape, run_params(p, r), runs[r].loads, measured[r]);
  };
  auto residuals = [&](const Eigen::VectorXd& x) {
    const timing_params p = to_params(x);
    std::vector<double> res;
    for (std::size_t r = 0; r < n_runs; ++r) {
      const auto ts = simulate(p, r);
      const token_metrics& metrics = runs[r].metrics;
      for (std::size_t t = 0; t < ts.size(); ++t) {
        if (!in_fit[r][t]) continue;
        res.push_back(ts[t].wall_ms - metrics.wall_ms[t]);
        if (std::isfinite(metrics.stall_ms[t])) res.push_back(ts[t].stall_ms - metrics.stall_ms[t]);
        if (std::isfinite(metrics.mgmt_ms[t])) res.push_back(ts[t].mgmt_ms - metrics.mgmt_ms[t]);
        if (options.fit_io && t < metrics.io_ms.size() && std::isfinite(metrics.io_ms[t]))
          res.push_back(ts[t].io_ms - metrics.io_ms[t]);
        if (options.fit_compute && t < metrics.compute_ms.size() && std::isfinite(metrics.compute_ms[t]))
          res.push_back(ts[t].compute_ms - metrics.compute_ms[t]);
      }
    }
    return Eigen::Map<Eigen::VectorXd>(res.data(), static_cast<Eigen::Index>(res.size())).eval();
  };
  auto project = [&](Eigen::VectorXd& x) {
    for (Eigen::Index i = 0; i < n; ++i)
      x[i] = std::min(std::max(x[i], free[static_cast<std::size_t>(i)].lo), free[static_cast<std::size_t>(i)].hi);
  };

  Eigen::VectorXd x(n);
  for (Eigen::Index i = 0; i < n; ++i) x[i] = start.*(free[static_cast<std::size_t>(i)].field);
  if (options.start_from_data) {
    double rest = 0, wall = 0, mgmt = 0, reads = 0, k = 0, comp = 0;
    bool have_parts = true, have_compute = options.fit_compute;
    for (std::size_t r = 0; r < n_runs; ++r) {
      const auto ts0 = simulate(base, r);
      const token_metrics& metrics = runs[r].metrics;
      for (std::size_t t = 0; t < ts0.size(); ++t) {
        if (!in_fit[r][t]) continue;
        ++k;
        wall += metrics.wall_ms[t];
        have_parts = have_parts && std::isfinite(metrics.stall_ms[t]) && std::isfinite(metrics.mgmt_ms[t]);
        if (have_parts) rest += metrics.wall_ms[t] - metrics.stall_ms[t] - metrics.mgmt_ms[t];
        if (std::isfinite(metrics.mgmt_ms[t])) mgmt += metrics.mgmt_ms[t];
        have_compute = have_compute && std::isfinite(metrics.compute_ms[t]);
        if (have_compute) comp += metrics.compute_ms[t];
        reads += ts0[t].demanded_reads;
      }
    }
    for (Eigen::Index i = 0; i < n; ++i) {
      switch (free[static_cast<std::size_t>(i)].id) {
        case timing_param::compute_ms_per_token:
          x[i] = (have_compute ? comp : have_parts ? rest : 0.9 * wall) / k;
          break;
        case timing_param::read_latency_ms: x[i] = 1.0; break;
        case timing_param::overlap: x[i] = 0.5; break;
        case timing_param::mgmt_ms_per_read: x[i] = reads > 0 ? mgmt / reads : 0.0; break;
        case timing_param::mgmt_ms_per_eviction: x[i] = 0.0; break;
        case timing_param::bandwidth_scale: x[i] = 1.0; break;
        case timing_param::read_cpu_ms_per_mib: x[i] = 0.0; break;
        case timing_param::expert_compute_share: x[i] = 0.5; break;
        case timing_param::compute_ms_per_fault: x[i] = 0.0; break;
        case timing_param::compute_ms_per_read_mib: x[i] = 0.0; break;
        case timing_param::mgmt_ms_per_lookup: x[i] = 0.0; break;
      }
    }
  }
  // One bounded Levenberg-Marquardt descent from x0.
  auto descend = [&](Eigen::VectorXd x, std::size_t& iterations) {
    Eigen::VectorXd r = residuals(x);
    double cost = r.squaredNorm();
    double mu = 1e-3;
    std::size_t it = 0;
    for (; it < options.max_iterations; ++it) {
      Eigen::MatrixXd J(r.size(), n);
      for (Eigen::Index i = 0; i < n; ++i) {
        Eigen::VectorXd xh = x;
        double h = 1e-4 * std::max(1.0, std::abs(x[i]));
        if (xh[i] + h > free[static_cast<std::size_t>(i)].hi) h = -h;  // stay inside the bounds
        xh[i] += h;
        J.col(i) = (residuals(xh) - r) / h;
      }
      // Active set: a parameter on a bound whose descent direction leaves the
      // box is held there for this step (its column is removed).
      const Eigen::VectorXd g0 = J.transpose() * r;
      for (Eigen::Index i = 0; i < n; ++i) {
        const auto& fp = free[static_cast<std::size_t>(i)];
        if ((x[i] <= fp.lo && g0[i] > 0) || (x[i] >= fp.hi && g0[i] < 0)) J.col(i).setZero();
      }
      const Eigen::MatrixXd JtJ = J.transpose() * J;
      const Eigen::VectorXd g = J.transpose() * r;
      bool accepted = false;
      for (int tries = 0; tries < 12 && !accepted; ++tries) {
        Eigen::MatrixXd A = JtJ;
        for (Eigen::Index i = 0; i < n; ++i) A(i, i) += mu * JtJ(i, i) + 1e-9;
        Eigen::VectorXd cand = x + A.ldlt().solve(-g);
        project(cand);
        const Eigen::VectorXd rc = residuals(cand);
        const double c = rc.squaredNorm();
        if (c < cost) {
          const double gain = cost - c;
          x = cand;
          r = rc;
          cost = c;
          mu = std::max(mu / 3.0, 1e-9);
          accepted = true;
          if (gain < 1e-10 * std::max(1.0, cost)) it = options.max_iterations;  // converged
        } else {
          mu *= 4.0;
        }
      }
      if (!accepted) break;
    }
    iterations = std::min(it, options.max_iterations);
    return std::make_pair(x, cost);
  };
  // The model is piecewise linear in latency and overlap (the max of (5)), so
  // a descent can stop on a kink: start from a few (latency, overlap) pairs
  // and keep the lowest cost on the fitted tokens.
  std::vector<Eigen::VectorXd> starts{x};
  for (double lat : {0.0, 1.0, 3.0})
    for (double ov : {0.2, 0.5, 0.9}) {
      Eigen::VectorXd s0 = x;
      bool changed = false;
      for (Eigen::Index i = 0; i < n; ++i) {
        const timing_param id = free[static_cast<std::size_t>(i)].id;
        if (id == timing_param::read_latency_ms || id == timing_param::overlap) {
          s0[i] = id == timing_param::overlap ? ov : lat;
          changed = true;
        }
      }
      if (changed) starts.push_back(s0);
    }
  double cost = std::numeric_limits<double>::infinity();
  std::size_t it = 0;
  Eigen::VectorXd r;
  for (const Eigen::VectorXd& s0 : starts) {
    std::size_t its = 0;
    auto [xs, cs] = descend(s0, its);
    if (cs < cost) {
      cost = cs;
      x = xs;
      it = its;
    }
  }
  r = residuals(x);

  calibration_result out;
  out.params = to_params(x);
  for (const auto& p : free) out.free.push_back(p.name);
  out.iterations = it;
  out.rms_ms = r.size() ? std::sqrt(cost / static_cast<double>(r.size())) : 0.0;
  // Scores: each run's, and over all runs' tokens together.
  token_metrics all;
  std::vector<double> all_pred;
  std::vector<bool> all_fit;
  for (std::size_t k = 0; k < n_runs; ++k) {
    calibration_run_score rs;
    rs.name = runs[k].name;
    for (const auto& t : simulate(out.params, k)) rs.predicted_ms.push_back(t.wall_ms);
    rs.in_fit = in_fit[k];
    rs.fit = detail::calib_score("fit", rs.predicted_ms, runs[k].metrics, rs.in_fit, true);
    rs.held_out = detail::calib_score("held_out", rs.predicted_ms, runs[k].metrics, rs.in_fit, false);
    all_pred.insert(all_pred.end(), rs.predicted_ms.begin(), rs.predicted_ms.end());
    all_fit.insert(all_fit.end(), rs.in_fit.begin(), rs.in_fit.end());
    all.wall_ms.insert(all.wall_ms.end(), runs[k].metrics.wall_ms.begin(), runs[k].metrics.wall_ms.end());
    all.compute_ms.insert(all.compute_ms.end(), runs[k].metrics.compute_ms.begin(), runs[k].metrics.compute_ms.end());
    out.runs.push_back(std::move(rs));
  }
  out.predicted_ms = all_pred;
  out.in_fit = all_fit;
  out.fit = detail::calib_score("fit", all_pred, all, all_fit, true);
  out.held_out = detail::calib_score("held_out", all_pred, all, all_fit, false);
  double csum = 0, cn = 0;
  bool have_compute = all.compute_ms.size() == all.wall_ms.size();
  for (std::size_t t = 0; have_compute && t < all.size(); ++t) {
    have_compute = std::isfinite(all.compute_ms[t]);
    if (all_fit[t]) {
      csum += all.compute_ms[t];
      ++cn;
    }
  }
  if (have_compute && cn > 0 && out.held_out.tokens > 0) {
    std::vector<double> floor;
    for (std::size_t t = 0; t < all.size(); ++t)
      if (!all_fit[t]) floor.push_back(100.0 * std::abs(all.compute_ms[t] - csum / cn) / all.wall_ms[t]);
    out.compute_floor_pct = detail::calib_median(floor);
  }
  return out;
}

/// Fits the free parameters of `start` to `metrics` over the loads of a replay
/// without speculation (`loads`: replay_dynamic's decode_loads, one token per
/// metrics row, in order), on the tokens `options.split` selects; scores both
/// sets. Throws `error` when the token counts differ, a recorded wall time is
/// not > 0, or no parameter is free. One run of calibrate_timing_runs.
inline calibration_result calibrate_timing(const model_shape& shape, const std::vector<load_event>& loads,
                                           const token_metrics& metrics, const timing_params& start,
                                           const calibration_options& options = {}) {
  calibration_run run{"metrics", shape, loads, metrics, 0, true};
  return calibrate_timing_runs({std::move(run)}, start, options);
}

/// CSV `set,tokens,mean_recorded_ms,mean_predicted_ms,median_abs_err_pct`, rows fit and held_out.
inline std::string calibration_csv(const calibration_result& c) {
  std::string s = "set,tokens,mean_recorded_ms,mean_predicted_ms,median_abs_err_pct\n";
  char buf[200];
  for (const calibration_score* sc : {&c.fit, &c.held_out}) {
    std::snprintf(buf, sizeof buf, "%s,%zu,%.3f,%.3f,%.2f\n", sc->set.c_str(), sc->tokens, sc->mean_recorded_ms,
                  sc->mean_predicted_ms, sc->median_abs_err_pct);
    s += buf;
  }
  return s;
}

}  // namespace moe_residency
