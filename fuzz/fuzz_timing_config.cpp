// libFuzzer target: the timing model's `key = value` configuration file
// (parse_timing_config: `calibrate --config`, `whatif --config`, what
// `calibrate --write-config` writes). Any input ends in moe_residency::error
// naming the input, or in parameters that validate, whose curve holds its rules,
// and whose config-file form (format_timing_config) parses back to the same
// text: lanes and the curve exactly, the other numbers to the 6 digits the
// writer prints.
//
// `curve_file = NAME` opens NAME relative to the working directory, so each
// input is parsed inside a private directory holding one curve file
// (`lanes.csv`, the default phone curve); a value with a '/' is skipped, so the
// fuzzer never opens a file outside it (/dev/zero would never end).
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>

#include "fuzz_check.hpp"
#include "moe_residency/timing.hpp"

namespace {

using moe_residency_fuzz::check;

std::string sandbox;  // the private directory, made once

void make_sandbox() {
  char dir[] = "/tmp/fuzz_timing_config.XXXXXX";
  if (!mkdtemp(dir)) moe_residency_fuzz::fail("mkdtemp failed");
  sandbox = dir;
  std::ofstream f(sandbox + "/lanes.csv");
  f << "lanes,read_kib,mib_per_s\n";
  const moe_residency::storage_curve phone;  // a named curve: points() refers into it
  for (const auto& p : phone.points()) f << p.first << ",4096," << p.second << "\n";
}

/// Runs `f` with the sandbox as the working directory (restored on the way out).
struct in_sandbox {
  char old[4096];
  in_sandbox() {
    if (!getcwd(old, sizeof old) || chdir(sandbox.c_str()) != 0) moe_residency_fuzz::fail("chdir into the sandbox");
  }
  ~in_sandbox() {
    if (chdir(old) != 0) moe_residency_fuzz::fail("chdir back");
  }
};

/// A curve_file value that leaves the sandbox: skip the input.
bool names_outside_file(const std::string& text) {
  for (std::size_t at = text.find("curve_file"); at != std::string::npos; at = text.find("curve_file", at + 1)) {
    const std::size_t eol = text.find('\n', at);
    const std::size_t slash = text.find('/', at);
    if (slash != std::string::npos && (eol == std::string::npos || slash < eol)) return true;
  }
  return false;
}

bool close6(double a, double b) { return a == b || std::fabs(a - b) <= 5e-6 * std::fmax(std::fabs(a), std::fabs(b)); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace moe_residency;
  if (sandbox.empty()) make_sandbox();
  const std::string text = moe_residency_fuzz::text_of(data, size);
  if (names_outside_file(text)) return 0;
  std::optional<timing_params> p;
  {
    in_sandbox here;
    try {
      p = parse_timing_config(text, "fuzz.cfg");
    } catch (const error& e) {
      moe_residency_fuzz::check_message(e, "fuzz.cfg", text.size());
    }
  }
  if (!p) return 0;
  try {
    p->validate();
  } catch (const error& e) {
    moe_residency_fuzz::fail("accepted parameters do not validate", e.what());
  }
  const auto& pts = p->curve.points();
  check(!pts.empty(), "an accepted curve has no points");
  for (std::size_t i = 0; i < pts.size(); ++i) {
    check(pts[i].first >= 1 && std::isfinite(pts[i].first) && (i == 0 || pts[i].first > pts[i - 1].first),
          "curve lanes below 1, not finite or not increasing");
    check(pts[i].second > 0 && std::isfinite(pts[i].second), "curve MiB/s not finite and > 0");
  }
  for (std::size_t d : {1u, 2u, 3u, 7u, 64u}) {
    const double ms = p->read_ms(d, 4u << 20);
    check(ms >= 0, "read_ms of valid parameters is NaN or negative", std::to_string(ms));
  }

  const std::string written = format_timing_config(*p);
  std::optional<timing_params> q;
  try {
    q = parse_timing_config(written, "roundtrip.cfg");
  } catch (const error& e) {
    moe_residency_fuzz::fail("format_timing_config's text does not parse back", written + e.what());
  }
  check(format_timing_config(*q) == written, "format_timing_config is not a fixed point", written);
  check(q->lanes == p->lanes, "lanes changed in the round trip");
  check(q->curve.points() == pts, "the curve changed in the round trip", written);
  check(close6(q->read_latency_ms, p->read_latency_ms) && close6(q->bandwidth_scale, p->bandwidth_scale) &&
            close6(q->compute_ms_per_token, p->compute_ms_per_token) &&
            close6(q->expert_compute_share, p->expert_compute_share) && close6(q->overlap, p->overlap) &&
            close6(q->mgmt_ms_per_read, p->mgmt_ms_per_read) &&
            close6(q->mgmt_ms_per_eviction, p->mgmt_ms_per_eviction) &&
            close6(q->read_cpu_ms_per_mib, p->read_cpu_ms_per_mib) &&
            close6(q->mgmt_ms_per_request, p->mgmt_ms_per_request) && close6(q->mgmt_ms_per_pin, p->mgmt_ms_per_pin) &&
            close6(q->fault_bandwidth_scale, p->fault_bandwidth_scale) && close6(q->kernel_overlap, p->kernel_overlap),
        "a parameter moved by more than its 6 printed digits", written);
  return 0;
}
