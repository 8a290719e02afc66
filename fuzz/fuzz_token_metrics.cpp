// libFuzzer target: the engine's per-decode-token metrics CSV (parse_token_metrics:
// `calibrate --metrics`, the lab's cells). Any input ends in moe_residency::error
// naming the input, or in metrics with at least one token, every column as long
// as wall_ms, every value a finite number >= 0 or (a column the file lacks) NaN
// on every row, and which a CSV written from them (17 digits) reads back bit for
// bit; the lab's tok/s of them is a number >= 0.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_check.hpp"
#include "moe_residency/timing.hpp"
#include "moe_residency_lab/lab.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace moe_residency;
  using namespace moe_residency::lab;
  using moe_residency_fuzz::check;
  const std::string text = moe_residency_fuzz::text_of(data, size);
  std::optional<token_metrics> m;
  try {
    m = parse_token_metrics(text, "fuzz.metrics.csv");
  } catch (const error& e) {
    moe_residency_fuzz::check_message(e, "fuzz.metrics.csv", text.size());
  }
  if (!m) return 0;
  check(m->size() > 0, "accepted metrics with no token");
  constexpr int kept = 8;
  const char* names[kept] = {"wall_ms", "stall_ms", "mgmt_ms", "compute_ms", "read_bytes", "io_ms", "cpu_ms", "sys_ms"};
  const std::vector<double>* cols[kept] = {&m->wall_ms,    &m->stall_ms, &m->mgmt_ms, &m->compute_ms,
                                           &m->read_bytes, &m->io_ms,    &m->cpu_ms,  &m->sys_ms};
  bool present[kept];
  for (int k = 0; k < kept; ++k) {
    const std::vector<double>& c = *cols[k];
    check(c.size() == m->size(), "a column is not as long as wall_ms", names[k]);
    present[k] = !std::isnan(c[0]);
    for (double v : c) {
      if (!present[k]) {
        check(std::isnan(v), "a column NaN on one row and a number on another", names[k]);
        continue;
      }
      check(std::isfinite(v) && v >= 0, "a value that is not a finite number >= 0",
            names[k] + (": " + std::to_string(v)));
    }
  }
  check(present[0], "wall_ms is NaN");
  // Infinite only when the wall times sum below 1000 / DBL_MAX ms (a subnormal wall_ms).
  const double tps = metrics_tok_per_s(*m);
  check(tps >= 0, "metrics_tok_per_s NaN or negative", std::to_string(tps));

  // Written back with the columns it has, in another order, with a comment and CRLF.
  std::string csv = "# written by fuzz_token_metrics\r\nstep";
  for (int k = kept - 1; k >= 0; --k)
    if (present[k]) csv += std::string(",") + names[k];
  csv += "\r\n";
  char buf[64];
  for (std::size_t i = 0; i < m->size(); ++i) {
    csv += std::to_string(i + 1);
    for (int k = kept - 1; k >= 0; --k)
      if (present[k]) {
        std::snprintf(buf, sizeof buf, ",%.17g", (*cols[k])[i]);
        csv += buf;
      }
    csv += "\r\n";
  }
  std::optional<token_metrics> back;
  try {
    back = parse_token_metrics(csv, "roundtrip.csv");
  } catch (const error& e) {
    moe_residency_fuzz::fail("the written metrics do not parse back", e.what());
  }
  check(moe_residency_fuzz::same_bits(back->wall_ms, m->wall_ms) &&
            moe_residency_fuzz::same_bits(back->stall_ms, m->stall_ms) &&
            moe_residency_fuzz::same_bits(back->mgmt_ms, m->mgmt_ms) &&
            moe_residency_fuzz::same_bits(back->compute_ms, m->compute_ms) &&
            moe_residency_fuzz::same_bits(back->read_bytes, m->read_bytes) &&
            moe_residency_fuzz::same_bits(back->io_ms, m->io_ms) &&
            moe_residency_fuzz::same_bits(back->cpu_ms, m->cpu_ms) &&
            moe_residency_fuzz::same_bits(back->sys_ms, m->sys_ms),
        "write -> parse changed a value");
  return 0;
}
