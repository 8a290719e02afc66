#pragma once
/// The binary route trace reader's exact pass (`detail::read_binary_rows_exact`):
/// records decoded field by field and run through the row checker, for the
/// message of a file the fast scan refused. Part of the reader in trace/binary.hpp.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/detail/half.hpp"
#include "moe_residency/detail/trace_binary.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/trace/types.hpp"
#include "moe_residency/trace/validate.hpp"

namespace moe_residency {
namespace detail {

/// The exact pass: each record decoded straight into a new row of `rows`,
/// field by field, and run through trace_row_checker; throws the checker's
/// message ("<source>: record i, column c: ...") at the first row it refuses.
/// The reader runs it only for a file the scanner refused; the benchmark
/// times it as the reader's reference twin (it was the whole reader).
inline void read_binary_rows_exact(const unsigned char* rp, std::uint64_t n_rows, const trace_header& h,
                                   std::vector<trace_row>& rows, const std::string& source_name) {
  rows.reserve(static_cast<std::size_t>(n_rows));
  const std::size_t n_layer = h.n_layer;
  const std::uint64_t* layer_bytes = h.expert_bytes.data();
  const unsigned dropped_code = h.has_dropped_column ? 1u : 0u;  // (bits >> 1) != 0 must equal this
  trace_row_checker checker(h);
  trace_issue issue;
  for (std::uint64_t i = 0; i < n_rows; ++i, rp += binary_trace_record_size) {
    trace_row& r = rows.emplace_back();
    r.turn = load_le<std::uint32_t>(rp);
    r.step = load_le<std::uint32_t>(rp + 4);
    r.weight = bits_float(load_le<std::uint32_t>(rp + 8));
    r.layer = static_cast<layer_id>(load_le<std::uint16_t>(rp + 12));
    r.expert = static_cast<expert_id>(load_le<std::uint16_t>(rp + 14));
    r.slot = rp[16];
    r.phase = static_cast<run_phase>(rp[17]);
    r.residency = rp[18];
    const unsigned bits = rp[19];
    if (bits > 7 || (bits >> 1) == 3 || static_cast<unsigned>((bits >> 1) != 0) != dropped_code)
      throw error(source_name + ": record " + std::to_string(i) + ", column dropped: bits " + std::to_string(bits) +
                  (h.has_dropped_column ? "; expected dropped 0 or 1" : "; expected no dropped value (no column)"));
    r.dropped = static_cast<std::int8_t>(static_cast<int>(bits >> 1) - 1);
    const std::size_t layer = to_index(r.layer);
    r.expert_bytes = (bits & 1) && layer < n_layer ? layer_bytes[layer] : 0;
    if (!checker.check(r, issue))
      throw error(source_name + ": record " + std::to_string(i) + ", column " + column_name(issue.column) + ": " +
                  issue.message);
  }
  if (!checker.finish(issue))
    throw error(source_name + ": end of records (" + std::to_string(n_rows) + " records): " + issue.message);
}

}  // namespace detail
}  // namespace moe_residency
