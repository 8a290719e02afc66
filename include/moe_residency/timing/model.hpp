#pragma once
/// timing/model.hpp: the per-token model, equations (1)–(8) of timing.hpp run
/// over a replay's decode loads: timing_simulator (which also decides, read by
/// read, which speculative reads complete), the per-token figures and their
/// means, and predict_timing, one dynamic replay timed. Standard library only.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/replay/dynamic.hpp"
#include "moe_residency/timing/params.hpp"

namespace moe_residency {

/// One decode token as the model predicts it.
struct token_timing {
  double wall_ms = 0, compute_ms = 0, stall_ms = 0, mgmt_ms = 0;
  double wait_ms = 0;  ///< of the stall, waiting for speculative reads in flight (4)
  double io_ms = 0;    ///< read durations summed over lanes, demanded and speculative
  /// Of compute_ms: the major faults' share (φ × f) and the reads' (ρ × MiB) (1).
  double fault_ms = 0, contention_ms = 0;
  double faults = 0;  ///< major faults the model charged this token (measured, or F_0 + χ × evicted MiB)
  std::uint64_t demanded_bytes = 0, speculative_bytes = 0;
  std::uint32_t demanded_reads = 0, speculative_reads = 0, speculative_cancelled = 0;
  std::uint32_t hits = 0, lookups = 0, evictions = 0;
};

/// Runs the equations over decode loads in execution order (token by token,
/// layer by layer). Feed it `on_load` for every decode load and, after each,
/// `admit` for every speculative read issued after it; or hand `observer()`
/// to replay_dynamic, which does exactly that.
class timing_simulator {
 public:
  /// Throws `error` on invalid params.
  timing_simulator(const model_shape& shape, timing_params params)
      : params_(std::move(params)), n_moe_(static_cast<double>(shape.n_moe_layers())) {
    params_.validate();
  }

  /// Major faults measured per decode token (token index → faults), in place
  /// of the model's F_0 + χ × evicted MiB, for the tokens it covers: what a
  /// calibration charges the recorded tokens (their `majflt`). Each token's
  /// faults are spread evenly over its MoE layers. NaN entries: the model's.
  void set_measured_faults(std::vector<double> faults) { measured_faults_ = std::move(faults); }

  /// Equations (1)-(6) and (8) for one decode load; opens its speculation window (7).
  void on_load(const load_event& e) {
    if (tokens_.empty() || e.token != token_) {
      tokens_.emplace_back();
      token_ = e.token;
    }
    token_timing& t = tokens_.back();
    const timing_params& p = params_;
    const double executed = static_cast<double>(e.routed - e.dropped);
    // e_l / k_c, or e_l / r_l without a reference top-k (the model before the top-k lever).
    const double share = p.compute_top_k ? executed / static_cast<double>(p.compute_top_k)
                         : e.routed      ? executed / static_cast<double>(e.routed)
                                         : 1.0;
    const double read_mib = to_mib(e.demanded_bytes) + to_mib(e.speculative_inserted_bytes);
    const double contention = p.compute_ms_per_read_mib * read_mib;
    const double matmul =
        p.compute_ms_per_token / n_moe_ * ((1.0 - p.expert_compute_share) + p.expert_compute_share * share) +
        contention;
    const double evicted_mib = static_cast<double>(e.evictions) * to_mib(e.expert_bytes);
    const bool measured = e.token < measured_faults_.size() && measured_faults_[e.token] == measured_faults_[e.token];
    const double faults = measured ? measured_faults_[e.token] / n_moe_
                                   : p.faults_per_token / n_moe_ + p.faults_per_evicted_mib * evicted_mib;
    const double fault_ms = p.compute_ms_per_fault * faults;
    const double c = matmul + fault_ms;
    const double wait = std::max(0.0, spec_end_ - now_);
    const double demanded = p.read_ms(e.misses, e.expert_bytes);
    const double own =
        p.read_cpu_ms_per_mib * to_mib(e.demanded_bytes) + p.mgmt_ms_per_pin * static_cast<double>(e.pinned);
    // The reads hide behind the matmuls, not behind a fault's wait in the kernel (5);
    // pipelined, also behind the making-resident of the reads earlier waves completed (5').
    const double ahead = p.overlap * matmul + p.kernel_overlap * own;
    const double stall = p.pipelined_mgmt && e.misses > 1 ? pipelined_stall(p, e.misses, e.expert_bytes, wait, ahead)
                                                          : std::max(0.0, wait + demanded - ahead);
    const double mgmt = p.mgmt_ms_per_read * static_cast<double>(e.misses + e.speculative_inserted) +
                        p.mgmt_ms_per_eviction * static_cast<double>(e.evictions) +
                        p.read_cpu_ms_per_mib * (to_mib(e.demanded_bytes) + to_mib(e.speculative_inserted_bytes)) +
                        p.mgmt_ms_per_request * static_cast<double>(e.requested) +
                        p.mgmt_ms_per_pin * static_cast<double>(e.pinned) +
                        p.mgmt_ms_per_lookup * static_cast<double>(e.hits + e.misses);
    const double layer = c + mgmt + stall;
    t.compute_ms += c;
    t.fault_ms += fault_ms;
    t.contention_ms += contention;
    t.faults += faults;
    t.stall_ms += stall;
    t.wait_ms += std::min(wait, stall);
    t.mgmt_ms += mgmt;
    t.wall_ms += layer;
    t.io_ms += p.read_io_ms(e.misses, e.expert_bytes);
    t.demanded_bytes += e.demanded_bytes;
    t.demanded_reads += e.misses;
    t.hits += e.hits;
    t.lookups += static_cast<std::uint32_t>(e.hits + e.misses);
    t.evictions += e.evictions;
    cursor_ = now_ + wait + demanded;
    now_ += layer;
    window_end_ = now_;
    wave_reads_ = 0;
  }

  /// Equation (7): true when a speculative read of `bytes` issued after the
  /// last load starts before that layer ends (it then completes), false when
  /// it is cancelled at the next demanded load. Its q requests (q =
  /// requests_per_read) fill the waves of `lanes` requests one by one; the
  /// first decides, a started read is never cut.
  bool admit(layer_id, std::uint64_t bytes) {
    if (tokens_.empty()) return false;
    token_timing& t = tokens_.back();
    for (std::size_t r = 0; r < params_.requests_per_read; ++r) {
      if (wave_reads_ == 0 || wave_reads_ == params_.lanes) {
        if (wave_reads_) cursor_ = wave_start_ + params_.wave_ms(wave_reads_, bytes);
        if (r == 0 && !(cursor_ < window_end_)) {
          ++t.speculative_cancelled;
          return false;
        }
        wave_start_ = cursor_;
        wave_reads_ = 0;
      }
      ++wave_reads_;
      spec_end_ = wave_start_ + params_.wave_ms(wave_reads_, bytes);
      // The wave's summed I/O time grows from (m−1)·w(m−1) to m·w(m).
      const auto m = static_cast<double>(wave_reads_);
      t.io_ms += m * params_.wave_ms(wave_reads_, bytes) - (m - 1) * params_.wave_ms(wave_reads_ - 1, bytes);
    }
    t.speculative_bytes += bytes;
    ++t.speculative_reads;
    return true;
  }

  /// Equation (5'): the engine thread's idle time at a load of d demanded
  /// reads whose waves (2)-(3) start after `wait`, when it first does `ahead`
  /// ms of its own work and then makes each read resident (μ_r + κ × its MiB)
  /// as soon as the wave holding its last request ends. With every read
  /// ending in the last wave it is (5)'s max(0, wait + T − ahead).
  static double pipelined_stall(const timing_params& p, std::size_t d, std::uint64_t bytes, double wait, double ahead) {
    const std::size_t q = p.requests_per_read, n = p.lanes, r = d * q;
    const double per_read = p.mgmt_ms_per_read + p.read_cpu_ms_per_mib * to_mib(bytes);
    double end = wait, free = ahead, idle = 0;
    std::size_t done = 0;  // reads whose last request has ended
    for (std::size_t first = 0; first < r; first += n) {
      const std::size_t m = std::min(n, r - first);
      end += p.wave_ms(m, bytes);
      const std::size_t now_done = (first + m) / q;  // reads wholly in waves so far
      if (free < end) idle += end - free, free = end;
      free += static_cast<double>(now_done - done) * per_read;
      done = now_done;
    }
    return idle;
  }

  /// The hooks for replay_dynamic (they refer to this simulator: keep it alive).
  replay_observer observer() {
    replay_observer o;
    o.on_load = [this](const load_event& e) { on_load(e); };
    o.admit = [this](layer_id l, std::uint64_t b) { return admit(l, b); };
    return o;
  }

  const std::vector<token_timing>& tokens() const noexcept { return tokens_; }
  const timing_params& params() const noexcept { return params_; }

 private:
  timing_params params_;
  double n_moe_ = 1;
  std::vector<token_timing> tokens_;
  std::vector<double> measured_faults_;
  std::uint32_t token_ = 0;
  double now_ = 0;         // model clock, ms
  double cursor_ = 0;      // when the device is free for the next speculative wave
  double window_end_ = 0;  // the last load's layer end
  double wave_start_ = 0;
  double spec_end_ = 0;  // when the last started speculative wave finishes
  std::size_t wave_reads_ = 0;
};

/// Replays the loads of a finished replay through the model (no speculation
/// admitted: for replays without it, whose loads do not depend on timing).
/// `measured_faults`: timing_simulator::set_measured_faults.
inline std::vector<token_timing> simulate_timing(const model_shape& shape, const timing_params& p,
                                                 const std::vector<load_event>& loads,
                                                 std::vector<double> measured_faults = {}) {
  timing_simulator sim(shape, p);
  sim.set_measured_faults(std::move(measured_faults));
  for (const load_event& e : loads) sim.on_load(e);
  return sim.tokens();
}

/// Per-configuration figures: decode means per token.
struct timing_summary {
  std::size_t tokens = 0;
  double s_per_token = 0, tok_per_s = 0;
  double stall_ms_per_token = 0, mgmt_ms_per_token = 0, compute_ms_per_token = 0;
  double demanded_mib_per_token = 0, speculative_mib_per_token = 0;
  double speculative_cancelled_per_token = 0;
  double hit_pct = 0;  ///< decode lookups that hit, %
  /// Of compute_ms_per_token: the major faults' and the reads' contention (1); faults charged per token.
  double fault_ms_per_token = 0, contention_ms_per_token = 0, faults_per_token = 0;
  double io_ms_per_token = 0;  ///< read durations summed over lanes (the engine's io_ms)
};

/// The means of `ts`, token t weighted by weights[t] (a campaign's mix of
/// tokens: timing/pairing.hpp's token_weights); every token alike when
/// `weights` is empty or all zero. Throws `error` when `weights` is neither
/// empty nor as long as `ts`, or holds a negative or non-finite weight.
inline timing_summary summarize_timing(const std::vector<token_timing>& ts, const std::vector<double>& weights) {
  if (!weights.empty() && weights.size() != ts.size())
    throw error("summarize_timing: " + std::to_string(weights.size()) + " weights for " + std::to_string(ts.size()) +
                " tokens; expected one per token, or none");
  double sum_w = 0;
  for (double w : weights) {
    if (!(w >= 0) || !std::isfinite(w))
      throw error("summarize_timing: weight " + std::to_string(w) + "; expected finite weights >= 0");
    sum_w += w;
  }
  const bool even = !(sum_w > 0);
  timing_summary s;
  s.tokens = ts.size();
  if (ts.empty()) return s;
  double wall = 0, stall = 0, mgmt = 0, comp = 0, dem = 0, spec = 0, canc = 0, hits = 0, looks = 0;
  double fault = 0, cont = 0, faults = 0, io = 0, n = 0;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const token_timing& t = ts[i];
    const double w = even ? 1.0 : weights[i];
    n += w;
    fault += w * t.fault_ms;
    cont += w * t.contention_ms;
    faults += w * t.faults;
    io += w * t.io_ms;
    wall += w * t.wall_ms;
    stall += w * t.stall_ms;
    mgmt += w * t.mgmt_ms;
    comp += w * t.compute_ms;
    dem += w * to_mib(t.demanded_bytes);
    spec += w * to_mib(t.speculative_bytes);
    canc += w * t.speculative_cancelled;
    hits += w * t.hits;
    looks += w * t.lookups;
  }
  s.s_per_token = wall / n / 1000.0;
  s.tok_per_s = wall > 0 ? 1000.0 * n / wall : 0.0;
  s.stall_ms_per_token = stall / n;
  s.mgmt_ms_per_token = mgmt / n;
  s.compute_ms_per_token = comp / n;
  s.demanded_mib_per_token = dem / n;
  s.speculative_mib_per_token = spec / n;
  s.speculative_cancelled_per_token = canc / n;
  s.hit_pct = looks > 0 ? 100.0 * hits / looks : 0.0;
  s.fault_ms_per_token = fault / n;
  s.contention_ms_per_token = cont / n;
  s.faults_per_token = faults / n;
  s.io_ms_per_token = io / n;
  return s;
}

/// The means of `ts`, every token alike.
inline timing_summary summarize_timing(const std::vector<token_timing>& ts) { return summarize_timing(ts, {}); }

/// A configuration's replay and its predicted timing.
struct timed_replay {
  dynamic_replay_result replay;
  std::vector<token_timing> tokens;
  timing_summary summary;
};

/// Runs one dynamic replay with the timing model deciding, read by read, which
/// speculative reads complete (7). Throws like replay_dynamic and timing_params::validate.
inline timed_replay predict_timing(const routed_replay_input& in, const dynamic_replay_options& o,
                                   const timing_params& p) {
  timing_simulator sim(in.shape(), p);
  timed_replay out;
  out.replay = replay_dynamic(in, o, sim.observer());
  out.tokens = sim.tokens();
  out.summary = summarize_timing(out.tokens);
  return out;
}

}  // namespace moe_residency
