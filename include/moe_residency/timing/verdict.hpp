#pragma once
/// timing/verdict.hpp: what an engine developer asks of a what-if — will this
/// configuration be faster or slower than the one I have, and is the
/// difference larger than the noise? The ratio is a configuration's mean
/// token time over the baseline's (> 1: slower); the verdict is `slower` when
/// the ratio exceeds 1 + band, `faster` below 1 − band, else `within noise`.
///
/// The band a calibration measures (noise_pct in the device config) is the
/// run-to-run noise of a mean token time, estimated from the calibration
/// runs themselves: twice the standard error of a run's mean token time by
/// batch means — the run cut into blocks of 16 consecutive tokens (neighbours
/// share cache and thermal state, so single tokens are not independent), the
/// spread of the block means over √blocks — the largest over the runs. It says
/// how far two runs of one configuration could differ by chance, not how far
/// the model is off: the model's own error is what calibrate's held-out
/// scores and the A/B table report. Standard library only.

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "moe_residency/error.hpp"

namespace moe_residency {

enum class timing_verdict { faster, slower, within_noise };

inline const char* to_string(timing_verdict v) noexcept {
  return v == timing_verdict::faster ? "faster" : v == timing_verdict::slower ? "slower" : "within noise";
}

/// A configuration against a baseline.
struct ratio_verdict {
  double ratio = 1;      ///< time / baseline time (> 1: slower)
  double noise_pct = 0;  ///< the band assumed, % of the baseline's time
  timing_verdict verdict = timing_verdict::within_noise;
};

/// Throws `error` when a time is not finite and > 0 or the band is not finite and >= 0.
inline ratio_verdict judge_ratio(double time_ms, double baseline_ms, double noise_pct) {
  if (!(time_ms > 0) || !std::isfinite(time_ms) || !(baseline_ms > 0) || !std::isfinite(baseline_ms))
    throw error("verdict: token times " + std::to_string(time_ms) + " and " + std::to_string(baseline_ms) +
                " ms (configuration, baseline); expected finite times > 0");
  if (!(noise_pct >= 0) || !std::isfinite(noise_pct))
    throw error("verdict: noise band " + std::to_string(noise_pct) + "%; expected a finite value >= 0");
  ratio_verdict r;
  r.ratio = time_ms / baseline_ms;
  r.noise_pct = noise_pct;
  r.verdict = r.ratio > 1 + noise_pct / 100   ? timing_verdict::slower
              : r.ratio < 1 - noise_pct / 100 ? timing_verdict::faster
                                              : timing_verdict::within_noise;
  return r;
}

/// Twice the standard error of the mean of `wall_ms`, % of the mean, by
/// batch means over blocks of `block` consecutive tokens (a last partial
/// block dropped). NaN with fewer than two whole blocks.
inline double run_noise_pct(const std::vector<double>& wall_ms, std::size_t block = 16) {
  if (block == 0 || wall_ms.size() < 2 * block) return std::nan("");
  const std::size_t blocks = wall_ms.size() / block;
  std::vector<double> means(blocks, 0.0);
  double all = 0;
  for (std::size_t b = 0; b < blocks; ++b) {
    for (std::size_t i = 0; i < block; ++i) means[b] += wall_ms[b * block + i];
    means[b] /= static_cast<double>(block);
    all += means[b];
  }
  all /= static_cast<double>(blocks);
  double var = 0;
  for (double m : means) var += (m - all) * (m - all);
  var /= static_cast<double>(blocks - 1);
  return all > 0 ? 200.0 * std::sqrt(var / static_cast<double>(blocks)) / all : std::nan("");
}

}  // namespace moe_residency
