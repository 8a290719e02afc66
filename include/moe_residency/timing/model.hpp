#pragma once
/// timing/model.hpp: the per-token model, equations (1)–(8) of timing.hpp run
/// over a replay's decode loads: timing_simulator (which also decides, read by
/// read, which speculative reads complete), the per-token figures and their
/// means, and predict_timing, one dynamic replay timed. Standard library only.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/replay/dynamic.hpp"
#include "moe_residency/timing/params.hpp"

namespace moe_residency {

/// One decode token as the model predicts it.
struct token_timing {
  double wall_ms = 0, compute_ms = 0, stall_ms = 0, mgmt_ms = 0;
  double wait_ms = 0;  ///< of the stall, waiting for speculative reads in flight (4)
  double io_ms = 0;    ///< read durations summed over lanes, demanded and speculative
  std::uint64_t demanded_bytes = 0, speculative_bytes = 0;
  std::uint32_t demanded_reads = 0, speculative_reads = 0, speculative_cancelled = 0;
  std::uint32_t hits = 0, lookups = 0;
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

  /// Equations (1)-(6) and (8) for one decode load; opens its speculation window (7).
  void on_load(const load_event& e) {
    if (tokens_.empty() || e.token != token_) {
      tokens_.emplace_back();
      token_ = e.token;
    }
    token_timing& t = tokens_.back();
    const timing_params& p = params_;
    const double executed = e.routed ? static_cast<double>(e.routed - e.dropped) / static_cast<double>(e.routed) : 1.0;
    const double c =
        p.compute_ms_per_token / n_moe_ * ((1.0 - p.expert_compute_share) + p.expert_compute_share * executed);
    const double wait = std::max(0.0, spec_end_ - now_);
    const double demanded = p.read_ms(e.misses, e.expert_bytes);
    const double own =
        p.read_cpu_ms_per_mib * to_mib(e.demanded_bytes) + p.mgmt_ms_per_pin * static_cast<double>(e.pinned);
    const double stall = std::max(0.0, wait + demanded - p.overlap * c - p.kernel_overlap * own);
    const double mgmt = p.mgmt_ms_per_read * static_cast<double>(e.misses + e.speculative_inserted) +
                        p.mgmt_ms_per_eviction * static_cast<double>(e.evictions) +
                        p.read_cpu_ms_per_mib * (to_mib(e.demanded_bytes) + to_mib(e.speculative_inserted_bytes)) +
                        p.mgmt_ms_per_request * static_cast<double>(e.requested) +
                        p.mgmt_ms_per_pin * static_cast<double>(e.pinned);
    const double layer = c + mgmt + stall;
    t.compute_ms += c;
    t.stall_ms += stall;
    t.wait_ms += std::min(wait, stall);
    t.mgmt_ms += mgmt;
    t.wall_ms += layer;
    t.io_ms += p.read_io_ms(e.misses, e.expert_bytes);
    t.demanded_bytes += e.demanded_bytes;
    t.demanded_reads += e.misses;
    t.hits += e.hits;
    t.lookups += static_cast<std::uint32_t>(e.hits + e.misses);
    cursor_ = now_ + wait + demanded;
    now_ += layer;
    window_end_ = now_;
    wave_reads_ = 0;
  }

  /// Equation (7): true when a speculative read of `bytes` issued after the
  /// last load starts before that layer ends (it then completes), false when
  /// it is cancelled at the next demanded load.
  bool admit(layer_id, std::uint64_t bytes) {
    if (tokens_.empty()) return false;
    token_timing& t = tokens_.back();
    if (wave_reads_ == 0 || wave_reads_ == params_.lanes) {
      if (wave_reads_) cursor_ = wave_start_ + params_.wave_ms(wave_reads_, bytes);
      if (!(cursor_ < window_end_)) {
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
    t.speculative_bytes += bytes;
    ++t.speculative_reads;
    return true;
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
inline std::vector<token_timing> simulate_timing(const model_shape& shape, const timing_params& p,
                                                 const std::vector<load_event>& loads) {
  timing_simulator sim(shape, p);
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
};

inline timing_summary summarize_timing(const std::vector<token_timing>& ts) {
  timing_summary s;
  s.tokens = ts.size();
  if (ts.empty()) return s;
  double wall = 0, stall = 0, mgmt = 0, comp = 0, dem = 0, spec = 0, canc = 0, hits = 0, looks = 0;
  for (const auto& t : ts) {
    wall += t.wall_ms;
    stall += t.stall_ms;
    mgmt += t.mgmt_ms;
    comp += t.compute_ms;
    dem += to_mib(t.demanded_bytes);
    spec += to_mib(t.speculative_bytes);
    canc += t.speculative_cancelled;
    hits += t.hits;
    looks += t.lookups;
  }
  const double n = static_cast<double>(ts.size());
  s.s_per_token = wall / n / 1000.0;
  s.tok_per_s = wall > 0 ? 1000.0 * n / wall : 0.0;
  s.stall_ms_per_token = stall / n;
  s.mgmt_ms_per_token = mgmt / n;
  s.compute_ms_per_token = comp / n;
  s.demanded_mib_per_token = dem / n;
  s.speculative_mib_per_token = spec / n;
  s.speculative_cancelled_per_token = canc / n;
  s.hit_pct = looks > 0 ? 100.0 * hits / looks : 0.0;
  return s;
}

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
