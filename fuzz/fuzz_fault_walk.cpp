// libFuzzer target: the walks' files (parse_fault_walk: `lab-predict
// --fault-walk`, and parse_inline_walk: `--inline-walk`, written by
// lab/memlab.sh from moe-disk-lanes --fault-walk and --inline-walk; one
// parser of rows underneath, so both read every input). Any input ends in
// moe_residency::error naming the input, or in rows of finite numbers >= 0;
// for each row's own shape (its limit, for the fault walk its dense pages
// locked or not) apply_fault_walk / apply_inline_walk finds a match and sets
// the mean of the matching rows, within their least and greatest value.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_check.hpp"
#include "moe_residency_lab/cells.hpp"

namespace {

/// parse_inline_walk's half: the same promises for inline-walk.csv.
void inline_walk(const std::string& text) {
  using namespace moe_residency;
  using namespace moe_residency::lab;
  using moe_residency_fuzz::check;
  std::optional<std::vector<inline_walk_row>> rows;
  try {
    rows = parse_inline_walk(text, "fuzz.inline-walk.csv");
  } catch (const error& e) {
    moe_residency_fuzz::check_message(e, "fuzz.inline-walk.csv", text.size());
  }
  if (!rows) return;
  check(!rows->empty(), "accepted an inline walk with no rows");
  for (const inline_walk_row& r : *rows)
    for (double v : {r.limit_mib, r.budget_mib, r.off_cpu_ms_per_mib, r.sys_ms_per_mib})
      check(std::isfinite(v) && v >= 0, "an inline walk's number that is not finite and >= 0", std::to_string(v));
  for (const inline_walk_row& r : *rows) {
    lab_setup s;
    check(apply_inline_walk(*rows, r.limit_mib, s), "an inline walk's row does not match its own limit");
    double lo = HUGE_VAL, hi = -HUGE_VAL;
    for (const inline_walk_row& q : *rows)
      if (std::abs(q.limit_mib - r.limit_mib) <= 0.5) {
        lo = std::min(lo, q.sys_ms_per_mib);
        hi = std::max(hi, q.sys_ms_per_mib);
      }
    const double m = s.inline_walk_sys_ms_per_mib, slack = 1e-9 * (1 + std::abs(hi));
    check(std::isfinite(m) && m >= lo - slack && m <= hi + slack, "the inline walk's mean lies outside its rows",
          std::to_string(m));
    check(std::isfinite(s.inline_walk_off_cpu_ms_per_mib) && s.inline_walk_off_cpu_ms_per_mib >= 0,
          "an off-CPU time per MiB that is not finite and >= 0");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace moe_residency;
  using namespace moe_residency::lab;
  using moe_residency_fuzz::check;
  const std::string text = moe_residency_fuzz::text_of(data, size);
  inline_walk(text);
  std::optional<std::vector<fault_walk_row>> rows;
  try {
    rows = parse_fault_walk(text, "fuzz.fault-walk.csv");
  } catch (const error& e) {
    moe_residency_fuzz::check_message(e, "fuzz.fault-walk.csv", text.size());
  }
  if (!rows) return 0;
  check(!rows->empty(), "accepted a file with no rows");
  for (const fault_walk_row& r : *rows)
    for (double v : {r.limit_mib, r.pinned_dense_mib, r.off_cpu_ms_per_mib, r.sys_ms_per_mib})
      check(std::isfinite(v) && v >= 0, "a number that is not finite and >= 0", std::to_string(v));
  for (const fault_walk_row& r : *rows) {
    lab_setup s;
    const bool pinned = r.pinned_dense_mib > 0;
    check(apply_fault_walk(*rows, r.limit_mib, pinned, s), "a row does not match its own shape");
    double lo = HUGE_VAL, hi = -HUGE_VAL;
    for (const fault_walk_row& q : *rows)
      if (std::abs(q.limit_mib - r.limit_mib) <= 0.5 && (q.pinned_dense_mib > 0) == pinned) {
        lo = std::min(lo, q.off_cpu_ms_per_mib);
        hi = std::max(hi, q.off_cpu_ms_per_mib);
      }
    const double m = s.fault_walk_off_cpu_ms_per_mib, slack = 1e-9 * (1 + std::abs(hi));
    check(std::isfinite(m) && m >= lo - slack && m <= hi + slack, "the mean lies outside its rows", std::to_string(m));
    check(std::isfinite(s.fault_walk_sys_ms_per_mib) && s.fault_walk_sys_ms_per_mib >= 0,
          "a kernel time per MiB that is not finite and >= 0");
  }
  return 0;
}
