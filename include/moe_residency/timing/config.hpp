#pragma once
/// timing/config.hpp: the timing model's parameters file (`key = value`
/// lines: what `moe-residency whatif --config` reads and `calibrate
/// --write-config` writes):
/// parse_timing_config and format_timing_config over timing_params
/// (timing/params.hpp). Standard library only.

#include <cstddef>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <utility>

#include "moe_residency/detail/files.hpp"
#include "moe_residency/detail/numbers.hpp"
#include "moe_residency/detail/text_encoding.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/timing/params.hpp"
#include "moe_residency/timing/storage_curve.hpp"

namespace moe_residency {

/// Parses `key = value` lines ('#' comments): lanes, curve (lanes:MiB/s
/// list), curve_file (a CSV like flash-lanes.csv, relative to the working
/// directory), read_latency_ms, bandwidth_scale, fault_bandwidth_scale,
/// compute_ms_per_token, expert_compute_share,
/// overlap, mgmt_ms_per_read, mgmt_ms_per_eviction, read_cpu_ms_per_mib,
/// mgmt_ms_per_request, mgmt_ms_per_pin, kernel_overlap, and the
/// contention and top-k terms: requests_per_read, pipelined_mgmt, compute_top_k,
/// mgmt_ms_per_lookup, compute_ms_per_fault, faults_per_token,
/// faults_per_evicted_mib, compute_ms_per_read_mib, noise_pct. Unlisted keys keep
/// `defaults`. Throws `error` naming the line on an unknown key, an empty
/// key or value, or a bad value; naming both lines on a key given twice (or
/// the curve given both as `curve` and `curve_file`), since one would
/// silently win; and on a text without any setting (an empty file would
/// otherwise mean every default, silently). A UTF-8 byte-order mark is
/// skipped; compressed or UTF-16 data is refused naming it.
inline timing_params parse_timing_config(const std::string& text, const std::string& source,
                                         timing_params defaults = {}) {
  timing_params p = std::move(defaults);
  detail::check_text_encoding(text, source, "a timing config (key = value lines)");
  std::stringstream ss(std::string(detail::strip_utf8_bom(text)));
  std::size_t n = 0, settings = 0;
  std::map<std::string, std::pair<std::string, std::size_t>> given;  // setting -> (key as written, line)
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
    if (key.empty()) throw error(where + "'" + line + "' has no key; expected key = value");
    if (value.empty()) throw error(where + key + ": empty value; expected key = value");
    // curve and curve_file set the same parameter: the second would win silently.
    const std::string setting = key == "curve_file" ? "curve" : key;
    if (const auto it = given.find(setting); it != given.end())
      throw error(where + key + ": given again (first on line " + std::to_string(it->second.second) +
                  (it->second.first == key ? "" : ", as " + it->second.first) + "); expected each setting once");
    given.emplace(setting, std::make_pair(key, n));
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
      } else if (key == "requests_per_read") {
        p.requests_per_read = detail::parse_whole<std::size_t>(value, where + key, 1, 16);
      } else if (key == "pipelined_mgmt") {
        p.pipelined_mgmt = detail::parse_whole<unsigned>(value, where + key + " (0 or 1)", 0, 1) == 1;
      } else if (key == "compute_top_k") {
        p.compute_top_k = detail::parse_whole<std::size_t>(value, where + key, 0, 256);
      } else if (key == "mgmt_ms_per_lookup") {
        p.mgmt_ms_per_lookup = number();
      } else if (key == "compute_ms_per_fault") {
        p.compute_ms_per_fault = number();
      } else if (key == "faults_per_token") {
        p.faults_per_token = number();
      } else if (key == "faults_per_evicted_mib") {
        p.faults_per_evicted_mib = number();
      } else if (key == "compute_ms_per_read_mib") {
        p.compute_ms_per_read_mib = number();
      } else if (key == "noise_pct") {
        p.noise_pct = number();
      } else {
        throw error("unknown key '" + key +
                    "'; expected lanes, curve, curve_file, read_latency_ms, bandwidth_scale, fault_bandwidth_scale, "
                    "compute_ms_per_token, "
                    "expert_compute_share, overlap, mgmt_ms_per_read, mgmt_ms_per_eviction, read_cpu_ms_per_mib, "
                    "mgmt_ms_per_request, mgmt_ms_per_pin, kernel_overlap, requests_per_read, pipelined_mgmt, "
                    "compute_top_k, "
                    "mgmt_ms_per_lookup, compute_ms_per_fault, faults_per_token, faults_per_evicted_mib, "
                    "compute_ms_per_read_mib or noise_pct");
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
  char more[512];
  std::snprintf(more, sizeof more,
                "requests_per_read = %zu\npipelined_mgmt = %d\ncompute_top_k = %zu\nmgmt_ms_per_lookup = %.6g\n"
                "compute_ms_per_fault = %.6g\nfaults_per_token = %.6g\nfaults_per_evicted_mib = %.6g\n"
                "compute_ms_per_read_mib = %.6g\nnoise_pct = %.6g\n",
                p.requests_per_read, p.pipelined_mgmt ? 1 : 0, p.compute_top_k, p.mgmt_ms_per_lookup,
                p.compute_ms_per_fault, p.faults_per_token, p.faults_per_evicted_mib, p.compute_ms_per_read_mib,
                p.noise_pct);
  return "lanes = " + std::to_string(p.lanes) + "\ncurve = " + p.curve.to_list() + "\n" + buf + more;
}

}  // namespace moe_residency
