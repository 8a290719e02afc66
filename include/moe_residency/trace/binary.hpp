#pragma once
/// The compact binary route trace (20 bytes per row; layout in
/// detail/trace_binary.hpp): a reader that validates every row as the CSV
/// parser does, and a writer. See docs/traces.md.
///
/// This header holds the reader: the file's frame and checksums, then the
/// records through three passes that must agree, one header each, which the
/// tests hold to one another (a change to a check is made in all three):
///   trace/binary_scan.hpp    the fast scan (vector lanes and their scalar twin)
///   trace/binary_decode.hpp  the decoders (vector tail, 64-bit words, member by member)
///   trace/binary_exact.hpp   the exact pass, whose messages the reader throws
/// It includes the writer, trace/binary_write.hpp.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moe_residency/detail/trace_binary.hpp"
#include "moe_residency/detail/trace_text.hpp"
#include "moe_residency/detail/xxhash64.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/trace/binary_decode.hpp"
#include "moe_residency/trace/binary_exact.hpp"
#include "moe_residency/trace/binary_scan.hpp"
#include "moe_residency/trace/binary_vector.hpp"
#include "moe_residency/trace/binary_write.hpp"
#include "moe_residency/trace/types.hpp"
#include "moe_residency/trace/validate.hpp"

namespace moe_residency {

/// Parses the binary form. `source_name` prefixes error messages ("record i,
/// column c: ..."). A version 1 file (no checksums) is read, and a warning
/// sent to `on_warning` (stderr when empty) says so.
validated_route_trace parse_route_trace_binary(std::string_view bytes, const std::string& source_name,
                                               const warning_sink& on_warning = {});

namespace detail {

/// Version 2's checksums, the file's size already checked: the header's, then
/// each block's, against the ones stored after the records. Throws `error`
/// naming the part whose bytes (or stored checksum) are damaged.
inline void check_binary_checksums(const unsigned char* b, std::size_t layers_end, std::uint64_t n_rows,
                                   const std::string& source_name) {
  auto hex = [](std::uint64_t v) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
    return std::string(buf);
  };
  const unsigned char* const records = b + layers_end;
  const unsigned char* const sums = records + static_cast<std::size_t>(n_rows) * binary_trace_record_size;
  const std::uint64_t header = xxh64(b, layers_end), header_stored = load_le<std::uint64_t>(sums);
  if (header != header_stored)
    throw error(source_name + ": header checksum (XXH64) " + hex(header) + ", stored " + hex(header_stored) +
                ": the header (bytes 0 to " + std::to_string(layers_end - 1) + ") or its checksum is damaged");
  const std::uint64_t blocks = (n_rows + binary_trace_block_records - 1) / binary_trace_block_records;
  for (std::uint64_t k = 0; k < blocks; ++k) {
    const std::uint64_t first = k * binary_trace_block_records;
    const std::uint64_t count = std::min(binary_trace_block_records, n_rows - first);
    const std::uint64_t sum = xxh64(records + static_cast<std::size_t>(first) * binary_trace_record_size,
                                    static_cast<std::size_t>(count) * binary_trace_record_size);
    const std::uint64_t stored = load_le<std::uint64_t>(sums + 8 + 8 * static_cast<std::size_t>(k));
    if (sum != stored)
      throw error(source_name + ": records " + std::to_string(first) + " to " + std::to_string(first + count - 1) +
                  " (block " + std::to_string(k) + " of " + std::to_string(blocks) + "): checksum (XXH64) " + hex(sum) +
                  ", stored " + hex(stored) + ": a byte in them or their checksum is damaged");
  }
}

/// Which pass reads the records: the reader's (scan, then decode; the exact
/// pass only for a refused file's message) or the exact pass alone (the
/// benchmark's and the tests' reference).
enum class binary_rows_pass : std::uint8_t { scan_then_decode, exact };

/// What a binary trace's fixed header says about the file: its version, the
/// lengths of its parts, and where its records begin.
struct binary_trace_frame {
  std::uint32_t version = 0;
  bool checked = false;  ///< version 2: checksums after the records
  std::uint32_t flags = 0;
  std::uint32_t n_layer = 0, n_expert = 0, n_expert_used = 0;
  std::uint64_t n_rows = 0;
  std::uint32_t model_len = 0, arch_len = 0;
  binary_trace_extent extent{};
};

/// Reads and checks the fixed header (the first binary_trace_fixed_header
/// bytes of `head`) against the file's total `size`: magic, version, record
/// size, flags, layer count, and that the header, the records and their
/// checksums fill the file exactly. Needs only the file's first bytes, so a
/// reader can refuse a large file that is not a trace before reading it
/// whole. Throws `error` prefixed with `source_name`.
inline binary_trace_frame read_binary_trace_frame(std::string_view head, std::uint64_t size,
                                                  const std::string& source_name) {
  const auto* b = reinterpret_cast<const unsigned char*>(head.data());
  auto fail = [&](const std::string& m) -> error { return error(source_name + ": " + m); };
  if (size < 8 || head.size() < 8 || std::memcmp(b, binary_trace_magic, 8) != 0)
    throw fail("not a binary route trace: bad magic " + quote_field(head.substr(0, 8)) + "; expected '\\x89MRTRACE'");
  if (size < binary_trace_fixed_header || head.size() < binary_trace_fixed_header)
    throw fail("truncated: " + std::to_string(size) + " bytes; the fixed header alone is " +
               std::to_string(binary_trace_fixed_header));
  binary_trace_frame f;
  f.version = load_le<std::uint32_t>(b + 8);
  if (f.version != binary_trace_version && f.version != binary_trace_version_unchecked)
    throw fail("unsupported binary version " + std::to_string(f.version) + "; this reader supports " +
               std::to_string(binary_trace_version_unchecked) + " and " + std::to_string(binary_trace_version));
  f.checked = f.version == binary_trace_version;
  const std::uint32_t record_size = load_le<std::uint32_t>(b + 12);
  if (record_size != binary_trace_record_size)
    throw fail("record size " + std::to_string(record_size) + "; expected " + std::to_string(binary_trace_record_size) +
               " for version " + std::to_string(f.version));
  f.flags = load_le<std::uint32_t>(b + 16);
  if (f.flags > 1) throw fail("header flags " + std::to_string(f.flags) + " have unknown bits; expected 0 or 1");
  f.n_layer = load_le<std::uint32_t>(b + 20);
  f.n_expert = load_le<std::uint32_t>(b + 24);
  f.n_expert_used = load_le<std::uint32_t>(b + 28);
  f.n_rows = load_le<std::uint64_t>(b + 32);
  f.model_len = load_le<std::uint32_t>(b + 40);
  f.arch_len = load_le<std::uint32_t>(b + 44);
  if (f.n_layer < 1 || f.n_layer > 65535)
    throw fail("header: n_layer " + std::to_string(f.n_layer) + " out of range [1, 65535]");
  // In 64 bits, and compared with the size before any offset becomes a size_t.
  f.extent = binary_trace_header_extent(f.model_len, f.arch_len, f.n_layer);
  if (size < f.extent.layers_end)
    throw fail("truncated: " + std::to_string(size) + " bytes; the header needs " +
               std::to_string(f.extent.layers_end));
  const std::uint64_t body = size - f.extent.layers_end;
  if (body / binary_trace_record_size < f.n_rows)
    throw fail("truncated: " + std::to_string(body) + " bytes of records for " + std::to_string(f.n_rows) +
               " rows; expected " + std::to_string(f.n_rows * binary_trace_record_size) +
               (f.checked ? " and their checksums" : ""));
  // n_rows <= body / 20 from here: nothing below wraps.
  const std::uint64_t expected_body =
      f.n_rows * binary_trace_record_size + (f.checked ? binary_trace_trailer_size(f.n_rows) : 0);
  if (body < expected_body)
    throw fail("truncated: " + std::to_string(body) + " bytes of records and checksums for " +
               std::to_string(f.n_rows) + " rows; expected " + std::to_string(expected_body));
  if (body != expected_body)
    throw fail(std::to_string(body - expected_body) + " bytes after the last " + (f.checked ? "checksum of " : "of ") +
               std::to_string(f.n_rows) + " records; expected the file to end there");
  // The declared shape bounded before anything is sized from it (an n_expert
  // outside [1, 65535] is the header check's, with its own message).
  if (f.n_expert >= 1 && f.n_expert <= 65535)
    if (const std::string p = expert_slots_problem(f.n_layer, f.n_expert); !p.empty()) throw fail("header: " + p);
  return f;
}

inline validated_route_trace parse_route_trace_binary_with(std::string_view bytes, const std::string& source_name,
                                                           binary_rows_pass pass) {
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  auto fail = [&](const std::string& m) -> error { return error(source_name + ": " + m); };
  const binary_trace_frame f = read_binary_trace_frame(bytes, bytes.size(), source_name);
  route_trace t;
  t.binary_version = f.version;
  trace_header& h = t.header;
  h.has_dropped_column = f.flags & 1;
  h.n_layer = f.n_layer;
  h.n_expert = f.n_expert;
  h.n_expert_used = f.n_expert_used;
  const std::uint64_t n_rows = f.n_rows;
  const std::uint32_t model_len = f.model_len, arch_len = f.arch_len;
  const bool checked = f.checked;
  const std::size_t strings_end = static_cast<std::size_t>(f.extent.strings_end);
  const std::size_t layers_end = static_cast<std::size_t>(f.extent.layers_end);
  if (checked) check_binary_checksums(b, layers_end, n_rows, source_name);
  // The layout's padding is zero; anything else means the lengths do not describe the file.
  auto check_padding = [&](std::uint64_t from, std::uint64_t to, const char* after) {
    for (std::uint64_t i = from; i < to; ++i)
      if (b[i] != 0)
        throw fail("header: padding byte at offset " + std::to_string(i) + " after the " + after + " is " +
                   std::to_string(b[i]) + "; expected 0");
  };
  check_padding(binary_trace_fixed_header + std::uint64_t{model_len} + arch_len, strings_end, "model and arch strings");
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
      throw fail("header: layer " + std::to_string(l) + " listed flag " + std::to_string(listed) + "; expected 0 or 1");
    h.layer_listed[l] = listed != 0;
    if (!listed && (h.expert_bytes[l] || h.dense_bytes[l]))
      throw fail("header: layer " + std::to_string(l) + " has bytes but no '# layer=' line flag");
  }
  if (const std::string p = header_problem(h); !p.empty()) throw fail("header: " + p);

  const unsigned char* const records = b + layers_end;
  if (pass == binary_rows_pass::scan_then_decode) {
    // The fast pass over a chunk of records (in L1), then the chunk decoded
    // straight into the rows' storage (reserved once: no per-row capacity
    // check, no value-initialising pass). Only a refused file goes through
    // the exact pass below, from the start, for its message.
    t.rows.reserve(static_cast<std::size_t>(n_rows));
    binary_record_scanner scanner(h);
    const std::uint64_t* const layer_bytes = h.expert_bytes.data();
    constexpr std::uint64_t chunk = 512;
    bool ok = true;
    for (std::uint64_t i = 0; i < n_rows && ok; i += chunk) {
      const std::size_t n = static_cast<std::size_t>(std::min(chunk, n_rows - i));
      const unsigned char* const rp = records + i * binary_trace_record_size;
      ok = scanner.check(rp, n);
      if (ok) append_binary_rows(t.rows, rp, n, layer_bytes);
    }
    ok = ok && scanner.finish();
    if (ok) return trace_access::make(std::move(t));
    t.rows.clear();
  }
  // Throws for a file the scanner refused (the scanner is never looser than
  // this pass, and tests/test_trace_errors.cpp holds them to the same verdict).
  read_binary_rows_exact(records, n_rows, h, t.rows, source_name);
  return trace_access::make(std::move(t));
}

}  // namespace detail

inline validated_route_trace parse_route_trace_binary(std::string_view bytes, const std::string& source_name,
                                                      const warning_sink& on_warning) {
  validated_route_trace t =
      detail::parse_route_trace_binary_with(bytes, source_name, detail::binary_rows_pass::scan_then_decode);
  if (t.binary_version() == detail::binary_trace_version_unchecked)
    detail::emit_warning(on_warning,
                         source_name +
                             ": binary trace version 1 has no checksums, so a damaged byte that still parses goes "
                             "unnoticed; rewrite it as version 2 (moe-residency convert --to binary)");
  return t;
}

}  // namespace moe_residency
