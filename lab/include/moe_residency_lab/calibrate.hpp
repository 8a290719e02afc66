#pragma once
/// Calibrating the timing model on one memory-lab run (moe_residency_lab/lab.hpp) the
/// way this machine's measurements allow (docs/lab-predict.md, "Calibration"). Three things differ from the phone's calibration
/// (timing/calibrate.hpp), each because of what the lab measures:
///
/// - **The eval thread's CPU is split in two, and each half is fitted.** The
///   probe records the eval thread's CPU time (cpu_ms) and its part in the
///   kernel (sys_ms). Under a memory limit the kernel part is the work for
///   the pages read — allocation and reclaim in the cgroup, page-cache
///   insertion, readahead submission: on quiet cores 0.6–0.8 ms per MiB
///   read in the fault-driven cells, 0.9–1.5 in the manager's, ~0 in the
///   resident run. So user time is the model's compute (C, fitted to
///   predicted compute − (cpu_ms − sys_ms)) and sys_ms the model's κ term
///   (read_cpu_ms_per_mib, fitted to predicted management − sys_ms; μ_r and
///   μ_e stay 0). κ is paid for every MiB read, speculative reads too: on
///   the lab's two cores the eval thread's kernel time per MiB is the same
///   with speculation (`all`) as without (`exact`), so only the time off
///   the CPU is what a speculative read can hide.
/// - **The probe's stall is not fitted.** It is wall − cpu_ms, the time off
///   the CPU; the model's stall is the reads, which the κ term does not
///   include. The wall is fitted, and what it has beyond C and κ × MiB is
///   the reads' device time: the bandwidth scale β, since the lanes curve is
///   measured with cold random O_DIRECT reads of 4 MiB while the engine reads through
///   the page cache in larger requests.
/// - **Nothing overlaps the demanded reads by default** (ω = 0): in every lab
///   configuration the eval thread waits for a layer's demanded reads (the
///   lanes, or its own page faults) before that layer's expert matmuls.
///
/// The manager's own cost per request and per pin (lab_setup's request_ms and
/// pin_ms, measured with every expert resident) is not fitted: it is in the
/// model's management, and its part outside the kernel is added to the
/// kernel-time target, so κ is what the reads cost; its part in the eval
/// thread's user time (request_user_ms, pin_user_ms) is taken off the compute
/// target, so C is the engine's compute alone. A pin made on the lanes (`all`,
/// `degraded`: lab_mapping::pins_on_lanes) costs the eval thread ν_p / lanes
/// of wall and none of its kernel time.
///
/// - **The fault path has its own bandwidth scale.** β is what the device
///   delivers to the manager's lanes (`MADV_POPULATE_READ` of an expert's
///   slices, two at a time); the fault-driven configurations read 16 MiB
///   read-around windows one fault at a time, and their time off the CPU per
///   MiB need not be β's: on one VM it was about the cold curve's, on another
///   about β's (the run history docs/lab-predict.md links, "The fault path's own bandwidth").
///   By default the two are tied (`start.fault_bandwidth_scale` 0): one β,
///   fitted on whichever cell calibrates. Untied (β_f > 0 in `start`), a
///   fault cell fits β_f and keeps `start`'s β, and any other cell fits β and
///   keeps `start`'s β_f (1: the curve's top as measured).
///
/// - **A cell measured more than once is fitted whole.** `m` may hold k ≥ 2
///   runs of the same cell one after the other (append_token_metrics): k
///   times the replay's decode tokens. The replay's loads are then repeated
///   k times, token t of run j paired with row j·n + t, so that one fit sees
///   every repeat and no single run's drift decides the parameters.
///
/// The default free parameters are C, β (or β_f) and κ. Metrics without cpu_ms and
/// sys_ms (a probe older than its sys_ms column) fit C and β on the wall
/// alone, κ staying 0 and β absorbing the kernel's time: tokens that read
/// more or fewer bytes then separate C from β, and a run whose tokens all read
/// about the same bytes cannot (its fit ends on a bound: params_on_bound).
///
/// Includes Eigen through timing/calibrate.hpp.

#include "moe_residency/timing/calibrate.hpp"
#include "moe_residency_lab/lab.hpp"

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace moe_residency::lab {

inline constexpr unsigned lab_default_free = static_cast<unsigned>(timing_param::compute_ms_per_token) |
                                             static_cast<unsigned>(timing_param::bandwidth_scale) |
                                             static_cast<unsigned>(timing_param::read_cpu_ms_per_mib);

/// Fits `free` (a mask of timing_param) on every decode token of one lab run
/// of configuration `c` whose per-token metrics are `m`, from the start
/// parameters `start` (its curve is the device's; its overlap is kept unless
/// fitted — pass 0, see above). read_cpu_ms_per_mib is fitted only when `m`
/// records cpu_ms and sys_ms. `m` may also be k whole runs of the cell
/// appended (see above). The result's curve and lanes are `start`'s.
/// Throws like predict_lab and calibrate_timing, when nothing is left free,
/// and when `m`'s rows are not a whole number of runs.
inline calibration_result calibrate_lab(const route_trace& trace, lab_config c, const lab_setup& s, token_metrics m,
                                        timing_params start, unsigned free = lab_default_free) {
  const timing_params given = start;
  lab_prediction fp = predict_lab(trace, c, s, start);
  const std::size_t n = fp.tokens.size();
  if (n > 0 && m.size() > n && m.size() % n == 0) {  // k runs of the cell, one after the other
    const std::size_t k = m.size() / n;
    std::vector<load_event> all;
    all.reserve(fp.loads.size() * k);
    for (std::size_t j = 0; j < k; ++j)
      for (load_event e : fp.loads) {
        e.token += static_cast<std::uint32_t>(j * n);
        all.push_back(e);
      }
    fp.loads = std::move(all);
  } else if (n > 0 && m.size() != n) {
    throw error("calibrate_lab: the metrics have " + std::to_string(m.size()) + " decode rows but the replay has " +
                std::to_string(n) + " decode tokens; expected one row per decode token of the run, or of each of " +
                "several runs of the same cell appended");
  }
  start.lanes = fp.mapping.lanes;
  start.mgmt_ms_per_request = s.request_ms;  // measured, not fitted (lab_setup)
  start.mgmt_ms_per_pin = fp.mapping.pin_ms(s);
  start.kernel_overlap = fp.mapping.reads_inline ? 1.0 : 0.0;  // as predict_lab maps it
  if (fp.mapping.kind == lab_model_kind::faults) {
    // predict_lab replays faults at the curve's top bandwidth, one at a time.
    double top = 0;
    for (const auto& q : start.curve.points()) top = std::max(top, q.second);
    start.curve = storage_curve({{1.0, top}});
    start.bandwidth_scale = start.fault_scale();  // fitted as β_f when untied (see the header)
  }
  for (double& x : m.stall_ms) x = std::numeric_limits<double>::quiet_NaN();  // not the model's stall (see the header)
  calibration_options co;
  co.split = calibration_split::all;
  co.free = free;
  co.fit_io = false;
  // The eval thread's user time is the model's compute, its kernel time the
  // model's κ term (see the header).
  bool split = m.cpu_ms.size() == m.size() && m.sys_ms.size() == m.size();
  for (std::size_t t = 0; split && t < m.size(); ++t) split = std::isfinite(m.cpu_ms[t]) && std::isfinite(m.sys_ms[t]);
  if (split) {
    for (std::size_t t = 0; t < m.size(); ++t) {
      m.compute_ms[t] = std::max(0.0, m.cpu_ms[t] - m.sys_ms[t]);
      m.mgmt_ms[t] = m.sys_ms[t];
    }
    // The manager's measured cost (ν_q, ν_p) is management in the model but
    // only partly kernel time: its part off the eval thread's CPU (waiting for
    // a lane) and its part in the eval thread's user time join the management
    // target, so that κ is fitted to the kernel time the reads cost and
    // nothing else, and the user-time part leaves the compute target, so that
    // C is the engine's compute (what the resident run has) and the manager's
    // calls are not counted twice.
    for (const load_event& e : fp.loads)
      if (e.token < m.size()) {
        const double user = s.request_user_ms * e.requested + fp.mapping.pin_user_ms(s) * e.pinned;
        m.mgmt_ms[e.token] += std::max(0.0, s.request_ms - s.request_sys_ms - s.request_user_ms) * e.requested +
                              fp.mapping.pin_off_cpu_ms(s) * e.pinned + user;
        m.compute_ms[e.token] = std::max(0.0, m.compute_ms[e.token] - user);
      }
    co.fit_compute = true;
  } else {
    co.free &= ~static_cast<unsigned>(timing_param::read_cpu_ms_per_mib);  // nothing measures it
  }
  if (!co.free) throw error("calibrate_lab: no free parameter left (read_cpu_ms_per_mib needs the metrics' sys_ms)");
  calibration_result r = calibrate_timing(trace.shape(), fp.loads, m, start, co);
  r.params.curve = given.curve;  // the device's, for the other cells (predict_lab maps each)
  r.params.lanes = given.lanes;
  r.params.kernel_overlap = given.kernel_overlap;
  if (fp.mapping.kind == lab_model_kind::faults && given.fault_bandwidth_scale > 0) {
    r.params.fault_bandwidth_scale = r.params.bandwidth_scale;
    r.params.bandwidth_scale = given.bandwidth_scale;
    for (std::string& name : r.free)
      if (name == "bandwidth_scale") name = "fault_bandwidth_scale";
  }
  return r;
}

/// The fitted parameters that ended on a bound of their range (compute 0,
/// bandwidth scale 4, ...): the calibration cell did not determine them.
inline std::vector<std::string> params_on_bound(const calibration_result& r) {
  std::vector<std::string> out;
  for (const auto& p : detail::calib_params())
    for (const std::string& name : r.free)
      if (name == p.name && (r.params.*(p.field) <= p.lo || r.params.*(p.field) >= p.hi)) out.push_back(name);
  // β_f is fitted in β's place, within β's range (calibrate_lab on a fault cell).
  for (const auto& p : detail::calib_params())
    if (p.id == timing_param::bandwidth_scale)
      for (const std::string& name : r.free)
        if (name == "fault_bandwidth_scale" &&
            (r.params.fault_bandwidth_scale <= p.lo || r.params.fault_bandwidth_scale >= p.hi))
          out.push_back(name);
  return out;
}

}  // namespace moe_residency::lab
