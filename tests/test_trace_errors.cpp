// Malformed route traces: each defect throws moe_residency::error naming the
// file, line and column (1-based field) and the offending value.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "moe_residency/trace.hpp"

using namespace moe_residency;

namespace {

// A valid trace: 3 layers, 16 experts, top-2; a 2-token prompt (layer 2 only
// for the last token), then decode tokens 2 and 3.
const std::vector<std::string> base_lines = {
    "# route_trace v1",                                                   // 1
    "# model=m.gguf arch=qwen3moe n_layer=3 n_expert=16 n_expert_used=2",  // 2
    "# layer=0 expert_bytes=1000 dense_bytes=50",                         // 3
    "# layer=1 expert_bytes=2000 dense_bytes=50",                         // 4
    "# layer=2 expert_bytes=1000 dense_bytes=50",                         // 5
    "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes",    // 6
    "0,0,0,0,0,5,0.6,0,1000",                                             // 7
    "0,0,0,0,1,9,0.4,0,1000",                                             // 8
    "0,0,1,0,0,5,0.7,0,0",                                                // 9
    "0,0,1,0,1,3,0.3,0,1000",                                             // 10
    "0,0,0,1,0,2,0.5,0,2000",                                             // 11
    "0,0,0,1,1,1,0.5,0,2000",                                             // 12
    "0,0,1,1,0,2,0.9,0,0",                                                // 13
    "0,0,1,1,1,4,0.1,0,2000",                                             // 14
    "0,0,1,2,0,7,0.8,0,1000",                                             // 15
    "0,0,1,2,1,8,0.2,0,1000",                                             // 16
    "0,1,2,0,0,5,0.6,1,0",                                                // 17
    "0,1,2,0,1,6,0.4,0,1000",                                             // 18
    "0,1,2,1,0,2,0.5,1,0",                                                // 19
    "0,1,2,1,1,3,nan,0,2000",                                             // 20
    "0,1,2,2,0,7,0.8,1,0",                                                // 21
    "0,1,2,2,1,8,0.2,1,0",                                                // 22
    "0,1,3,0,0,5,0.6,1,0",                                                // 23
    "0,1,3,0,1,6,0.4,1,0",                                                // 24
    "0,1,3,1,0,2,0.5,1,0",                                                // 25
    "0,1,3,1,1,3,0.5,1,0",                                                // 26
    "0,1,3,2,0,7,0.8,1,0",                                                // 27
    "0,1,3,2,1,8,0.2,1,0",                                                // 28
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

}  // namespace

TEST_CASE("the base fixture is valid (so each error below is the one defect)") {
  const route_trace t = parse(join(base_lines));
  CHECK(t.rows.size() == 22);
  CHECK(group_load_batches(t).batches.size() == 3 + 6);
}

TEST_CASE("CSV: magic and header lines") {
  SUBCASE("empty file") {
    CHECK_THROWS_WITH_AS(parse(""),
                         "t.csv: line 1, column 1: empty file; expected '# route_trace v1' (CSV) or a binary route trace",
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
        {"unknown version", 1, "# route_trace v2",
         "t.csv: line 1, column 2: unsupported version 'v2'; expected 'v1'"},
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
        {"too few columns", 9, "0,0,1,0,0,5,0.7,0",
         "t.csv: line 9, column 9: row has 8 fields; expected 9"},
        {"too many columns", 9, "0,0,1,0,0,5,0.7,0,0,0",
         "t.csv: line 9, column 10: row has 10 fields; expected 9"},
        {"a row with only a few fields", 9, "0,0,1",
         "t.csv: line 9, column 4: row has 3 fields; expected 9"},
        {"expert id out of range", 9, "0,0,1,0,0,16,0.7,0,0",
         "t.csv: line 9, column 6: expert 16 out of range [0, 16)"},
        {"layer out of range", 16, "0,0,1,3,1,8,0.2,0,1000",
         "t.csv: line 16, column 4: layer 3 out of range [0, 3)"},
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
    CHECK_THROWS_WITH_AS(parse(join(lines)),
                         "t.csv: line 9, column 10: dropped 2 out of range; expected 0 or 1", error);
  }
  SUBCASE("empty line and comment among the rows") {
    CHECK_THROWS_WITH_AS(parse(with_inserted(9, "")),
                         "t.csv: line 9, column 1: empty line; expected a row of 9 fields", error);
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
    std::swap(lines[22], lines[24]);  // token 3: layer 1 before layer 0
    std::swap(lines[23], lines[25]);
    CHECK_THROWS_WITH_AS(parse(join(lines)),
                         "t.csv: line 25, column 4: layer 0 after layer 1 at decode step 3; expected ascending "
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

TEST_CASE("binary: magic, version, truncation, records") {
  const route_trace t = parse(join(base_lines));
  const std::string good = binary_of(t);
  CHECK(good.size() == 48 + 16 + 3 * 16 + 8 + 22 * 20);  // model+arch "m.gguf""qwen3moe" pad to 16
  SUBCASE("bad magic") {
    std::string b = good;
    b[1] = 'X';
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(b, "t.bin"),
                         "t.bin: not a binary route trace: bad magic '\\x89XRTRACE'; expected '\\x89MRTRACE'", error);
  }
  SUBCASE("bad version") {
    std::string b = good;
    b[8] = 2;
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(b, "t.bin"),
                         "t.bin: unsupported binary version 2; this reader supports 1", error);
  }
  SUBCASE("truncated in the fixed header") {
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(good.substr(0, 20), "t.bin"),
                         "t.bin: truncated: 20 bytes; the fixed header alone is 48", error);
  }
  SUBCASE("truncated in the layer table") {
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(good.substr(0, 70), "t.bin"),
                         "t.bin: truncated: 70 bytes; the header needs 120", error);
  }
  SUBCASE("truncated in the records") {
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(good.substr(0, good.size() - 7), "t.bin"),
                         "t.bin: truncated: 433 bytes of records for 22 rows; expected 440", error);
  }
  SUBCASE("bytes after the last record") {
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(good + "xx", "t.bin"),
                         "t.bin: 2 bytes after the last of 22 records; expected the file to end there", error);
  }
  SUBCASE("a record out of range is validated like a CSV row") {
    std::string b = good;
    b[120 + 3 * 20 + 14] = 16;  // record 3's expert
    CHECK_THROWS_WITH_AS(parse_route_trace_binary(b, "t.bin"),
                         "t.bin: record 3, column expert: expert 16 out of range [0, 16)", error);
  }
  SUBCASE("a record's flag bits") {
    std::string b = good;
    b[120 + 19] = 4;  // dropped = 1 without a dropped column
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
                         "test_trace_errors_truncated.bin: truncated: 439 bytes of records for 22 rows; expected 440",
                         error);
    std::remove(path.c_str());
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
    const std::size_t first = good.size() - t.rows.size() * 20;
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
        same = x.turn == y.turn && x.phase == y.phase && x.step == y.step && x.layer == y.layer &&
               x.slot == y.slot && x.expert == y.expert &&
               detail::float_bits(x.weight) == detail::float_bits(y.weight) && x.residency == y.residency &&
               x.expert_bytes == y.expert_bytes && x.dropped == y.dropped;
      }
      return same;
    };
    // The scan's verdict; where it accepts, its rows written both ways (the
    // composed words, where the layout allows them, and member by member)
    // must be the same.
    std::size_t stores_differ = 0;
    auto scan = [&](const std::string& b, std::size_t piece) {
      detail::binary_record_scanner s(t.header), m(t.header);
      const auto* p = reinterpret_cast<const unsigned char*>(b.data()) + first;
      std::vector<trace_row> rows(t.rows.size()), member_rows(t.rows.size());
      for (std::size_t i = 0; i < t.rows.size(); i += piece) {
        const std::size_t n = std::min(piece, t.rows.size() - i);
        const bool ok = s.read(p + 20 * i, n, rows.data() + i);
        if (ok != m.read<detail::row_store::members>(p + 20 * i, n, member_rows.data() + i)) ++stores_differ;
        if (!ok) return false;
      }
      stores_differ += !same_rows(rows, member_rows);
      return true;
    };
    std::size_t cases = 0, accepted = 0, disagreements = 0, rows_differ = 0;
    for (std::size_t at = first; at < good.size(); ++at) {
      const auto orig = static_cast<unsigned char>(good[at]);
      for (const unsigned v : {0u, 1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 15u, 16u, 17u, 255u, orig - 1u, orig + 1u}) {
        std::string b = good;
        b[at] = static_cast<char>(v & 0xffu);
        std::vector<trace_row> exact;
        const bool slow = exact_rows(b, exact);
        ++cases;
        accepted += slow;
        for (const std::size_t piece : {t.rows.size(), std::size_t{1}, std::size_t{3}})
          if (scan(b, piece) != slow) {
            ++disagreements;
            MESSAGE("byte " << at - first << " = " << (v & 0xffu) << ", pieces of " << piece << ": exact pass "
                            << slow);
          }
        if (!slow) continue;
        rows_differ += !same_rows(parse_route_trace_binary(b, "t.bin").rows(), exact);
      }
    }
    CHECK(cases == t.rows.size() * 20 * 15);
    CHECK(disagreements == 0);
    CHECK(rows_differ == 0);
    CHECK(stores_differ == 0);
    CHECK(accepted > 0);          // harmless damage exists (a weight byte)
    CHECK(accepted < cases / 2);  // and most is caught
  }
}

TEST_CASE("header strings: a model name of any length round-trips whole; past the binary form's 32-bit length it is refused") {
  // Issue 11: the llama.cpp adapter read GGUF metadata into 256 bytes, so a model
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
