// Malformed route traces: each defect throws moe_residency::error naming the
// file, line and column (1-based field) and the offending value.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "moe_residency/trace.hpp"

using namespace moe_residency;

namespace {

// A valid trace: 3 layers, 16 experts, top-2; a 2-token prompt (layer 2 only
// for the last token), then decode tokens 2 and 3.
const std::vector<std::string> base_lines = {
    "# route_trace v1",                                                    // 1
    "# model=m.gguf arch=qwen3moe n_layer=3 n_expert=16 n_expert_used=2",  // 2
    "# layer=0 expert_bytes=1000 dense_bytes=50",                          // 3
    "# layer=1 expert_bytes=2000 dense_bytes=50",                          // 4
    "# layer=2 expert_bytes=1000 dense_bytes=50",                          // 5
    "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes",     // 6
    "0,0,0,0,0,5,0.6,0,1000",                                              // 7
    "0,0,0,0,1,9,0.4,0,1000",                                              // 8
    "0,0,1,0,0,5,0.7,0,0",                                                 // 9
    "0,0,1,0,1,3,0.3,0,1000",                                              // 10
    "0,0,0,1,0,2,0.5,0,2000",                                              // 11
    "0,0,0,1,1,1,0.5,0,2000",                                              // 12
    "0,0,1,1,0,2,0.9,0,0",                                                 // 13
    "0,0,1,1,1,4,0.1,0,2000",                                              // 14
    "0,0,1,2,0,7,0.8,0,1000",                                              // 15
    "0,0,1,2,1,8,0.2,0,1000",                                              // 16
    "0,1,2,0,0,5,0.6,1,0",                                                 // 17
    "0,1,2,0,1,6,0.4,0,1000",                                              // 18
    "0,1,2,1,0,2,0.5,1,0",                                                 // 19
    "0,1,2,1,1,3,nan,0,2000",                                              // 20
    "0,1,2,2,0,7,0.8,1,0",                                                 // 21
    "0,1,2,2,1,8,0.2,1,0",                                                 // 22
    "0,1,3,0,0,5,0.6,1,0",                                                 // 23
    "0,1,3,0,1,6,0.4,1,0",                                                 // 24
    "0,1,3,1,0,2,0.5,1,0",                                                 // 25
    "0,1,3,1,1,3,0.5,1,0",                                                 // 26
    "0,1,3,2,0,7,0.8,1,0",                                                 // 27
    "0,1,3,2,1,8,0.2,1,0",                                                 // 28
};

std::string join(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

/// The base trace with line n (1-based) replaced.
std::string with_line(std::size_t n, const std::string& text) {
  auto lines = base_lines;
  lines.at(n - 1) = text;
  return join(lines);
}

std::string without_line(std::size_t n) {
  auto lines = base_lines;
  lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(n - 1));
  return join(lines);
}

std::string with_inserted(std::size_t before, const std::string& text) {
  auto lines = base_lines;
  lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(before - 1), text);
  return join(lines);
}

route_trace parse(const std::string& text) { return parse_route_trace_csv(text, "t.csv"); }

/// One defect of a row or header line: the base trace with line `line`
/// (1-based) replaced by `text` must raise exactly `message`.
struct line_case {
  const char* defect;
  std::size_t line;
  const char* text;
  const char* message;
};

void check_line_cases(std::initializer_list<line_case> cases) {
  for (const line_case& c : cases) {
    CAPTURE(c.defect);
    CHECK_THROWS_WITH_AS(parse(with_line(c.line, c.text)), c.message, error);
  }
}

std::string binary_of(const route_trace& t) {
  std::ostringstream s;
  write_route_trace_binary(t, s);
  return s.str();
}

/// The first binary form, without checksums (still read, with a warning).
std::string binary_v1_of(const route_trace& t) {
  std::ostringstream s;
  detail::write_binary_rows(t, s, detail::binary_trace_version_unchecked);
  return s.str();
}

/// Where the records of binary file `b` begin, from its header's lengths.
std::size_t records_at(const std::string& b) {
  const auto* p = reinterpret_cast<const unsigned char*>(b.data());
  return static_cast<std::size_t>(detail::binary_trace_header_extent(detail::load_le<std::uint32_t>(p + 40),
                                                                     detail::load_le<std::uint32_t>(p + 44),
                                                                     detail::load_le<std::uint32_t>(p + 20))
                                      .layers_end);
}

/// Rewrites the checksums of version 2 file `b` for its header and the rows
/// its header counts (dropping or adding the bytes after them), so that a
/// test's deliberate damage to the records reaches the record checks rather
/// than stopping at a checksum.
void reseal(std::string& b) {
  const std::size_t first = records_at(b);
  const auto n = static_cast<std::size_t>(detail::load_le<std::uint64_t>(reinterpret_cast<unsigned char*>(&b[32])));
  b.resize(first + 20 * n + static_cast<std::size_t>(detail::binary_trace_trailer_size(n)));
  auto* p = reinterpret_cast<unsigned char*>(&b[0]);
  unsigned char* sums = p + first + 20 * n;
  detail::store_le<std::uint64_t>(sums, detail::xxh64(p, first));
  for (std::size_t k = 0; 4096 * k < n; ++k)
    detail::store_le<std::uint64_t>(
        sums + 8 + 8 * k, detail::xxh64(p + first + 20 * 4096 * k, 20 * std::min<std::size_t>(4096, n - 4096 * k)));
}

}  // namespace

// Random float bits made a valid gate weight (finite and >= 0, -0 included,
// or NaN): a negative value loses its sign, an infinity becomes a NaN.
std::uint32_t weight_bits(std::uint32_t u) {
  if ((u >> 31) && (u & 0x7fffffffu) != 0) u &= 0x7fffffffu;
  if ((u & 0x7fffffffu) == 0x7f800000u) u ^= 1u;
  return u;
}

TEST_CASE("the base fixture is valid (so each error below is the one defect)") {
  const route_trace t = parse(join(base_lines));
  CHECK(t.rows.size() == 22);
  CHECK(group_load_batches(t).batches.size() == 3 + 6);
}

TEST_CASE("CSV: magic and header lines") {
  SUBCASE("empty file") {
    CHECK_THROWS_WITH_AS(
        parse(""), "t.csv: line 1, column 1: empty file; expected '# route_trace v1' (CSV) or a binary route trace",
        error);
  }
  SUBCASE("missing magic line") {
    CHECK_THROWS_WITH_AS(parse(without_line(1)),
                         "t.csv: line 1, column 1: missing magic line: found '# model=m.gguf arch=qwen3moe n_layer=3 "
                         "n...'; expected '# route_trace v1'",
                         error);
  }
  SUBCASE("one replaced line each (defect, line, text, message)") {
    check_line_cases({
        {"unknown version", 1, "# route_trace v2", "t.csv: line 1, column 2: unsupported version 'v2'; expected 'v1'"},
        {"CRLF line endings are named", 1, "# route_trace v1\r",
         "t.csv: line 1, column 2: unsupported version 'v1\\r'; expected 'v1' (the file has CRLF "
         "line endings; expected LF)"},
        {"missing header key", 2, "# model=m.gguf arch=qwen3moe n_layer=3 n_expert=16",
         "t.csv: line 2, column 5: missing header key 'n_expert_used'"},
        {"non-numeric header value", 2, "# model=m.gguf arch=qwen3moe n_layer=three n_expert=16 n_expert_used=2",
         "t.csv: line 2, column 3: n_layer 'three' is not an unsigned integer"},
        {"n_expert_used beyond n_expert", 2, "# model=m.gguf arch=qwen3moe n_layer=3 n_expert=16 n_expert_used=17",
         "t.csv: line 2, column 5: n_expert_used 17 out of range [1, 16]"},
        {"n_layer zero", 2, "# model=m.gguf arch=qwen3moe n_layer=0 n_expert=16 n_expert_used=2",
         "t.csv: line 2, column 3: n_layer 0 out of range [1, 65535]"},
    });
  }
  SUBCASE("unknown header key") {
    CHECK_THROWS_WITH_AS(
        parse(with_line(2, "# model=m.gguf arch=qwen3moe n_layers=3 n_expert=16 n_expert_used=2")),
        "t.csv: line 2, column 3: unknown header key 'n_layers'; expected 'n_layer=' (keys: model, arch, n_layer, "
        "n_expert, n_expert_used)",
        error);
  }
  SUBCASE("header keys out of order") {
    CHECK_THROWS_WITH_AS(
        parse(with_line(2, "# model=m.gguf arch=qwen3moe n_expert=16 n_layer=3 n_expert_used=2")),
        "t.csv: line 2, column 3: header key 'n_expert'; expected 'n_layer=' (keys: model, arch, n_layer, "
        "n_expert, n_expert_used)",
        error);
  }
  SUBCASE("extra header field") {
    CHECK_THROWS_WITH_AS(
        parse(with_line(2, "# model=m.gguf arch=qwen3moe n_layer=3 n_expert=16 n_expert_used=2 seed=1")),
        "t.csv: line 2, column 6: unknown header field 'seed=1'; expected nothing after n_expert_used", error);
  }
  SUBCASE("header ends early") {
    CHECK_THROWS_WITH_AS(parse("# route_trace v1\n"),
                         "t.csv: line 2, column 1: unexpected end of file; expected '# model=... arch=... n_layer=...'",
                         error);
  }
}

TEST_CASE("CSV: '# layer=' lines and the column header") {
  SUBCASE("one replaced line each (defect, line, text, message)") {
    check_line_cases({
        {"duplicate layer line", 5, "# layer=1 expert_bytes=2000 dense_bytes=50",
         "t.csv: line 5, column 1: duplicate '# layer=1' line (first on line 4)"},
        {"layer line beyond n_layer", 5, "# layer=3 expert_bytes=1000 dense_bytes=50",
         "t.csv: line 5, column 1: layer 3 out of range [0, 2]"},
        {"bad key in a layer line", 4, "# layer=1 bytes=2000 dense_bytes=50",
         "t.csv: line 4, column 2: unknown key 'bytes' in '# layer=' line; expected 'expert_bytes='"},
        {"routed layer with zero expert bytes", 4, "# layer=1 expert_bytes=0 dense_bytes=50",
         "t.csv: line 11, column 4: layer 1 is routed but its expert_bytes is 0; expected > 0"},
        {"misspelt column", 6, "turn,phase,step,layer,rank,expert,weight,residency,expert_bytes",
         "t.csv: line 6, column 5: column header field 'rank'; expected 'slot' (the header line is "
         "'turn,phase,step,layer,slot,expert,weight,residency,expert_bytes[,dropped]')"},
    });
  }
  SUBCASE("layer lines out of order") {
    auto lines = base_lines;
    std::swap(lines[2], lines[3]);
    CHECK_THROWS_WITH_AS(parse(join(lines)),
                         "t.csv: line 4, column 1: layer 0 after layer 1; expected '# layer=' lines in ascending order",
                         error);
  }
  SUBCASE("missing layer line for a routed layer") {
    // Layer 1's rows move up one line (11 -> 10).
    CHECK_THROWS_WITH_AS(parse(without_line(4)),
                         "t.csv: line 10, column 4: layer 1 is routed but has no '# layer=' line; expected its "
                         "expert bytes in the header",
                         error);
  }
  SUBCASE("unknown comment line in the header") {
    CHECK_THROWS_WITH_AS(parse(with_inserted(6, "# seed=42")),
                         "t.csv: line 6, column 1: unknown header line '# seed=42'; expected '# layer=<l> "
                         "expert_bytes=<b> dense_bytes=<b>'",
                         error);
  }
  SUBCASE("missing column header") {
    CHECK_THROWS_WITH_AS(parse(without_line(6)),
                         "t.csv: line 6, column 1: column header field '0'; expected 'turn' (the header line is "
                         "'turn,phase,step,layer,slot,expert,weight,residency,expert_bytes[,dropped]')",
                         error);
  }
}

TEST_CASE("CSV: row fields") {
  SUBCASE("one replaced line each (defect, line, text, message)") {
    check_line_cases({
        {"non-numeric field", 9, "0,0,1a,0,0,5,0.7,0,0",
         "t.csv: line 9, column 3: step '1a' is not an unsigned integer"},
        {"empty field", 9, "0,0,1,,0,5,0.7,0,0",
         "t.csv: line 9, column 4: layer is empty; expected an unsigned integer"},
        {"negative number", 9, "-1,0,1,0,0,5,0.7,0,0",
         "t.csv: line 9, column 1: turn '-1' is negative; expected an unsigned integer"},
        {"too few columns", 9, "0,0,1,0,0,5,0.7,0", "t.csv: line 9, column 9: row has 8 fields; expected 9"},
        {"too many columns", 9, "0,0,1,0,0,5,0.7,0,0,0", "t.csv: line 9, column 10: row has 10 fields; expected 9"},
        {"a row with only a few fields", 9, "0,0,1", "t.csv: line 9, column 4: row has 3 fields; expected 9"},
        {"expert id out of range", 9, "0,0,1,0,0,16,0.7,0,0",
         "t.csv: line 9, column 6: expert 16 out of range [0, 16)"},
        {"layer out of range", 16, "0,0,1,3,1,8,0.2,0,1000", "t.csv: line 16, column 4: layer 3 out of range [0, 3)"},
        {"slot >= n_expert_used", 9, "0,0,1,0,2,5,0.7,0,0",
         "t.csv: line 9, column 5: slot 2 out of range [0, 2) (n_expert_used=2)"},
        {"slot > 32 (beyond any routing the library holds)", 9, "0,0,1,0,33,5,0.7,0,0",
         "t.csv: line 9, column 5: slot 33 out of range [0, 2) (n_expert_used=2)"},
        {"phase not 0/1", 9, "0,2,1,0,0,5,0.7,0,0",
         "t.csv: line 9, column 2: phase 2 out of range; expected 0 (prefill) or 1 (decode)"},
        {"residency not 0/1/2", 9, "0,0,1,0,0,5,0.7,3,0",
         "t.csv: line 9, column 8: residency 3 out of range; expected 0 (miss), 1 (hit) or 2 (hit "
         "thanks to a speculative read)"},
        {"weight not a number", 9, "0,0,1,0,0,5,heavy,0,0",
         "t.csv: line 9, column 7: weight 'heavy' is not a float ('%g', or 'nan')"},
        {"weight outside float's range", 9, "0,0,1,0,0,5,1e39,0,0",
         "t.csv: line 9, column 7: weight '1e39' is outside float's range"},
        {"turn beyond 32 bits", 9, "4294967296,0,1,0,0,5,0.7,0,0",
         "t.csv: line 9, column 1: turn 4294967296 out of range [0, 4294967296)"},
        {"number beyond 64 bits", 9, "0,0,1,0,0,5,0.7,0,99999999999999999999",
         "t.csv: line 9, column 9: expert_bytes '99999999999999999999' does not fit in 64 bits"},
        {"expert_bytes neither 0 nor the layer's bytes", 10, "0,0,1,0,1,3,0.3,0,2000",
         "t.csv: line 10, column 9: expert_bytes 2000 for layer 0; expected 0 or the layer's 1000"},
        {"a hit that read bytes", 17, "0,1,2,0,0,5,0.6,1,1000",
         "t.csv: line 17, column 9: expert_bytes 1000 on a hit (residency 1); expected 0 (only a miss "
         "reads)"},
        {"CRLF in a row", 9, "0,0,1,0,0,5,0.7,0,0\r",
         "t.csv: line 9, column 9: expert_bytes '0\\r' is not an unsigned integer (the file has CRLF "
         "line endings; expected LF)"},
    });
  }
  SUBCASE("dropped column out of range") {
    auto lines = base_lines;
    lines[5] += ",dropped";
    for (std::size_t i = 6; i < lines.size(); ++i) lines[i] += ",0";
    lines[8] = "0,0,1,0,0,5,0.7,0,0,2";
    CHECK_THROWS_WITH_AS(parse(join(lines)), "t.csv: line 9, column 10: dropped 2 out of range; expected 0 or 1",
                         error);
  }
  SUBCASE("empty line and comment among the rows") {
    CHECK_THROWS_WITH_AS(parse(with_inserted(9, "")), "t.csv: line 9, column 1: empty line; expected a row of 9 fields",
                         error);
    CHECK_THROWS_WITH_AS(parse(with_inserted(9, "# note")),
                         "t.csv: line 9, column 1: comment line '# note' after the column header; expected a row",
                         error);
  }
}

TEST_CASE("CSV: row order") {
  SUBCASE("one replaced line each (defect, line, text, message)") {
    check_line_cases({
        {"step going backwards within decode", 23, "0,1,1,0,0,5,0.6,1,0",
         "t.csv: line 23, column 3: step 1 after step 2 in decode of turn 0; expected non-decreasing "
         "steps"},
        {"slots out of rank order", 9, "0,0,1,0,1,5,0.7,0,0",
         "t.csv: line 9, column 5: slot 1 starts a routing; expected 0 (rows in rank order)"},
        {"the same expert twice in one routing", 10, "0,0,1,0,1,5,0.3,0,0",
         "t.csv: line 10, column 6: expert 5 already routed at slot 0 of this routing; expected "
         "distinct experts"},
    });
  }
  SUBCASE("layers descending within a decode token") {
    auto lines = base_lines;
    lines[26] = "0,1,3,0,0,5,0.6,1,0";  // token 3: layers 0, 1, then 0 again
    lines[27] = "0,1,3,0,1,6,0.4,1,0";
    CHECK_THROWS_WITH_AS(parse(join(lines)),
                         "t.csv: line 27, column 4: layer 0 after layer 1 at decode step 3; expected ascending "
                         "layers within a token",
                         error);
  }
  SUBCASE("prefill steps going backwards within a layer") {
    auto lines = base_lines;
    std::swap(lines[6], lines[8]);
    std::swap(lines[7], lines[9]);
    CHECK_THROWS_WITH_AS(parse(join(lines)),
                         "t.csv: line 9, column 3: step 0 after step 1 in prefill of layer 0, turn 0; expected "
                         "ascending steps within a layer (rows layer-major)",
                         error);
  }
  SUBCASE("prefill after decode in the same turn") {
    CHECK_THROWS_WITH_AS(parse(join(base_lines) + "0,0,4,0,0,5,0.6,1,0\n"),
                         "t.csv: line 29, column 2: prefill row after decode rows of turn 0; expected each turn's "
                         "prefill before its decode",
                         error);
  }
  SUBCASE("turn going backwards") {
    CHECK_THROWS_WITH_AS(parse(join(base_lines) + "1,1,4,0,0,5,0.6,1,0\n1,1,4,0,1,6,0.4,1,0\n0,1,5,0,0,5,0.6,1,0\n"),
                         "t.csv: line 31, column 1: turn 0 after turn 1; expected non-decreasing turns", error);
  }
  SUBCASE("a second prompt batch repeating tokens") {
    CHECK_THROWS_WITH_AS(parse(with_inserted(17, "0,0,0,0,0,5,0.6,1,0")),
                         "t.csv: line 17, column 3: step 0 in a prefill batch of turn 0 that follows step 1; "
                         "expected each batch's tokens after the previous batch's",
                         error);
  }
}

/// The base trace without lines `from` to `to` (1-based, inclusive).
std::string without_lines(std::size_t from, std::size_t to) {
  auto lines = base_lines;
  lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(from - 1), lines.begin() + static_cast<std::ptrdiff_t>(to));
  return join(lines);
}

TEST_CASE("CSV: every routing has n_expert_used rows and every token every MoE layer, once, in order") {
  SUBCASE("a file cut at its end: mid-routing, mid-token, or after its header") {
    CHECK_THROWS_WITH_AS(parse(without_line(28)),
                         "t.csv: end of file after line 27: the last routing (turn 0, decode step 3, layer 2) has 1 "
                         "of 2 experts; expected 2 (n_expert_used): is the file cut short?",
                         error);
    CHECK_THROWS_WITH_AS(parse(without_lines(27, 28)),
                         "t.csv: end of file after line 26: the last token (decode step 3 of turn 0) ends at layer 1; "
                         "expected its layer 2 too (every token routes every MoE layer): is the file cut short?",
                         error);
    CHECK_THROWS_WITH_AS(parse(without_lines(19, 28)),
                         "t.csv: end of file after line 18: the last token (decode step 2 of turn 0) ends at layer 0; "
                         "expected its layers 1 to 2 too (every token routes every MoE layer): is the file cut short?",
                         error);
    CHECK_THROWS_WITH_AS(parse(without_lines(7, 28)),
                         "t.csv: end of file after line 6: no routing rows; expected at least one token", error);
  }
  SUBCASE("rows missing inside the file") {
    CHECK_THROWS_WITH_AS(parse(without_line(20)),
                         "t.csv: line 20, column 5: slot 0 starts a routing, but the routing before it (turn 0, "
                         "decode step 2, layer 1) has 1 of 2 experts; expected 2 (n_expert_used)",
                         error);
    CHECK_THROWS_WITH_AS(parse(without_lines(19, 20)),
                         "t.csv: line 19, column 4: layer 2 after layer 0 at decode step 2 of turn 0; expected layer 1 "
                         "(every token routes every MoE layer once, in order)",
                         error);
    CHECK_THROWS_WITH_AS(parse(without_lines(21, 22)),
                         "t.csv: line 21, column 3: decode step 3 of turn 0 begins, but decode step 2 of turn 0 "
                         "ended at layer 1; expected its layer 2 first (every token routes every MoE layer)",
                         error);
    CHECK_THROWS_WITH_AS(parse(without_lines(15, 16)),
                         "t.csv: line 15, column 2: decode of turn 0 begins, but prefill step 1 of turn 0 ended at "
                         "layer 1; expected its layer 2 first (every token routes every MoE layer)",
                         error);
    CHECK_THROWS_WITH_AS(parse(without_lines(7, 10)),
                         "t.csv: line 7, column 4: layer 1 is the trace's first routing; expected layer 0 (the first "
                         "MoE layer: every token routes every MoE layer, in order)",
                         error);
    CHECK_THROWS_WITH_AS(parse(without_lines(11, 14)),
                         "t.csv: line 11, column 4: layer 2 after layer 0 at prefill step 1 of turn 0; expected layer "
                         "1 (every token routes every MoE layer once, in order)",
                         error);
  }
  SUBCASE("a decode token beginning at a later layer") {
    auto lines = base_lines;
    std::swap(lines[22], lines[24]);  // token 3: layer 1 before layer 0
    std::swap(lines[23], lines[25]);
    CHECK_THROWS_WITH_AS(parse(join(lines)),
                         "t.csv: line 23, column 4: layer 1 begins decode step 3 of turn 0; expected layer 0 (the "
                         "first MoE layer: every token routes every MoE layer, in order)",
                         error);
  }
  SUBCASE("a new turn before the last token's last layer") {
    std::string text = without_lines(27, 28);
    for (int l = 0; l < 3; ++l)
      for (int s = 0; s < 2; ++s)
        text += "1,1,4," + std::to_string(l) + "," + std::to_string(s) + "," + std::to_string(5 + s) + ",0.5,1,0\n";
    CHECK_THROWS_WITH_AS(parse(text),
                         "t.csv: line 27, column 1: turn 1 begins, but decode step 3 of turn 0 ended at layer 1; "
                         "expected its layer 2 first (every token routes every MoE layer)",
                         error);
  }
  SUBCASE("a prompt batch before the last may stop one layer short, not two") {
    // llama.cpp computes the last layer only for rows it needs logits of: a
    // batch before the prompt's last routes no token there.
    std::vector<std::string> lines(base_lines.begin(), base_lines.begin() + 6);
    const std::vector<std::string> prompt = {
        "0,0,0,0,0,5,0.6,0,1000", "0,0,0,0,1,9,0.4,0,1000", "0,0,0,1,0,2,0.5,0,2000", "0,0,0,1,1,1,0.5,0,2000",
        "0,0,1,0,0,5,0.7,0,0",    "0,0,1,0,1,3,0.3,0,1000", "0,0,1,1,0,2,0.9,0,0",    "0,0,1,1,1,4,0.1,0,2000",
        "0,0,1,2,0,7,0.8,0,1000", "0,0,1,2,1,8,0.2,0,1000"};
    lines.insert(lines.end(), prompt.begin(), prompt.end());
    lines.insert(lines.end(), base_lines.begin() + 16, base_lines.end());
    const route_trace t = parse(join(lines));
    CHECK(t.rows.size() == 22);
    CHECK(group_load_batches(t).batches.size() == 5 + 6);  // (0,0) (0,1) (1,0) (1,1) (1,2), 6 decode
    // Four layers, batch 1 stopping at layer 1 (with three, a batch of layer 0
    // alone would read as the same batch's layer 0 going on).
    std::string four = "# route_trace v1\n# model=m arch=t n_layer=4 n_expert=8 n_expert_used=1\n";
    for (int l = 0; l < 4; ++l) four += "# layer=" + std::to_string(l) + " expert_bytes=10 dense_bytes=1\n";
    four += "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n";
    four += "0,0,0,0,0,1,1,0,10\n0,0,0,1,0,1,1,0,10\n0,0,1,0,0,2,1,0,10\n";
    CHECK_THROWS_WITH_AS(parse(four),
                         "t.csv: line 10, column 3: a prompt batch of turn 0 begins at prefill step 1, but prefill "
                         "step 0 of turn 0 ended at layer 1; expected its layers 2 to 3 first (every token routes "
                         "every MoE layer)",
                         error);
  }
  SUBCASE("the binary reader and a hand-built trace say the same") {
    route_trace t = parse(join(base_lines));
    t.rows.pop_back();
    CHECK_THROWS_WITH_AS(validate_route_trace(t, "mine"),
                         "mine: end of rows (21 rows): the last routing (turn 0, decode step 3, layer 2) has 1 of 2 "
                         "experts; expected 2 (n_expert_used): is the file cut short?",
                         error);
    std::string b = binary_of(parse(join(base_lines)));
    // Without the last routing's two records, the row count and checksums to match.
    detail::store_le<std::uint64_t>(reinterpret_cast<unsigned char*>(&b[32]), 20);
    reseal(b);
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(b, "t.bin"),
                         "t.bin: end of records (20 records): the last token (decode step 3 of turn 0) ends at layer "
                         "1; expected its layer 2 too (every token routes every MoE layer): is the file cut short?",
                         error);
    t.rows.clear();
    CHECK_THROWS_WITH_AS(validate_route_trace(t, "mine"),
                         "mine: end of rows (0 rows): no routing rows; expected at least one token", error);
  }
}

TEST_CASE("binary: magic, version, truncation, records") {
  const route_trace t = parse(join(base_lines));
  const std::string good = binary_of(t);
  // model+arch "m.gguf""qwen3moe" pad to 16; then the header's checksum and one block's
  CHECK(good.size() == 48 + 16 + 3 * 16 + 8 + 22 * 20 + 8 + 8);
  CHECK(records_at(good) == 120);
  CHECK(parse_route_trace_binary(good, "t.bin").binary_version() == 2);
  SUBCASE("bad magic") {
    std::string b = good;
    b[1] = 'X';
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(b, "t.bin"),
                         "t.bin: not a binary route trace: bad magic '\\x89XRTRACE'; expected '\\x89MRTRACE'", error);
  }
  SUBCASE("bad version") {
    std::string b = good;
    b[8] = 3;
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(b, "t.bin"),
                         "t.bin: unsupported binary version 3; this reader supports 1 and 2", error);
  }
  SUBCASE("truncated in the fixed header") {
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(good.substr(0, 20), "t.bin"),
                         "t.bin: truncated: 20 bytes; the fixed header alone is 48", error);
  }
  SUBCASE("truncated in the layer table") {
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(good.substr(0, 70), "t.bin"),
                         "t.bin: truncated: 70 bytes; the header needs 120", error);
  }
  SUBCASE("truncated in the records or their checksums") {
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(good.substr(0, good.size() - 7), "t.bin"),
                         "t.bin: truncated: 449 bytes of records and checksums for 22 rows; expected 456", error);
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(good.substr(0, good.size() - 30), "t.bin"),
                         "t.bin: truncated: 426 bytes of records for 22 rows; expected 440 and their checksums", error);
    const std::string v1 = binary_v1_of(t);
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(v1.substr(0, v1.size() - 7), "t.bin"),
                         "t.bin: truncated: 433 bytes of records for 22 rows; expected 440", error);
  }
  SUBCASE("bytes after the last checksum (or the last record of version 1)") {
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(good + "xx", "t.bin"),
                         "t.bin: 2 bytes after the last checksum of 22 records; expected the file to end there", error);
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(binary_v1_of(t) + "xx", "t.bin"),
                         "t.bin: 2 bytes after the last of 22 records; expected the file to end there", error);
  }
  SUBCASE("a record out of range is validated like a CSV row") {
    std::string b = good;
    b[120 + 3 * 20 + 14] = 16;  // record 3's expert
    reseal(b);
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(b, "t.bin"),
                         "t.bin: record 3, column expert: expert 16 out of range [0, 16)", error);
  }
  SUBCASE("a record's weight: negative or infinite is refused, by the scan as by the exact pass; -0 and NaN pass") {
    for (std::uint32_t bits : {0xbf800000u, 0x7f800000u, 0xff800000u, 0x80000001u, 0x80000000u, 0xffc00000u}) {
      std::string b = good;
      for (int i = 0; i < 4; ++i)
        b[120 + 3 * 20 + 8 + static_cast<std::size_t>(i)] = static_cast<char>(bits >> (8 * i));
      reseal(b);
      const bool valid = bits == 0x80000000u || bits == 0xffc00000u;  // -0, -nan
      CHECK(detail::weight_bits_in_domain(bits) == valid);
      if (valid) {
        CHECK(parse_route_trace_binary(b, "t.bin").rows().size() == 22);
      } else {
        CHECK_THROWS_WITH_AS(parse_route_trace_binary(b, "t.bin"),
                             doctest::Contains("t.bin: record 3, column weight: weight "), error);
        CHECK_THROWS_WITH_AS(detail::parse_route_trace_binary_with(b, "t.bin", detail::binary_rows_pass::exact),
                             doctest::Contains("t.bin: record 3, column weight: weight "), error);
      }
    }
  }
  SUBCASE("a record's flag bits") {
    std::string b = good;
    b[120 + 19] = 4;  // dropped = 1 without a dropped column
    reseal(b);
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(b, "t.bin"),
                         "t.bin: record 0, column dropped: bits 4; expected no dropped value (no column)", error);
  }
  SUBCASE("through read_route_trace, the path names the file") {
    const std::string path = "test_trace_errors_truncated.bin";
    {
      std::ofstream f(path, std::ios::binary);
      f << good.substr(0, good.size() - 1);
    }
    CHECK_THROWS_WITH_AS(read_route_trace(path),
                         "test_trace_errors_truncated.bin: truncated: 455 bytes of records and checksums for 22 rows; "
                         "expected 456",
                         error);
    std::remove(path.c_str());
  }
}

TEST_CASE("read_route_trace checks a file's head before reading the rest, with the whole parse's message") {
  const route_trace t = parse(join(base_lines));
  const std::string bin = binary_of(t), v1 = binary_v1_of(t), csv = join(base_lines);
  const std::string path = "test_trace_errors_head.trace";
  auto write = [&](const std::string& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << bytes;
  };
  auto verdict = [](auto&& read) -> std::string {
    try {
      read();
      return "accepted";
    } catch (const error& e) {
      return e.what();
    }
  };
  // Every cut and every one-byte change of the binary forms' first 128 bytes,
  // every cut of the CSV's first line: the file reader gives exactly the
  // in-memory parser's verdict, whether the head check or the parse refuses.
  std::vector<std::string> files;
  for (const std::string* g : {&bin, &v1}) {
    for (std::size_t n = 0; n <= g->size(); n += (n < 130 ? 1 : 37)) files.push_back(g->substr(0, n));
    for (std::size_t i = 0; i < 128; ++i)
      for (unsigned char x : {0x01, 0x80, 0xff}) {
        std::string d = *g;
        d[i] = static_cast<char>(static_cast<unsigned char>(d[i]) ^ x);
        files.push_back(d);
      }
    files.push_back(*g + "x");
  }
  for (std::size_t n = 0; n < 40; ++n) files.push_back(csv.substr(0, n));
  files.push_back("\n" + csv);
  // The encodings: a byte-order mark (skipped), compressed data and UTF-16 (named), cut anywhere.
  for (const std::string& lead :
       {std::string("\xef\xbb\xbf"), std::string("\x1f\x8b\x08\x00", 4), std::string("\x28\xb5\x2f\xfd"),
        std::string("\xfd\x37\x7a\x58\x5a\x00", 6), std::string("\xff\xfe#\0", 4)})
    for (std::size_t n = 0; n <= lead.size() + 3; ++n) files.push_back((lead + csv).substr(0, n));
  files.push_back(std::string(100000, 'x'));  // a first line longer than the head
  std::size_t refused = 0;
  for (const std::string& f : files) {
    write(f);
    const std::string from_file = verdict([&] { (void)read_route_trace(path, [](auto&&) {}); });
    const std::string in_memory = verdict([&] {
      (void)(!f.empty() && static_cast<unsigned char>(f[0]) == 0x89 ? parse_route_trace_binary(f, path, [](auto&&) {})
                                                                    : parse_route_trace_csv(f, path));
    });
    REQUIRE_MESSAGE(from_file == in_memory, "a file of ", f.size(), " bytes");
    refused += from_file != "accepted";
  }
  CHECK(refused > files.size() / 2);
  std::remove(path.c_str());
}

TEST_CASE("read_route_trace refuses a huge sparse file from its head, without reading or allocating it whole") {
  // A 1 TiB file of zeros (sparse: no disk blocks) and one whose binary header
  // claims a few records: read whole, either would fail for memory, not with
  // the trace's message.
  const std::string path = "test_trace_errors_sparse.trace";
  const std::uint64_t tib = std::uint64_t{1} << 40;
  { std::ofstream f(path, std::ios::binary | std::ios::trunc); }
  std::error_code ec;
  std::filesystem::resize_file(path, tib, ec);
  if (ec) {
    MESSAGE("SKIPPED: this file system cannot hold a 1 TiB sparse file: " << ec.message());
    std::remove(path.c_str());
    return;
  }
  CHECK_THROWS_WITH_AS(read_route_trace(path),
                       doctest::Contains((path + ": line 1, column 1: missing magic line").c_str()), error);
  const route_trace t = parse(join(base_lines));
  {
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
    const std::string bin = binary_of(t);
    f.write(bin.data(), static_cast<std::streamsize>(bin.size()));
  }
  CHECK_THROWS_WITH_AS(read_route_trace(path),
                       (path + ": " + std::to_string(tib - binary_of(t).size()) +
                        " bytes after the last checksum of 22 records; expected the file to end there")
                           .c_str(),
                       error);
  std::remove(path.c_str());
}

TEST_CASE("text inputs: binary data in a configuration's head is refused before the rest is read") {
  const std::string path = "test_trace_errors_nul.cfg";
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << std::string("lanes = 2\n\0\0", 12);
  }
  CHECK_THROWS_WITH_AS(detail::read_input_file(path, "a config", detail::text_head(path, "a text file")),
                       (path + ": holds binary data (a NUL byte at offset 10); expected a text file").c_str(), error);
  CHECK(detail::read_input_file(path, "a config").size() == 12);  // without the check: the bytes as they are
  std::remove(path.c_str());
}

TEST_CASE("encodings: a UTF-8 byte-order mark is skipped; compressed data and UTF-16 are named, not 'no magic'") {
  const std::string csv = join(base_lines);
  const route_trace plain = parse(csv);
  // Notepad's and Excel's byte-order mark: the same trace.
  const route_trace bom = parse("\xef\xbb\xbf" + csv);
  CHECK(bom.rows.size() == plain.rows.size());
  CHECK(bom.header.arch == "qwen3moe");
  // One mark only: a second is no magic line.
  CHECK_THROWS_WITH_AS(parse("\xef\xbb\xbf\xef\xbb\xbf" + csv),
                       "t.csv: line 1, column 1: missing magic line: found '\\xef\\xbb\\xbf# route_trace v1'; expected "
                       "'# route_trace v1'",
                       error);
  const struct {
    std::string lead, message;
  } cases[] = {
      {std::string("\x1f\x8b\x08\x00", 4),
       "t.csv: is gzip-compressed data (magic bytes 1f 8b); expected a route trace (CSV or binary): decompress it "
       "first (gunzip -k FILE)"},
      {"\x28\xb5\x2f\xfd",
       "t.csv: is zstd-compressed data (magic bytes 28 b5 2f fd); expected a route trace (CSV or binary): decompress "
       "it first (zstd -d FILE)"},
      {std::string("\xfd\x37\x7a\x58\x5a\x00", 6),
       "t.csv: is xz-compressed data (magic bytes fd 37 7a 58 5a 00); expected a route trace (CSV or binary): "
       "decompress it first (xz -dk FILE)"},
      {"BZh91AY&SY",
       "t.csv: is bzip2-compressed data (magic bytes 42 5a 68); expected a route trace (CSV or binary): decompress "
       "it first (bunzip2 -k FILE)"},
      {"PK\x03\x04",
       "t.csv: is a zip archive (magic bytes 50 4b 03 04); expected a route trace (CSV or binary): extract the file "
       "first (unzip)"},
      {"\xff\xfe",
       "t.csv: is UTF-16 text (byte-order mark ff fe); expected a route trace (CSV or binary): convert it to UTF-8 "
       "first (iconv -f UTF-16 -t UTF-8 FILE)"},
      {"\xfe\xff",
       "t.csv: is UTF-16 text (byte-order mark fe ff); expected a route trace (CSV or binary): convert it to UTF-8 "
       "first (iconv -f UTF-16 -t UTF-8 FILE)"},
      {std::string("\xff\xfe\0\0", 4),
       "t.csv: is UTF-32 text (byte-order mark ff fe 00 00); expected a route trace (CSV or binary): convert it to "
       "UTF-8 first (iconv -f UTF-32 -t UTF-8 FILE)"},
      {std::string("\0\0\xfe\xff", 4),
       "t.csv: is UTF-32 text (byte-order mark 00 00 fe ff); expected a route trace (CSV or binary): convert it to "
       "UTF-8 first (iconv -f UTF-32 -t UTF-8 FILE)"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.message);
    CHECK_THROWS_WITH_AS(parse(c.lead + csv), c.message.c_str(), error);
  }
  // "BZh" alone is text (a trace's magic line is checked next), not bzip2.
  CHECK_THROWS_WITH_AS(parse("BZh9 not compressed\n" + csv),
                       "t.csv: line 1, column 1: missing magic line: found 'BZh9 not compressed'; expected '# "
                       "route_trace v1'",
                       error);
}

TEST_CASE("a declared shape is bounded before anything is sized from it") {
  // A few hundred bytes declaring 65535 layers x 65535 experts: every replay
  // table (one entry per layer and expert) would be 4.3 billion entries.
  CHECK(max_expert_slots == 1048576);
  CHECK_THROWS_WITH_AS(parse(with_line(2, "# model=m.gguf arch=qwen3moe n_layer=65535 n_expert=65535 n_expert_used=2")),
                       "t.csv: line 2, column 4: n_layer 65535 x n_expert 65535 = 4294836225 expert slots; expected at "
                       "most 1048576 (MOE_RESIDENCY_MAX_EXPERT_SLOTS: a replay sizes its tables by layer x expert)",
                       error);
  // At the limit is fine (the rows are then checked as ever: this one routes layer 0 of 16).
  CHECK(parse(with_line(2, "# model=m.gguf arch=qwen3moe n_layer=16 n_expert=65535 n_expert_used=2")).rows.size() ==
        22);
  const route_trace t = parse(join(base_lines));
  SUBCASE("binary: refused from the fixed header, before the layer table is read") {
    // 17 layers (3 routed) of 16 experts, then n_expert made 65535 and the checksums made to match.
    route_trace wide = t;
    wide.header.n_layer = 17;
    wide.header.expert_bytes.resize(17, 0);
    wide.header.dense_bytes.resize(17, 0);
    wide.header.layer_listed.assign(17, false);
    for (std::size_t l = 0; l < 3; ++l) wide.header.layer_listed[l] = true;
    std::string w = binary_of(wide);
    detail::store_le<std::uint32_t>(reinterpret_cast<unsigned char*>(&w[24]), 65535);
    reseal(w);
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(w, "t.bin"),
                         "t.bin: header: n_layer 17 x n_expert 65535 = 1114095 expert slots; expected at most 1048576 "
                         "(MOE_RESIDENCY_MAX_EXPERT_SLOTS: a replay sizes its tables by layer x expert)",
                         error);
    CHECK_THROWS_WITH_AS(detail::read_binary_trace_frame(w.substr(0, 48), w.size(), "t.bin"),
                         doctest::Contains("n_layer 17 x n_expert 65535 = 1114095 expert slots"), error);
  }
  SUBCASE("a hand-built trace, and its writers") {
    route_trace h = t;
    h.header.n_expert = 65535;
    h.header.n_layer = 3;
    CHECK_NOTHROW(validate_route_trace(h));  // 196605 slots
    h.header.n_layer = 20;
    h.header.expert_bytes.resize(20, 0);
    h.header.dense_bytes.resize(20, 0);
    h.header.layer_listed.assign(20, false);
    for (std::size_t l = 0; l < 3; ++l) h.header.layer_listed[l] = true;
    CHECK_THROWS_WITH_AS(validate_route_trace(h, "h"),
                         "h: header: n_layer 20 x n_expert 65535 = 1310700 expert slots; expected at most 1048576 "
                         "(MOE_RESIDENCY_MAX_EXPERT_SLOTS: a replay sizes its tables by layer x expert)",
                         error);
    CHECK_THROWS_WITH_AS(h.shape(), doctest::Contains("1310700 expert slots"), error);
  }
}

TEST_CASE("binary: XXH64 gives the published values") {
  // xxhsum -H64 (xxHash 0.8) prints these; the lengths cover each of the tail
  // paths (32-byte stripes, 8-, 4- and 1-byte steps).
  auto h = [](const std::string& s) {
    return detail::xxh64(reinterpret_cast<const unsigned char*>(s.data()), s.size());
  };
  CHECK(h("") == 0xef46db3751d8e999ull);
  CHECK(h("abc") == 0x44bc2cf5ad770999ull);
  const std::string text = join(base_lines);  // xxhsum over these bytes of the fixture
  CHECK(h(text.substr(0, 1)) == 0x1fb4526836352e25ull);
  CHECK(h(text.substr(0, 31)) == 0x4b58bc995eb0ec4dull);
  CHECK(h(text.substr(0, 100)) == 0xf78a08c9b0580fffull);
  CHECK(h(text) == 0x9809f03e7b82ef1eull);
  // The same bytes at any alignment.
  std::string shifted = "x" + text;
  CHECK(detail::xxh64(reinterpret_cast<const unsigned char*>(shifted.data()) + 1, text.size()) == h(text));
}

TEST_CASE("binary: a damaged byte is caught by its block's checksum, even where the damaged record still parses") {
  const route_trace t = parse(join(base_lines));
  const std::string good = binary_of(t);
  SUBCASE("a weight byte: version 1 reads it as another weight, version 2 refuses it, naming the block") {
    std::string v1 = binary_v1_of(t);
    v1[120 + 5 * 20 + 8] ^= 0x10;  // record 5's weight
    std::vector<std::string> warnings;
    const validated_route_trace read =
        parse_route_trace_binary(v1, "old.bin", [&](const std::string& w) { warnings.push_back(w); });
    CHECK(read.binary_version() == 1);
    CHECK(detail::float_bits(read.rows()[5].weight) != detail::float_bits(t.rows[5].weight));
    REQUIRE(warnings.size() == 1);
    CHECK(warnings[0] ==
          "old.bin: binary trace version 1 has no checksums, so a damaged byte that still parses goes "
          "unnoticed; rewrite it as version 2 (moe-residency convert --to binary)");
    std::string b = good;
    b[120 + 5 * 20 + 8] ^= 0x10;
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(b, "t.bin"),
                         doctest::Contains("t.bin: records 0 to 21 (block 0 of 1): checksum (XXH64) 0x"), error);
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(b, "t.bin"),
                         doctest::Contains(": a byte in them or their checksum is damaged"), error);
  }
  SUBCASE("a header byte (a layer's expert bytes) and a stored checksum") {
    std::string b = good;
    b[64] ^= 0x01;  // layer 0's expert_bytes: 1000 becomes 1001, which would still parse
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(b, "t.bin"),
                         doctest::Contains("the header (bytes 0 to 119) or its checksum is damaged"), error);
    std::string c = good;
    c[c.size() - 1] ^= 0x80;  // the block's checksum itself
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(c, "t.bin"),
                         doctest::Contains("t.bin: records 0 to 21 (block 0 of 1)"), error);
  }
  SUBCASE("every change of any one byte to any other value, and every truncation, is refused") {
    std::size_t accepted = 0, tried = 0;
    auto refused = [&](const std::string& b) {
      ++tried;
      try {
        (void)parse_route_trace_binary(b, "t.bin");
        ++accepted;
        return false;
      } catch (const error&) {
        return true;
      }
    };
    for (std::size_t at = 0; at < good.size(); ++at)
      for (int x = 1; x < 256; ++x) {
        std::string b = good;
        b[at] = static_cast<char>(b[at] ^ x);
        if (!refused(b)) FAIL_CHECK("byte ", at, " xor ", x, " accepted");
      }
    for (std::size_t n = 0; n < good.size(); ++n)
      if (!refused(good.substr(0, n))) FAIL_CHECK("the first ", n, " bytes accepted");
    CHECK(tried == good.size() * 256);
    CHECK(accepted == 0);
  }
  SUBCASE("in a file of three blocks, the damaged block is named") {
    std::string text = join(std::vector<std::string>(base_lines.begin(), base_lines.begin() + 6));
    for (int step = 0; step < 2000; ++step)
      for (int l = 0; l < 3; ++l)
        for (int slot = 0; slot < 2; ++slot)
          text += "0,1," + std::to_string(step) + "," + std::to_string(l) + "," + std::to_string(slot) + "," +
                  std::to_string((step + 3 * l + slot) % 16) + ",0.5,1,0\n";
    const route_trace big = parse(text);
    REQUIRE(big.rows.size() == 12000);
    std::string b = binary_of(big);
    CHECK(b.size() == 120 + 12000 * 20 + 8 + 3 * 8);
    CHECK(parse_route_trace_binary(b, "big.bin").rows().size() == 12000);
    b[120 + 9000 * 20 + 3] ^= 0x01;  // record 9000's turn
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(b, "big.bin"),
                         doctest::Contains("big.bin: records 8192 to 11999 (block 2 of 3): checksum (XXH64) 0x"),
                         error);
  }
}

TEST_CASE("hand-built traces are validated before anything is written or derived") {
  route_trace t = parse(join(base_lines));
  SUBCASE("writer refuses and writes nothing") {
    t.rows[4].expert = expert_id{200};
    std::ostringstream out;
    CHECK_THROWS_WITH_AS(write_route_trace_csv(t, out),
                         "route_trace: rows[4], column expert: expert 200 out of range [0, 16)", error);
    CHECK(out.str().empty());
    CHECK_THROWS_WITH_AS(write_route_trace_binary(t, out),
                         "route_trace: rows[4], column expert: expert 200 out of range [0, 16)", error);
    CHECK(out.str().empty());
    CHECK_THROWS_AS(group_load_batches(t), error);
    CHECK_THROWS_AS(collect_routings(t), error);
  }
  SUBCASE("header vectors of the wrong size") {
    t.header.expert_bytes.pop_back();
    CHECK_THROWS_WITH_AS(validate_route_trace(t),
                         "route_trace: header: expert_bytes has 2 and dense_bytes 3 entries; expected n_layer (3) each",
                         error);
  }
  SUBCASE("shape() of a routed layer with zero bytes") {
    t.header.expert_bytes[1] = 0;
    CHECK_THROWS_WITH_AS(t.shape(),
                         "route_trace 'qwen3moe': layer 1 is routed but has 0 expert bytes; expected its expert bytes "
                         "> 0",
                         error);
  }
  SUBCASE("dropped value without a dropped column") {
    t.rows[0].dropped = 0;
    CHECK_THROWS_WITH_AS(validate_route_trace(t, "mine"),
                         "mine: rows[0], column dropped: dropped 0 but the trace has no dropped column; expected -1",
                         error);
  }
}

TEST_CASE("corrupted input either parses into a valid trace or throws moe_residency::error") {
  // Random single-byte damage with fixed seeds; run under ASan/UBSan in CI.
  const std::string csv = join(base_lines);
  const route_trace t = parse(csv);
  const std::string bin = binary_of(t);
  std::mt19937 rng(412);
  const std::string alphabet = "0123456789,-\n#.nax =\r";
  std::size_t parsed = 0, rejected = 0, other = 0, invalid_but_parsed = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string damaged = (i % 2) ? bin : csv;
    const std::size_t n_edits = 1 + rng() % 3;
    for (std::size_t e = 0; e < n_edits; ++e) {
      const std::size_t at = rng() % damaged.size();
      damaged[at] = (i % 2) ? static_cast<char>(rng() & 0xff) : alphabet[rng() % alphabet.size()];
    }
    if (rng() % 8 == 0) damaged.resize(rng() % damaged.size());
    try {
      const route_trace d = (i % 2) ? parse_route_trace_binary(damaged, "d.bin") : parse(damaged);
      ++parsed;
      try {
        validate_route_trace(d);
      } catch (const error& ex) {
        ++invalid_but_parsed;
        MESSAGE("parsed but invalid: " << std::string(ex.what()));
      }
    } catch (const error&) {
      ++rejected;
    } catch (...) {
      ++other;
    }
  }
  CHECK(other == 0);
  CHECK(invalid_but_parsed == 0);
  CHECK(rejected > 1000);  // most damage is caught
  CHECK(parsed > 0);       // and some is harmless (a weight digit, a hit flag)
}

TEST_CASE("binary: the reader's scan accepts exactly the records the exact pass accepts, in any chunking") {
  // The reader (parse_route_trace_binary) scans the raw records and decodes
  // them only after they pass; the exact pass (each record decoded and run
  // through trace_row_checker, which the reader runs for a refused file's
  // message) is its slow twin. Every byte of every record is set to values
  // around each range's edge, in the base trace and in one with a dropped
  // column: the scan must refuse a damaged file exactly when the exact pass
  // does (a looser scan would accept an invalid trace, a stricter one would
  // only be slow), whether it sees the records at once, one by one or three
  // at a time (its state carries across the reader's chunks); and where both
  // accept, the reader's rows are the exact pass's rows.
  std::vector<std::string> with_dropped = base_lines;
  with_dropped[5] += ",dropped";
  for (std::size_t i = 6; i < with_dropped.size(); ++i) with_dropped[i] += (i % 3 == 0) ? ",1" : ",0";
  const std::vector<std::string>& dropped_lines = with_dropped;
  for (const std::vector<std::string>* lines : {&base_lines, &dropped_lines}) {
    const route_trace t = parse(join(*lines));
    CAPTURE(t.header.has_dropped_column);
    const std::string good = binary_of(t);
    const std::size_t first = records_at(good);
    auto exact_rows = [&](const std::string& b, std::vector<trace_row>& rows) {
      try {
        detail::read_binary_rows_exact(reinterpret_cast<const unsigned char*>(b.data()) + first, t.rows.size(),
                                       t.header, rows, "t.bin");
        return true;
      } catch (const error&) {
        return false;
      }
    };
    auto same_rows = [](const std::vector<trace_row>& a, const std::vector<trace_row>& b) {
      bool same = a.size() == b.size();
      for (std::size_t i = 0; same && i < a.size(); ++i) {
        const trace_row &x = a[i], &y = b[i];
        same = x.turn == y.turn && x.phase == y.phase && x.step == y.step && x.layer == y.layer && x.slot == y.slot &&
               x.expert == y.expert && detail::float_bits(x.weight) == detail::float_bits(y.weight) &&
               x.residency == y.residency && x.expert_bytes == y.expert_bytes && x.dropped == y.dropped;
      }
      return same;
    };
    // The scan's verdict; where it accepts, the rows decoded both ways (the
    // composed words, where the layout allows them, and member by member)
    // must be the exact pass's rows.
    std::size_t stores_differ = 0;
    auto scan = [&](const std::string& b, std::size_t piece) {
      detail::binary_record_scanner s(t.header);
      const auto* p = reinterpret_cast<const unsigned char*>(b.data()) + first;
      for (std::size_t i = 0; i < t.rows.size(); i += piece)
        if (!s.check(p + 20 * i, std::min(piece, t.rows.size() - i))) return false;
      return s.finish();
    };
    auto decoded = [&](const std::string& b, auto store) {
      const auto* p = reinterpret_cast<const unsigned char*>(b.data()) + first;
      const detail::binary_row_iterator<decltype(store)::value> it(p, t.header.expert_bytes.data());
      return std::vector<trace_row>(it, it + static_cast<std::ptrdiff_t>(t.rows.size()));
    };
    std::size_t cases = 0, accepted = 0, disagreements = 0, rows_differ = 0, values_differ = 0, values_refused = 0;
    for (std::size_t at = first; at < first + 20 * t.rows.size(); ++at) {
      const auto orig = static_cast<unsigned char>(good[at]);
      for (const unsigned v : {0u, 1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 15u, 16u, 17u, 255u, orig - 1u, orig + 1u}) {
        std::string b = good;
        b[at] = static_cast<char>(v & 0xffu);
        reseal(b);  // the damage reaches the record checks (the checksums are tested above)
        std::vector<trace_row> exact;
        const bool slow = exact_rows(b, exact);
        ++cases;
        accepted += slow;
        {
          // The value checks alone: the vector lanes and the scalar twin agree.
          const detail::binary_record_scanner s(t.header);
          const auto* p = reinterpret_cast<const unsigned char*>(b.data()) + first;
          const bool scalar = s.check_values_scalar(p, t.rows.size());
#if MOE_RESIDENCY_BINARY_SCAN_VECTOR
          values_differ += s.check_values_vector(p, t.rows.size()) != scalar;
#endif
          values_refused += !scalar;
        }
        for (const std::size_t piece : {t.rows.size(), std::size_t{1}, std::size_t{3}})
          if (scan(b, piece) != slow) {
            ++disagreements;
            MESSAGE("byte " << at - first << " = " << (v & 0xffu) << ", pieces of " << piece << ": exact pass "
                            << slow);
          }
        if (!slow) continue;
        rows_differ += !same_rows(parse_route_trace_binary(b, "t.bin").rows(), exact);
        stores_differ +=
            !same_rows(decoded(b, std::integral_constant<detail::row_store, detail::row_store::words>{}), exact);
        stores_differ +=
            !same_rows(decoded(b, std::integral_constant<detail::row_store, detail::row_store::members>{}), exact);
#if MOE_RESIDENCY_BINARY_SCAN_VECTOR
        stores_differ +=
            !same_rows(decoded(b, std::integral_constant<detail::row_store, detail::row_store::lanes>{}), exact);
#endif
      }
    }
    CHECK(cases == t.rows.size() * 20 * 15);
    CHECK(disagreements == 0);
    CHECK(rows_differ == 0);
    CHECK(stores_differ == 0);
    CHECK(values_differ == 0);
    CHECK(values_refused > cases / 4);  // the value checks alone refuse much of the damage
    CHECK(accepted > 0);                // harmless damage exists (a weight byte)
    CHECK(accepted < cases / 2);        // and most is caught
  }
}

namespace {

// A random valid trace: 1-6 layers, some unlisted or with 0 expert bytes (never
// routed), 1-300 experts, k from 1 to 256, with or without a dropped column;
// one or two turns of a prompt in one or two batches (layer-major; a batch
// before the last may stop short of the last layer, the last batch's last
// layer may hold only its last token) and decode tokens, every routing of k
// rows, random weights (NaN among them), residencies and reads; at least one
// routing.
route_trace random_trace(std::mt19937& rng) {
  route_trace t;
  trace_header& h = t.header;
  h.model = "m.gguf";
  h.arch = "qwen3moe";
  const bool big_k = rng() % 8 == 0;
  h.n_layer = big_k ? 1 + rng() % 2 : 1 + rng() % 6;
  static const std::size_t experts[] = {1, 2, 3, 8, 16, 64, 128, 256, 300};
  h.n_expert = big_k ? 256 + rng() % 45 : experts[rng() % 9];
  h.n_expert_used = big_k ? 256 - rng() % 2 : 1 + rng() % std::min<std::size_t>(h.n_expert, 8);
  h.has_dropped_column = rng() % 2;
  const bool listing = rng() % 2;
  std::vector<std::size_t> routed;
  for (std::size_t l = 0; l < h.n_layer; ++l) {
    const bool listed = l == 0 || !listing || rng() % 4 != 0;  // layer 0 routed: a trace holds a token
    const bool moe = listed && (l == 0 || rng() % 5 != 0);
    h.expert_bytes.push_back(moe ? 1000 + 8 * l : 0);
    h.dense_bytes.push_back(listed ? 50 : 0);
    if (listing) h.layer_listed.push_back(listed);
    if (moe) routed.push_back(l);
  }
  std::vector<std::uint16_t> perm(h.n_expert);
  for (std::size_t e = 0; e < perm.size(); ++e) perm[e] = static_cast<std::uint16_t>(e);
  auto routing = [&](std::uint32_t turn, run_phase phase, std::uint32_t step, std::size_t layer) {
    const std::size_t m = h.n_expert_used;
    for (std::size_t s = 0; s < m; ++s) std::swap(perm[s], perm[s + rng() % (perm.size() - s)]);
    for (std::size_t s = 0; s < m; ++s) {
      trace_row r;
      r.turn = turn;
      r.phase = phase;
      r.step = step;
      r.layer = layer_id{static_cast<std::uint16_t>(layer)};
      r.slot = static_cast<std::uint8_t>(s);
      r.expert = expert_id{perm[s]};
      r.weight = rng() % 16 == 0 ? detail::bits_float(0x7fc00000u | static_cast<std::uint32_t>(rng() % 4))
                                 : detail::bits_float(weight_bits(static_cast<std::uint32_t>(rng())));
      r.residency = static_cast<std::uint8_t>(rng() % 3);
      r.expert_bytes = r.residency == 0 && rng() % 2 ? h.expert_bytes[layer] : 0;
      r.dropped = h.has_dropped_column ? static_cast<std::int8_t>(rng() % 2) : std::int8_t{-1};
      t.rows.push_back(r);
    }
  };
  const std::uint32_t turns = 1 + rng() % 2;
  for (std::uint32_t turn = 0; turn < turns; ++turn) {
    std::uint32_t step = turn * 7 + static_cast<std::uint32_t>(rng() % 3);
    const std::uint32_t batches = big_k ? 1 : static_cast<std::uint32_t>(rng() % 3);
    for (std::uint32_t b = 0; b < batches; ++b) {
      const std::uint32_t tokens = 1 + static_cast<std::uint32_t>(rng() % 3);
      const bool last_batch = b + 1 == batches;
      // llama.cpp computes the last layer only for the rows it needs logits of.
      const bool no_outputs = !last_batch && routed.size() > 1 && rng() % 2;
      const bool one_output = last_batch && rng() % 2;
      for (std::size_t j = 0; j < routed.size(); ++j) {
        const bool top = j + 1 == routed.size();
        if (top && no_outputs) break;
        for (std::uint32_t i = top && one_output ? tokens - 1 : 0; i < tokens; ++i)
          routing(turn, run_phase::prefill, step + i, routed[j]);
      }
      step += tokens;
    }
    std::uint32_t decode = big_k ? 1 : static_cast<std::uint32_t>(rng() % 4);
    if (turn + 1 == turns && t.rows.empty()) decode = 1;  // at least one token
    // Decode may begin at the prompt's last step: with one routed layer and
    // k = 256, a routing's slot 255 is then followed by slot 0 of the same
    // turn, step and layer in the next phase (the scanner's key carries there).
    if (batches > 0 && rng() % 2) --step;
    for (std::uint32_t i = 0; i < decode; ++i, ++step)
      for (const std::size_t l : routed) routing(turn, run_phase::decode, step, l);
  }
  return t;
}

// One random defect in the records: a byte set to a random or edge value, a
// 16-bit field (layer, expert) or the slot set around its range's edge, two
// neighbouring records swapped, a record copied over another, or a turn or
// step nudged.
void damage_records(std::string& b, std::size_t first, const trace_header& h, std::mt19937& rng) {
  const auto n = static_cast<std::size_t>(detail::load_le<std::uint64_t>(reinterpret_cast<unsigned char*>(&b[32])));
  if (n == 0) return;
  const std::size_t i = rng() % n;
  unsigned char* r = reinterpret_cast<unsigned char*>(&b[first + 20 * i]);
  auto edge = [&](std::size_t end) {
    const std::uint64_t v[] = {0, 1, end - 1, end, end + 1, 255, 256, 0xffff};
    return v[rng() % 8];
  };
  switch (rng() % 9) {
    case 0: r[rng() % 20] = static_cast<unsigned char>(rng()); break;
    case 1: r[16 + rng() % 4] = static_cast<unsigned char>(edge(4)); break;
    case 2: detail::store_le<std::uint16_t>(r + 12, static_cast<std::uint16_t>(edge(h.n_layer))); break;
    case 3: detail::store_le<std::uint16_t>(r + 14, static_cast<std::uint16_t>(edge(h.n_expert))); break;
    case 4: r[16] = static_cast<unsigned char>(edge(h.n_expert_used)); break;
    case 5:
      if (i + 1 < n) std::swap_ranges(r, r + 20, r + 20);
      break;
    case 6: std::memcpy(r, &b[first + 20 * (rng() % n)], 20); break;
    case 7: {  // cut at a record boundary (the header's row count follows)
      const std::size_t keep = rng() % n;
      b.resize(first + 20 * keep);
      detail::store_le<std::uint64_t>(reinterpret_cast<unsigned char*>(&b[32]), keep);
      break;
    }
    default: {
      const std::size_t at = (rng() % 2) * 4;  // turn or step
      const std::uint32_t v = detail::load_le<std::uint32_t>(r + at);
      detail::store_le<std::uint32_t>(r + at, rng() % 2 ? v + 1 : v - 1);
    }
  }
}

}  // namespace

TEST_CASE(
    "binary: the reader and its exact twin agree on random traces and random damage, row for row and word for word") {
  // The reader (scan in chunks of 512, then decode) against the exact pass
  // alone (each record decoded and run through trace_row_checker, the
  // reader's whole reference): on random valid traces and on the same traces
  // with one to three defects each, both accept with the same rows or both
  // throw the same message; the scanner alone, fed in random pieces, gives
  // the exact pass's verdict.
  std::mt19937 rng(1216);
  auto same_rows = [](const std::vector<trace_row>& a, const std::vector<trace_row>& b) {
    bool same = a.size() == b.size();
    for (std::size_t i = 0; same && i < a.size(); ++i) {
      const trace_row &x = a[i], &y = b[i];
      same = x.turn == y.turn && x.phase == y.phase && x.step == y.step && x.layer == y.layer && x.slot == y.slot &&
             x.expert == y.expert && detail::float_bits(x.weight) == detail::float_bits(y.weight) &&
             x.residency == y.residency && x.expert_bytes == y.expert_bytes && x.dropped == y.dropped;
    }
    return same;
  };
  std::size_t traces = 0, cases = 0, accepted = 0, refused = 0, verdicts_differ = 0, messages_differ = 0,
              rows_differ = 0, scans_differ = 0, big_k = 0, long_traces = 0, slot_255_then_decode = 0,
              values_differ = 0, values_refused = 0, decoders_differ = 0, cut_files = 0;
  for (int trial = 0; trial < 160; ++trial) {
    const route_trace t = random_trace(rng);
    REQUIRE_NOTHROW(validate_route_trace(t, "random"));
    ++traces;
    big_k += t.header.n_expert_used >= 255;
    for (std::size_t i = 1; i < t.rows.size(); ++i) {
      const trace_row &a = t.rows[i - 1], &r = t.rows[i];
      slot_255_then_decode += a.slot == 255 && r.slot == 0 && r.turn == a.turn && r.step == a.step &&
                              r.layer == a.layer && r.phase == run_phase::decode && a.phase == run_phase::prefill;
    }
    long_traces += t.rows.size() > 512;  // the reader's chunk
    const std::string good = binary_of(t);
    const std::size_t first = records_at(good);
    for (int d = 0; d < 24; ++d) {
      std::string b = good;
      const int defects = d == 0 ? 0 : 1 + static_cast<int>(rng() % 3);
      for (int e = 0; e < defects; ++e) damage_records(b, first, t.header, rng);
      reseal(b);  // the damage reaches the record checks
      ++cases;
      std::string fast_message, exact_message;
      std::vector<trace_row> fast_rows, exact_rows;
      try {
        fast_rows = parse_route_trace_binary(b, "r.bin").rows();
      } catch (const error& e) {
        fast_message = e.what();
      }
      try {
        exact_rows = detail::parse_route_trace_binary_with(b, "r.bin", detail::binary_rows_pass::exact).rows();
      } catch (const error& e) {
        exact_message = e.what();
      }
      const bool fast_ok = fast_message.empty(), exact_ok = exact_message.empty();
      if (fast_ok != exact_ok) {
        ++verdicts_differ;
        MESSAGE("trial " << trial << ", case " << d << ": reader '" << fast_message << "', exact pass '"
                         << exact_message << "'");
      }
      messages_differ += fast_message != exact_message;
      if (fast_ok && exact_ok) {
        ++accepted;
        rows_differ += !same_rows(fast_rows, exact_rows);
      } else {
        refused += !exact_ok;
      }
      // The scanner alone, in random pieces (its state carries across them),
      // over the records the (perhaps cut) file holds.
      const auto n_records =
          static_cast<std::size_t>(detail::load_le<std::uint64_t>(reinterpret_cast<const unsigned char*>(&b[32])));
      cut_files += n_records < t.rows.size();
      detail::binary_record_scanner s(t.header);
      const auto* p = reinterpret_cast<const unsigned char*>(b.data()) + first;
      bool scan_ok = true;
      for (std::size_t i = 0; i < n_records && scan_ok;) {
        const std::size_t piece = std::min<std::size_t>(1 + rng() % 300, n_records - i);
        scan_ok = s.check(p + 20 * i, piece);
        i += piece;
      }
      scan_ok = scan_ok && s.finish();
      scans_differ += scan_ok != exact_ok;
      // The value checks: vector lanes against the scalar twin, over the
      // whole file and over a random piece of it (the lanes' tail one by one).
      {
        const std::size_t from = n_records == 0 ? 0 : rng() % n_records;
        for (const std::size_t at : {std::size_t{0}, from}) {
          const bool scalar = s.check_values_scalar(p + 20 * at, n_records - at);
#if MOE_RESIDENCY_BINARY_SCAN_VECTOR
          values_differ += s.check_values_vector(p + 20 * at, n_records - at) != scalar;
#endif
          values_refused += !scalar;
        }
      }
      // Every decoder on an accepted file: the exact pass's rows.
      if (exact_ok) {
        const detail::binary_row_iterator<detail::row_store::words> w(p, t.header.expert_bytes.data());
        const detail::binary_row_iterator<detail::row_store::members> m(p, t.header.expert_bytes.data());
        const auto n = static_cast<std::ptrdiff_t>(n_records);
        decoders_differ += !same_rows(std::vector<trace_row>(w, w + n), exact_rows);
        decoders_differ += !same_rows(std::vector<trace_row>(m, m + n), exact_rows);
#if MOE_RESIDENCY_BINARY_SCAN_VECTOR
        const detail::binary_row_iterator<detail::row_store::lanes> l(p, t.header.expert_bytes.data());
        decoders_differ += !same_rows(std::vector<trace_row>(l, l + n), exact_rows);
#endif
      }
    }
  }
  CHECK(verdicts_differ == 0);
  CHECK(messages_differ == 0);
  CHECK(rows_differ == 0);
  CHECK(scans_differ == 0);
  CHECK(values_differ == 0);
  CHECK(decoders_differ == 0);
  CHECK(values_refused > cases / 4);
  // The draw covers what it claims to: valid and damaged files, both
  // accepted and refused, k of 255-256 (and a full routing of 256 followed
  // by the next phase at the same turn, step and layer), and traces longer
  // than one chunk.
  CHECK(traces == 160);
  CHECK(accepted > cases / 10);
  CHECK(refused > cases / 2);
  CHECK(big_k > 5);
  CHECK(slot_255_then_decode > 0);
  CHECK(long_traces > 5);
  CHECK(cut_files > 50);
}

TEST_CASE("binary: the scanner's (phase, residency, bits) slot is one to one on the bits it gathers") {
  std::vector<int> seen(64, 0);
  for (std::uint32_t phase = 0; phase < 2; ++phase)
    for (std::uint32_t residency = 0; residency < 4; ++residency)
      for (std::uint32_t bits = 0; bits < 8; ++bits) {
        const std::uint32_t slot = detail::binary_record_scanner::combo_index(phase | residency << 8 | bits << 16);
        REQUIRE(slot < 64);
        ++seen[slot];
      }
  CHECK(std::count(seen.begin(), seen.end(), 1) == 64);
}

TEST_CASE(
    "header strings: a model name of any length round-trips whole; past the binary form's 32-bit length it is "
    "refused") {
  // A regression: the llama.cpp adapter read GGUF metadata into 256 bytes, so a model
  // name was cut at 255 silently (tests/llama_cpp/test_llama_cpp_files.cpp holds
  // the adapter to the whole name). Here the trace forms themselves: 300 bytes
  // come back exactly from both, and a length the binary form cannot store is
  // refused, naming the field, its length and the limit, never cut to fit.
  route_trace t = parse(join(base_lines));
  std::string name = "Qwen3 30B A3B, a name longer than 255 bytes:";
  while (name.size() < 300) name += static_cast<char>('a' + name.size() % 26);
  t.header.model = name;
  std::ostringstream csv;
  write_route_trace_csv(t, csv);
  const route_trace from_csv = parse(csv.str());
  const route_trace from_bin = parse_route_trace_binary(binary_of(t), "t.bin");
  CHECK(from_csv.header.model == name);
  CHECK(from_bin.header.model == name);
  CHECK(from_bin.rows.size() == t.rows.size());
  // 2^32 bytes cannot be allocated in a unit test; the rule header_problem applies is.
  CHECK(detail::header_string_length_problem("model", 4294967295ull).empty());
  CHECK(detail::header_string_length_problem("model", 4294967296ull) ==
        "model is 4294967296 bytes; expected at most 4294967295 (the binary form stores a 32-bit length)");
  CHECK(detail::header_string_length_problem("arch", 1ull << 40) ==
        "arch is 1099511627776 bytes; expected at most 4294967295 (the binary form stores a 32-bit length)");
}

namespace {

// A long valid trace in the shape of the real ones: 8 layers, 128 experts,
// top-6, a 3-token prompt (one batch, layer-major) and 40 decode tokens:
// (3 + 40) x 8 x 6 = 2 064 rows, four of the reader's 512-record chunks.
// Experts drawn without repeats per routing, residencies and reads varied.
route_trace long_trace(bool dropped_column) {
  route_trace t;
  trace_header& h = t.header;
  h.model = "m.gguf";
  h.arch = "qwen3moe";
  h.n_layer = 8;
  h.n_expert = 128;
  h.n_expert_used = 6;
  h.has_dropped_column = dropped_column;
  for (std::size_t l = 0; l < h.n_layer; ++l) {
    // Odd layers above 2^32 bytes: the upper half of a row's expert_bytes is written too.
    h.expert_bytes.push_back(l % 2 ? (std::uint64_t{1} << 33) + 16 * l : 1000 + 16 * l);
    h.dense_bytes.push_back(50);
  }
  std::mt19937 rng(512);
  std::vector<std::uint16_t> perm(h.n_expert);
  for (std::size_t e = 0; e < perm.size(); ++e) perm[e] = static_cast<std::uint16_t>(e);
  auto routing = [&](run_phase phase, std::uint32_t step, std::size_t layer) {
    for (std::size_t s = 0; s < h.n_expert_used; ++s) std::swap(perm[s], perm[s + rng() % (perm.size() - s)]);
    for (std::size_t s = 0; s < h.n_expert_used; ++s) {
      trace_row r;
      r.phase = phase;
      r.step = step;
      r.layer = layer_id{static_cast<std::uint16_t>(layer)};
      r.slot = static_cast<std::uint8_t>(s);
      r.expert = expert_id{perm[s]};
      r.weight = detail::bits_float(weight_bits(static_cast<std::uint32_t>(rng())));
      r.residency = static_cast<std::uint8_t>(rng() % 3);
      r.expert_bytes = r.residency == 0 && rng() % 2 ? h.expert_bytes[layer] : 0;
      r.dropped = dropped_column ? static_cast<std::int8_t>(rng() % 2) : std::int8_t{-1};
      t.rows.push_back(r);
    }
  };
  for (std::size_t l = 0; l < h.n_layer; ++l)
    for (std::uint32_t step = 0; step < 3; ++step) routing(run_phase::prefill, step, l);
  for (std::uint32_t step = 3; step < 43; ++step)
    for (std::size_t l = 0; l < h.n_layer; ++l) routing(run_phase::decode, step, l);
  return t;
}

}  // namespace

TEST_CASE(
    "binary: a long trace decodes to its rows, and defects at the reader's chunk boundaries get the exact pass's "
    "message") {
  // The reader checks and decodes in chunks of 512 records, its scan state
  // (the routing, the per-expert stamps, the row order) carried from one
  // chunk to the next. The traces above are mostly shorter than a chunk;
  // this one spans four. Its rows must come back field for field (the
  // decoders write each row as two halves: a half written to the wrong place
  // or from the wrong record fails here), and a defect in a record on either
  // side of a chunk boundary must be refused with the exact pass's message:
  // an expert repeated from the routing's previous row (in the previous
  // chunk), a slot skipped, a routing's step moved back, a bad bits byte, a
  // layer out of range, a routing cut short by a row of the next layer.
  for (const bool dropped_column : {false, true}) {
    CAPTURE(dropped_column);
    const route_trace t = long_trace(dropped_column);
    REQUIRE(t.rows.size() == 2064);
    REQUIRE_NOTHROW(validate_route_trace(t, "long"));
    const std::string good = binary_of(t);
    const std::size_t first = records_at(good);
    const validated_route_trace read = parse_route_trace_binary(good, "long.bin");
    REQUIRE(read.rows().size() == t.rows.size());
    std::size_t fields_differ = 0;
    for (std::size_t i = 0; i < t.rows.size(); ++i) {
      const trace_row &x = read.rows()[i], &y = t.rows[i];
      fields_differ += x.turn != y.turn || x.phase != y.phase || x.step != y.step || x.layer != y.layer ||
                       x.slot != y.slot || x.expert != y.expert ||
                       detail::float_bits(x.weight) != detail::float_bits(y.weight) || x.residency != y.residency ||
                       x.expert_bytes != y.expert_bytes || x.dropped != y.dropped;
    }
    CHECK(fields_differ == 0);

    std::size_t cases = 0;
    for (const std::size_t at : {std::size_t{510}, std::size_t{511}, std::size_t{512}, std::size_t{513},
                                 std::size_t{1023}, std::size_t{1024}, std::size_t{1536}, std::size_t{2063}}) {
      for (int defect = 0; defect < 6; ++defect) {
        CAPTURE(at);
        CAPTURE(defect);
        std::string b = good;
        unsigned char* r = reinterpret_cast<unsigned char*>(&b[first + 20 * at]);
        const unsigned char* prev = r - 20;
        const unsigned slot = r[16];
        switch (defect) {
          case 0:  // the expert of another row of the same routing
            std::memcpy(r + 14, slot == 0 ? r + 20 + 14 : prev + 14, 2);
            break;
          case 1: r[16] = static_cast<unsigned char>(slot + 1); break;
          case 2: {  // the routing's step one back (every row of it)
            const std::size_t begin = at - slot;
            for (std::size_t j = begin; j < begin + 6; ++j) {
              unsigned char* q = reinterpret_cast<unsigned char*>(&b[first + 20 * j]);
              detail::store_le<std::uint32_t>(q + 4, detail::load_le<std::uint32_t>(q + 4) - 2);
            }
            break;
          }
          case 3: r[19] = static_cast<unsigned char>(dropped_column ? 0 : 2); break;
          case 4: detail::store_le<std::uint16_t>(r + 12, 8); break;
          default:  // a routing left at this row: the row claims the next layer's slot 1
            detail::store_le<std::uint16_t>(r + 12, static_cast<std::uint16_t>((r[12] + 1) % 8));
            r[16] = 1;
        }
        reseal(b);  // the damage reaches the record checks
        std::string fast, exact;
        try {
          (void)parse_route_trace_binary(b, "long.bin");
        } catch (const error& e) {
          fast = e.what();
        }
        try {
          (void)detail::parse_route_trace_binary_with(b, "long.bin", detail::binary_rows_pass::exact);
        } catch (const error& e) {
          exact = e.what();
        }
        CHECK(!exact.empty());  // each defect is one
        CHECK(fast == exact);
        ++cases;
      }
    }
    CHECK(cases == 48);
  }
}
