#pragma once
/// The memory-lab manager's own cost (equation 6's ν_q and ν_p of timing.hpp),
/// measured before any limited cell runs, as the disk curve is: three runs
/// without a memory limit, the page cache warm, every expert resident, so
/// whatever they spend beyond the baseline is the manager's calls and lane
/// hand-offs, not reads (scripts/memlab.sh's resident-all, manager-exact and
/// manager-cache; the run history docs/lab-predict.md links, "The manager's own cost").
///
/// Standard library only.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "moe_residency/error.hpp"
#include "moe_residency/timing.hpp"
#include "moe_residency_lab/lab.hpp"
#include "moe_residency/trace/batches.hpp"

namespace moe_residency::lab {

/// What the manager costs a decode token when every expert it requests is
/// resident, from three runs without a memory limit, the page cache warm
/// (memlab's resident-all, manager-exact and manager-cache): the mean wall (and
/// kernel) time per token each manager run has beyond the baseline's
/// (resident-all: the observer on and the manager standing down, so the
/// observer's own cost, which every manager cell has and the calibrated
/// compute carries, is not counted twice), over the requests
/// and pins per token the trace gives (`exact` requests every routed expert;
/// the cache pins its misses at `cache_budget_mib`). Clamped at 0: a run no
/// slower than the baseline costs nothing measurable. Throws `error` when a run
/// has no decode token or the trace none.
///
/// The user-time part (request_user_ms, pin_user_ms) is the same difference of
/// the eval thread's cpu_ms − sys_ms, clamped to what the kernel part leaves of
/// the whole: 0 when the metrics do not record cpu_ms and sys_ms.
struct lab_manager_cost {
  double request_ms = 0, request_sys_ms = 0, pin_ms = 0, pin_sys_ms = 0;
  double request_user_ms = 0, pin_user_ms = 0;
  double requests_per_token = 0, pins_per_token = 0;
  double exact_extra_ms = 0, cache_extra_ms = 0;  ///< mean wall per token beyond the baseline's
};

inline lab_manager_cost measure_manager_cost(const route_trace& trace, const token_metrics& baseline,
                                             const token_metrics& exact, const token_metrics& cache,
                                             double cache_budget_mib) {
  const auto mean = [](const std::vector<double>& v, const char* what, const char* col) {
    if (v.empty()) throw error(std::string("manager cost: the ") + what + " run has no decode token with " + col);
    double sum = 0;
    for (double x : v) sum += std::isfinite(x) ? x : 0.0;
    return sum / static_cast<double>(v.size());
  };
  const auto sys = [&](const token_metrics& m, const char* what) {
    return m.sys_ms.size() == m.size() ? mean(m.sys_ms, what, "sys_ms") : 0.0;
  };
  // The eval thread's user time (cpu_ms − sys_ms); NaN when a run does not record both.
  const auto user = [&](const token_metrics& m, const char* what) {
    if (m.cpu_ms.size() != m.size() || m.sys_ms.size() != m.size()) return std::nan("");
    for (std::size_t t = 0; t < m.size(); ++t)
      if (!std::isfinite(m.cpu_ms[t]) || !std::isfinite(m.sys_ms[t])) return std::nan("");
    return mean(m.cpu_ms, what, "cpu_ms") - mean(m.sys_ms, what, "sys_ms");
  };
  const load_batches lb = group_load_batches(trace);
  double routed = 0;
  std::size_t tokens = 0;
  std::uint32_t last_step = 0;
  std::vector<std::uint8_t> seen(trace.header.n_expert, 0);
  for (const load_batch& b : lb.batches) {
    if (b.phase != run_phase::decode || !trace.shape().is_moe(b.layer)) continue;
    if (tokens == 0 || b.step != last_step) ++tokens;
    last_step = b.step;
    std::vector<std::size_t> uniq;
    for (expert_id e : lb.experts_of(b)) {
      if (to_index(e) >= seen.size() || seen[to_index(e)]) continue;
      seen[to_index(e)] = 1;
      uniq.push_back(to_index(e));
    }
    for (std::size_t e : uniq) seen[e] = 0;
    routed += static_cast<double>(uniq.size());
  }
  if (tokens == 0) throw error("manager cost: the route trace has no decode token");
  const double pins = static_cast<double>(pinned_misses(trace, cache_budget_mib).total());
  lab_manager_cost c;
  c.requests_per_token = routed / static_cast<double>(tokens);
  c.pins_per_token = pins / static_cast<double>(tokens);
  const double r_wall = mean(baseline.wall_ms, "resident-all", "wall_ms"), r_sys = sys(baseline, "resident-all");
  c.exact_extra_ms = mean(exact.wall_ms, "manager-exact", "wall_ms") - r_wall;
  c.cache_extra_ms = mean(cache.wall_ms, "manager-cache", "wall_ms") - r_wall;
  const auto per = [](double extra, double n) { return n > 0 ? std::max(0.0, extra) / n : 0.0; };
  c.request_ms = per(c.exact_extra_ms, c.requests_per_token);
  c.request_sys_ms = std::min(c.request_ms, per(sys(exact, "manager-exact") - r_sys, c.requests_per_token));
  c.pin_ms = per(c.cache_extra_ms, c.pins_per_token);
  c.pin_sys_ms = std::min(c.pin_ms, per(sys(cache, "manager-cache") - r_sys, c.pins_per_token));
  const double r_user = user(baseline, "resident-all");
  const auto user_part = [&](const token_metrics& m, const char* what, double n, double whole, double kernel) {
    const double u = user(m, what) - r_user;
    return std::isfinite(u) ? std::min(whole - kernel, per(u, n)) : 0.0;
  };
  c.request_user_ms = user_part(exact, "manager-exact", c.requests_per_token, c.request_ms, c.request_sys_ms);
  c.pin_user_ms = user_part(cache, "manager-cache", c.pins_per_token, c.pin_ms, c.pin_sys_ms);
  return c;
}

}  // namespace moe_residency::lab
