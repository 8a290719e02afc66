#pragma once
/// timing/fault_line.hpp: the fault count of equation (1), f = F_0 + χ × V
/// (timing/params.hpp's faults_per_token and faults_per_evicted_mib), fitted
/// to the major faults recorded tokens took (`majflt`) against the MiB the
/// replay evicted at them: what the calibration (timing/calibrate.hpp)
/// charges tokens whose faults were not measured. Standard library only.

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/replay/dynamic.hpp"

namespace moe_residency {

namespace detail {

/// Each token's evicted MiB in `loads` (token index → MiB), `tokens` long.
inline std::vector<double> evicted_mib_per_token(const std::vector<load_event>& loads, std::size_t tokens) {
  std::vector<double> v(tokens, 0.0);
  for (const load_event& e : loads)
    if (e.token < tokens) v[e.token] += static_cast<double>(e.evictions) * to_mib(e.expert_bytes);
  return v;
}

/// Least squares of y = F_0 + χ × x over the pairs, both >= 0 (a bound
/// holds the other at its own optimum). {0, 0} without pairs.
inline std::pair<double, double> fit_faults_line(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = static_cast<double>(x.size());
  if (x.empty()) return {0.0, 0.0};
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) sx += x[i], sy += y[i], sxx += x[i] * x[i], sxy += x[i] * y[i];
  const double det = n * sxx - sx * sx;
  double chi = det > 0 ? (n * sxy - sx * sy) / det : 0.0;
  double f0 = (sy - chi * sx) / n;
  if (chi < 0) chi = 0, f0 = sy / n;
  if (f0 < 0) f0 = 0, chi = sxx > 0 ? std::max(0.0, sxy / sxx) : 0.0;
  return {f0, chi};
}

}  // namespace detail

}  // namespace moe_residency
