#pragma once
/// Calibrating the timing model on one memory-lab run (timing/lab.hpp) the
/// way this machine's measurements allow (docs/wall-clock.md, "Against this
/// machine"). Two things differ from the phone's calibration
/// (timing/calibrate.hpp), each because of what the lab measures:
///
/// - **Only the wall time is fitted.** The probe records stall as wall − the
///   eval thread's CPU time. Under a memory limit that CPU time holds the
///   kernel's work for every page read — reclaim in the cgroup, page-cache
///   insertion, readahead submission — which grows with the bytes read
///   (in the quick lab on quiet cores: 0.6–1.5 ms of eval-thread CPU per MiB
///   read beyond the resident run's, whose CPU is its wall). The timing
///   model counts that work as reading, not compute, so the probe's stall
///   column is not the model's stall and fitting it would force the model's
///   reads to be as short as the device's idle time.
/// - **Nothing overlaps the demanded reads by default** (ω = 0): in every lab
///   configuration the eval thread waits for a layer's demanded reads (the
///   lanes, or its own page faults) before that layer's expert matmuls.
///
/// The default free parameters are the compute per token and the bandwidth
/// scale: the lanes curve is measured with O_DIRECT reads of 256 KiB, while
/// the engine reads through the page cache, whose deeper queues and per-MiB
/// kernel cost the scale absorbs (on this machine's quick lab the curve alone
/// makes exact@2.5's reads longer than its whole measured token). Tokens that
/// read more or fewer bytes separate the two; a run whose tokens all read
/// about the same bytes cannot, and its fit ends on a bound (params_on_bound).
///
/// Includes Eigen through timing/calibrate.hpp.

#include "moe_residency/timing/calibrate.hpp"
#include "moe_residency/timing/lab.hpp"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace moe_residency {

inline constexpr unsigned lab_default_free =
    static_cast<unsigned>(timing_param::compute_ms_per_token) | static_cast<unsigned>(timing_param::bandwidth_scale);

/// Fits `free` (a mask of timing_param) on every decode token of one lab run
/// of configuration `c` whose per-token metrics are `m`, from the start
/// parameters `start` (its curve is the device's; its overlap is kept unless
/// fitted — pass 0, see above). The result's curve and lanes are `start`'s.
/// Throws like predict_lab and calibrate_timing.
inline calibration_result calibrate_lab(const route_trace& trace, lab_config c, const lab_setup& s, token_metrics m,
                                        timing_params start, unsigned free = lab_default_free) {
  const timing_params given = start;
  const lab_prediction fp = predict_lab(trace, c, s, start);
  start.lanes = fp.mapping.lanes;
  if (fp.mapping.kind == lab_model_kind::faults) {
    // predict_lab replays faults at the curve's top bandwidth, one at a time.
    double top = 0;
    for (const auto& q : start.curve.points()) top = std::max(top, q.second);
    start.curve = storage_curve({{1.0, top}});
  }
  for (double& x : m.stall_ms) x = std::numeric_limits<double>::quiet_NaN();  // wall only (see the header)
  calibration_options co;
  co.split = calibration_split::all;
  co.free = free;
  co.fit_io = false;
  calibration_result r = calibrate_timing(trace.shape(), fp.loads, m, start, co);
  r.params.curve = given.curve;  // the device's, for the other cells (predict_lab maps each)
  r.params.lanes = given.lanes;
  return r;
}

/// The fitted parameters that ended on a bound of their range (compute 0,
/// bandwidth scale 4, ...): the calibration cell did not determine them.
inline std::vector<std::string> params_on_bound(const calibration_result& r) {
  std::vector<std::string> out;
  for (const auto& p : detail::calib_params())
    for (const std::string& name : r.free)
      if (name == p.name && (r.params.*(p.field) <= p.lo || r.params.*(p.field) >= p.hi)) out.push_back(name);
  return out;
}

}  // namespace moe_residency
