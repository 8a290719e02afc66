#pragma once
/// Route trace types: one routed expert (`trace_row`), the header
/// (`trace_header`), a trace being built or edited (`route_trace`, open
/// fields) and a trace known to be valid (`validated_route_trace`, which only
/// the parsers and `validate_route_trace` create, so code that takes one never
/// checks it again). See docs/traces.md.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/detail/trace_text.hpp"
#include "moe_residency/error.hpp"

/// The most (layer, expert) pairs a trace's shape may declare, n_layer ×
/// n_expert: every replay, cache policy and predictor sizes a table of one
/// entry per pair from it, so a file of a few hundred bytes declaring 65535
/// layers × 65535 experts would otherwise ask for 4.3 billion entries. The
/// largest MoE models have about 25 000 (61 layers × 384 experts); the
/// default allows 40 times that. Override it before including any header.
#ifndef MOE_RESIDENCY_MAX_EXPERT_SLOTS
#define MOE_RESIDENCY_MAX_EXPERT_SLOTS 1048576
#endif

namespace moe_residency {

/// MOE_RESIDENCY_MAX_EXPERT_SLOTS: the largest n_layer × n_expert a trace may declare.
inline constexpr std::uint64_t max_expert_slots = MOE_RESIDENCY_MAX_EXPERT_SLOTS;

/// One routed expert: one row of the CSV. 32 bytes: the members are ordered by
/// size, not as the CSV's columns (a row in CSV order padded to 48 bytes, and
/// every reader, replay and copy moved half as much again).
struct trace_row {
  std::uint32_t turn = 0;
  std::uint32_t step = 0;  ///< absolute position of the token
  float weight = 0;        ///< final applied routing weight; may be NaN
  layer_id layer{};
  expert_id expert{};
  std::uint8_t slot = 0;  ///< rank, 0 = highest weight
  run_phase phase = run_phase::decode;
  std::uint8_t residency = 0;      ///< 0 miss, 1 hit, 2 hit thanks to a speculative read
  std::int8_t dropped = -1;        ///< 1 skipped by a drop policy, 0 not; -1 when the column is absent
  std::uint64_t expert_bytes = 0;  ///< bytes this routing read: 0, or the layer's expert bytes
};

/// The trace's header lines.
struct trace_header {
  std::string model, arch;
  std::size_t n_layer = 0, n_expert = 0, n_expert_used = 0;
  /// Per layer (n_layer entries), from the "# layer=" lines; 0 for a layer without one.
  std::vector<std::uint64_t> expert_bytes, dense_bytes;
  bool has_dropped_column = false;
  /// Which layers had a "# layer=" line, so a write reproduces exactly those.
  /// Empty means every layer has one.
  std::vector<bool> layer_listed;
};

/// A whole route trace: header and rows in the file's order (validated: see
/// docs/traces.md, "Row order").

/// A route trace: header and rows in the file's order. Its fields are open, for
/// a host that records a trace row by row; nothing checks them until the trace
/// is written, grouped or passed to `validate_route_trace` (see docs/traces.md,
/// "Row order"). The parsers return a `validated_route_trace`.
class route_trace {
 public:
  trace_header header;
  std::vector<trace_row> rows;
  /// CSV weights whose text is not what the engine's "%g" prints for the
  /// parsed float (e.g. "0.50", "1e-3", more than 6 significant digits). The
  /// value is kept as the nearest float; a write prints that float with
  /// "%g", so such a file does not round-trip byte for byte. Every weight the
  /// engine writes is canonical; binary traces always report 0.
  std::size_t noncanonical_weights = 0;
  /// The binary form's version the trace was read from: 2 (checksummed), 1
  /// (the first form, without checksums: read with a warning), or 0 when it
  /// was read from a CSV or built by hand.
  std::uint32_t binary_version = 0;

  /// The model shape: name = arch, n_expert experts, top-k = n_expert_used,
  /// per-layer expert bytes. A layer without a "# layer=" line or with 0
  /// expert bytes is dense if never routed; if routed, this throws `error`
  /// (as it does for k > 32, which model_shape cannot represent).
  model_shape shape() const;
};

namespace detail {
struct trace_access;
}

/// A route trace that passed every check of docs/traces.md. Created only by the
/// parsers (`read_route_trace`, `parse_route_trace_csv/_binary`) and by
/// `validate_route_trace`, and read-only, so the writers, `group_load_batches`
/// and `collect_routings` trust it instead of validating it again.
/// `route_trace t = read_route_trace(path);` still compiles (it moves the
/// trace out and gives up the guarantee); keep the validated type (`auto`) to
/// avoid a second validation downstream.
class validated_route_trace {
 public:
  const trace_header& header() const noexcept { return t_.header; }
  const std::vector<trace_row>& rows() const noexcept { return t_.rows; }
  /// See route_trace::noncanonical_weights.
  std::size_t noncanonical_weights() const noexcept { return t_.noncanonical_weights; }
  /// See route_trace::binary_version.
  std::uint32_t binary_version() const noexcept { return t_.binary_version; }
  /// See route_trace::shape().
  model_shape shape() const { return t_.shape(); }
  /// The trace, read-only.
  const route_trace& trace() const& noexcept { return t_; }
  /// Moves the trace out, to edit it (it must be validated again after).
  route_trace release() && noexcept { return std::move(t_); }
  operator route_trace() && noexcept { return std::move(t_); }

 private:
  friend struct detail::trace_access;
  explicit validated_route_trace(route_trace&& t) noexcept : t_(std::move(t)) {}
  route_trace t_;
};

namespace detail {

/// The one door to validated_route_trace's constructor: used by the parsers
/// and validate_route_trace after they checked every row.
struct trace_access {
  static validated_route_trace make(route_trace&& t) noexcept { return validated_route_trace(std::move(t)); }
};

/// A header string of `bytes` bytes against the binary form's 32-bit length:
/// "" when it fits, else what is wrong (never cut to fit).
inline std::string header_string_length_problem(const char* field, std::uint64_t bytes) {
  constexpr std::uint64_t limit = 0xFFFFFFFFu;
  if (bytes <= limit) return {};
  return std::string(field) + " is " + std::to_string(bytes) + " bytes; expected at most " + std::to_string(limit) +
         " (the binary form stores a 32-bit length)";
}

/// A declared shape against max_expert_slots, before anything is sized from
/// it: "" when n_layer × n_expert fits, else what is wrong.
inline std::string expert_slots_problem(std::uint64_t n_layer, std::uint64_t n_expert) {
  if (n_layer * n_expert <= max_expert_slots) return {};  // both <= 65535: no wrap
  return "n_layer " + std::to_string(n_layer) + " x n_expert " + std::to_string(n_expert) + " = " +
         std::to_string(n_layer * n_expert) + " expert slots; expected at most " + std::to_string(max_expert_slots) +
         " (MOE_RESIDENCY_MAX_EXPERT_SLOTS: a replay sizes its tables by layer x expert)";
}

/// Header consistency shared by the parsers and the writers; "" when fine.
inline std::string header_problem(const trace_header& h) {
  if (h.n_layer < 1 || h.n_layer > 65535) return "n_layer " + std::to_string(h.n_layer) + " out of range [1, 65535]";
  if (h.n_expert < 1 || h.n_expert > 65535)
    return "n_expert " + std::to_string(h.n_expert) + " out of range [1, 65535]";
  if (std::string p = expert_slots_problem(h.n_layer, h.n_expert); !p.empty()) return p;
  const std::size_t kmax = std::min<std::size_t>(h.n_expert, 256);
  if (h.n_expert_used < 1 || h.n_expert_used > kmax)
    return "n_expert_used " + std::to_string(h.n_expert_used) + " out of range [1, " + std::to_string(kmax) +
           "] (at most n_expert and 256)";
  if (h.expert_bytes.size() != h.n_layer || h.dense_bytes.size() != h.n_layer)
    return "expert_bytes has " + std::to_string(h.expert_bytes.size()) + " and dense_bytes " +
           std::to_string(h.dense_bytes.size()) + " entries; expected n_layer (" + std::to_string(h.n_layer) + ") each";
  if (!h.layer_listed.empty() && h.layer_listed.size() != h.n_layer)
    return "layer_listed has " + std::to_string(h.layer_listed.size()) + " entries; expected 0 or n_layer (" +
           std::to_string(h.n_layer) + ")";
  if (std::string p = header_string_length_problem("model", h.model.size()); !p.empty()) return p;
  if (std::string p = header_string_length_problem("arch", h.arch.size()); !p.empty()) return p;
  if (h.arch.find_first_of(" \n\r") != std::string::npos)
    return "arch " + quote_field(h.arch) + " contains a space or line break";
  if (h.model.find_first_of("\n\r") != std::string::npos)
    return "model " + quote_field(h.model) + " contains a line break";
  // The CSV header line runs the model up to its " arch=" field, and drops a trailing space.
  if (h.model.find(" arch=") != std::string::npos || (!h.model.empty() && h.model.back() == ' '))
    return "model " + quote_field(h.model) + " contains ' arch=' or ends in a space; the CSV form cannot hold it";
  return {};
}

}  // namespace detail

inline model_shape route_trace::shape() const {
  if (const std::string p = detail::header_problem(header); !p.empty()) throw error("route_trace: header: " + p);
  std::vector<bool> routed(header.n_layer, false);
  for (const trace_row& r : rows)
    if (to_index(r.layer) < header.n_layer) routed[to_index(r.layer)] = true;
  std::vector<bool> is_moe(header.n_layer, false);
  for (std::size_t l = 0; l < header.n_layer; ++l) {
    const bool listed = header.layer_listed.empty() || header.layer_listed[l];
    if (header.expert_bytes[l] != 0 && listed) {
      is_moe[l] = true;
    } else if (routed[l]) {
      throw error("route_trace '" + header.arch + "': layer " + std::to_string(l) + " is routed but has " +
                  (listed ? "0 expert bytes" : "no '# layer=' line") + "; expected its expert bytes > 0");
    }
  }
  std::vector<std::uint64_t> bytes(header.n_layer, 0);
  for (std::size_t l = 0; l < header.n_layer; ++l)
    if (is_moe[l]) bytes[l] = header.expert_bytes[l];
  return model_shape(header.arch, header.n_expert, header.n_expert_used, std::move(bytes), std::move(is_moe));
}

}  // namespace moe_residency
