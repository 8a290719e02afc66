#pragma once
/// The compact binary route trace (20 bytes per row; layout in
/// detail/trace_binary.hpp): a reader that validates every row as the CSV
/// parser does, and a writer. See docs/traces.md.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/detail/trace_binary.hpp"
#include "moe_residency/detail/trace_text.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/trace/types.hpp"
#include "moe_residency/trace/validate.hpp"

namespace moe_residency {

/// Parses the binary form. `source_name` prefixes error messages ("record i,
/// column c: ...").
validated_route_trace parse_route_trace_binary(std::string_view bytes, const std::string& source_name);
/// Writes the binary form (20 bytes per row).
void write_route_trace_binary(const validated_route_trace& trace, std::ostream& out);
/// Validates the whole trace first and throws `error` before writing anything.
void write_route_trace_binary(const route_trace& trace, std::ostream& out);

namespace detail {

inline std::string binary_header_bytes(const trace_header& h, std::uint64_t n_rows) {
  std::string out(binary_trace_fixed_header, '\0');
  auto* p = reinterpret_cast<unsigned char*>(&out[0]);
  std::memcpy(p, binary_trace_magic, 8);
  store_le<std::uint32_t>(p + 8, binary_trace_version);
  store_le<std::uint32_t>(p + 12, static_cast<std::uint32_t>(binary_trace_record_size));
  store_le<std::uint32_t>(p + 16, h.has_dropped_column ? 1u : 0u);
  store_le<std::uint32_t>(p + 20, static_cast<std::uint32_t>(h.n_layer));
  store_le<std::uint32_t>(p + 24, static_cast<std::uint32_t>(h.n_expert));
  store_le<std::uint32_t>(p + 28, static_cast<std::uint32_t>(h.n_expert_used));
  store_le<std::uint64_t>(p + 32, n_rows);
  store_le<std::uint32_t>(p + 40, static_cast<std::uint32_t>(h.model.size()));
  store_le<std::uint32_t>(p + 44, static_cast<std::uint32_t>(h.arch.size()));
  out += h.model;
  out += h.arch;
  out.resize(pad8(out.size()), '\0');
  const std::size_t at = out.size();
  out.resize(at + 16 * h.n_layer + pad8(h.n_layer), '\0');
  p = reinterpret_cast<unsigned char*>(&out[0]) + at;
  for (std::size_t l = 0; l < h.n_layer; ++l) {
    store_le<std::uint64_t>(p + 8 * l, h.expert_bytes[l]);
    store_le<std::uint64_t>(p + 8 * (h.n_layer + l), h.dense_bytes[l]);
    p[16 * h.n_layer + l] = h.layer_listed.empty() || h.layer_listed[l] ? 1 : 0;
  }
  return out;
}

}  // namespace detail

inline validated_route_trace parse_route_trace_binary(std::string_view bytes, const std::string& source_name) {
  using namespace detail;
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t size = bytes.size();
  auto fail = [&](const std::string& m) -> error { return error(source_name + ": " + m); };
  if (size < 8 || std::memcmp(b, binary_trace_magic, 8) != 0)
    throw fail("not a binary route trace: bad magic " + quote_field(bytes.substr(0, 8)) + "; expected '\\x89MRTRACE'");
  if (size < binary_trace_fixed_header)
    throw fail("truncated: " + std::to_string(size) + " bytes; the fixed header alone is " +
               std::to_string(binary_trace_fixed_header));
  const std::uint32_t version = load_le<std::uint32_t>(b + 8);
  if (version != binary_trace_version)
    throw fail("unsupported binary version " + std::to_string(version) + "; this reader supports " +
               std::to_string(binary_trace_version));
  const std::uint32_t record_size = load_le<std::uint32_t>(b + 12);
  if (record_size != binary_trace_record_size)
    throw fail("record size " + std::to_string(record_size) + "; expected " +
               std::to_string(binary_trace_record_size) + " for version 1");
  const std::uint32_t flags = load_le<std::uint32_t>(b + 16);
  if (flags > 1) throw fail("header flags " + std::to_string(flags) + " have unknown bits; expected 0 or 1");
  route_trace t;
  trace_header& h = t.header;
  h.has_dropped_column = flags & 1;
  h.n_layer = load_le<std::uint32_t>(b + 20);
  h.n_expert = load_le<std::uint32_t>(b + 24);
  h.n_expert_used = load_le<std::uint32_t>(b + 28);
  const std::uint64_t n_rows = load_le<std::uint64_t>(b + 32);
  const std::uint32_t model_len = load_le<std::uint32_t>(b + 40);
  const std::uint32_t arch_len = load_le<std::uint32_t>(b + 44);
  if (h.n_layer < 1 || h.n_layer > 65535)
    throw fail("header: n_layer " + std::to_string(h.n_layer) + " out of range [1, 65535]");
  // In 64 bits, and compared with the size before any offset becomes a size_t.
  const binary_trace_extent extent =
      binary_trace_header_extent(model_len, arch_len, static_cast<std::uint32_t>(h.n_layer));
  if (size < extent.layers_end)
    throw fail("truncated: " + std::to_string(size) + " bytes; the header needs " + std::to_string(extent.layers_end));
  const std::size_t strings_end = static_cast<std::size_t>(extent.strings_end);
  const std::size_t layers_end = static_cast<std::size_t>(extent.layers_end);
  const std::uint64_t body = size - layers_end;
  if (body / binary_trace_record_size < n_rows)
    throw fail("truncated: " + std::to_string(body) + " bytes of records for " + std::to_string(n_rows) +
               " rows; expected " + std::to_string(n_rows * binary_trace_record_size));
  if (body != n_rows * binary_trace_record_size)
    throw fail(std::to_string(body - n_rows * binary_trace_record_size) + " bytes after the last of " +
               std::to_string(n_rows) + " records; expected the file to end there");
  // The layout's padding is zero; anything else means the lengths do not describe the file.
  auto check_padding = [&](std::uint64_t from, std::uint64_t to, const char* after) {
    for (std::uint64_t i = from; i < to; ++i)
      if (b[i] != 0)
        throw fail("header: padding byte at offset " + std::to_string(i) + " after the " + after + " is " +
                   std::to_string(b[i]) + "; expected 0");
  };
  check_padding(binary_trace_fixed_header + std::uint64_t{model_len} + arch_len, strings_end,
                "model and arch strings");
  check_padding(strings_end + 17 * static_cast<std::uint64_t>(h.n_layer), layers_end, "layer flags");
  h.model.assign(reinterpret_cast<const char*>(b) + binary_trace_fixed_header, std::size_t{model_len});
  h.arch.assign(reinterpret_cast<const char*>(b) + binary_trace_fixed_header + std::size_t{model_len},
                std::size_t{arch_len});
  h.expert_bytes.resize(h.n_layer);
  h.dense_bytes.resize(h.n_layer);
  h.layer_listed.resize(h.n_layer);
  const unsigned char* lp = b + strings_end;
  for (std::size_t l = 0; l < h.n_layer; ++l) {
    h.expert_bytes[l] = load_le<std::uint64_t>(lp + 8 * l);
    h.dense_bytes[l] = load_le<std::uint64_t>(lp + 8 * (h.n_layer + l));
    const unsigned char listed = lp[16 * h.n_layer + l];
    if (listed > 1)
      throw fail("header: layer " + std::to_string(l) + " listed flag " + std::to_string(listed) +
                 "; expected 0 or 1");
    h.layer_listed[l] = listed != 0;
    if (!listed && (h.expert_bytes[l] || h.dense_bytes[l]))
      throw fail("header: layer " + std::to_string(l) + " has bytes but no '# layer=' line flag");
  }
  if (const std::string p = header_problem(h); !p.empty()) throw fail("header: " + p);

  // One pass: each record is decoded straight into a new row of the vector,
  // field by field, and checked there (the checker reads each field at the
  // width it was stored). A row assembled on the stack and then copied
  // (push_back) was reloaded 16 bytes at a time right after its one-byte
  // stores: a store-forwarding stall that perf showed taking a quarter of the
  // read. No value-initialising resize() pass either.
  t.rows.reserve(static_cast<std::size_t>(n_rows));
  const std::size_t n_layer = h.n_layer;
  const std::uint64_t* layer_bytes = h.expert_bytes.data();
  const unsigned dropped_code = h.has_dropped_column ? 1u : 0u;  // (bits >> 1) != 0 must equal this
  trace_row_checker checker(h);
  trace_issue issue;
  const unsigned char* rp = b + layers_end;
  for (std::uint64_t i = 0; i < n_rows; ++i, rp += binary_trace_record_size) {
    trace_row& r = t.rows.emplace_back();
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
      throw fail("record " + std::to_string(i) + ", column dropped: bits " + std::to_string(bits) +
                 (h.has_dropped_column ? "; expected dropped 0 or 1" : "; expected no dropped value (no column)"));
    r.dropped = static_cast<std::int8_t>(static_cast<int>(bits >> 1) - 1);
    // The read bit stands for the layer's expert bytes; an out-of-range
    // layer is reported by the checker.
    const std::size_t layer = to_index(r.layer);
    r.expert_bytes = (bits & 1) && layer < n_layer ? layer_bytes[layer] : 0;
    if (!checker.check(r, issue))
      throw fail("record " + std::to_string(i) + ", column " + column_name(issue.column) + ": " + issue.message);
  }
  return trace_access::make(std::move(t));
}

namespace detail {
// The writer proper: `trace` is known valid. Records go out in chunks of 4096
// (80 KiB) from the heap: a stack buffer that size overflowed small thread stacks.
inline void write_binary_rows(const route_trace& trace, std::ostream& out) {
  const std::string head = binary_header_bytes(trace.header, trace.rows.size());
  out.write(head.data(), static_cast<std::streamsize>(head.size()));
  constexpr std::size_t chunk = 4096;
  std::vector<unsigned char> storage(std::min(trace.rows.size(), chunk) * binary_trace_record_size);
  unsigned char* const buf = storage.data();
  std::size_t n = 0;
  for (const trace_row& r : trace.rows) {
    unsigned char* p = buf + n * binary_trace_record_size;
    store_le<std::uint32_t>(p, r.turn);
    store_le<std::uint32_t>(p + 4, r.step);
    store_le<std::uint32_t>(p + 8, float_bits(r.weight));
    store_le<std::uint16_t>(p + 12, static_cast<std::uint16_t>(r.layer));
    store_le<std::uint16_t>(p + 14, static_cast<std::uint16_t>(r.expert));
    p[16] = r.slot;
    p[17] = static_cast<unsigned char>(r.phase);
    p[18] = r.residency;
    p[19] = static_cast<unsigned char>((r.expert_bytes != 0 ? 1 : 0) | ((r.dropped + 1) << 1));
    if (++n == chunk) {
      out.write(reinterpret_cast<const char*>(buf), static_cast<std::streamsize>(n * binary_trace_record_size));
      n = 0;
    }
  }
  out.write(reinterpret_cast<const char*>(buf), static_cast<std::streamsize>(n * binary_trace_record_size));
}
}  // namespace detail

inline void write_route_trace_binary(const validated_route_trace& trace, std::ostream& out) {
  detail::write_binary_rows(trace.trace(), out);
}

inline void write_route_trace_binary(const route_trace& trace, std::ostream& out) {
  detail::validate_rows(trace, "route_trace");
  detail::write_binary_rows(trace, out);
}

}  // namespace moe_residency
