#pragma once
/// timing: the wall-clock model over a replay. Given what a dynamic replay did
/// per decode load (demanded misses, drops, speculative reads, evictions) and a
/// device/model description, it predicts each decode token's wall time.
/// Standard library only; the least-squares calibration is in
/// timing/calibrate.hpp (the one header that includes Eigen).
///
/// Units: milliseconds (ms), MiB = 1048576 bytes, MiB/s.
///
/// The model, per decode token, per MoE layer l in execution order (every
/// symbol is a `timing_params` field or a `load_event` count):
///
///   (1) compute      c_l   = C / L × ((1 − σ) + σ × e_l / r_l)
///                    C = compute_ms_per_token, L = MoE layers, σ = expert_compute_share,
///                    r_l = routed experts, e_l = r_l − dropped (experts executed).
///   (2) one wave     w(m)  = λ + 1000 × m × b / (β × B(m))
///                    m ≤ n concurrent reads of b MiB each (b = the layer's expert bytes),
///                    λ = read_latency_ms (paid once per wave), B(m) = curve bandwidth at m
///                    lanes (MiB/s, piecewise linear in m between measured points),
///                    β = bandwidth_scale (what the device delivers while the model computes,
///                    against the cold curve; the memory lab's page faults may have their
///                    own, β_f = fault_bandwidth_scale, or a measured time per MiB in
///                    place of the curve, κ and λ: lab_setup's fault walk, timing/lab.hpp).
///                    Its I/O time (the engine's io_ms: read durations summed over lanes)
///                    is m × w(m).
///   (3) demanded     T_l   = (⌈d/n⌉ − 1) × w(n) + w(d − (⌈d/n⌉ − 1) × n),   0 when d = 0
///                    d = the layer's demanded misses, n = lanes.
///   (4) wait         q_l   = max(0, S_prev − t_l)
///                    t_l = the layer's start; S_prev = when the speculative reads issued
///                    after the previous load finish (a started read is waited for; see 7).
///   (5) stall        s_l   = max(0, q_l + T_l − ω × c_l − ψ × (κ × D_l + ν_p × p_l))
///                    ω = overlap: the share of the layer's compute the demanded reads hide
///                    behind (the engine computes resident experts while misses load);
///                    ψ = kernel_overlap: the share of the engine thread's own work for
///                    these reads (6's κ and ν_p terms) that their device time hides behind
///                    — 0 when another thread reads them (the lanes) and the engine only
///                    waits; in the memory lab, 1 where the engine thread locks the misses
///                    itself (the kernel's readahead is in flight while it allocates and
///                    inserts the pages: timing/lab.hpp). Default 0.
///   (6) management   g_l   = μ_r × (d + i_l) + μ_e × v_l + κ × (D_l + I_l) + ν_q × a_l + ν_p × p_l
///                    μ_r = mgmt_ms_per_read, i_l = speculative reads made resident at this
///                    load, μ_e = mgmt_ms_per_eviction, v_l = evictions at this load,
///                    κ = read_cpu_ms_per_mib (the engine thread's CPU per MiB read: the
///                    kernel's page-cache work when reads go through it; 0 on the phone),
///                    D_l = the demanded reads' MiB, I_l = the MiB the i_l reads read
///                    (i_l × b in a replay; the pages a read found missing in the lab's
///                    fault model);
///                    ν_q = mgmt_ms_per_request, a_l = experts the engine's manager requests
///                    at this load whether resident or not (the lab's `exact` requests
///                    every routed expert, and each speculative read is one request);
///                    ν_p = mgmt_ms_per_pin, p_l = misses of a pinned cache the manager keeps
///                    inside the page cache (a lock, and its eviction's unlock) — both 0 in a
///                    replay, set by timing/lab.hpp, and measured with every expert resident.
///   (7) speculation  reads planned after layer l's demanded load start at
///                    t_l + q_l + T_l (the device is then free) and run in waves of up
///                    to n reads, each wave per (2), back to back, competing for the same
///                    bandwidth; a wave starts only before the layer ends (t_l + layer
///                    time): the reads that would start later are cancelled at the next
///                    demanded load (they never enter the cache); a started wave finishes,
///                    and what it runs past the layer's end is the next layer's wait (4).
///   (8) layer time   c_l + g_l + s_l;   token wall = Σ_l layer time.
///
/// Per token it reports wall, compute, stall (the wait included), management,
/// and the demanded and speculative bytes. docs/wall-clock.md has the
/// derivation, the calibration and what the model cannot see.
///
/// Why this header is long: every equation above is implemented once, below,
/// next to the comment that restates it, and the storage curve, the
/// parameters file and the per-token model share those symbols; the
/// calibration (Eigen) and the memory lab's mapping are their own headers.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/detail/files.hpp"
#include "moe_residency/detail/numbers.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/replay.hpp"

namespace moe_residency {

/// Aggregate random-read bandwidth of a storage device against concurrent
/// read lanes, from measured points; linear between points, flat beyond them.
class storage_curve {
 public:
  /// The phone of shared/traces/flash-lanes.csv (4 MiB random reads, cold).
  storage_curve()
      : points_{{1, 1809.9},  {2, 2459.8},  {4, 2457.9},  {8, 2420.0},
                {12, 2360.1}, {16, 2243.9}, {24, 2308.6}, {32, 2254.8}} {}
  /// Points (lanes, MiB/s): lanes >= 1 and strictly increasing, MiB/s finite
  /// and > 0. Throws `error` naming the point otherwise.
  explicit storage_curve(std::vector<std::pair<double, double>> points) : points_(std::move(points)) {
    if (points_.empty()) throw error("storage_curve: no points; expected (lanes, MiB/s) pairs");
    for (std::size_t i = 0; i < points_.size(); ++i) {
      const auto& p = points_[i];
      if (!(p.first >= 1) || !std::isfinite(p.first) || (i && !(p.first > points_[i - 1].first)))
        throw error("storage_curve: point " + std::to_string(i) + ": lanes " + fmt(p.first) +
                    "; expected lanes >= 1, strictly increasing");
      if (!(p.second > 0) || !std::isfinite(p.second))
        throw error("storage_curve: point " + std::to_string(i) + ": " + fmt(p.second) +
                    " MiB/s; expected a finite bandwidth > 0");
    }
  }

  /// Parses "1:1809.9,2:2459.8" (lanes:MiB/s, comma-separated).
  static storage_curve parse_list(const std::string& text) {
    std::vector<std::pair<double, double>> pts;
    std::stringstream ss(text);
    const std::string example = "; expected lanes:MiB/s pairs like 1:1809.9,2:2459.8";
    std::size_t start = 0;
    for (std::size_t i = 1;; ++i) {
      const std::size_t comma = text.find(',', start);
      const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      const std::string where = "storage_curve: point " + std::to_string(i) + " of '" + text + "'";
      if (item.empty()) throw error(where + " is empty" + example);
      const auto colon = item.find(':');
      if (colon == std::string::npos) throw error(where + ": '" + item + "' has no ':'" + example);
      pts.emplace_back(detail::parse_real(item.substr(0, colon), where + ", lanes"),
                       detail::parse_real(item.substr(colon + 1), where + ", MiB/s"));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return storage_curve(std::move(pts));
  }

  /// Parses a CSV with a header naming the columns `lanes` and `mib_per_s`
  /// (as shared/traces/flash-lanes.csv). `source` prefixes errors.
  static storage_curve parse_csv(const std::string& text, const std::string& source) {
    std::stringstream ss(text);
    std::string line;
    if (!std::getline(ss, line)) throw error(source + ": empty; expected a header with lanes and mib_per_s");
    const auto cols = split(line);
    const auto lanes_col = std::find(cols.begin(), cols.end(), "lanes") - cols.begin();
    const auto bw_col = std::find(cols.begin(), cols.end(), "mib_per_s") - cols.begin();
    if (static_cast<std::size_t>(lanes_col) == cols.size() || static_cast<std::size_t>(bw_col) == cols.size())
      throw error(source + ": header '" + line + "'; expected columns lanes and mib_per_s");
    std::vector<std::pair<double, double>> pts;
    std::size_t n = 1;
    while (std::getline(ss, line)) {
      ++n;
      if (line.empty() || line[0] == '#') continue;
      const auto f = split(line);
      if (f.size() != cols.size())
        throw error(source + ": line " + std::to_string(n) + ": " + std::to_string(f.size()) + " fields; expected " +
                    std::to_string(cols.size()));
      // Each field wholly a finite number: a bare strtod would read "1:1809.9" as 1.
      auto number = [&](std::ptrdiff_t col) {
        return detail::parse_real(
            f[static_cast<std::size_t>(col)],
            source + ": line " + std::to_string(n) + ", column " + cols[static_cast<std::size_t>(col)]);
      };
      const double lanes = number(lanes_col);
      pts.emplace_back(lanes, number(bw_col));
    }
    try {
      return storage_curve(std::move(pts));
    } catch (const error& e) {
      throw error(source + ": " + e.what());
    }
  }

  /// Aggregate MiB/s with `lanes` concurrent reads.
  double mib_per_s(double lanes) const noexcept {
    if (lanes <= points_.front().first) return points_.front().second;
    for (std::size_t i = 1; i < points_.size(); ++i)
      if (lanes <= points_[i].first) {
        const auto& a = points_[i - 1];
        const auto& b = points_[i];
        // Weighted, not a + (b - a)·t: that cancels to 0 at t = 1 when b is
        // negligible next to a; this is b there and stays between a and b.
        const double t = (lanes - a.first) / (b.first - a.first);
        return (1 - t) * a.second + t * b.second;
      }
    return points_.back().second;
  }
  const std::vector<std::pair<double, double>>& points() const noexcept { return points_; }
  /// "1:1809.9,2:2459.8,..." (parse_list's form, which reads it back exactly).
  std::string to_list() const {
    std::string s;
    for (const auto& p : points_) s += (s.empty() ? "" : ",") + fmt(p.first) + ":" + fmt(p.second);
    return s;
  }

 private:
  /// "%g" when it reads back as `v`, else 17 digits: to_list() must parse back
  /// to the same points (two lanes "%g" prints alike would not even parse).
  static std::string fmt(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", v);
    if (std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof buf, "%.17g", v);
    return buf;
  }
  static std::vector<std::string> split(const std::string& line) {
    std::vector<std::string> out;
    std::stringstream ss(line);
    for (std::string f; std::getline(ss, f, ',');) {
      while (!f.empty() && (f.back() == '\r' || f.back() == ' ')) f.pop_back();
      out.push_back(f);
    }
    return out;
  }
  std::vector<std::pair<double, double>> points_;
};

/// The device and model parameters of the timing model (see the equations at
/// the top of this header). All times in ms.
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
  /// β_f: β for the memory lab's fault-driven configurations (timing/lab.hpp),
  /// whose page faults read through the kernel's read-around, not the
  /// manager's lanes; predict_lab uses it in place of β there. 0: tied, the
  /// same as β. Unused by simulate_timing itself.
  double fault_bandwidth_scale = 0.0;
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
  }

  /// Duration of one wave of m concurrent reads of `bytes` each, equation (2).
  double wave_ms(std::size_t m, std::uint64_t bytes) const noexcept {
    if (m == 0) return 0.0;
    return read_latency_ms + 1000.0 * to_mib(bytes) * static_cast<double>(m) /
                                 (bandwidth_scale * curve.mib_per_s(static_cast<double>(m)));
  }
  /// Duration of d reads of `bytes` each on `lanes` lanes, equation (3).
  double read_ms(std::size_t d, std::uint64_t bytes) const noexcept {
    if (d == 0) return 0.0;
    const std::size_t full = (d - 1) / lanes;  // ⌈d/n⌉ − 1 full waves before the last one
    // No full wave: 0, not 0 × an infinite wave (NaN) when the bandwidth underflows.
    return (full ? static_cast<double>(full) * wave_ms(lanes, bytes) : 0.0) + wave_ms(d - full * lanes, bytes);
  }
  /// I/O time of those d reads: each read's duration summed (the engine's io_ms).
  double read_io_ms(std::size_t d, std::uint64_t bytes) const noexcept {
    if (d == 0) return 0.0;
    const std::size_t full = (d - 1) / lanes, last = d - full * lanes;
    return (full ? static_cast<double>(full * lanes) * wave_ms(lanes, bytes) : 0.0) +
           static_cast<double>(last) * wave_ms(last, bytes);
  }
};

/// Parses `key = value` lines ('#' comments): lanes, curve (lanes:MiB/s
/// list), curve_file (a CSV like flash-lanes.csv, relative to the working
/// directory), read_latency_ms, bandwidth_scale, fault_bandwidth_scale,
/// compute_ms_per_token, expert_compute_share,
/// overlap, mgmt_ms_per_read, mgmt_ms_per_eviction, read_cpu_ms_per_mib,
/// mgmt_ms_per_request, mgmt_ms_per_pin, kernel_overlap. Unlisted keys keep
/// `defaults`. Throws `error` naming the line on an unknown key or bad value,
/// and on a text without any setting (an empty file would otherwise mean
/// every default, silently).
inline timing_params parse_timing_config(const std::string& text, const std::string& source,
                                         timing_params defaults = {}) {
  timing_params p = std::move(defaults);
  std::stringstream ss(text);
  std::size_t n = 0, settings = 0;
  for (std::string line; std::getline(ss, line);) {
    ++n;
    if (const auto hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    auto trim = [](std::string s) {
      const auto a = s.find_first_not_of(" \t\r"), b = s.find_last_not_of(" \t\r");
      return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
    };
    line = trim(line);
    if (line.empty()) continue;
    const auto eq = line.find('=');
    const std::string where = source + ": line " + std::to_string(n) + ": ";
    ++settings;
    if (eq == std::string::npos) throw error(where + "'" + line + "'; expected key = value");
    const std::string key = trim(line.substr(0, eq)), value = trim(line.substr(eq + 1));
    // Finite here; each parameter's own range in timing_params::validate.
    auto number = [&]() { return detail::parse_real(value, where + key); };
    try {
      if (key == "lanes") {
        p.lanes = detail::parse_whole<std::size_t>(value, where + key, 1, 64);
      } else if (key == "curve") {
        p.curve = storage_curve::parse_list(value);
      } else if (key == "curve_file") {
        p.curve = storage_curve::parse_csv(
            detail::read_input_file(value, "a lanes CSV file", detail::text_head(value, "a lanes CSV file")), value);
      } else if (key == "read_latency_ms") {
        p.read_latency_ms = number();
      } else if (key == "bandwidth_scale") {
        p.bandwidth_scale = number();
      } else if (key == "fault_bandwidth_scale") {
        p.fault_bandwidth_scale = number();
      } else if (key == "compute_ms_per_token") {
        p.compute_ms_per_token = number();
      } else if (key == "expert_compute_share") {
        p.expert_compute_share = number();
      } else if (key == "overlap") {
        p.overlap = number();
      } else if (key == "kernel_overlap") {
        p.kernel_overlap = number();
      } else if (key == "mgmt_ms_per_read") {
        p.mgmt_ms_per_read = number();
      } else if (key == "mgmt_ms_per_eviction") {
        p.mgmt_ms_per_eviction = number();
      } else if (key == "read_cpu_ms_per_mib") {
        p.read_cpu_ms_per_mib = number();
      } else if (key == "mgmt_ms_per_request") {
        p.mgmt_ms_per_request = number();
      } else if (key == "mgmt_ms_per_pin") {
        p.mgmt_ms_per_pin = number();
      } else {
        throw error("unknown key '" + key +
                    "'; expected lanes, curve, curve_file, read_latency_ms, bandwidth_scale, fault_bandwidth_scale, "
                    "compute_ms_per_token, "
                    "expert_compute_share, overlap, mgmt_ms_per_read, mgmt_ms_per_eviction, read_cpu_ms_per_mib, "
                    "mgmt_ms_per_request, mgmt_ms_per_pin or kernel_overlap");
      }
    } catch (const error& e) {
      const std::string m = e.what();
      throw error(m.rfind(source, 0) == 0 ? m : where + m);
    }
  }
  if (settings == 0)
    throw error(source + ": no settings (" + (n == 0 ? "an empty file" : "only blank and comment lines") +
                "); expected key = value lines, e.g. compute_ms_per_token = 20");
  try {
    p.validate();
  } catch (const error& e) {
    throw error(source + ": " + e.what());
  }
  return p;
}

/// The config-file form of `p` (parse_timing_config reads it back).
inline std::string format_timing_config(const timing_params& p) {
  // The curve apart: a long one would not fit a fixed buffer (it was cut at 512 bytes).
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "read_latency_ms = %.6g\nbandwidth_scale = %.6g\ncompute_ms_per_token = %.6g\n"
                "expert_compute_share = %.6g\noverlap = %.6g\nmgmt_ms_per_read = %.6g\nmgmt_ms_per_eviction = %.6g\n"
                "read_cpu_ms_per_mib = %.6g\nmgmt_ms_per_request = %.6g\nmgmt_ms_per_pin = %.6g\n"
                "fault_bandwidth_scale = %.6g\nkernel_overlap = %.6g\n",
                p.read_latency_ms, p.bandwidth_scale, p.compute_ms_per_token, p.expert_compute_share, p.overlap,
                p.mgmt_ms_per_read, p.mgmt_ms_per_eviction, p.read_cpu_ms_per_mib, p.mgmt_ms_per_request,
                p.mgmt_ms_per_pin, p.fault_bandwidth_scale, p.kernel_overlap);
  return "lanes = " + std::to_string(p.lanes) + "\ncurve = " + p.curve.to_list() + "\n" + buf;
}

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

/// Recorded per-decode-token metrics (the engine's *.metrics.csv): columns by
/// header name; wall_ms is required, stall_ms, mgmt_ms, compute_ms,
/// read_bytes, io_ms, cpu_ms and sys_ms are kept when present (NaN
/// otherwise). '#' lines are skipped. cpu_ms and sys_ms are the memory lab
/// probe's: the eval thread's CPU time and the part of it in the kernel.
///
/// Rows are paired with decode tokens by the `step` they carry, not by their
/// place in the file: step s is the run's s-th decode token (from 1), rows are
/// put in step order, and a step missing, repeated or not from 1 is an error
/// naming the line; a `steps` column (the run's decode tokens) must agree with
/// the rows there are, so a cut file is refused. A file without a `step`
/// column is paired by position.
struct token_metrics {
  std::vector<double> wall_ms, stall_ms, mgmt_ms, compute_ms, read_bytes, io_ms, cpu_ms, sys_ms;
  std::size_t size() const noexcept { return wall_ms.size(); }
};

/// Throws `error` naming the source, line and column on a malformed file.
inline token_metrics parse_token_metrics(const std::string& text, const std::string& source) {
  std::stringstream ss(text);
  std::string line;
  std::size_t n = 0;
  std::vector<std::string> cols;
  while (std::getline(ss, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    std::stringstream ls(line);
    for (std::string f; std::getline(ls, f, ',');) cols.push_back(f);
    break;
  }
  auto col = [&](const char* name) -> std::ptrdiff_t {
    const auto it = std::find(cols.begin(), cols.end(), name);
    return it == cols.end() ? -1 : it - cols.begin();
  };
  const std::ptrdiff_t wall = col("wall_ms");
  if (wall < 0)
    throw error(source + ": line " + std::to_string(n) +
                ": no wall_ms column; expected a metrics header like step,steps,wall_ms,...");
  constexpr int kept = 8;
  const std::ptrdiff_t idx[kept] = {wall,         col("stall_ms"), col("mgmt_ms"), col("compute_ms"), col("read_bytes"),
                                    col("io_ms"), col("cpu_ms"),   col("sys_ms")};
  token_metrics m;
  std::vector<double>* dst[kept] = {&m.wall_ms,    &m.stall_ms, &m.mgmt_ms, &m.compute_ms,
                                    &m.read_bytes, &m.io_ms,    &m.cpu_ms,  &m.sys_ms};
  const std::ptrdiff_t step_col = col("step"), steps_col = col("steps");
  struct row_step {
    std::uint64_t step, steps;
    std::size_t line;
  };
  std::vector<row_step> steps;  // per row, when the file has a step column
  auto whole = [&](const std::vector<std::string>& f, std::ptrdiff_t c, std::size_t line_no) -> std::uint64_t {
    // Decode tokens count from 1.
    return detail::parse_whole<std::uint64_t>(
        f[static_cast<std::size_t>(c)],
        source + ": line " + std::to_string(line_no) + ", column " + cols[static_cast<std::size_t>(c)], 1);
  };
  while (std::getline(ss, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f;
    std::stringstream ls(line);
    for (std::string x; std::getline(ls, x, ',');) f.push_back(x);
    if (f.size() != cols.size())
      throw error(source + ": line " + std::to_string(n) + ": " + std::to_string(f.size()) + " fields; expected " +
                  std::to_string(cols.size()));
    for (int k = 0; k < kept; ++k) {
      double v = std::numeric_limits<double>::quiet_NaN();
      if (idx[k] >= 0) {
        v = detail::parse_real(
            f[static_cast<std::size_t>(idx[k])],
            source + ": line " + std::to_string(n) + ", column " + cols[static_cast<std::size_t>(idx[k])],
            detail::real_domain::non_negative());
      }
      dst[k]->push_back(v);
    }
    if (step_col >= 0) steps.push_back({whole(f, step_col, n), steps_col >= 0 ? whole(f, steps_col, n) : 0, n});
  }
  if (m.wall_ms.empty()) throw error(source + ": no token rows");
  if (steps.empty()) return m;
  // Pair by step: rows in step order, each step 1..N exactly once.
  std::vector<std::size_t> order(steps.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return steps[a].step < steps[b].step; });
  for (std::size_t i = 0; i < order.size(); ++i) {
    const row_step& r = steps[order[i]];
    if (r.step == i + 1) continue;
    if (i > 0 && r.step == steps[order[i - 1]].step)
      throw error(source + ": line " + std::to_string(r.line) + ": step " + std::to_string(r.step) + " again (line " +
                  std::to_string(steps[order[i - 1]].line) + " has it); expected each decode token's step once");
    throw error(source + ": line " + std::to_string(r.line) + ": step " + std::to_string(r.step) + ", but step " +
                std::to_string(i + 1) + " is missing; expected steps 1 to " + std::to_string(steps.size()) +
                ", one row per decode token");
  }
  for (const row_step& r : steps)
    if (steps_col >= 0 && r.steps != steps.size())
      throw error(source + ": line " + std::to_string(r.line) + ": steps " + std::to_string(r.steps) +
                  " (the run's decode tokens), but the file has " + std::to_string(steps.size()) +
                  " rows; expected one row per decode token (a cut or merged file?)");
  bool sorted = true;
  for (std::size_t i = 0; i < order.size(); ++i) sorted = sorted && order[i] == i;
  if (!sorted)
    for (int k = 0; k < kept; ++k) {
      std::vector<double> v(order.size());
      for (std::size_t i = 0; i < order.size(); ++i) v[i] = (*dst[k])[order[i]];
      *dst[k] = std::move(v);
    }
  return m;
}

/// Decode tok/s of a metrics file as the memory lab counts it: tokens / Σ wall.
inline double metrics_tok_per_s(const token_metrics& m) {
  double wall = 0;
  for (double w : m.wall_ms) wall += w;
  return wall > 0 ? 1000.0 * static_cast<double>(m.size()) / wall : 0.0;
}

/// Appends `more`'s rows to `into`: one cell measured again (the lab's
/// repeated runs), for a fit or a mean over every run. A column one of the
/// two lacks is NaN for its rows.
inline void append_token_metrics(token_metrics& into, const token_metrics& more) {
  const std::size_t n = into.size();
  std::vector<double> token_metrics::*cols[] = {
      &token_metrics::wall_ms,    &token_metrics::stall_ms, &token_metrics::mgmt_ms, &token_metrics::compute_ms,
      &token_metrics::read_bytes, &token_metrics::io_ms,    &token_metrics::cpu_ms,  &token_metrics::sys_ms};
  for (auto c : cols) {
    std::vector<double>& a = into.*c;
    const std::vector<double>& b = more.*c;
    a.resize(n, std::numeric_limits<double>::quiet_NaN());
    if (b.size() == more.size()) a.insert(a.end(), b.begin(), b.end());
    else a.resize(n + more.size(), std::numeric_limits<double>::quiet_NaN());
  }
}

}  // namespace moe_residency
