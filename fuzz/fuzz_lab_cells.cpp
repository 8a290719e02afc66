// libFuzzer target: the memory lab's cells file (parse_lab_cells:
// `lab-predict --cells`, written by lab/memlab.sh predict). Any input ends
// in moe_residency::error naming the input, or in cells each with a ratio, a
// configuration, finite numbers >= 0 (a percentage <= 100) and at most one cell
// per configuration and ratio, which format_lab_cells writes and
// parse_lab_cells reads back exactly (the written text a fixed point).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_check.hpp"
#include "moe_residency_lab/cells.hpp"

namespace {

bool same(const moe_residency::lab::lab_cell& a, const moe_residency::lab::lab_cell& b) {
  return a.ratio == b.ratio && a.config == b.config && moe_residency_fuzz::same_bits(a.limit_mib, b.limit_mib) &&
         moe_residency_fuzz::same_bits(a.budget_mib, b.budget_mib) &&
         moe_residency_fuzz::same_bits(a.stale_gate_pct, b.stale_gate_pct) && a.metrics == b.metrics &&
         a.lanes == b.lanes && a.label == b.label;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace moe_residency;
  using namespace moe_residency::lab;
  using moe_residency_fuzz::check;
  const std::string text = moe_residency_fuzz::text_of(data, size);
  std::optional<std::vector<lab_cell>> cells;
  try {
    cells = parse_lab_cells(text, "fuzz.cells.csv");
  } catch (const error& e) {
    moe_residency_fuzz::check_message(e, "fuzz.cells.csv", text.size());
  }
  if (!cells) return 0;
  check(!cells->empty(), "accepted a file with no cells");
  for (std::size_t i = 0; i < cells->size(); ++i) {
    const lab_cell& c = (*cells)[i];
    check(!c.ratio.empty(), "a cell with no ratio");
    check(c.ratio.find_first_of(",\n") == std::string::npos && c.metrics.find_first_of(",\n") == std::string::npos,
          "a field holding a separator");
    for (const std::string* field : {&c.ratio, &c.metrics})
      for (char ch : *field)
        check(static_cast<unsigned char>(ch) >= 0x20 && ch != 0x7f, "a field holding a control character", *field);
    for (double v : {c.limit_mib, c.budget_mib, c.stale_gate_pct})
      check(std::isfinite(v) && v >= 0, "a number that is not finite and >= 0", std::to_string(v));
    check(c.stale_gate_pct <= 100, "a percentage above 100");
    check(parse_lab_config(to_string(c.config)) == c.config, "the configuration does not name itself");
    for (std::size_t j = 0; j < i; ++j) check((*cells)[j].id() != c.id(), "a cell listed twice");
  }
  const std::string written = format_lab_cells(*cells);
  std::optional<std::vector<lab_cell>> back;
  try {
    back = parse_lab_cells(written, "roundtrip.cells.csv");
  } catch (const error& e) {
    moe_residency_fuzz::fail("format_lab_cells's text does not parse back", written + e.what());
  }
  check(back->size() == cells->size(), "write -> parse changed the number of cells", written);
  for (std::size_t i = 0; i < back->size(); ++i)
    check(same((*back)[i], (*cells)[i]), "write -> parse changed a cell", written);
  check(format_lab_cells(*back) == written, "format_lab_cells is not a fixed point");
  return 0;
}
