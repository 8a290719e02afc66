#pragma once
/// Route traces: read and write the `route_trace v1` CSV that streaming
/// engines emit, a compact binary form of the same data, and the two views a
/// replay needs — the engine's load batches and one routing per (token, layer).
/// Parsing is strict: malformed input throws `moe_residency::error` naming the
/// file, line, column (1-based field) and offending value; nothing is half-loaded.
/// See docs/traces.md.

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/detail/trace_binary.hpp"
#include "moe_residency/detail/trace_text.hpp"
#include "moe_residency/error.hpp"

namespace moe_residency {

/// One routed expert: one row of the CSV.
struct trace_row {
  std::uint32_t turn = 0;
  run_phase phase = run_phase::decode;
  std::uint32_t step = 0;  ///< absolute position of the token
  layer_id layer{};
  std::uint8_t slot = 0;  ///< rank, 0 = highest weight
  expert_id expert{};
  float weight = 0;  ///< final applied routing weight; may be NaN
  std::uint8_t residency = 0;  ///< 0 miss, 1 hit, 2 hit thanks to a speculative read
  std::uint64_t expert_bytes = 0;  ///< bytes this routing read: 0, or the layer's expert bytes
  std::int8_t dropped = -1;  ///< 1 skipped by a drop policy, 0 not; -1 when the column is absent
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

  /// The model shape: name = arch, n_expert experts, top-k = n_expert_used,
  /// per-layer expert bytes. A layer without a "# layer=" line or with 0
  /// expert bytes is dense if never routed; if routed, this throws `error`
  /// (as it does for k > 32, which model_shape cannot represent).
  model_shape shape() const;
};

/// Reads a trace file, CSV or binary (detected by its first bytes). Throws
/// `error` (naming the path, line/record, column and value) on any defect.
route_trace read_route_trace(const std::string& path);
/// Parses route_trace v1 CSV text. `source_name` prefixes error messages.
route_trace parse_route_trace_csv(std::string_view text, const std::string& source_name);
/// Parses the binary form (see detail/trace_binary.hpp for the layout).
route_trace parse_route_trace_binary(std::string_view bytes, const std::string& source_name);
/// Writes route_trace v1 CSV exactly as the engine does (weights "%g").
/// Validates the whole trace first and throws `error` before writing anything.
void write_route_trace_csv(const route_trace& trace, std::ostream& out);
/// Writes the binary form (20 bytes per row). Validates first, like the CSV writer.
void write_route_trace_binary(const route_trace& trace, std::ostream& out);
/// Throws `error` ("<source_name>: rows[i], column <name>: ...") unless the
/// trace is one the parsers would have produced. Both writers call it.
void validate_route_trace(const route_trace& trace, const std::string& source_name = "route_trace");

/// One load batch of the engine: the experts one layer demanded at once.
struct load_batch {
  run_phase phase;
  std::uint32_t turn;
  std::uint32_t step;  ///< the first token's position
  layer_id layer;
  std::uint32_t first;  ///< index of the batch's first id in load_batches::experts (and in rows)
  std::uint32_t count;  ///< ids in the batch, duplicates included
};

/// The engine's load batches in execution order.
struct load_batches {
  /// Routed ids, batch after batch; token-major inside a prefill batch;
  /// duplicates kept. `experts[i]` is `rows[i].expert` of the trace.
  std::vector<expert_id> experts;
  std::vector<load_batch> batches;
  span<const expert_id> experts_of(const load_batch& b) const noexcept {
    return span<const expert_id>(experts.data() + b.first, b.count);
  }
};

/// Groups rows into the engine's load batches: prefill is one batch per
/// (turn, layer) holding every prompt token's ids, token-major (a new batch
/// also starts where the layer goes back down, i.e. at the next ubatch);
/// decode is one batch per (token, layer). Validates the trace first.
load_batches group_load_batches(const route_trace& trace);

/// One routing per (turn, phase, step, layer), ids and weights in rank
/// order; `declined` counts routings wider than 32, which are left out.
struct trace_routings {
  std::vector<routing> routings;
  std::size_t declined = 0;
};
trace_routings collect_routings(const route_trace& trace);

// ---------------------------------------------------------------------------
// Implementation.

namespace detail {

/// The columns of a row, numbered as in error messages (1-based).
enum class trace_column : std::uint8_t {
  turn = 1, phase, step, layer, slot, expert, weight, residency, expert_bytes, dropped
};

inline const char* column_name(trace_column c) noexcept {
  static const char* const names[] = {"",     "turn",   "phase",  "step",      "layer",       "slot",
                                      "expert", "weight", "residency", "expert_bytes", "dropped"};
  return names[static_cast<int>(c)];
}

inline constexpr std::string_view csv_columns =
    "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes";
inline constexpr std::string_view csv_columns_dropped =
    "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped";
inline constexpr std::string_view csv_magic = "# route_trace v1";

struct trace_issue {
  trace_column column = trace_column::turn;
  std::string message;
};

inline std::string range_message(const char* what, std::uint64_t v, std::uint64_t end) {
  return std::string(what) + " " + std::to_string(v) + " out of range [0, " + std::to_string(end) + ")";
}
inline std::string phase_message(std::uint64_t v) {
  return "phase " + std::to_string(v) + " out of range; expected 0 (prefill) or 1 (decode)";
}
inline std::string residency_message(std::uint64_t v) {
  return "residency " + std::to_string(v) +
         " out of range; expected 0 (miss), 1 (hit) or 2 (hit thanks to a speculative read)";
}
inline std::string dropped_message(std::uint64_t v) {
  return "dropped " + std::to_string(v) + " out of range; expected 0 or 1";
}
inline std::string slot_message(std::uint64_t v, std::size_t k) {
  return "slot " + std::to_string(v) + " out of range [0, " + std::to_string(k) +
         ") (n_expert_used=" + std::to_string(k) + ")";
}

/// Header consistency shared by the parsers and the writers; "" when fine.
inline std::string header_problem(const trace_header& h) {
  if (h.n_layer < 1 || h.n_layer > 65535)
    return "n_layer " + std::to_string(h.n_layer) + " out of range [1, 65535]";
  if (h.n_expert < 1 || h.n_expert > 65535)
    return "n_expert " + std::to_string(h.n_expert) + " out of range [1, 65535]";
  const std::size_t kmax = std::min<std::size_t>(h.n_expert, 256);
  if (h.n_expert_used < 1 || h.n_expert_used > kmax)
    return "n_expert_used " + std::to_string(h.n_expert_used) + " out of range [1, " +
           std::to_string(kmax) + "] (at most n_expert and 256)";
  if (h.expert_bytes.size() != h.n_layer || h.dense_bytes.size() != h.n_layer)
    return "expert_bytes has " + std::to_string(h.expert_bytes.size()) + " and dense_bytes " +
           std::to_string(h.dense_bytes.size()) + " entries; expected n_layer (" +
           std::to_string(h.n_layer) + ") each";
  if (!h.layer_listed.empty() && h.layer_listed.size() != h.n_layer)
    return "layer_listed has " + std::to_string(h.layer_listed.size()) +
           " entries; expected 0 or n_layer (" + std::to_string(h.n_layer) + ")";
  if (h.arch.find_first_of(" \n\r") != std::string::npos)
    return "arch " + quote_field(h.arch) + " contains a space or line break";
  if (h.model.find_first_of("\n\r") != std::string::npos)
    return "model " + quote_field(h.model) + " contains a line break";
  // The CSV header line runs the model up to its " arch=" field, and drops a trailing space.
  if (h.model.find(" arch=") != std::string::npos || (!h.model.empty() && h.model.back() == ' '))
    return "model " + quote_field(h.model) + " contains ' arch=' or ends in a space; the CSV form cannot hold it";
  return {};
}

/// Checks rows one at a time, in order: value ranges against the header,
/// the expert_bytes rule, slots in rank order, distinct experts per routing,
/// and the row order (see docs/traces.md). No allocation unless a row fails.
class trace_row_checker {
 public:
  /// `h` must satisfy header_problem(h).empty().
  explicit trace_row_checker(const trace_header& h)
      : h_(h),
        layer_bytes_(h.expert_bytes.data()),
        n_layer_(h.n_layer),
        n_expert_(h.n_expert),
        k_(h.n_expert_used),
        has_dropped_(h.has_dropped_column),
        stamp_(h.n_expert, 0) {}

  /// True when `r` may follow the rows checked so far; otherwise fills
  /// `issue` and leaves the checker's state as it was.
  bool check(const trace_row& r, trace_issue& issue) {
    const fault f = find_fault(r);
    if (f == fault::none) return true;
    describe(f, r, issue);
    return false;
  }

 private:
  enum class fault : std::uint8_t {
    none, phase, layer_range, layer_unlisted, layer_zero, slot_range, expert_range, residency,
    bytes_mismatch, bytes_on_hit, dropped_range, dropped_absent, slot_order, slot_start, duplicate_expert,
    turn_back, prefill_after_decode, decode_step_back, decode_layer_back, prefill_step_back, prefill_overlap
  };

  // The hot path: comparisons only, state updated only when the row passes.
  fault find_fault(const trace_row& r) noexcept {
    const auto phase = static_cast<std::uint8_t>(r.phase);
    if (phase > 1) return fault::phase;
    const std::size_t layer = to_index(r.layer);
    if (layer >= n_layer_) return fault::layer_range;
    const std::uint64_t layer_bytes = layer_bytes_[layer];
    if (layer_bytes == 0)
      return !h_.layer_listed.empty() && !h_.layer_listed[layer] ? fault::layer_unlisted : fault::layer_zero;
    if (r.slot >= k_) return fault::slot_range;
    const std::size_t expert = to_index(r.expert);
    if (expert >= n_expert_) return fault::expert_range;
    if (r.residency > 2) return fault::residency;
    if (r.expert_bytes != 0) {
      if (r.expert_bytes != layer_bytes) return fault::bytes_mismatch;
      if (r.residency != 0) return fault::bytes_on_hit;
    }
    if (has_dropped_ ? (r.dropped != 0 && r.dropped != 1) : r.dropped != -1)
      return has_dropped_ ? fault::dropped_range : fault::dropped_absent;

    const bool same_routing = has_prev_ && r.turn == prev_turn_ && r.phase == prev_phase_ &&
                              r.step == prev_step_ && r.layer == prev_layer_;
    if (same_routing) {
      if (r.slot != prev_slot_ + 1) return fault::slot_order;
      if ((stamp_[expert] >> 8) == routing_) return fault::duplicate_expert;
    } else {
      if (r.slot != 0) return fault::slot_start;
      const fault f = order_fault(r);
      if (f != fault::none) return f;
      commit_new_routing(r);
    }
    stamp_[expert] = routing_ << 8 | r.slot;
    prev_slot_ = r.slot;
    return fault::none;
  }

  // A new routing (turn, phase, step, layer) begins at r: is it in order?
  fault order_fault(const trace_row& r) const noexcept {
    if (!has_prev_ || r.turn > prev_turn_) return fault::none;  // a new turn starts afresh
    if (r.turn < prev_turn_) return fault::turn_back;
    if (r.phase == run_phase::prefill && prev_phase_ == run_phase::decode) return fault::prefill_after_decode;
    if (r.phase == run_phase::decode) {
      if (prev_phase_ == run_phase::prefill) return fault::none;
      if (r.step < prev_step_) return fault::decode_step_back;
      if (r.step == prev_step_ && r.layer < prev_layer_) return fault::decode_layer_back;
      return fault::none;
    }
    // Prefill rows are layer-major: within a layer steps ascend; a lower
    // layer starts the next prompt batch (ubatch), whose tokens all follow
    // the earlier batches' tokens.
    if (r.layer == prev_layer_ && r.step < prev_step_) return fault::prefill_step_back;
    const bool floor_set = floor_set_ || r.layer < prev_layer_;
    const std::uint32_t floor = r.layer < prev_layer_ ? max_step_ : floor_;
    if (floor_set && r.step <= floor) return fault::prefill_overlap;
    return fault::none;
  }

  void commit_new_routing(const trace_row& r) noexcept {
    const bool new_turn = !has_prev_ || r.turn != prev_turn_;
    if (new_turn) {
      prefill_any_ = false;
      floor_set_ = false;
    }
    if (r.phase == run_phase::prefill) {
      if (!new_turn && prev_phase_ == run_phase::prefill && r.layer < prev_layer_) {
        floor_ = max_step_;
        floor_set_ = true;
      }
      max_step_ = prefill_any_ ? std::max(max_step_, r.step) : r.step;
      prefill_any_ = true;
    }
    ++routing_;
    has_prev_ = true;
    prev_turn_ = r.turn;
    prev_phase_ = r.phase;
    prev_step_ = r.step;
    prev_layer_ = r.layer;
  }

  // The cold path: words for a fault, from the state before the row.
  void describe(fault f, const trace_row& r, trace_issue& issue) const {
    using std::to_string;
    const std::size_t layer = to_index(r.layer);
    const std::string turn = to_string(r.turn);
    auto set = [&issue](trace_column c, std::string m) {
      issue.column = c;
      issue.message = std::move(m);
    };
    switch (f) {
      case fault::none: break;
      case fault::phase: set(trace_column::phase, phase_message(static_cast<std::uint8_t>(r.phase))); break;
      case fault::layer_range: set(trace_column::layer, range_message("layer", layer, h_.n_layer)); break;
      case fault::layer_unlisted:
        set(trace_column::layer, "layer " + to_string(layer) +
                                     " is routed but has no '# layer=' line; expected its expert bytes in the header");
        break;
      case fault::layer_zero:
        set(trace_column::layer, "layer " + to_string(layer) + " is routed but its expert_bytes is 0; expected > 0");
        break;
      case fault::slot_range: set(trace_column::slot, slot_message(r.slot, h_.n_expert_used)); break;
      case fault::expert_range:
        set(trace_column::expert, range_message("expert", to_index(r.expert), h_.n_expert));
        break;
      case fault::residency: set(trace_column::residency, residency_message(r.residency)); break;
      case fault::bytes_mismatch:
        set(trace_column::expert_bytes, "expert_bytes " + to_string(r.expert_bytes) + " for layer " +
                                            to_string(layer) + "; expected 0 or the layer's " +
                                            to_string(h_.expert_bytes[layer]));
        break;
      case fault::bytes_on_hit:
        set(trace_column::expert_bytes, "expert_bytes " + to_string(r.expert_bytes) + " on a hit (residency " +
                                            to_string(r.residency) + "); expected 0 (only a miss reads)");
        break;
      case fault::dropped_range:
        set(trace_column::dropped, "dropped " + to_string(r.dropped) + " out of range; expected 0 or 1");
        break;
      case fault::dropped_absent:
        set(trace_column::dropped,
            "dropped " + to_string(r.dropped) + " but the trace has no dropped column; expected -1");
        break;
      case fault::slot_order:
        set(trace_column::slot, "slot " + to_string(r.slot) + " after slot " + to_string(prev_slot_) +
                                    " of the same routing; expected " + to_string(prev_slot_ + 1) +
                                    " (rows in rank order)");
        break;
      case fault::slot_start:
        set(trace_column::slot,
            "slot " + to_string(r.slot) + " starts a routing; expected 0 (rows in rank order)");
        break;
      case fault::duplicate_expert:
        set(trace_column::expert, "expert " + to_string(to_index(r.expert)) + " already routed at slot " +
                                      to_string(stamp_[to_index(r.expert)] & 0xff) +
                                      " of this routing; expected distinct experts");
        break;
      case fault::turn_back:
        set(trace_column::turn,
            "turn " + turn + " after turn " + to_string(prev_turn_) + "; expected non-decreasing turns");
        break;
      case fault::prefill_after_decode:
        set(trace_column::phase, "prefill row after decode rows of turn " + turn +
                                     "; expected each turn's prefill before its decode");
        break;
      case fault::decode_step_back:
        set(trace_column::step, "step " + to_string(r.step) + " after step " + to_string(prev_step_) +
                                    " in decode of turn " + turn + "; expected non-decreasing steps");
        break;
      case fault::decode_layer_back:
        set(trace_column::layer, "layer " + to_string(layer) + " after layer " + to_string(to_index(prev_layer_)) +
                                     " at decode step " + to_string(r.step) +
                                     "; expected ascending layers within a token");
        break;
      case fault::prefill_step_back:
        set(trace_column::step, "step " + to_string(r.step) + " after step " + to_string(prev_step_) +
                                    " in prefill of layer " + to_string(layer) + ", turn " + turn +
                                    "; expected ascending steps within a layer (rows layer-major)");
        break;
      case fault::prefill_overlap:
        set(trace_column::step, "step " + to_string(r.step) + " in a prefill batch of turn " + turn +
                                    " that follows step " +
                                    to_string(r.layer < prev_layer_ ? max_step_ : floor_) +
                                    "; expected each batch's tokens after the previous batch's");
        break;
    }
  }

  const trace_header& h_;
  // Copies of the header's hot fields: stores through std::uint8_t members
  // may alias anything, and would otherwise force reloads through h_.
  const std::uint64_t* layer_bytes_;
  std::size_t n_layer_, n_expert_, k_;
  bool has_dropped_;
  // Per expert: (routing that last routed it) << 8 | its slot there. Not
  // std::uint8_t arrays, for the same aliasing reason.
  std::vector<std::uint64_t> stamp_;
  std::uint64_t routing_ = 0;  // routings started so far (0 = none)
  bool has_prev_ = false;
  std::uint32_t prev_turn_ = 0, prev_step_ = 0;
  run_phase prev_phase_ = run_phase::decode;
  layer_id prev_layer_{};
  std::uint8_t prev_slot_ = 0;
  bool prefill_any_ = false;  // this turn has prefill rows; max_step_ is their largest step
  bool floor_set_ = false;    // a later prompt batch began; its steps must exceed floor_
  std::uint32_t max_step_ = 0;
  std::uint32_t floor_ = 0;
};

inline void validate_rows(const route_trace& t, const std::string& source_name) {
  if (const std::string p = header_problem(t.header); !p.empty())
    throw error(source_name + ": header: " + p);
  trace_row_checker checker(t.header);
  trace_issue issue;
  for (std::size_t i = 0; i < t.rows.size(); ++i)
    if (!checker.check(t.rows[i], issue))
      throw error(source_name + ": rows[" + std::to_string(i) + "], column " + column_name(issue.column) +
                  ": " + issue.message);
}

// --- CSV parsing -----------------------------------------------------------

class csv_parser {
 public:
  csv_parser(std::string_view text, const std::string& source) : text_(text), source_(source) {}

  route_trace parse() {
    route_trace t;
    parse_magic();
    parse_model_line(t.header);
    parse_layer_lines_and_columns(t.header);
    // Backstop: the rows are checked against a header the writers accept.
    if (const std::string p = header_problem(t.header); !p.empty()) fail(1, p);
    parse_rows(t);
    return t;
  }

 private:
  [[noreturn]] void fail(std::size_t column, const std::string& message) const {
    throw error(source_ + ": line " + std::to_string(line_no_) + ", column " + std::to_string(column) + ": " +
                message);
  }

  // Next line without its '\n'; false at the end of the text.
  bool next_line(std::string_view& line) {
    if (pos_ >= text_.size()) return false;
    const char* begin = text_.data() + pos_;
    const void* nl = std::memchr(begin, '\n', text_.size() - pos_);
    const std::size_t len = nl ? static_cast<std::size_t>(static_cast<const char*>(nl) - begin) : text_.size() - pos_;
    line = std::string_view(begin, len);
    pos_ += len + 1;
    ++line_no_;
    return true;
  }

  static std::vector<std::string_view> split(std::string_view s, char sep) {
    std::vector<std::string_view> out;
    std::size_t start = 0;
    for (;;) {
      const std::size_t p = s.find(sep, start);
      out.push_back(s.substr(start, p == std::string_view::npos ? std::string_view::npos : p - start));
      if (p == std::string_view::npos) return out;
      start = p + 1;
    }
  }

  // A whole header value as an unsigned integer in [lo, hi].
  std::uint64_t header_number(std::string_view key, std::string_view v, std::size_t column, std::uint64_t lo,
                              std::uint64_t hi) const {
    std::uint64_t x = 0;
    const char* end = nullptr;
    const auto st = parse_u64(v.data(), v.data() + v.size(), x, &end);
    if (st != number_status::ok || end != v.data() + v.size()) {
      if (st == number_status::too_large)
        fail(column, std::string(key) + " " + quote_field(v) + " does not fit in 64 bits");
      fail(column, std::string(key) + " " + quote_field(v) + " is not an unsigned integer" + crlf_hint(v));
    }
    if (x < lo || x > hi)
      fail(column, std::string(key) + " " + std::to_string(x) + " out of range [" + std::to_string(lo) + ", " +
                       std::to_string(hi) + "]");
    return x;
  }

  void parse_magic() {
    std::string_view line;
    if (!next_line(line)) {
      ++line_no_;
      fail(1, "empty file; expected '# route_trace v1' (CSV) or a binary route trace");
    }
    if (line == csv_magic) return;
    if (line.substr(0, 14) == "# route_trace ")
      fail(2, "unsupported version " + quote_field(line.substr(14)) + "; expected 'v1'" + crlf_hint(line));
    fail(1, "missing magic line: found " + quote_field(line) + "; expected '# route_trace v1'");
  }

  void parse_model_line(trace_header& h) {
    std::string_view line;
    if (!next_line(line)) {
      ++line_no_;
      fail(1, "unexpected end of file; expected '# model=... arch=... n_layer=...'");
    }
    if (line.substr(0, 2) != "# ")
      fail(1, "found " + quote_field(line) + "; expected '# model=<path> arch=<arch> n_layer=<L> n_expert=<E> "
                                        "n_expert_used=<k>'");
    std::vector<std::string_view> tok = split(line.substr(2), ' ');
    static const char* const keys[] = {"model", "arch", "n_layer", "n_expert", "n_expert_used"};
    // The model path may contain spaces: it runs up to the field "arch=...".
    std::size_t model_parts = 1;
    if (tok[0].substr(0, 6) == "model=")
      while (model_parts < tok.size() && tok[model_parts].substr(0, 5) != "arch=") ++model_parts;
    if (model_parts == tok.size()) model_parts = 1;
    std::vector<std::string_view> values;
    for (std::size_t i = 0; i < 5; ++i) {
      const std::size_t t = i == 0 ? 0 : model_parts + i - 1;
      const std::size_t column = t + 1;
      if (t >= tok.size()) fail(column, std::string("missing header key '") + keys[i] + "'");
      std::string_view field = tok[t];
      if (i == 0 && model_parts > 1)
        field = line.substr(2, static_cast<std::size_t>(tok[model_parts - 1].data() + tok[model_parts - 1].size() -
                                                         (line.data() + 2)));
      const std::size_t eq = field.find('=');
      const std::string_view key = field.substr(0, eq);
      if (eq == std::string_view::npos || key != keys[i]) {
        const bool known = std::find_if(std::begin(keys), std::end(keys), [&](const char* k) {
                             return key == k;
                           }) != std::end(keys);
        fail(column, std::string(known ? "header key " : "unknown header key ") + quote_field(key) +
                         "; expected '" + keys[i] + "=' (keys: model, arch, n_layer, n_expert, n_expert_used)");
      }
      values.push_back(field.substr(eq + 1));
    }
    if (tok.size() > model_parts + 4)
      fail(model_parts + 5, "unknown header field " + quote_field(tok[model_parts + 4]) +
                                "; expected nothing after n_expert_used");
    h.model = std::string(values[0]);
    h.arch = std::string(values[1]);
    if (h.model.find('\r') != std::string::npos)
      fail(1, "model " + quote_field(h.model) + " contains a carriage return; expected a path");
    if (h.arch.find('\r') != std::string::npos)
      fail(model_parts + 1, "arch " + quote_field(h.arch) + " contains a carriage return; expected a name");
    const std::size_t c0 = model_parts;  // column of arch is model_parts + 1
    h.n_layer = header_number("n_layer", values[2], c0 + 2, 1, 65535);
    h.n_expert = header_number("n_expert", values[3], c0 + 3, 1, 65535);
    h.n_expert_used = header_number("n_expert_used", values[4], c0 + 4, 1, std::min<std::uint64_t>(h.n_expert, 256));
    h.expert_bytes.assign(h.n_layer, 0);
    h.dense_bytes.assign(h.n_layer, 0);
    h.layer_listed.assign(h.n_layer, false);
  }

  void parse_layer_lines_and_columns(trace_header& h) {
    std::vector<std::size_t> line_of(h.n_layer, 0);
    std::size_t last = 0;
    bool any = false;
    std::string_view line;
    for (;;) {
      if (!next_line(line)) {
        ++line_no_;
        fail(1, "unexpected end of file; expected '# layer=...' lines and then the column header '" +
                    std::string(csv_columns) + "'");
      }
      if (line.substr(0, 8) == "# layer=") {
        std::vector<std::string_view> tok = split(line.substr(2), ' ');
        static const char* const keys[] = {"layer", "expert_bytes", "dense_bytes"};
        std::uint64_t v[3] = {0, 0, 0};
        for (std::size_t i = 0; i < 3; ++i) {
          if (i >= tok.size()) fail(i + 1, std::string("missing key '") + keys[i] + "' in '# layer=' line");
          const std::size_t eq = tok[i].find('=');
          if (eq == std::string_view::npos || tok[i].substr(0, eq) != keys[i])
            fail(i + 1, "unknown key " + quote_field(tok[i].substr(0, eq)) + " in '# layer=' line; expected '" +
                            keys[i] + "='");
          v[i] = header_number(keys[i], tok[i].substr(eq + 1), i + 1, 0,
                               i == 0 ? h.n_layer - 1 : std::numeric_limits<std::uint64_t>::max());
        }
        if (tok.size() > 3) fail(4, "unknown field " + quote_field(tok[3]) + " in '# layer=' line");
        const std::size_t l = static_cast<std::size_t>(v[0]);
        if (line_of[l])
          fail(1, "duplicate '# layer=" + std::to_string(l) + "' line (first on line " + std::to_string(line_of[l]) +
                      ")");
        if (any && l < last)
          fail(1, "layer " + std::to_string(l) + " after layer " + std::to_string(last) +
                      "; expected '# layer=' lines in ascending order");
        line_of[l] = line_no_;
        last = l;
        any = true;
        h.expert_bytes[l] = v[1];
        h.dense_bytes[l] = v[2];
        h.layer_listed[l] = true;
        continue;
      }
      if (line == csv_columns) return;
      if (line.size() == csv_columns.size() + 8 && line.substr(0, csv_columns.size()) == csv_columns &&
          line.substr(csv_columns.size()) == ",dropped") {
        h.has_dropped_column = true;
        return;
      }
      if (!line.empty() && line[0] == '#')
        fail(1, "unknown header line " + quote_field(line) + "; expected '# layer=<l> expert_bytes=<b> dense_bytes=<b>'");
      // A column header that differs: name the first column that does.
      const std::vector<std::string_view> got = split(line, ',');
      const std::vector<std::string_view> want = split(csv_columns_dropped, ',');
      for (std::size_t i = 0; i < got.size(); ++i) {
        if (i >= want.size() || got[i] != want[i])
          fail(i + 1, "column header field " + quote_field(got[i]) + "; expected " +
                          (i < want.size() ? "'" + std::string(want[i]) + "'" : std::string("nothing")) +
                          " (the header line is '" + std::string(csv_columns) + "[,dropped]')" + crlf_hint(got[i]));
      }
      fail(got.size() + 1, "column header ends after " + std::to_string(got.size()) + " fields; expected '" +
                               std::string(csv_columns) + "[,dropped]'");
    }
  }

  // The extent of the field starting at p (up to ',' or the end of the line).
  static std::string_view field_at(const char* p, const char* eol) {
    const char* e = p;
    while (e != eol && *e != ',') ++e;
    return std::string_view(p, static_cast<std::size_t>(e - p));
  }

  [[noreturn]] void number_error(number_status st, trace_column c, const char* p, const char* eol,
                                 const char* what) const {
    const std::string_view f = field_at(p, eol);
    const std::size_t col = static_cast<std::size_t>(c);
    const std::string name = column_name(c);
    switch (st) {
      case number_status::empty: fail(col, name + " is empty; expected " + what);
      case number_status::negative: fail(col, name + " " + quote_field(f) + " is negative; expected " + what);
      case number_status::too_large:
        fail(col, name + " " + quote_field(f) + (c == trace_column::weight ? " is outside float's range"
                                                                        : " does not fit in 64 bits"));
      default: fail(col, name + " " + quote_field(f) + " is not " + what + crlf_hint(f));
    }
  }

  // Parses the unsigned field at p, which must end at ',' (or, for the last
  // column, the end of the line); advances p past the separator.
  std::uint64_t row_u64(const char*& p, const char* eol, trace_column c, bool last) const {
    std::uint64_t v = 0;
    const char* end = nullptr;
    const number_status st = parse_u64(p, eol, v, &end);
    if (st != number_status::ok) number_error(st, c, p, eol, "an unsigned integer");
    if (end == eol) {
      if (!last) column_count_error(c);
    } else if (*end != ',' || last) {
      if (*end == ',' && last) column_count_error(c);
      number_error(number_status::invalid, c, p, eol, "an unsigned integer");
    }
    p = end + 1;
    return v;
  }

  [[noreturn]] void column_count_error(trace_column at) const {
    const std::size_t got = static_cast<std::size_t>(std::count(line_.begin(), line_.end(), ',')) + 1;
    const std::size_t col = static_cast<std::size_t>(at);
    fail(got < n_columns_ ? col + 1 : n_columns_ + 1,
         "row has " + std::to_string(got) + " fields; expected " + std::to_string(n_columns_));
  }

  void parse_rows(route_trace& t) {
    const trace_header& h = t.header;
    n_columns_ = h.has_dropped_column ? 10 : 9;
    const std::size_t remaining = text_.size() > pos_ ? text_.size() - pos_ : 0;
    t.rows.reserve(static_cast<std::size_t>(std::count(text_.data() + pos_, text_.data() + pos_ + remaining, '\n')) +
                   1);
    trace_row_checker checker(h);
    trace_issue issue;
    char buf[32];
    std::string_view line;
    while (next_line(line)) {
      const char* p = line.data();
      const char* eol = p + line.size();
      if (line.empty()) fail(1, "empty line; expected a row of " + std::to_string(n_columns_) + " fields");
      if (*p == '#') fail(1, "comment line " + quote_field(line) + " after the column header; expected a row");
      line_ = line;
      trace_row r;
      const std::uint64_t turn = row_u64(p, eol, trace_column::turn, false);
      if (turn > std::numeric_limits<std::uint32_t>::max()) fail(1, range_message("turn", turn, 1ull << 32));
      const std::uint64_t phase = row_u64(p, eol, trace_column::phase, false);
      if (phase > 1) fail(2, phase_message(phase));
      const std::uint64_t step = row_u64(p, eol, trace_column::step, false);
      if (step > std::numeric_limits<std::uint32_t>::max()) fail(3, range_message("step", step, 1ull << 32));
      const std::uint64_t layer = row_u64(p, eol, trace_column::layer, false);
      if (layer >= h.n_layer) fail(4, range_message("layer", layer, h.n_layer));
      const std::uint64_t slot = row_u64(p, eol, trace_column::slot, false);
      if (slot >= h.n_expert_used) fail(5, slot_message(slot, h.n_expert_used));
      const std::uint64_t expert = row_u64(p, eol, trace_column::expert, false);
      if (expert >= h.n_expert) fail(6, range_message("expert", expert, h.n_expert));
      {
        float w = 0;
        const char* end = nullptr;
        const number_status st = parse_float(p, eol, w, &end);
        if (st != number_status::ok) number_error(st, trace_column::weight, p, eol, "a float ('%g', or 'nan')");
        if (end == eol) column_count_error(trace_column::weight);
        if (*end != ',') number_error(number_status::invalid, trace_column::weight, p, eol, "a float ('%g', or 'nan')");
        const std::size_t n = format_weight(w, buf);
        if (n != static_cast<std::size_t>(end - p) || std::memcmp(buf, p, n) != 0) ++t.noncanonical_weights;
        r.weight = w;
        p = end + 1;
      }
      const std::uint64_t residency = row_u64(p, eol, trace_column::residency, false);
      if (residency > 2) fail(8, residency_message(residency));
      const std::uint64_t bytes = row_u64(p, eol, trace_column::expert_bytes, !h.has_dropped_column);
      if (h.has_dropped_column) {
        const std::uint64_t dropped = row_u64(p, eol, trace_column::dropped, true);
        if (dropped > 1) fail(10, dropped_message(dropped));
        r.dropped = static_cast<std::int8_t>(dropped);
      }
      r.turn = static_cast<std::uint32_t>(turn);
      r.phase = static_cast<run_phase>(phase);
      r.step = static_cast<std::uint32_t>(step);
      r.layer = static_cast<layer_id>(layer);
      r.slot = static_cast<std::uint8_t>(slot);
      r.expert = static_cast<expert_id>(expert);
      r.residency = static_cast<std::uint8_t>(residency);
      r.expert_bytes = bytes;
      if (!checker.check(r, issue)) fail(static_cast<std::size_t>(issue.column), issue.message);
      t.rows.push_back(r);
    }
  }

  std::string_view text_;
  const std::string& source_;
  std::size_t pos_ = 0;
  std::size_t line_no_ = 0;
  std::size_t n_columns_ = 9;
  std::string_view line_;  // the row being parsed
};

// --- binary ----------------------------------------------------------------

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

// ---------------------------------------------------------------------------

inline model_shape route_trace::shape() const {
  if (const std::string p = detail::header_problem(header); !p.empty())
    throw error("route_trace: header: " + p);
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

inline void validate_route_trace(const route_trace& trace, const std::string& source_name) {
  detail::validate_rows(trace, source_name);
}

inline route_trace parse_route_trace_csv(std::string_view text, const std::string& source_name) {
  return detail::csv_parser(text, source_name).parse();
}

inline route_trace parse_route_trace_binary(std::string_view bytes, const std::string& source_name) {
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
  const std::uint64_t model_len = load_le<std::uint32_t>(b + 40);
  const std::uint64_t arch_len = load_le<std::uint32_t>(b + 44);
  // Bounds in 64 bits; every quantity below is at most 2^32 times a small constant.
  const std::uint64_t strings_end = pad8(static_cast<std::size_t>(binary_trace_fixed_header + model_len + arch_len));
  if (h.n_layer < 1 || h.n_layer > 65535)
    throw fail("header: n_layer " + std::to_string(h.n_layer) + " out of range [1, 65535]");
  const std::uint64_t layers_end = strings_end + 16 * h.n_layer + pad8(h.n_layer);
  if (size < layers_end)
    throw fail("truncated: " + std::to_string(size) + " bytes; the header needs " + std::to_string(layers_end));
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
  check_padding(binary_trace_fixed_header + model_len + arch_len, strings_end, "model and arch strings");
  check_padding(strings_end + 17 * static_cast<std::uint64_t>(h.n_layer), layers_end, "layer flags");
  h.model.assign(reinterpret_cast<const char*>(b) + binary_trace_fixed_header, model_len);
  h.arch.assign(reinterpret_cast<const char*>(b) + binary_trace_fixed_header + model_len, arch_len);
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

  // Decode every fixed-width record, then validate the rows in one pass
  // (checking each row right after its stores stalled on store forwarding).
  // Decode straight into the rows: a row assembled on the stack and copied
  // would be reloaded wide right after its narrow stores (a forwarding stall).
  t.rows.resize(static_cast<std::size_t>(n_rows));
  trace_row* const out = t.rows.data();
  const unsigned char* rp = b + layers_end;
  bool bad_bits = false;
  const std::size_t n_layer = h.n_layer;
  const std::uint64_t* layer_bytes = h.expert_bytes.data();
  const bool has_dropped = h.has_dropped_column;
  for (std::uint64_t i = 0; i < n_rows; ++i, rp += binary_trace_record_size) {
    trace_row& r = out[i];
    r.turn = load_le<std::uint32_t>(rp);
    r.step = load_le<std::uint32_t>(rp + 4);
    r.weight = float_from_bits(load_le<std::uint32_t>(rp + 8));
    r.layer = static_cast<layer_id>(load_le<std::uint16_t>(rp + 12));
    r.expert = static_cast<expert_id>(load_le<std::uint16_t>(rp + 14));
    r.slot = rp[16];
    r.phase = static_cast<run_phase>(rp[17]);
    r.residency = rp[18];
    const unsigned bits = rp[19];
    bad_bits |= bits > 7 || (bits >> 1) == 3 || ((bits >> 1) != 0) != has_dropped;
    r.dropped = static_cast<std::int8_t>(static_cast<int>(bits >> 1) - 1);
    // The read bit stands for the layer's expert bytes; an out-of-range
    // layer is reported by the checker below.
    const std::size_t layer = to_index(r.layer);
    r.expert_bytes = (bits & 1) && layer < n_layer ? layer_bytes[layer] : 0;
  }
  trace_row_checker checker(h);
  trace_issue issue;
  rp = b + layers_end;
  for (std::uint64_t i = 0; i < n_rows; ++i, rp += binary_trace_record_size) {
    if (bad_bits) {
      const unsigned bits = rp[19];
      if (bits > 7 || (bits >> 1) == 3 || ((bits >> 1) != 0) != h.has_dropped_column)
        throw fail("record " + std::to_string(i) + ", column dropped: bits " + std::to_string(bits) +
                   (h.has_dropped_column ? "; expected dropped 0 or 1" : "; expected no dropped value (no column)"));
    }
    if (!checker.check(out[i], issue))
      throw fail("record " + std::to_string(i) + ", column " + column_name(issue.column) + ": " + issue.message);
  }
  return t;
}

inline route_trace read_route_trace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw error(path + ": cannot open: " + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff n = in.tellg();
  if (n < 0) throw error(path + ": cannot determine the file size");
  in.seekg(0, std::ios::beg);
  std::string bytes(static_cast<std::size_t>(n), '\0');
  if (n > 0 && !in.read(&bytes[0], n)) throw error(path + ": read failed after " + std::to_string(in.gcount()) + " bytes");
  if (!bytes.empty() && static_cast<unsigned char>(bytes[0]) == 0x89) return parse_route_trace_binary(bytes, path);
  return parse_route_trace_csv(bytes, path);
}

inline void write_route_trace_csv(const route_trace& trace, std::ostream& out) {
  detail::validate_rows(trace, "route_trace");
  const trace_header& h = trace.header;
  std::string s;
  s.reserve(1 << 16);
  s += detail::csv_magic;
  s += "\n# model=" + h.model + " arch=" + h.arch + " n_layer=" + std::to_string(h.n_layer) +
       " n_expert=" + std::to_string(h.n_expert) + " n_expert_used=" + std::to_string(h.n_expert_used) + "\n";
  for (std::size_t l = 0; l < h.n_layer; ++l) {
    if (!h.layer_listed.empty() && !h.layer_listed[l]) continue;
    s += "# layer=" + std::to_string(l) + " expert_bytes=" + std::to_string(h.expert_bytes[l]) +
         " dense_bytes=" + std::to_string(h.dense_bytes[l]) + "\n";
  }
  s += detail::csv_columns;
  if (h.has_dropped_column) s += ",dropped";
  s += '\n';
  char line[256];
  for (const trace_row& r : trace.rows) {
    char* p = line;
    auto num = [&p](std::uint64_t v) {
      p += detail::format_u64(v, p);
      *p++ = ',';
    };
    num(r.turn);
    *p++ = static_cast<char>('0' + static_cast<int>(r.phase));
    *p++ = ',';
    num(r.step);
    num(to_index(r.layer));
    num(r.slot);
    num(to_index(r.expert));
    p += detail::format_weight(r.weight, p);
    *p++ = ',';
    num(r.residency);
    p += detail::format_u64(r.expert_bytes, p);
    if (h.has_dropped_column) {
      *p++ = ',';
      *p++ = static_cast<char>('0' + r.dropped);
    }
    *p++ = '\n';
    s.append(line, static_cast<std::size_t>(p - line));
    if (s.size() > (1u << 16) - 256) {
      out.write(s.data(), static_cast<std::streamsize>(s.size()));
      s.clear();
    }
  }
  out.write(s.data(), static_cast<std::streamsize>(s.size()));
}

inline void write_route_trace_binary(const route_trace& trace, std::ostream& out) {
  detail::validate_rows(trace, "route_trace");
  const std::string head = detail::binary_header_bytes(trace.header, trace.rows.size());
  out.write(head.data(), static_cast<std::streamsize>(head.size()));
  constexpr std::size_t chunk = 4096;
  unsigned char buf[chunk * detail::binary_trace_record_size];
  std::size_t n = 0;
  for (const trace_row& r : trace.rows) {
    unsigned char* p = buf + n * detail::binary_trace_record_size;
    detail::store_le<std::uint32_t>(p, r.turn);
    detail::store_le<std::uint32_t>(p + 4, r.step);
    detail::store_le<std::uint32_t>(p + 8, detail::bits_of_float(r.weight));
    detail::store_le<std::uint16_t>(p + 12, static_cast<std::uint16_t>(r.layer));
    detail::store_le<std::uint16_t>(p + 14, static_cast<std::uint16_t>(r.expert));
    p[16] = r.slot;
    p[17] = static_cast<unsigned char>(r.phase);
    p[18] = r.residency;
    p[19] = static_cast<unsigned char>((r.expert_bytes != 0 ? 1 : 0) | ((r.dropped + 1) << 1));
    if (++n == chunk) {
      out.write(reinterpret_cast<const char*>(buf), static_cast<std::streamsize>(n * detail::binary_trace_record_size));
      n = 0;
    }
  }
  out.write(reinterpret_cast<const char*>(buf), static_cast<std::streamsize>(n * detail::binary_trace_record_size));
}

inline load_batches group_load_batches(const route_trace& trace) {
  detail::validate_rows(trace, "route_trace");
  if (trace.rows.size() > std::numeric_limits<std::uint32_t>::max())
    throw error("route_trace: " + std::to_string(trace.rows.size()) + " rows; load batches index at most 2^32 - 1");
  load_batches out;
  out.experts.reserve(trace.rows.size());
  const trace_row* prev = nullptr;
  for (std::size_t i = 0; i < trace.rows.size(); ++i) {
    const trace_row& r = trace.rows[i];
    // Prefill: a batch is a run of one layer's rows (all prompt tokens);
    // decode: one token's routing of one layer.
    const bool same = prev && r.turn == prev->turn && r.phase == prev->phase && r.layer == prev->layer &&
                      (r.phase == run_phase::prefill || r.step == prev->step);
    if (!same)
      out.batches.push_back(load_batch{r.phase, r.turn, r.step, r.layer, static_cast<std::uint32_t>(i), 0});
    ++out.batches.back().count;
    out.experts.push_back(r.expert);
    prev = &r;
  }
  return out;
}

inline trace_routings collect_routings(const route_trace& trace) {
  detail::validate_rows(trace, "route_trace");
  trace_routings out;
  const auto& rows = trace.rows;
  for (std::size_t i = 0; i < rows.size();) {
    // Validation guarantees a routing is a run of rows with slots 0, 1, ...
    std::size_t j = i + 1;
    while (j < rows.size() && rows[j].slot != 0) ++j;
    if (j - i > routing::capacity) {
      ++out.declined;
    } else {
      routing r;
      r.layer = rows[i].layer;
      r.phase = rows[i].phase;
      r.token = rows[i].step;
      for (std::size_t s = i; s < j; ++s) r.push_back(rows[s].expert, rows[s].weight);
      out.routings.push_back(r);
    }
    i = j;
  }
  return out;
}

}  // namespace moe_residency
