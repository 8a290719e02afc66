#pragma once
/// timing/params.hpp: the timing model's parameters (timing.hpp's symbols:
/// n, q, B, λ, β, C, σ, k_c, ω, μ_r, μ_e, κ, ν_q, ν_p, ν_l, ψ, β_f, φ, F_0, χ, ρ),
/// their ranges, and the read times they give, equations (2) and (3). The parameters file is
/// timing/config.hpp; the per-token model that uses them, timing/model.hpp.
/// Standard library only.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>

#include "moe_residency/core.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/timing/storage_curve.hpp"

namespace moe_residency {

/// The device and model parameters of the timing model (see the equations at
/// the top of timing.hpp). All times in ms.
struct timing_params {
  std::size_t lanes = 2;              ///< n: concurrent read lanes (2 saturate phone flash)
  storage_curve curve;                ///< B(m): aggregate MiB/s against concurrent reads
  double read_latency_ms = 0.0;       ///< λ: fixed cost of each wave of reads
  double bandwidth_scale = 1.0;       ///< β: share of the curve's bandwidth the device delivers during decode
  double compute_ms_per_token = 100;  ///< C: compute of one decode token (all layers)
  double expert_compute_share = 0.5;  ///< σ: share of a layer's compute that scales with experts executed
  double overlap = 1.0;               ///< ω: share of a layer's compute demanded reads hide behind, [0, 1]
  double mgmt_ms_per_read = 0.0;      ///< μ_r: cache management per expert made resident
  double mgmt_ms_per_eviction = 0.0;  ///< μ_e: cache management per eviction
  double read_cpu_ms_per_mib = 0.0;   ///< κ: the engine thread's CPU per MiB read (page-cache work), serial
  double mgmt_ms_per_request = 0.0;   ///< ν_q: the manager's cost per expert it requests, resident or not
  double mgmt_ms_per_pin = 0.0;       ///< ν_p: the manager's cost per pinned-cache miss (lock and eviction)
  double kernel_overlap = 0.0;        ///< ψ: share of the κ and ν_p work the demanded reads hide behind, [0, 1]
  /// β_f: β for the memory lab's fault-driven configurations (moe_residency_lab/lab.hpp),
  /// whose page faults read through the kernel's read-around, not the
  /// manager's lanes; predict_lab uses it in place of β there. 0: tied, the
  /// same as β. Unused by simulate_timing itself.
  double fault_bandwidth_scale = 0.0;
  /// q: requests one expert read is split into on the lanes, each of b/q
  /// bytes. The phone's engine reads an expert's gate, up and down tensors
  /// separately (its read_bytes exceed the replay's by 3 pages a read:
  /// tests/test_timing.cpp): 3 there. 1: one request an expert.
  std::size_t requests_per_read = 1;
  /// k_c: the top-k at which C was measured; a layer's expert compute scales
  /// with e_l / k_c (1). 0: with e_l / r_l, the experts executed of those routed
  /// (the top-k does not change compute: the model before the top-k lever).
  std::size_t compute_top_k = 0;
  /// The engine thread makes each demanded read resident (μ_r + κ × its MiB)
  /// as soon as its last request ends, while the layer's later waves still
  /// read, so that work hides behind them (equation 5'). false: after the
  /// layer's last wave, behind nothing (5).
  bool pipelined_mgmt = false;
  double mgmt_ms_per_lookup = 0.0;       ///< ν_l: management per unique lookup, hit or miss (the cache's own lookup)
  double compute_ms_per_fault = 0.0;     ///< φ: compute stretched by one major page fault (a synchronous page read)
  double faults_per_token = 0.0;         ///< F_0: major faults a token takes whatever the cache does (memory pressure)
  double faults_per_evicted_mib = 0.0;   ///< χ: major faults per MiB the cache evicts (churn re-read as faults)
  double compute_ms_per_read_mib = 0.0;  ///< ρ: compute stretched per MiB read (the lanes and their DMA compete)
  /// The verdict's noise band, % of the baseline's time: a predicted ratio
  /// within 1 ± noise_pct/100 is "within noise" (timing/verdict.hpp). 0: not
  /// measured (the verdict then needs a band given).
  double noise_pct = 0.0;
  /// β_f as predict_lab applies it: fault_bandwidth_scale, or β when tied.
  double fault_scale() const noexcept { return fault_bandwidth_scale > 0 ? fault_bandwidth_scale : bandwidth_scale; }

  /// Throws `error` naming the field and value when one is out of range.
  void validate() const {
    auto bad = [](const char* name, double v, const char* want) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%g", v);
      throw error(std::string("timing_params: ") + name + " = " + buf + "; expected " + want);
    };
    if (lanes < 1 || lanes > 64) bad("lanes", static_cast<double>(lanes), "1 to 64");
    if (!(read_latency_ms >= 0) || !std::isfinite(read_latency_ms))
      bad("read_latency_ms", read_latency_ms, "a finite value >= 0");
    if (!(bandwidth_scale > 0 && bandwidth_scale <= 4)) bad("bandwidth_scale", bandwidth_scale, "a factor in (0, 4]");
    if (!(fault_bandwidth_scale == 0 || (fault_bandwidth_scale > 0 && fault_bandwidth_scale <= 4)))
      bad("fault_bandwidth_scale", fault_bandwidth_scale, "a factor in (0, 4], or 0 for the same as bandwidth_scale");
    if (!(compute_ms_per_token >= 0) || !std::isfinite(compute_ms_per_token))
      bad("compute_ms_per_token", compute_ms_per_token, "a finite value >= 0");
    if (!(expert_compute_share >= 0 && expert_compute_share <= 1))
      bad("expert_compute_share", expert_compute_share, "a share in [0, 1]");
    if (!(overlap >= 0 && overlap <= 1)) bad("overlap", overlap, "a share in [0, 1]");
    if (!(kernel_overlap >= 0 && kernel_overlap <= 1)) bad("kernel_overlap", kernel_overlap, "a share in [0, 1]");
    if (!(mgmt_ms_per_read >= 0) || !std::isfinite(mgmt_ms_per_read))
      bad("mgmt_ms_per_read", mgmt_ms_per_read, "a finite value >= 0");
    if (!(mgmt_ms_per_eviction >= 0) || !std::isfinite(mgmt_ms_per_eviction))
      bad("mgmt_ms_per_eviction", mgmt_ms_per_eviction, "a finite value >= 0");
    if (!(read_cpu_ms_per_mib >= 0) || !std::isfinite(read_cpu_ms_per_mib))
      bad("read_cpu_ms_per_mib", read_cpu_ms_per_mib, "a finite value >= 0");
    if (!(mgmt_ms_per_request >= 0) || !std::isfinite(mgmt_ms_per_request))
      bad("mgmt_ms_per_request", mgmt_ms_per_request, "a finite value >= 0");
    if (!(mgmt_ms_per_pin >= 0) || !std::isfinite(mgmt_ms_per_pin))
      bad("mgmt_ms_per_pin", mgmt_ms_per_pin, "a finite value >= 0");
    if (requests_per_read < 1 || requests_per_read > 16)
      bad("requests_per_read", static_cast<double>(requests_per_read), "1 to 16");
    if (compute_top_k > 256) bad("compute_top_k", static_cast<double>(compute_top_k), "0 (the routed count) to 256");
    const std::pair<const char*, double> non_negative[] = {{"mgmt_ms_per_lookup", mgmt_ms_per_lookup},
                                                           {"compute_ms_per_fault", compute_ms_per_fault},
                                                           {"faults_per_token", faults_per_token},
                                                           {"faults_per_evicted_mib", faults_per_evicted_mib},
                                                           {"compute_ms_per_read_mib", compute_ms_per_read_mib},
                                                           {"noise_pct", noise_pct}};
    for (const auto& [name, v] : non_negative)
      if (!(v >= 0) || !std::isfinite(v)) bad(name, v, "a finite value >= 0");
  }

  /// Duration of one wave of m concurrent requests, each 1/q of an expert of
  /// `bytes`, equation (2).
  double wave_ms(std::size_t m, std::uint64_t bytes) const noexcept {
    if (m == 0) return 0.0;
    return read_latency_ms + 1000.0 * to_mib(bytes) / static_cast<double>(requests_per_read) * static_cast<double>(m) /
                                 (bandwidth_scale * curve.mib_per_s(static_cast<double>(m)));
  }
  /// Duration of d reads of `bytes` each (q × d requests) on `lanes` lanes, equation (3).
  double read_ms(std::size_t d, std::uint64_t bytes) const noexcept {
    if (d == 0) return 0.0;
    const std::size_t r = d * requests_per_read;
    const std::size_t full = (r - 1) / lanes;  // ⌈R/n⌉ − 1 full waves before the last one
    // No full wave: 0, not 0 × an infinite wave (NaN) when the bandwidth underflows.
    return (full ? static_cast<double>(full) * wave_ms(lanes, bytes) : 0.0) + wave_ms(r - full * lanes, bytes);
  }
  /// I/O time of those d reads: each request's duration summed (the engine's io_ms).
  double read_io_ms(std::size_t d, std::uint64_t bytes) const noexcept {
    if (d == 0) return 0.0;
    const std::size_t r = d * requests_per_read;
    const std::size_t full = (r - 1) / lanes, last = r - full * lanes;
    return (full ? static_cast<double>(full * lanes) * wave_ms(lanes, bytes) : 0.0) +
           static_cast<double>(last) * wave_ms(last, bytes);
  }
};

}  // namespace moe_residency
