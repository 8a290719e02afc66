#pragma once
// What every fuzz target shares: a check that aborts with a message (libFuzzer
// saves the input that caused it), and the rules an error message must meet.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "moe_residency/error.hpp"
#include "moe_residency/trace.hpp"

namespace moe_residency_fuzz {

[[noreturn]] inline void fail(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "FUZZ CHECK FAILED: %s %s\n", what, detail.c_str());
  std::abort();
}

inline void check(bool ok, const char* what, const std::string& detail = {}) {
  if (!ok) fail(what, detail);
}

/// An error for people: not empty, names the input it is about, at most 4 KiB
/// longer than what it may quote (`quoted`: the parsers of short files quote a
/// whole line, which a fuzzer makes as long as its input).
inline void check_message(const moe_residency::error& e, const char* source, std::size_t quoted = 0) {
  const std::string m = e.what();
  check(!m.empty(), "empty error message");
  check(m.find(source) != std::string::npos, "error message does not name the input", m);
  check(m.size() < 4096 + quoted, "error message more than 4 KiB longer than what it quotes", m.substr(0, 200));
}

/// Equal bit for bit (NaN equals the same NaN, -0 differs from +0).
inline bool same_bits(double a, double b) {
  std::uint64_t x, y;
  std::memcpy(&x, &a, 8);
  std::memcpy(&y, &b, 8);
  return x == y;
}

inline bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!same_bits(a[i], b[i])) return false;
  return true;
}

/// The fuzzer's bytes as text (NUL bytes included).
inline std::string text_of(const std::uint8_t* data, std::size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

/// Row by row equality; weights compared by their bits (NaN included).
inline bool same_rows(const moe_residency::route_trace& a, const moe_residency::route_trace& b, bool compare_weights) {
  if (a.rows.size() != b.rows.size()) return false;
  for (std::size_t i = 0; i < a.rows.size(); ++i) {
    const auto &x = a.rows[i], &y = b.rows[i];
    std::uint32_t wx, wy;
    std::memcpy(&wx, &x.weight, 4);
    std::memcpy(&wy, &y.weight, 4);
    if (x.turn != y.turn || x.phase != y.phase || x.step != y.step || x.layer != y.layer || x.slot != y.slot ||
        x.expert != y.expert || x.residency != y.residency || x.expert_bytes != y.expert_bytes ||
        x.dropped != y.dropped || (compare_weights && wx != wy))
      return false;
  }
  return true;
}

inline bool same_header(const moe_residency::trace_header& a, const moe_residency::trace_header& b) {
  return a.model == b.model && a.arch == b.arch && a.n_layer == b.n_layer && a.n_expert == b.n_expert &&
         a.n_expert_used == b.n_expert_used && a.expert_bytes == b.expert_bytes && a.dense_bytes == b.dense_bytes &&
         a.has_dropped_column == b.has_dropped_column;
}

/// What may be asked of any trace a parser accepted: it validates, it writes in
/// both forms and reads back the same, its load batches and routings cover every
/// row, and its shape is built or refused with an error.
/// `csv_weights_exact`: the trace's weights are ones "%g" prints exactly (a CSV
/// with no non-canonical weight); a binary trace may hold any float, which the
/// CSV form rounds to 6 significant digits (docs/traces.md).
inline void check_accepted_trace(const moe_residency::route_trace& t, const char* source, bool csv_weights_exact) {
  using namespace moe_residency;
  validate_route_trace(t, source);  // an accepted trace is valid: a throw here escapes and is reported

  std::ostringstream bin;
  write_route_trace_binary(t, bin);
  const route_trace b = parse_route_trace_binary(bin.str(), "roundtrip.bin");
  check(same_header(t.header, b.header), "binary round trip changed the header");
  check(same_rows(t, b, true), "binary round trip changed a row");

  std::ostringstream csv;
  write_route_trace_csv(t, csv);
  const route_trace c = parse_route_trace_csv(csv.str(), "roundtrip.csv");
  check(same_header(t.header, c.header), "CSV round trip changed the header");
  // Weights survive "%g" exactly when they were canonical; the write is then a fixed point.
  check(same_rows(t, c, csv_weights_exact && t.noncanonical_weights == 0), "CSV round trip changed a row");
  check(c.noncanonical_weights == 0, "the CSV writer wrote a non-canonical weight");
  std::ostringstream csv2;
  write_route_trace_csv(c, csv2);
  check(csv2.str() == csv.str(), "writing the CSV again gave different text");

  const load_batches lb = group_load_batches(t);
  check(lb.experts.size() == t.rows.size(), "load batches do not hold every row");
  std::size_t n = 0;
  for (const load_batch& x : lb.batches) {
    check(x.count > 0, "an empty load batch");
    check(x.first == n, "load batches are not contiguous");
    n += x.count;
  }
  check(n == t.rows.size(), "load batch counts do not add up to the rows");

  const trace_routings r = collect_routings(t);
  std::size_t slots = 0;
  for (const routing& x : r.routings) slots += x.size();
  check(slots <= t.rows.size(), "routings hold more slots than rows");
  try {
    const model_shape s = t.shape();
    check(s.n_layers() == t.header.n_layer, "shape layers differ from the header");
  } catch (const error& e) {
    check(std::strlen(e.what()) > 0, "empty shape error");
  }
}

}  // namespace moe_residency_fuzz
