#pragma once
/// Route traces: read and write the `route_trace v1` CSV that streaming
/// engines emit, a compact binary form of the same data, and the two views a
/// replay needs — the engine's load batches and one routing per (token, layer).
/// Parsing is strict: malformed input throws `moe_residency::error` naming the
/// file, line, column (1-based field) and offending value; nothing is half-loaded.
/// See docs/traces.md.
///
/// This header includes the whole of trace/, one header per job:
///   trace/types.hpp     trace_row, trace_header, route_trace, validated_route_trace
///   trace/validate.hpp  the row checker (row order state machine), validate_route_trace,
///                       with trace/row_values.hpp (columns, ranges, messages) and
///                       trace/token_layers.hpp (which layers each token routes)
///   trace/csv.hpp       CSV parser and writer
///   trace/binary.hpp    binary reader (the frame, then trace/binary_scan.hpp's scan,
///                       trace/binary_decode.hpp's decoders or trace/binary_exact.hpp's
///                       exact pass) and trace/binary_write.hpp's writer
///   trace/batches.hpp   group_load_batches, collect_routings
///   trace/first_layers.hpp  a trace's first n layers (a cut model's routing)
/// and read_route_trace, which picks the parser by the file's first byte.

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>

#include "moe_residency/detail/files.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/trace/batches.hpp"
#include "moe_residency/trace/binary.hpp"
#include "moe_residency/trace/csv.hpp"
#include "moe_residency/trace/first_layers.hpp"
#include "moe_residency/trace/types.hpp"
#include "moe_residency/trace/validate.hpp"

namespace moe_residency {

namespace detail {

/// Refuses, from its first bytes and its size alone, a file that cannot be a
/// route trace, with the message the whole parse would give: a binary
/// trace's fixed header must describe the file's size exactly, and a CSV
/// must begin with its magic line. A reader calls it before reading the rest
/// (read_input_file's head check), so a large file that is not a trace is
/// never read whole.
inline void check_route_trace_head(std::string_view head, std::uint64_t size, const std::string& source) {
  if (!head.empty() && static_cast<unsigned char>(head[0]) == 0x89) {
    (void)read_binary_trace_frame(head, size, source);
    return;
  }
  csv_parser(head, source).check_magic();
}

}  // namespace detail

/// Reads a trace file, CSV or binary (detected by its first bytes). Throws
/// `error` (naming the path, line/record, column and value) on any defect;
/// a file whose first bytes show it is no trace is refused before the rest
/// is read. Warnings (a binary file of version 1, which has no checksums)
/// go to `on_warning`, or to stderr when it is empty.
inline validated_route_trace read_route_trace(const std::string& path, const warning_sink& on_warning = {}) {
  const std::string bytes = detail::read_input_file(
      path, "a route trace file (CSV or binary)",
      [&path](std::string_view head, std::uint64_t size) { detail::check_route_trace_head(head, size, path); });
  if (!bytes.empty() && static_cast<unsigned char>(bytes[0]) == 0x89)
    return parse_route_trace_binary(bytes, path, on_warning);
  return parse_route_trace_csv(bytes, path);
}

}  // namespace moe_residency
