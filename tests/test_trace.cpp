// Route traces: the real traces parse, batch and round-trip byte for byte;
// the fast paths agree with slow obvious twins.

// <iomanip> first: it declares std::quoted, which ADL would pick over a
// library helper of the same name (a bug this include keeps fixed).
#include <iomanip>

#include "moe_residency/trace.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#include <unistd.h>
#endif

#include "support.hpp"

using namespace moe_residency;

namespace {

std::string to_csv(const route_trace& t) {
  std::ostringstream s;
  write_route_trace_csv(t, s);
  return s.str();
}

std::string to_binary(const route_trace& t) {
  std::ostringstream s;
  write_route_trace_binary(t, s);
  return s.str();
}

bool same_row(const trace_row& a, const trace_row& b) {
  std::uint32_t wa, wb;
  std::memcpy(&wa, &a.weight, 4);
  std::memcpy(&wb, &b.weight, 4);
  return a.turn == b.turn && a.phase == b.phase && a.step == b.step && a.layer == b.layer && a.slot == b.slot &&
         a.expert == b.expert && wa == wb && a.residency == b.residency && a.expert_bytes == b.expert_bytes &&
         a.dropped == b.dropped;
}

// The slow obvious twin of group_load_batches: collect every routed id into a
// map keyed by what the engine batches on, then order the keys the way the
// engine executes them (prefill layer by layer, then decode token by token,
// layer by layer). Only valid for one prompt batch per turn, as in the traces.
struct ref_batch {
  run_phase phase;
  std::uint32_t turn, step;
  std::size_t layer;
  std::vector<std::size_t> ids;
};

std::vector<ref_batch> reference_batches(const route_trace& t) {
  // key: (turn, phase, decode step or 0, layer) -> (step, slot) -> expert
  std::map<std::tuple<std::uint32_t, int, std::uint32_t, std::size_t>,
           std::map<std::pair<std::uint32_t, int>, std::size_t>>
      groups;
  for (const trace_row& r : t.rows) {
    const bool decode = r.phase == run_phase::decode;
    groups[{r.turn, decode ? 1 : 0, decode ? r.step : 0, to_index(r.layer)}][{r.step, r.slot}] = to_index(r.expert);
  }
  std::vector<ref_batch> out;
  for (const auto& [key, members] : groups) {
    ref_batch b{std::get<1>(key) ? run_phase::decode : run_phase::prefill,
                std::get<0>(key),
                members.begin()->first.first,
                std::get<3>(key),
                {}};
    for (const auto& m : members) b.ids.push_back(m.second);
    out.push_back(b);
  }
  return out;
}

struct real_case {
  const char* file;
  std::size_t rows, prefill_batches, decode_batches, prompt_tokens, decode_tokens, k;
  double token_cycle_mib;  // shared/traces/README.md: 785 MiB (qwen, k=6), 908 MiB (gptoss, k=2)
};

const real_case real_cases[] = {
    {"qwen.route.csv", 44766, 48, 6144, 28, 128, 6, 785},
    {"gptoss.route.csv", 10560, 36, 2304, 85, 64, 2, 908},
};

}  // namespace

TEST_CASE("real traces: parse, shape, batch, round-trip") {
  for (const real_case& c : real_cases) {
    CAPTURE(c.file);
    const std::string path = moe_residency_test::real_trace(c.file);
    if (path.empty()) continue;
    const std::string text = moe_residency_test::read_file(path);
    const route_trace t = read_route_trace(path);

    SUBCASE("rows and header") {
      CHECK(t.rows.size() == c.rows);
      CHECK(t.header.n_expert == 128);
      CHECK(t.header.n_expert_used == c.k);
      CHECK(t.noncanonical_weights == 0);
      CHECK_FALSE(t.header.has_dropped_column);
      const model_shape s = t.shape();
      CHECK(s.top_k() == c.k);
      CHECK(s.n_moe_layers() == t.header.n_layer);
      CHECK(std::round(to_mib(token_cycle_bytes(s))) == c.token_cycle_mib);
    }

    SUBCASE("CSV -> read -> write is byte-identical") { CHECK(to_csv(t) == text); }

    SUBCASE("CSV -> binary -> CSV is byte-identical, rows bit-identical") {
      const std::string bin = to_binary(t);
      // 20 bytes per row plus a small header: smaller than the CSV.
      CHECK(bin.size() < 20 * t.rows.size() + 2048);
      CHECK(bin.size() < text.size());
      const route_trace b = parse_route_trace_binary(bin, "mem.bin");
      REQUIRE(b.rows.size() == t.rows.size());
      std::size_t differing = 0;
      for (std::size_t i = 0; i < t.rows.size(); ++i) differing += !same_row(t.rows[i], b.rows[i]);
      CHECK(differing == 0);
      CHECK(b.header.model == t.header.model);
      CHECK(b.header.expert_bytes == t.header.expert_bytes);
      CHECK(b.header.dense_bytes == t.header.dense_bytes);
      CHECK(to_csv(b) == text);
      CHECK(to_binary(b) == bin);
    }

    SUBCASE("load batches: counts and the engine's grouping") {
      const load_batches lb = group_load_batches(t);
      std::size_t pre = 0, dec = 0;
      for (const load_batch& b : lb.batches) (b.phase == run_phase::prefill ? pre : dec)++;
      CHECK(pre == c.prefill_batches);
      CHECK(dec == c.decode_batches);
      CHECK(lb.experts.size() == t.rows.size());
      // Every prefill batch holds every prompt token's ids, except the last
      // layer, where the engine only computes the token whose logits it needs.
      for (const load_batch& b : lb.batches) {
        if (b.phase == run_phase::decode) {
          CHECK(b.count == c.k);
        } else if (to_index(b.layer) + 1 < t.header.n_layer) {
          CHECK(b.count == c.prompt_tokens * c.k);
        } else {
          CHECK(b.count == c.k);
        }
      }
      // experts[i] is rows[i].expert.
      for (std::size_t i = 0; i < t.rows.size(); ++i) REQUIRE(lb.experts[i] == t.rows[i].expert);

      const std::vector<ref_batch> ref = reference_batches(t);
      REQUIRE(ref.size() == lb.batches.size());
      for (std::size_t i = 0; i < ref.size(); ++i) {
        const load_batch& b = lb.batches[i];
        CAPTURE(i);
        CHECK(b.phase == ref[i].phase);
        CHECK(b.turn == ref[i].turn);
        CHECK(b.step == ref[i].step);
        CHECK(to_index(b.layer) == ref[i].layer);
        const span<const expert_id> ids = lb.experts_of(b);
        REQUIRE(ids.size() == ref[i].ids.size());
        bool same = true;
        for (std::size_t j = 0; j < ids.size(); ++j) same = same && to_index(ids[j]) == ref[i].ids[j];
        CHECK(same);
      }
    }

    SUBCASE("routings") {
      const trace_routings tr = collect_routings(t);
      CHECK(tr.declined == 0);
      CHECK(tr.routings.size() == t.rows.size() / c.k);
      std::size_t decode = 0;
      for (const routing& r : tr.routings) decode += r.phase == run_phase::decode;
      CHECK(decode == c.decode_batches);
      // Rank order: the engine's weights descend by slot.
      std::size_t unordered = 0;
      for (const routing& r : tr.routings)
        for (std::size_t s = 1; s < r.size(); ++s) unordered += r.weight(s) > r.weight(s - 1);
      CHECK(unordered == 0);
      const routing& first = tr.routings.front();
      CHECK(first.phase == run_phase::prefill);
      CHECK(first.token == 0);
      CHECK(first.id(0) == t.rows[0].expert);
      CHECK(first.weight(0) == t.rows[0].weight);
    }

    SUBCASE("expert_bytes column: a miss that read carries its layer's bytes") {
      // Checked by the parser for every row; here a property that could be
      // false: hits never read, and some misses read 0 (a duplicate in a
      // prefill batch already loaded the expert).
      std::size_t hit_reads = 0, miss_reads = 0, miss_free = 0;
      for (const trace_row& r : t.rows) {
        if (r.residency != 0) hit_reads += r.expert_bytes != 0;
        else (r.expert_bytes ? miss_reads : miss_free)++;
      }
      CHECK(hit_reads == 0);
      CHECK(miss_reads > 0);
      CHECK(miss_free > 0);
    }
  }
}

TEST_CASE("weight text: format_weight is printf %g, and every %g text round-trips through float") {
  std::mt19937 rng(20260720);
  std::uniform_int_distribution<std::uint32_t> bits;
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  char fast[32], slow[64];
  std::size_t mismatched = 0, not_round_tripped = 0;
  for (int i = 0; i < 200000; ++i) {
    // Half arbitrary bit patterns (NaNs, infinities, subnormals), half routing weights.
    float w;
    if (i % 2) {
      const std::uint32_t b = bits(rng);
      std::memcpy(&w, &b, 4);
    } else {
      w = unit(rng);
    }
    const std::size_t n = detail::format_weight(w, fast);
    std::snprintf(slow, sizeof slow, "%g", static_cast<double>(w));
    mismatched += std::string(fast, n) != slow;
    float back = 0;
    const char* end = nullptr;
    if (detail::parse_float(fast, fast + n, back, &end) != detail::number_status::ok || end != fast + n) {
      ++not_round_tripped;
      continue;
    }
    char again[32];
    const std::size_t m = detail::format_weight(back, again);
    not_round_tripped += std::string(again, m) != std::string(fast, n);
  }
  CHECK(mismatched == 0);
  CHECK(not_round_tripped == 0);
}

TEST_CASE("weights: nan round-trips; non-canonical text is counted, not hidden") {
  const std::string head =
      "# route_trace v1\n"
      "# model=m.gguf arch=test n_layer=2 n_expert=8 n_expert_used=2\n"
      "# layer=0 expert_bytes=100 dense_bytes=7\n"
      "# layer=1 expert_bytes=200 dense_bytes=7\n"
      "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n";
  SUBCASE("nan, -nan, inf, tiny and exponent forms are canonical") {
    const std::string text = head +
                             "0,1,0,0,0,3,nan,0,100\n"
                             "0,1,0,0,1,4,-nan,1,0\n"
                             "0,1,0,1,0,3,1e-05,0,200\n"
                             "0,1,0,1,1,5,3.40282e+38,2,0\n"
                             "0,1,1,0,0,3,1.4013e-45,1,0\n"
                             "0,1,1,0,1,7,0.5,1,0\n"
                             "0,1,1,1,0,2,0.25,1,0\n"
                             "0,1,1,1,1,6,0.75,1,0\n";
    const route_trace t = parse_route_trace_csv(text, "mem.csv");
    CHECK(std::isnan(t.rows[0].weight));
    CHECK(std::isnan(t.rows[1].weight));
    CHECK(std::signbit(t.rows[1].weight));
    CHECK(t.noncanonical_weights == 0);
    CHECK(to_csv(t) == text);
    const route_trace b = parse_route_trace_binary(to_binary(t), "mem.bin");
    CHECK(std::isnan(b.rows[0].weight));
    CHECK(to_csv(b) == text);
  }
  SUBCASE("a negative or infinite weight is refused; -0 is a weight of 0") {
    auto row = [&](const char* w) {
      return head + "0,1,0,0,0,3," + w + ",0,100\n0,1,0,0,1,4,0.5,1,0\n0,1,0,1,0,3,0.5,0,200\n0,1,0,1,1,5,0.5,1,0\n";
    };
    CHECK_THROWS_WITH_AS(parse_route_trace_csv(row("-0.5"), "w.csv"),
                         "w.csv: line 6, column 7: weight -0.5 is negative; expected a finite weight >= 0 (or nan, an "
                         "unrecorded weight)",
                         error);
    CHECK_THROWS_WITH_AS(parse_route_trace_csv(row("inf"), "w.csv"),
                         "w.csv: line 6, column 7: weight inf is not finite; expected a finite weight >= 0 (or nan, an "
                         "unrecorded weight)",
                         error);
    CHECK_THROWS_WITH_AS(parse_route_trace_csv(row("-inf"), "w.csv"), doctest::Contains("weight -inf is not finite"),
                         error);
    CHECK(std::signbit(parse_route_trace_csv(row("-0"), "w.csv").rows()[0].weight));
    // A hand-built trace too (the binary reader: tests/test_trace_errors.cpp).
    route_trace t = parse_route_trace_csv(row("0.5"), "w.csv");
    t.rows[2].weight = -1.0f;
    CHECK_THROWS_WITH_AS(validate_route_trace(t, "hand"),
                         doctest::Contains("hand: rows[2], column weight: weight -1 "
                                           "is negative"),
                         error);
  }
  SUBCASE("0.50 and 5e-1 parse as 0.5 and are reported as non-canonical") {
    const std::string text = head +
                             "0,1,0,0,0,3,0.50,0,100\n"
                             "0,1,0,0,1,4,5e-1,1,0\n"
                             "0,1,0,1,0,4,0.123456789,1,0\n"
                             "0,1,0,1,1,6,0.25,1,0\n";
    const route_trace t = parse_route_trace_csv(text, "mem.csv");
    CHECK(t.rows[0].weight == 0.5f);
    CHECK(t.rows[1].weight == 0.5f);
    CHECK(t.noncanonical_weights == 3);
    const std::string out = to_csv(t);
    CHECK(out != text);
    CHECK(out.find("0,1,0,0,0,3,0.5,0,100\n") != std::string::npos);
    CHECK(out.find("0,1,0,1,0,4,0.123457,1,0\n") != std::string::npos);
  }
}

TEST_CASE("small traces: dropped column, dense layers, ubatches, multi-turn") {
  SUBCASE("dropped column round-trips through CSV and binary") {
    const std::string text =
        "# route_trace v1\n"
        "# model=/path with spaces/m.gguf arch=qwen3moe n_layer=1 n_expert=4 n_expert_used=2\n"
        "# layer=0 expert_bytes=10 dense_bytes=3\n"
        "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped\n"
        "0,1,5,0,0,1,0.75,0,10,0\n"
        "0,1,5,0,1,2,0.25,0,0,1\n";
    const route_trace t = parse_route_trace_csv(text, "d.csv");
    CHECK(t.header.model == "/path with spaces/m.gguf");
    CHECK(t.header.has_dropped_column);
    CHECK(t.rows[1].dropped == 1);
    CHECK(to_csv(t) == text);
    CHECK(to_csv(parse_route_trace_binary(to_binary(t), "d.bin")) == text);
  }
  SUBCASE("a layer without a '# layer=' line that is never routed is dense") {
    const std::string text =
        "# route_trace v1\n"
        "# model=m arch=deepseek2 n_layer=3 n_expert=4 n_expert_used=1\n"
        "# layer=1 expert_bytes=10 dense_bytes=3\n"
        "# layer=2 expert_bytes=20 dense_bytes=3\n"
        "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n"
        "0,1,0,1,0,1,1,0,10\n"
        "0,1,0,2,0,3,1,0,20\n";
    const route_trace t = parse_route_trace_csv(text, "dense.csv");
    const model_shape s = t.shape();
    CHECK(s.n_layers() == 3);
    CHECK(s.n_moe_layers() == 2);
    CHECK_FALSE(s.is_moe(layer_id{0}));
    CHECK(token_cycle_bytes(s) == 30);
    CHECK(to_csv(t) == text);
    CHECK(to_csv(parse_route_trace_binary(to_binary(t), "dense.bin")) == text);
  }
  SUBCASE("two prompt ubatches and two turns make separate prefill batches") {
    // Turn 0: ubatch of tokens 0-1, then ubatch of token 2 (layer goes back to 0),
    // then decode of token 3. Turn 1: prefill of tokens 4-5, decode of 6.
    const std::string text =
        "# route_trace v1\n"
        "# model=m arch=t n_layer=2 n_expert=8 n_expert_used=1\n"
        "# layer=0 expert_bytes=10 dense_bytes=1\n"
        "# layer=1 expert_bytes=10 dense_bytes=1\n"
        "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n"
        "0,0,0,0,0,1,1,0,10\n"
        "0,0,1,0,0,1,1,0,0\n"
        "0,0,0,1,0,2,1,0,10\n"
        "0,0,1,1,0,3,1,0,10\n"
        "0,0,2,0,0,4,1,0,10\n"
        "0,0,2,1,0,5,1,0,10\n"
        "0,1,3,0,0,6,1,0,10\n"
        "0,1,3,1,0,7,1,0,10\n"
        "1,0,4,0,0,1,1,1,0\n"
        "1,0,5,0,0,2,1,0,10\n"
        "1,0,5,1,0,2,1,1,0\n"
        "1,1,6,0,0,1,1,1,0\n"
        "1,1,6,1,0,2,1,1,0\n";
    const route_trace t = parse_route_trace_csv(text, "ub.csv");
    const load_batches lb = group_load_batches(t);
    // (phase, turn, step, layer, first, count)
    const std::vector<std::tuple<int, int, int, int, int, int>> want = {
        {0, 0, 0, 0, 0, 2}, {0, 0, 0, 1, 2, 2}, {0, 0, 2, 0, 4, 1},  {0, 0, 2, 1, 5, 1},  {1, 0, 3, 0, 6, 1},
        {1, 0, 3, 1, 7, 1}, {0, 1, 4, 0, 8, 2}, {0, 1, 5, 1, 10, 1}, {1, 1, 6, 0, 11, 1}, {1, 1, 6, 1, 12, 1}};
    REQUIRE(lb.batches.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      const load_batch& b = lb.batches[i];
      CAPTURE(i);
      CHECK(std::make_tuple(static_cast<int>(b.phase), static_cast<int>(b.turn), static_cast<int>(b.step),
                            static_cast<int>(to_index(b.layer)), static_cast<int>(b.first),
                            static_cast<int>(b.count)) == want[i]);
    }
    CHECK(to_index(lb.experts_of(lb.batches[0])[1]) == 1);  // the duplicate is kept
    CHECK(collect_routings(t).routings.size() == 13);
  }
  SUBCASE("routings wider than 32 are declined") {
    std::string text =
        "# route_trace v1\n"
        "# model=m arch=wide n_layer=1 n_expert=64 n_expert_used=40\n"
        "# layer=0 expert_bytes=1 dense_bytes=1\n"
        "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n";
    for (int s = 0; s < 40; ++s) text += "0,1,0,0," + std::to_string(s) + "," + std::to_string(s) + ",0.025,1,0\n";
    for (int s = 0; s < 40; ++s) text += "0,1,1,0," + std::to_string(s) + "," + std::to_string(63 - s) + ",0.025,1,0\n";
    const route_trace t = parse_route_trace_csv(text, "wide.csv");
    const trace_routings tr = collect_routings(t);
    CHECK(tr.declined == 2);  // every routing of a valid trace has n_expert_used rows
    CHECK(tr.routings.empty());
    CHECK_THROWS_AS(t.shape(), error);  // model_shape holds k <= 32
  }
  SUBCASE("a trace without rows and a file without a final newline") {
    const std::string text =
        "# route_trace v1\n"
        "# model=m arch=t n_layer=1 n_expert=2 n_expert_used=1\n"
        "# layer=0 expert_bytes=5 dense_bytes=1\n"
        "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n";
    CHECK_THROWS_WITH_AS(parse_route_trace_csv(text, "empty.csv"),
                         "empty.csv: end of file after line 4: no routing rows; expected at least one token", error);
    const route_trace t = parse_route_trace_csv(text + "0,1,0,0,0,1,1,0,5", "nonl.csv");
    CHECK(t.rows.size() == 1);
    CHECK(to_csv(t) == text + "0,1,0,0,0,1,1,0,5\n");
  }
}

TEST_CASE("binary and CSV are told apart by content") {
  const std::string text =
      "# route_trace v1\n"
      "# model=m arch=t n_layer=1 n_expert=2 n_expert_used=1\n"
      "# layer=0 expert_bytes=5 dense_bytes=1\n"
      "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n"
      "0,1,0,0,0,1,0.5,0,5\n";
  const route_trace t = parse_route_trace_csv(text, "x.csv");
  const std::string csv_path = "test_trace_detect.csv", bin_path = "test_trace_detect.csv.bin";
  {
    std::ofstream(csv_path, std::ios::binary) << text;
    std::ofstream b(bin_path, std::ios::binary);
    write_route_trace_binary(t, b);
  }
  CHECK(to_csv(read_route_trace(csv_path)) == text);
  CHECK(to_csv(read_route_trace(bin_path)) == text);
  std::remove(csv_path.c_str());
  std::remove(bin_path.c_str());
  CHECK_THROWS_WITH_AS(read_route_trace("no/such/trace.csv"), doctest::Contains("no/such/trace.csv: cannot open"),
                       error);
}

// ---------------------------------------------------------------------------
// The validated-trace contract and the smells fixed in the trace split.

namespace {
const char* const tiny_csv =
    "# route_trace v1\n"
    "# model=m.gguf arch=tiny n_layer=2 n_expert=4 n_expert_used=2\n"
    "# layer=0 expert_bytes=100 dense_bytes=0\n"
    "# layer=1 expert_bytes=100 dense_bytes=0\n"
    "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n"
    "0,1,0,0,0,0,0.6,0,100\n0,1,0,0,1,1,0.4,0,100\n"
    "0,1,0,1,0,2,0.5,0,100\n0,1,0,1,1,3,0.5,0,100\n";
}  // namespace

// Only the parsers and validate_route_trace make one; it cannot be edited.
static_assert(!std::is_default_constructible<validated_route_trace>::value, "validated only by the library");
static_assert(!std::is_constructible<validated_route_trace, route_trace>::value, "validated only by the library");
static_assert(!std::is_constructible<validated_route_trace, const route_trace&>::value,
              "validated only by the library");
static_assert(
    std::is_same<decltype(std::declval<const validated_route_trace&>().rows()), const std::vector<trace_row>&>::value,
    "rows are read-only");
// The old spelling keeps compiling: a parse result converts into an open route_trace.
static_assert(std::is_convertible<validated_route_trace&&, route_trace>::value, "source compatibility");

TEST_CASE("validated_route_trace: the parsers' result is what the writers and grouping trust") {
  const validated_route_trace v = parse_route_trace_csv(tiny_csv, "tiny.csv");
  CHECK(v.rows().size() == 4);
  CHECK(v.header().n_layer == 2);
  // Same output as through an open trace that is validated again.
  route_trace open = parse_route_trace_csv(tiny_csv, "tiny.csv");
  CHECK(to_csv(open) == tiny_csv);
  std::ostringstream s;
  write_route_trace_csv(v, s);
  CHECK(s.str() == tiny_csv);
  CHECK(group_load_batches(v).batches.size() == group_load_batches(open).batches.size());
  CHECK(collect_routings(v).routings.size() == 2);
  SUBCASE("validate_route_trace turns an open trace into a validated one, or names the defect") {
    const validated_route_trace again = validate_route_trace(open, "edited");
    CHECK(again.rows().size() == 4);
    open.rows[1].expert = open.rows[0].expert;  // a duplicate expert in one routing
    CHECK_THROWS_WITH_AS(validate_route_trace(open, "edited"),
                         "edited: rows[1], column expert: expert 0 already routed at slot 0 of this routing; "
                         "expected distinct experts",
                         error);
    // The overloads for open traces still refuse it before writing anything.
    std::ostringstream out;
    CHECK_THROWS_AS(write_route_trace_binary(open, out), error);
    CHECK(out.str().empty());
  }
}

TEST_CASE("binary header bounds are computed in 64 bits before any size_t offset") {
  // The largest lengths a header can claim: 48 + 2 (2^32 - 1) = 8589934638,
  // padded to 8589934640. Formed as a size_t on a 32-bit target this wrapped
  // to 48, and the reader then ran past the buffer.
  constexpr auto e = detail::binary_trace_header_extent(0xFFFFFFFFu, 0xFFFFFFFFu, 65535);
  static_assert(e.strings_end == 8589934640ull, "no wrap");
  static_assert(e.layers_end == 8589934640ull + 16ull * 65535 + 65536, "no wrap");
  CHECK(e.strings_end > 0xFFFFFFFFull);
  CHECK(detail::binary_trace_header_extent(3, 5, 2).strings_end == 56);
  CHECK(detail::binary_trace_header_extent(3, 5, 2).layers_end == 56 + 32 + 8);
  // A file of 128 bytes that claims those lengths is refused as truncated,
  // naming the 64-bit size it would need.
  std::string bytes = to_binary(parse_route_trace_csv(tiny_csv, "tiny.csv"));
  bytes.resize(128);
  auto* p = reinterpret_cast<unsigned char*>(&bytes[0]);
  detail::store_le<std::uint32_t>(p + 20, 1);  // n_layer
  detail::store_le<std::uint64_t>(p + 32, 0);  // rows
  detail::store_le<std::uint32_t>(p + 40, 0xFFFFFFFFu);
  detail::store_le<std::uint32_t>(p + 44, 0xFFFFFFFFu);
  CHECK_THROWS_WITH_AS(parse_route_trace_binary(bytes, "huge.bin"),
                       "huge.bin: truncated: 128 bytes; the header needs 8589934664", error);
}

#if defined(__unix__) || defined(__APPLE__)
namespace {
struct stack_job {
  const validated_route_trace* trace;
  std::string out;
};
void* write_on_small_stack(void* arg) {
  auto* job = static_cast<stack_job*>(arg);
  std::ostringstream s;
  write_route_trace_binary(*job->trace, s);
  job->out = s.str();
  return nullptr;
}
}  // namespace

TEST_CASE("the binary writer runs on a small thread stack (64 KiB, or the platform minimum)") {
  // It used to keep an 80 KiB record buffer on the stack, which overflowed
  // such a thread (a crash, so this test fails loudly without the fix).
  const validated_route_trace t = parse_route_trace_csv(tiny_csv, "tiny.csv");
  stack_job job{&t, {}};
  // 64 KiB, or the platform's minimum where that is larger (aarch64 glibc
  // refuses anything below 128 KiB with EINVAL; there the test still runs
  // the writer on the smallest stack the platform allows).
  const long platform_min = sysconf(_SC_THREAD_STACK_MIN);
  const std::size_t stack_bytes =
      std::max<std::size_t>(64 * 1024, platform_min > 0 ? static_cast<std::size_t>(platform_min) : 0);
  INFO("thread stack bytes: " << stack_bytes);
  pthread_attr_t attr;
  REQUIRE(pthread_attr_init(&attr) == 0);
  REQUIRE(pthread_attr_setstacksize(&attr, stack_bytes) == 0);
  pthread_t thread;
  REQUIRE(pthread_create(&thread, &attr, write_on_small_stack, &job) == 0);
  REQUIRE(pthread_join(thread, nullptr) == 0);
  pthread_attr_destroy(&attr);
  CHECK(job.out == to_binary(t.trace()));
  CHECK(job.out.size() == 48 + 16 + 32 + 8 + 4 * 20 + 8 + 8);  // header, strings "m.gguf"+"tiny", layers, records
}
#endif

TEST_CASE("first_layers: a trace's first layers, as a model cut there routes") {
  const std::string path = moe_residency_test::real_trace("qwen.route.csv");
  if (path.empty()) return;
  const auto whole = moe_residency::read_route_trace(path);
  const auto cut = moe_residency::first_layers(whole, 8, path);
  CHECK(cut.header().n_layer == 8);
  CHECK(cut.header().expert_bytes ==
        std::vector<std::uint64_t>(whole.header().expert_bytes.begin(), whole.header().expert_bytes.begin() + 8));
  // Its decode rows: the whole trace's of layers 0-7, in order.
  std::vector<std::tuple<std::uint32_t, std::uint16_t, std::uint8_t, std::uint16_t>> a, b;
  for (const auto& r : whole.rows())
    if (r.phase == moe_residency::run_phase::decode && moe_residency::to_index(r.layer) < 8)
      a.emplace_back(r.step, moe_residency::to_index(r.layer), r.slot, moe_residency::to_index(r.expert));
  for (const auto& r : cut.rows())
    if (r.phase == moe_residency::run_phase::decode)
      b.emplace_back(r.step, moe_residency::to_index(r.layer), r.slot, moe_residency::to_index(r.expert));
  CHECK(a == b);
  CHECK(a.size() == 128u * 8 * 6);
  // The prompt: layers 0-6 every one of the 28 tokens; the cut's last layer only the output
  // row, the one token the whole trace's last layer (47) routed.
  std::map<std::size_t, std::size_t> prompt_rows;
  for (const auto& r : cut.rows())
    if (r.phase == moe_residency::run_phase::prefill) ++prompt_rows[moe_residency::to_index(r.layer)];
  CHECK(prompt_rows[0] == 28u * 6);
  CHECK(prompt_rows[6] == 28u * 6);
  CHECK(prompt_rows[7] == 6u);
  // Refused: no layer, or more than it has.
  CHECK_THROWS_WITH_AS(moe_residency::first_layers(whole, 0, "q.csv"),
                       "q.csv: first 0 layers; expected 1 to 48 (its n_layer)", moe_residency::error);
  CHECK_THROWS_WITH_AS(moe_residency::first_layers(whole, 49, "q.csv"),
                       "q.csv: first 49 layers; expected 1 to 48 (its n_layer)", moe_residency::error);
  // All of them: the trace itself.
  CHECK(moe_residency::first_layers(whole, 48, path).rows().size() == whole.rows().size());
}
