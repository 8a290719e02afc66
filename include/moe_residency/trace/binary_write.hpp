#pragma once
/// The binary route trace writer: `write_route_trace_binary` and the header
/// and record encoding behind it (layout in detail/trace_binary.hpp). The
/// reader is trace/binary.hpp, which includes this header.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "moe_residency/detail/half.hpp"
#include "moe_residency/detail/trace_binary.hpp"
#include "moe_residency/detail/xxhash64.hpp"
#include "moe_residency/trace/types.hpp"
#include "moe_residency/trace/validate.hpp"

namespace moe_residency {

/// Writes the binary form, version 2 (20 bytes per row, a checksum per 4096 rows).
void write_route_trace_binary(const validated_route_trace& trace, std::ostream& out);
/// Validates the whole trace first and throws `error` before writing anything.
void write_route_trace_binary(const route_trace& trace, std::ostream& out);

namespace detail {

inline std::string binary_header_bytes(const trace_header& h, std::uint64_t n_rows,
                                       std::uint32_t version = binary_trace_version) {
  std::string out(binary_trace_fixed_header, '\0');
  auto* p = reinterpret_cast<unsigned char*>(&out[0]);
  std::memcpy(p, binary_trace_magic, 8);
  store_le<std::uint32_t>(p + 8, version);
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

// The writer proper: `trace` is known valid. Records go out in chunks of 4096
// (80 KiB) from the heap: a stack buffer that size overflowed small thread stacks.
// Version 2 (the default) follows the records with the header's checksum
// and one per chunk (a chunk is a checksummed block); version 1, the same
// records without them, is written only for the tests of the reader's
// compatibility path.
inline void write_binary_rows(const route_trace& trace, std::ostream& out,
                              std::uint32_t version = binary_trace_version) {
  const bool checked = version == binary_trace_version;
  const std::string head = binary_header_bytes(trace.header, trace.rows.size(), version);
  out.write(head.data(), static_cast<std::streamsize>(head.size()));
  std::string sums(8, '\0');
  store_le<std::uint64_t>(reinterpret_cast<unsigned char*>(&sums[0]),
                          xxh64(reinterpret_cast<const unsigned char*>(head.data()), head.size()));
  auto flush = [&](const unsigned char* buf, std::size_t n) {
    if (n == 0) return;
    out.write(reinterpret_cast<const char*>(buf), static_cast<std::streamsize>(n * binary_trace_record_size));
    if (!checked) return;
    unsigned char sum[8];
    store_le<std::uint64_t>(sum, xxh64(buf, n * binary_trace_record_size));
    sums.append(reinterpret_cast<const char*>(sum), 8);
  };
  constexpr std::size_t chunk = static_cast<std::size_t>(binary_trace_block_records);
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
      flush(buf, n);
      n = 0;
    }
  }
  flush(buf, n);
  if (checked) out.write(sums.data(), static_cast<std::streamsize>(sums.size()));
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
