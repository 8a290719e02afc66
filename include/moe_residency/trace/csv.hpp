#pragma once
/// The `route_trace v1` CSV that streaming engines emit: a strict parser that
/// names the line, column and value of any defect, and a writer that prints
/// exactly what the engine prints (weights "%g"). See docs/traces.md.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/detail/text_encoding.hpp"
#include "moe_residency/detail/trace_text.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/trace/types.hpp"
#include "moe_residency/trace/validate.hpp"

namespace moe_residency {

/// Parses route_trace v1 CSV text. `source_name` prefixes error messages.
validated_route_trace parse_route_trace_csv(std::string_view text, const std::string& source_name);
/// Writes route_trace v1 CSV exactly as the engine does (weights "%g").
void write_route_trace_csv(const validated_route_trace& trace, std::ostream& out);
/// Validates the whole trace first (validate_route_trace) and throws `error`
/// before writing anything.
void write_route_trace_csv(const route_trace& trace, std::ostream& out);

namespace detail {

inline constexpr std::string_view csv_columns = "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes";
inline constexpr std::string_view csv_columns_dropped =
    "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped";
inline constexpr std::string_view csv_magic = "# route_trace v1";

class csv_parser {
 public:
  /// A UTF-8 byte-order mark before the magic line is skipped.
  csv_parser(std::string_view text, const std::string& source)
      : text_(strip_utf8_bom(text)), whole_(text), source_(source) {}

  validated_route_trace parse() {
    route_trace t;
    parse_magic();
    parse_model_line(t.header);
    parse_layer_lines_and_columns(t.header);
    // Backstop: the rows are checked against a header the writers accept.
    if (const std::string p = header_problem(t.header); !p.empty()) fail(1, p);
    parse_rows(t);
    return trace_access::make(std::move(t));
  }

  /// The magic line alone, as parse() checks it first: a reader refuses a
  /// file that is no CSV trace from its first bytes (check_route_trace_head).
  void check_magic() { parse_magic(); }

 private:
  [[noreturn]] void fail(std::size_t column, const std::string& message) const {
    throw error(source_ + ": line " + std::to_string(line_no_) + ", column " + std::to_string(column) + ": " + message);
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
    // Compressed data or UTF-16 text is named as such, not as a missing magic line.
    check_text_encoding(whole_, source_, "a route trace (CSV or binary)");
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
      fail(1, "found " + quote_field(line) +
                  "; expected '# model=<path> arch=<arch> n_layer=<L> n_expert=<E> "
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
        field = line.substr(
            2, static_cast<std::size_t>(tok[model_parts - 1].data() + tok[model_parts - 1].size() - (line.data() + 2)));
      const std::size_t eq = field.find('=');
      const std::string_view key = field.substr(0, eq);
      if (eq == std::string_view::npos || key != keys[i]) {
        const bool known =
            std::find_if(std::begin(keys), std::end(keys), [&](const char* k) { return key == k; }) != std::end(keys);
        fail(column, std::string(known ? "header key " : "unknown header key ") + quote_field(key) + "; expected '" +
                         keys[i] + "=' (keys: model, arch, n_layer, n_expert, n_expert_used)");
      }
      values.push_back(field.substr(eq + 1));
    }
    if (tok.size() > model_parts + 4)
      fail(model_parts + 5,
           "unknown header field " + quote_field(tok[model_parts + 4]) + "; expected nothing after n_expert_used");
    h.model = std::string(values[0]);
    h.arch = std::string(values[1]);
    if (h.model.find('\r') != std::string::npos)
      fail(1, "model " + quote_field(h.model) + " contains a carriage return; expected a path");
    if (h.arch.find('\r') != std::string::npos)
      fail(model_parts + 1, "arch " + quote_field(h.arch) + " contains a carriage return; expected a name");
    const std::size_t c0 = model_parts;  // column of arch is model_parts + 1
    h.n_layer = header_number("n_layer", values[2], c0 + 2, 1, 65535);
    h.n_expert = header_number("n_expert", values[3], c0 + 3, 1, 65535);
    // Bounded before anything is sized from it (the header's own vectors are n_layer long).
    if (const std::string p = expert_slots_problem(h.n_layer, h.n_expert); !p.empty()) fail(c0 + 3, p);
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
          fail(1,
               "duplicate '# layer=" + std::to_string(l) + "' line (first on line " + std::to_string(line_of[l]) + ")");
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
        fail(1,
             "unknown header line " + quote_field(line) + "; expected '# layer=<l> expert_bytes=<b> dense_bytes=<b>'");
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
        fail(col, name + " " + quote_field(f) +
                      (c == trace_column::weight ? " is outside float's range" : " does not fit in 64 bits"));
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

  // A range fault; the checker saw dropped clamped to 2, the message names the value read.
  [[noreturn]] void fail_value(const trace_issue& issue, std::uint64_t dropped) const {
    if (issue.column == trace_column::dropped) fail(static_cast<std::size_t>(issue.column), dropped_message(dropped));
    fail(static_cast<std::size_t>(issue.column), issue.message);
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
      const std::uint64_t step = row_u64(p, eol, trace_column::step, false);
      if (step > std::numeric_limits<std::uint32_t>::max()) fail(3, range_message("step", step, 1ull << 32));
      const std::uint64_t layer = row_u64(p, eol, trace_column::layer, false);
      const std::uint64_t slot = row_u64(p, eol, trace_column::slot, false);
      const std::uint64_t expert = row_u64(p, eol, trace_column::expert, false);
      float w = 0;
      {
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
      const std::uint64_t bytes = row_u64(p, eol, trace_column::expert_bytes, !h.has_dropped_column);
      const std::uint64_t dropped = h.has_dropped_column ? row_u64(p, eol, trace_column::dropped, true) : 0;
      // The checker's own range checks, on the values before they are narrowed.
      const trace_row_checker::wide_row v{
          phase,
          layer,
          slot,
          expert,
          residency,
          bytes,
          h.has_dropped_column ? static_cast<std::int64_t>(std::min<std::uint64_t>(dropped, 2)) : -1,
          w};
      if (!checker.check_values(v, issue)) fail_value(issue, dropped);
      r.turn = static_cast<std::uint32_t>(turn);
      r.phase = static_cast<run_phase>(phase);
      r.step = static_cast<std::uint32_t>(step);
      r.layer = static_cast<layer_id>(layer);
      r.slot = static_cast<std::uint8_t>(slot);
      r.expert = static_cast<expert_id>(expert);
      r.residency = static_cast<std::uint8_t>(residency);
      r.expert_bytes = bytes;
      r.dropped = static_cast<std::int8_t>(v.dropped);
      if (!checker.check(r, issue)) fail(static_cast<std::size_t>(issue.column), issue.message);
      t.rows.push_back(r);
    }
    if (!checker.finish(issue))
      throw error(source_ + ": end of file after line " + std::to_string(line_no_) + ": " + issue.message);
  }

  std::string_view text_;
  std::string_view whole_;  // the text as given, its byte-order mark included
  const std::string& source_;
  std::size_t pos_ = 0;
  std::size_t line_no_ = 0;
  std::size_t n_columns_ = 9;
  std::string_view line_;  // the row being parsed
};
}  // namespace detail

inline validated_route_trace parse_route_trace_csv(std::string_view text, const std::string& source_name) {
  return detail::csv_parser(text, source_name).parse();
}

namespace detail {
// The writer proper: `trace` is known valid.
inline void write_csv_rows(const route_trace& trace, std::ostream& out) {
  const trace_header& h = trace.header;
  std::string s;
  s.reserve(1 << 16);
  s += csv_magic;
  s += "\n# model=" + h.model + " arch=" + h.arch + " n_layer=" + std::to_string(h.n_layer) +
       " n_expert=" + std::to_string(h.n_expert) + " n_expert_used=" + std::to_string(h.n_expert_used) + "\n";
  for (std::size_t l = 0; l < h.n_layer; ++l) {
    if (!h.layer_listed.empty() && !h.layer_listed[l]) continue;
    s += "# layer=" + std::to_string(l) + " expert_bytes=" + std::to_string(h.expert_bytes[l]) +
         " dense_bytes=" + std::to_string(h.dense_bytes[l]) + "\n";
  }
  s += csv_columns;
  if (h.has_dropped_column) s += ",dropped";
  s += '\n';
  char line[256];
  for (const trace_row& r : trace.rows) {
    char* p = line;
    auto num = [&p](std::uint64_t v) {
      p += format_u64(v, p);
      *p++ = ',';
    };
    num(r.turn);
    *p++ = static_cast<char>('0' + static_cast<int>(r.phase));
    *p++ = ',';
    num(r.step);
    num(to_index(r.layer));
    num(r.slot);
    num(to_index(r.expert));
    p += format_weight(r.weight, p);
    *p++ = ',';
    num(r.residency);
    p += format_u64(r.expert_bytes, p);
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
}  // namespace detail

inline void write_route_trace_csv(const validated_route_trace& trace, std::ostream& out) {
  detail::write_csv_rows(trace.trace(), out);
}

inline void write_route_trace_csv(const route_trace& trace, std::ostream& out) {
  detail::validate_rows(trace, "route_trace");
  detail::write_csv_rows(trace, out);
}

}  // namespace moe_residency
