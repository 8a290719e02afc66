#include "moe_residency/session.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "moe_residency/synthetic.hpp"
#include "moe_residency/trace.hpp"
#include "alloc_counter.hpp"  // this suite is its own executable: the one TU that replaces new/delete
#include "support.hpp"

using namespace moe_residency;

namespace {
layer_id L(std::size_t l) { return layer_id(static_cast<std::uint16_t>(l)); }
expert_id E(std::size_t e) { return expert_id(static_cast<std::uint16_t>(e)); }

synthetic_config small_cfg() {
  return synthetic_presets::small(synthetic_router::qwen3moe, element_type::f32, 4, 32, 64, 4);
}

// Records what the extension hooks saw; asks to drop slot 3 of every decode routing.
struct recorder {
  static constexpr session_hook hooks = session_hook::begin_batch | session_hook::gate_input | session_hook::routed |
                                        session_hook::layer_loaded | session_hook::end_batch |
                                        session_hook::append_notes;
  int begins = 0, gates = 0, routings = 0, loads = 0, ends = 0;
  std::size_t predicted_next = 0;
  template <class S>
  void on_begin_batch(S&, run_phase, std::uint32_t, std::size_t) {
    ++begins;
  }
  template <class S>
  void on_gate_input(S&, layer_id, const gate_input_view&) {
    ++gates;
  }
  template <class S>
  void on_routed(S& s, layer_id, span<const routing> rs, span<std::uint32_t> drop) {
    routings += static_cast<int>(rs.size());
    if (s.phase() == run_phase::decode) drop[0] = 1u << 3;
  }
  template <class S>
  void on_layer_loaded(S& s, layer_id l) {
    ++loads;
    // What a planner does here: read the stale-gate's ranking of the next layer.
    if (s.template prediction<0>(L(to_index(l) + 1))) ++predicted_next;
  }
  template <class S>
  void on_end_batch(S&) {
    ++ends;
  }
  void append_notes(std::vector<std::string>& notes) const { notes.push_back("recorder: ok"); }
};
}  // namespace

TEST_CASE("prefill is accepted and not scored; decode is") {
  const synthetic_model m(small_cfg());
  synthetic_stream st(m);
  standard_session s(m.shape());
  install_routers(s, m);
  st.next(5);
  REQUIRE(feed_batch(s, st, run_phase::prefill));
  CHECK(s.report().offered[1] == 0);
  CHECK(s.report().ignored_phase == 4 * 5);
  for (int t = 0; t < 3; ++t) {
    st.next(1);
    REQUIRE(feed_batch(s, st, run_phase::decode));
  }
  const prediction_report r = s.report();
  CHECK(r.offered[1] == 3);
  CHECK(r.totals[0].routings == 3 * 3);  // stale-gate: layers 1..3
  CHECK(r.totals[0].unscored == 3);      // layer 0 of each token
  CHECK(r.totals[1].unscored == 4);      // prev-token: the first decode token
  CHECK(r.totals[2].routings == 12);
  CHECK(s.decode_tokens() == 3);
  CHECK(s.prefill_tokens() == 5);
  CHECK(format_text(r).find("      0       -") != std::string::npos);
}

TEST_CASE("engine-layout routing batches: int32 ids with an n_expert row stride") {
  const synthetic_model m(small_cfg());
  synthetic_stream st(m);
  st.next(3);
  session<predictor_set<fresh_gate_control, prev_token_predictor>> s(m.shape());
  install_routers(s, m);
  // Decode, one token at a time, ids laid out like ggml's ffn_moe_topk.
  for (std::size_t t = 0; t < 3; ++t) {
    REQUIRE(s.begin_batch(run_phase::decode, static_cast<std::uint32_t>(t)));
    for (std::size_t l = 0; l < 4; ++l) {
      std::vector<std::int32_t> ids(32, -1);  // row stride n_expert * 4 bytes
      std::vector<float> w(4);
      const routing& r = st.routed(L(l), t);
      for (std::size_t i = 0; i < 4; ++i) {
        ids[i] = static_cast<std::int32_t>(to_index(r.id(i)));
        w[i] = r.weight(i);
      }
      REQUIRE(s.gate_input(L(l), st.gate_inputs(L(l)) + t * 64, 64));
      REQUIRE(s.routed(L(l), routing_batch_view{ids.data(), 4, 1, 32 * 4, w.data(), 0}));
      REQUIRE(s.layer_loaded(L(l)));
    }
  }
  CHECK(s.report().totals[0].perfect());
  CHECK(s.report().totals[0].routings == 12);
}

TEST_CASE("extensions see every checked event and can ask for drops") {
  const synthetic_model m(small_cfg());
  synthetic_stream st(m);
  session<predictor_set<stale_gate_predictor, stale_gate_l2_predictor, fresh_gate_control>, recorder> s(m.shape());
  install_routers(s, m);
  st.next(2);
  REQUIRE(feed_batch(s, st, run_phase::prefill));
  st.next(1);
  REQUIRE(feed_batch(s, st, run_phase::decode));
  const recorder& x = s.extension<0>();
  CHECK(x.begins == 2);
  CHECK(x.ends == 2);
  CHECK(x.gates == 8);
  CHECK(x.routings == 2 * 4 + 4);
  CHECK(x.loads == 8);
  CHECK(x.predicted_next == 3);  // decode layers 0..2 had a stale-gate ranking of the next
  CHECK(s.drop_mask(0) == (1u << 3));
  const prediction_report r = s.report();
  CHECK(r.predictors[1].name == "stale-gate l+2");
  CHECK(r.totals[1].unscored == 2);  // layers 0 and 1 cannot be ranked two layers early
  CHECK(r.notes.back() == "recorder: ok");
}

// Logs every event hook by the event's own name (events.hpp).
struct event_log {
  static constexpr session_hook hooks = session_hook::begin_batch | session_hook::gate_input | session_hook::routed |
                                        session_hook::layer_loaded | session_hook::end_batch;
  std::vector<std::string> seen;
  std::uint32_t first = 0;
  std::size_t tokens = 0;
  template <class S>
  void on_begin_batch(S&, run_phase, std::uint32_t first_token, std::size_t n) {
    seen.push_back(to_string(engine_event::begin_batch));
    first = first_token;
    tokens = n;
  }
  template <class S>
  void on_gate_input(S&, layer_id, const gate_input_view&) {
    seen.push_back(to_string(engine_event::gate_input));
  }
  template <class S>
  void on_routed(S&, layer_id, span<const routing>, span<std::uint32_t>) {
    seen.push_back(to_string(engine_event::routed));
  }
  template <class S>
  void on_layer_loaded(S&, layer_id) {
    seen.push_back(to_string(engine_event::layer_loaded));
  }
  template <class S>
  void on_end_batch(S&) {
    seen.push_back(to_string(engine_event::end_batch));
  }
};

TEST_CASE("one event vocabulary: a hook is its event's bit and name; begin_batch takes the event's record") {
  // Each event hook's bit is the event's place in the batch's order.
  CHECK(static_cast<unsigned>(session_hook::begin_batch) == 1u << static_cast<unsigned>(engine_event::begin_batch));
  CHECK(static_cast<unsigned>(session_hook::gate_input) == 1u << static_cast<unsigned>(engine_event::gate_input));
  CHECK(static_cast<unsigned>(session_hook::routed) == 1u << static_cast<unsigned>(engine_event::routed));
  CHECK(static_cast<unsigned>(session_hook::layer_loaded) == 1u << static_cast<unsigned>(engine_event::layer_loaded));
  CHECK(static_cast<unsigned>(session_hook::end_batch) == 1u << static_cast<unsigned>(engine_event::end_batch));

  const synthetic_model m(small_cfg());
  synthetic_stream st(m);
  session<predictor_set<prev_token_predictor>, event_log> s(m.shape());
  st.next(2);
  REQUIRE(s.begin_batch(batch_info{run_phase::prefill, st.first_token(), 2}));
  const layer_id l0 = L(0);
  REQUIRE(s.gate_input(l0, st.gate_inputs(l0), 64, 2, 64 * sizeof(float)));
  REQUIRE(s.routed(l0, span<const routing>(&st.routed(l0, 0), 2)));
  REQUIRE(s.layer_loaded(l0));
  REQUIRE(s.end_batch());
  const event_log& x = s.extension<0>();
  CHECK(x.first == st.first_token());
  CHECK(x.tokens == 2);
  CHECK(s.phase() == run_phase::prefill);
  const std::vector<std::string> order{"begin_batch", "gate_input", "routed", "layer_loaded", "end_batch"};
  CHECK(x.seen == order);
}

TEST_CASE("out-of-order and malformed events: a clear error, or a counted anomaly") {
  const synthetic_model m(synthetic_presets::small(synthetic_router::qwen3moe, element_type::f32, 4, 32, 64, 4, true));
  synthetic_stream st(m);
  st.next(1);
  const float* x1 = st.gate_inputs(L(1));
  const routing& r1 = st.routed(L(1), 0);

  SUBCASE("errors name the event") {
    standard_session s(m.shape());
    install_routers(s, m);
    CHECK_THROWS_WITH_AS(s.gate_input(L(1), x1, 64),
                         "session: gate_input(layer 1): no batch has begun; call begin_batch first", error);
    REQUIRE(s.begin_batch(run_phase::decode, 7));
    CHECK_THROWS_WITH_AS(s.routed(r1),
                         "session: decode token 7 layer 1: routed: the layer's gate input never "
                         "came; expected gate_input before routed",
                         error);
    CHECK_THROWS_WITH_AS(s.gate_input(L(9), x1, 64),
                         "session: decode token 7 layer 9: gate_input: layer out of range [0, 4)", error);
    CHECK_THROWS_WITH_AS(s.gate_input(L(0), x1, 64),
                         "session: decode token 7 layer 0: gate_input: the layer is dense in "
                         "model 'synthetic-qwen3moe'",
                         error);
    CHECK_THROWS_AS(s.gate_input(L(1), x1, 63), error);
    std::vector<float> nan(x1, x1 + 64);
    nan[5] = std::nanf("");
    CHECK_THROWS_WITH_AS(s.gate_input(L(2), nan.data(), 64),
                         "session: decode token 7 layer 2: gate_input: token 7 element 5 is nan; "
                         "expected a finite value",
                         error);
    REQUIRE(s.gate_input(L(1), x1, 64));
    CHECK_THROWS_AS(s.gate_input(L(1), x1, 64), error);  // duplicate
    const std::int32_t bad[] = {3, 40, 1, 2};
    CHECK_THROWS_WITH_AS(s.routed(L(1), routing_batch_view{bad, 4}),
                         "session: decode token 7 layer 1: routed: token 7 slot 1: expert 40 out "
                         "of range [0, 32)",
                         error);
    const expert_id dup[] = {E(3), E(4), E(3), E(5)};
    CHECK_THROWS_AS(s.routed(L(1), dup, nullptr, 4), error);
    CHECK_THROWS_AS(s.layer_loaded(L(1)), error);  // no routing yet
    // A token boundary mid-layer: layer 1's gate input came, its routing did not.
    CHECK_THROWS_WITH_AS(s.begin_batch(run_phase::decode, 8),
                         "session: decode token 7 layer 1: begin_batch: the layer's gate input "
                         "came but its routing did not",
                         error);
  }

  SUBCASE("counted anomalies are ignored, reported, and never scored") {
    session_options o;
    o.on_anomaly = anomaly_action::count;
    standard_session s(m.shape(), o);
    install_routers(s, m);
    CHECK_FALSE(s.gate_input(L(1), x1, 64));  // no batch
    REQUIRE(s.begin_batch(run_phase::decode, 0));
    CHECK_FALSE(s.routed(r1));                      // no gate input
    CHECK_FALSE(s.gate_input(L(3), x1, 64, 2, 0));  // 2 tokens in a 1-token batch
    std::vector<float> nan(x1, x1 + 64);
    nan[0] = std::nanf("");
    CHECK_FALSE(s.gate_input(L(2), nan.data(), 64));  // NaN: layer 2's input rejected
    REQUIRE(s.gate_input(L(1), x1, 64));
    REQUIRE(s.routed(r1));
    CHECK_FALSE(s.routed(r1));            // duplicate routing
    CHECK(s.routed(st.routed(L(2), 0)));  // after a NaN input: scored, gate predictors unscored
    REQUIRE(s.begin_batch(run_phase::decode, 1));
    const auto& a = s.anomalies();
    CHECK(a[anomaly_kind::no_batch] == 1);
    CHECK(a[anomaly_kind::routing_without_gate_input] == 1);
    CHECK(a[anomaly_kind::gate_input_shape] == 1);
    CHECK(a[anomaly_kind::nan_gate_input] == 1);
    CHECK(a[anomaly_kind::duplicate_routing] == 1);
    CHECK(a.total() == 5);
    const prediction_report r = s.report();
    CHECK(r.totals[2].routings == 1);  // only layer 1's routing was scored by the control
    CHECK(r.totals[2].unscored == 1);  // layer 2's: its gate input was a NaN
    CHECK(r.totals[2].perfect());
    CHECK(format_text(r).find("prev-token - (-) |") != std::string::npos);
    CHECK(format_text(r).find("moe-predict: 5 anomalies ignored (1 event before begin_batch, 1 "
                              "routing without gate input, 1 duplicate routing, 1 malformed gate "
                              "input, 1 NaN in a gate input); first: session: gate_input(layer "
                              "1): no batch has begun") != std::string::npos);
  }
}

TEST_CASE("count mode: a repeated anomaly allocates nothing after the first message") {
  using moe_residency_test::allocations;
  const synthetic_model m(synthetic_presets::small(synthetic_router::qwen3moe, element_type::f32, 4, 32, 64, 4, true));
  synthetic_stream st(m);
  st.next(1);
  const float* x1 = st.gate_inputs(L(1));
  const float* x3 = st.gate_inputs(L(3));
  const routing& r1 = st.routed(L(1), 0);
  std::vector<float> nan(x1, x1 + 64);
  nan[7] = std::nanf("");
  const std::int32_t out_of_range[] = {3, 40, 1, 2};
  const std::int32_t good[] = {3, 4, 1, 2};
  const expert_id dup[] = {E(3), E(4), E(3), E(5)};

  session_options o;
  o.on_anomaly = anomaly_action::count;
  standard_session s(m.shape(), o);
  install_routers(s, m);
  // One token of an engine that gets every kind of anomaly wrong, every token.
  // Results are tallied, not CHECKed, so the loop runs nothing but the session.
  int refused = 0, accepted = 0;
  const auto tally = [&](bool ok) { ok ? ++accepted : ++refused; };
  const auto bad_token = [&](std::uint32_t pos) {
    tally(s.begin_batch(run_phase::decode, pos, 0));          // bad_batch
    tally(s.begin_batch(run_phase::decode, 0xFFFFFFFFu, 2));  // position_overflow
    tally(s.begin_batch(run_phase::decode, pos));
    tally(s.routed(r1));                                 // routing_without_gate_input
    tally(s.gate_input(L(9), x1, 64));                   // layer_out_of_range
    tally(s.gate_input(L(0), x1, 64));                   // dense_layer
    tally(s.gate_input(L(2), nan.data(), 64));           // nan_gate_input
    tally(s.routed(L(2), span<const routing>(&r1, 1)));  // routing_shape (layer 1's)
    tally(s.gate_input(L(1), x1, 63));                   // gate_input_shape
    tally(s.gate_input(L(1), x1, 64));
    tally(s.gate_input(L(1), x1, 64));                           // duplicate_gate_input
    tally(s.routed(L(1), routing_batch_view{out_of_range, 4}));  // expert_out_of_range
    tally(s.routed(L(1), routing_batch_view{good, 4, 1, 8}));    // routing_shape (stride)
    tally(s.routed(L(1), dup, nullptr, 4));                      // duplicate_expert
    tally(s.layer_loaded(L(1)));                                 // loaded_without_routing
    tally(s.routed(r1));
    tally(s.routed(r1));  // duplicate_routing
    tally(s.layer_loaded(L(1)));
    tally(s.gate_input(L(3), x3, 64));
    tally(s.end_batch());  // token_boundary_mid_layer: layers 2 and 3
    tally(s.end_batch());  // no_batch
  };
  bad_token(0);  // stores the first message
  REQUIRE(s.anomalies().first_message == "session: begin_batch: 0 tokens; expected >= 1");
  REQUIRE(refused == 16);
  REQUIRE(accepted == 5);
  const anomaly_counts first = s.anomalies();
  const long before = allocations();
  for (std::uint32_t pos = 1; pos <= 20; ++pos) bad_token(pos);
  const long allocated = allocations() - before;
  CHECK(allocated == 0);
  CHECK(refused == 16 * 21);
  CHECK(accepted == 5 * 21);
  const anomaly_counts& a = s.anomalies();
  for (std::size_t k = 0; k < anomaly_kind_count; ++k) {
    const auto kind = static_cast<anomaly_kind>(k);
    const std::uint64_t per_token =
        kind == anomaly_kind::routing_shape || kind == anomaly_kind::token_boundary_mid_layer ? 2 : 1;
    CAPTURE(to_string(kind));
    CHECK(first[kind] == per_token);  // every kind is exercised
    CHECK(a[kind] == 21 * per_token);
  }
  CHECK(a.first_message == "session: begin_batch: 0 tokens; expected >= 1");
}

TEST_CASE("positions are 32-bit: a batch past 2^32 - 1 is refused, never wrapped") {
  const synthetic_model m(small_cfg());
  const std::uint32_t top = std::numeric_limits<std::uint32_t>::max();
  {
    standard_session s(m.shape());
    CHECK(s.begin_batch(run_phase::decode, top, 1));  // the last position itself fits
    CHECK(s.first_token() == top);
    CHECK_THROWS_WITH_AS(s.begin_batch(run_phase::prefill, top - 2, 4),
                         "session: begin_batch: 4 tokens from position 4294967293 pass 2^32 - 1; expected the "
                         "last position to fit in 32 bits (start a new sequence at 0)",
                         error);
    CHECK(s.begin_batch(run_phase::prefill, top - 3, 4));  // ends exactly at 2^32 - 1
  }
  {
    session_options o;
    o.on_anomaly = anomaly_action::count;
    standard_session s(m.shape(), o);
    CHECK_FALSE(s.begin_batch(run_phase::prefill, top, 2));
    CHECK(s.anomalies()[anomaly_kind::position_overflow] == 1);
    CHECK(s.anomalies().total() == 1);
    CHECK(s.begin_batch(run_phase::decode, 0, 1));  // a new sequence goes on
  }
}

TEST_CASE("anomaly kinds: the enum, the count and the texts come from one list") {
  CHECK(anomaly_kind_count == static_cast<std::size_t>(anomaly_kind::position_overflow) + 1);
  std::set<std::string> texts;
  for (std::size_t k = 0; k < anomaly_kind_count; ++k) {
    const std::string t = to_string(static_cast<anomaly_kind>(k));
    CAPTURE(k);
    CHECK(t != "anomaly");
    texts.insert(t);
  }
  CHECK(texts.size() == anomaly_kind_count);  // no two kinds print alike
  CHECK(std::string(to_string(anomaly_kind::duplicate_routing)) == "duplicate routing");
  CHECK(std::string(to_string(static_cast<anomaly_kind>(anomaly_kind_count))) == "anomaly");
  CHECK(anomaly_counts{}.by_kind.size() == anomaly_kind_count);
}

TEST_CASE("messages name the failing value and the token of a multi-token batch") {
  const synthetic_model m(synthetic_presets::small(synthetic_router::qwen3moe, element_type::f32, 4, 32, 64, 4, true));
  synthetic_stream st(m);
  st.next(5);
  standard_session s(m.shape());
  install_routers(s, m);
  // A prefill batch of tokens 10..14 whose layers see only the last 2 rows
  // (tokens 13 and 14), as llama.cpp's last prompt layer does.
  REQUIRE(s.begin_batch(run_phase::prefill, 10, 5));
  REQUIRE(s.gate_input(L(1), st.gate_inputs(L(1)) + 3 * 64, 64, 2, 0));
  std::vector<routing> rows{st.routed(L(1), 3), st.routed(L(1), 4)};

  SUBCASE("a row carrying another layer") {
    rows[1].layer = L(2);
    CHECK_THROWS_WITH_AS(s.routed(L(1), span<const routing>(rows)),
                         "session: prefill tokens 10..14 layer 1: routed: token 14 carries layer 2; "
                         "expected the event's layer",
                         error);
  }
  SUBCASE("an expert out of range, as routings and as engine ids") {
    rows[1].clear();
    for (std::size_t e : {5, 6, 40, 7}) rows[1].push_back(E(e));
    CHECK_THROWS_WITH_AS(s.routed(L(1), span<const routing>(rows)),
                         "session: prefill tokens 10..14 layer 1: routed: token 14 slot 2: expert 40 "
                         "out of range [0, 32)",
                         error);
    const std::int32_t ids[] = {5, 6, 7, 8, 1, 2, 33, 3};
    CHECK_THROWS_WITH_AS(s.routed(L(1), routing_batch_view{ids, 4, 2}),
                         "session: prefill tokens 10..14 layer 1: routed: token 14 slot 2: expert 33 "
                         "out of range [0, 32)",
                         error);
  }
  SUBCASE("a duplicate expert") {
    rows[0].clear();
    for (std::size_t e : {5, 6, 9, 6}) rows[0].push_back(E(e));
    CHECK_THROWS_WITH_AS(s.routed(L(1), span<const routing>(rows)),
                         "session: prefill tokens 10..14 layer 1: routed: token 13: expert 6 in "
                         "slots 1 and 3",
                         error);
  }
  SUBCASE("a NaN in the second of two rows") {
    std::vector<float> x(st.gate_inputs(L(1)), st.gate_inputs(L(1)) + 2 * 64);
    x[64 + 9] = std::nanf("");
    CHECK_THROWS_WITH_AS(s.gate_input(L(2), x.data(), 64, 2, 0),
                         "session: prefill tokens 10..14 layer 2: gate_input: token 14 element 9 is "
                         "nan; expected a finite value",
                         error);
  }
  SUBCASE("a batch view names the field that is wrong") {
    const std::int32_t ids[] = {5, 6, 7, 8, 1, 2, 3, 4};
    const float w[8] = {};
    CHECK_THROWS_WITH_AS(s.routed(L(1), routing_batch_view{nullptr, 4, 2}),
                         "session: prefill tokens 10..14 layer 1: routed: routing_batch_view::ids "
                         "is null; expected k ids per token",
                         error);
    CHECK_THROWS_WITH_AS(s.routed(L(1), routing_batch_view{ids, 0, 2}),
                         "session: prefill tokens 10..14 layer 1: routed: routing_batch_view::k is "
                         "0; expected k >= 1",
                         error);
    CHECK_THROWS_WITH_AS(s.routed(L(1), routing_batch_view{ids, 4, 2, 12}),
                         "session: prefill tokens 10..14 layer 1: routed: ids_row_stride_bytes 12 "
                         "for k 4; expected a multiple of 4 >= k * 4 = 16 (or 0 = packed)",
                         error);
    CHECK_THROWS_WITH_AS(s.routed(L(1), routing_batch_view{ids, 4, 2, 18}),
                         "session: prefill tokens 10..14 layer 1: routed: ids_row_stride_bytes 18 "
                         "for k 4; expected a multiple of 4 >= k * 4 = 16 (or 0 = packed)",
                         error);
    CHECK_THROWS_WITH_AS(s.routed(L(1), routing_batch_view{ids, 4, 2, 0, w, 8}),
                         "session: prefill tokens 10..14 layer 1: routed: weights_row_stride_bytes "
                         "8 for k 4; expected a multiple of 4 >= k * 4 = 16 (or 0 = packed)",
                         error);
    CHECK(s.routed(L(1), routing_batch_view{ids, 4, 2, 0, w, 0}));  // every field fixed
  }
  SUBCASE("a row count the batch cannot have") {
    CHECK_THROWS_WITH_AS(s.routed(L(1), span<const routing>(rows.data(), 0)),
                         "session: prefill tokens 10..14 layer 1: routed: 0 token(s); expected the "
                         "batch's 5 (or its last 1..5)",
                         error);
    REQUIRE(s.routed(L(1), span<const routing>(rows)));  // the last 2 rows: accepted
    CHECK_THROWS_WITH_AS(s.gate_input(L(2), st.gate_inputs(L(2)), 64, 6, 0),
                         "session: prefill tokens 10..14 layer 2: gate_input: 6 token(s) of 64 "
                         "floats, stride 256 bytes; expected 5 token(s) (or the batch's last 1..5) "
                         "of 64 floats, stride >= a row, non-null data",
                         error);
    REQUIRE(s.begin_batch(run_phase::decode, 20, 3));
    REQUIRE(s.gate_input(L(1), st.gate_inputs(L(1)), 64, 3, 0));
    CHECK_THROWS_WITH_AS(s.routed(L(1), span<const routing>(rows)),
                         "session: decode tokens 20..22 layer 1: routed: 2 token(s); expected the "
                         "batch's 3",
                         error);
  }
}

namespace {
// Records the tokens and row counts of the routings the session passes on.
struct routing_log {
  static constexpr session_hook hooks = session_hook::routed;
  std::vector<std::uint32_t> tokens;
  std::vector<std::size_t> rows;
  template <class S>
  void on_routed(S&, layer_id, span<const routing> rs, span<std::uint32_t> drop) {
    rows.push_back(rs.size());
    for (const routing& r : rs) tokens.push_back(r.token);
    drop[drop.size() - 1] = 1u;  // the last row's slot 0
  }
};
}  // namespace

TEST_CASE("a prefill layer may carry only the batch's last rows (llama.cpp's last prompt layer)") {
  const synthetic_model m(synthetic_presets::small(synthetic_router::qwen3moe, element_type::f32, 4, 32, 64, 4, true));
  synthetic_stream st(m);
  st.next(5);
  prev_token_options remember_prefill;
  remember_prefill.include_prefill = true;
  session<predictor_set<stale_gate_predictor, prev_token_predictor>, routing_log> s(
      m.shape(), session_options{}, std::make_tuple(stale_gate_predictor{}, prev_token_predictor(remember_prefill)));
  install_routers(s, m);
  REQUIRE(s.begin_batch(run_phase::prefill, 10, 5));
  // Layers 1 and 2: every row (as routings, then as engine ids); layer 3: the last 2 rows.
  REQUIRE(s.gate_input(L(1), st.gate_inputs(L(1)), 64, 5, 0));
  REQUIRE(s.routed(L(1), span<const routing>(&st.routed(L(1), 0), 5)));
  REQUIRE(s.layer_loaded(L(1)));
  REQUIRE(s.gate_input(L(2), st.gate_inputs(L(2)) + 3 * 64, 64, 2, 0));
  std::vector<std::int32_t> ids(2 * 32, -1);  // ggml's layout: row stride n_expert * 4
  for (std::size_t t = 0; t < 2; ++t)
    for (std::size_t i = 0; i < 4; ++i)
      ids[t * 32 + i] = static_cast<std::int32_t>(to_index(st.routed(L(2), 3 + t).id(i)));
  REQUIRE(s.routed(L(2), routing_batch_view{ids.data(), 4, 2, 32 * 4}));
  CHECK(s.drop_mask(0) == 0);
  CHECK(s.drop_mask(1) == 1u);  // drop masks index the rows given, not the batch's tokens
  REQUIRE(s.gate_input(L(3), st.gate_inputs(L(3)) + 4 * 64, 64, 1, 0));
  REQUIRE(s.routed(L(3), span<const routing>(&st.routed(L(3), 4), 1)));
  REQUIRE(s.layer_loaded(L(3)));
  REQUIRE(s.end_batch());

  const routing_log& log = s.extension<0>();
  CHECK(log.rows == std::vector<std::size_t>{5, 2, 1});
  CHECK(log.tokens == std::vector<std::uint32_t>{10, 11, 12, 13, 14, 13, 14, 14});
  CHECK(s.anomalies().total() == 0);
  CHECK(s.prefill_tokens() == 5);
  CHECK(s.report().ignored_phase == 5 + 2 + 1);
  // The predictors observed the rows given: prev-token's ranking of layer 3 is token 14's routing.
  REQUIRE(s.begin_batch(run_phase::decode, 15));
  const ranking* p3 = s.prediction<1>(L(3));
  REQUIRE(p3 != nullptr);
  const routing& r14 = st.routed(L(3), 4);
  REQUIRE(p3->size() == r14.size());
  for (std::size_t i = 0; i < r14.size(); ++i) CHECK(p3->id(i) == r14.id(i));
}

TEST_CASE("max_batch_tokens: batches up to it allocate nothing after construction") {
  using moe_residency_test::allocations;
  const synthetic_model m(small_cfg());
  synthetic_stream st(m);
  st.next(8);
  const auto allocations_of_first_batch = [&](std::size_t max_batch_tokens) {
    session_options o;
    o.max_batch_tokens = max_batch_tokens;
    session<predictor_set<prev_token_predictor>> s(m.shape(), o);
    const long before = allocations();
    const bool ok = feed_batch(s, st, run_phase::prefill);
    const long allocated = allocations() - before;
    CHECK(ok);
    CHECK(s.report().ignored_phase == 4 * 8);
    return allocated;
  };
  CHECK(allocations_of_first_batch(8) == 0);
  CHECK(allocations_of_first_batch(16) == 0);
  CHECK(allocations_of_first_batch(0) > 0);  // the default: the first larger batch grows them
  CHECK(allocations_of_first_batch(7) > 0);
}

TEST_CASE("routings wider than 32 are declined, counted, never scored") {
  const model_shape shape("wide", 64, 4, {1, 1});
  session<predictor_set<prev_token_predictor>> s(shape);
  std::vector<expert_id> ids;
  for (std::size_t i = 0; i < 33; ++i) ids.push_back(E(i));
  for (std::uint32_t t = 0; t < 3; ++t) {
    REQUIRE(s.begin_batch(run_phase::decode, t));
    REQUIRE(s.routed(L(0), ids.data(), nullptr, 33));
    REQUIRE(s.routed(L(1), ids.data(), nullptr, 4));
  }
  const prediction_report r = s.report();
  CHECK(r.declined == 3);
  CHECK(r.declined_by_layer[0] == 3);
  CHECK(r.offered[0] == 0);
  CHECK(r.totals[0].routings == 2);
  CHECK(r.totals[0].slots == 8);
  CHECK(r.totals[0].slot_pct() == doctest::Approx(100.0));
  CHECK(format_text(r).find("      0       -          0\n") != std::string::npos);
}

TEST_CASE("multi-token decode batches are accepted and not scored") {
  const synthetic_model m(small_cfg());
  synthetic_stream st(m);
  standard_session s(m.shape());
  install_routers(s, m);
  st.next(3);
  REQUIRE(feed_batch(s, st, run_phase::decode));
  CHECK(s.unscored_batched() == 12);
  CHECK(s.report().offered[0] == 0);
  CHECK(format_text(s.report()).find("12 decode routings came in multi-token batches") != std::string::npos);
}

TEST_CASE("a session fed a recorded trace scores like score_routings") {
  const std::string path = moe_residency_test::real_trace("gptoss.route.csv");
  if (path.empty()) return;
  const route_trace t = read_route_trace(path);
  const trace_routings rs = collect_routings(t);
  session<predictor_set<prev_token_predictor, frequency_predictor>> s(t.shape());
  // The prompt as one prefill batch (token-major per layer), then decode token by token.
  std::vector<std::vector<routing>> prefill(t.shape().n_layers());
  for (const routing& r : rs.routings)
    if (r.phase == run_phase::prefill) prefill[to_index(r.layer)].push_back(r);
  REQUIRE(s.begin_batch(run_phase::prefill, prefill[0].front().token, prefill[0].size()));
  for (std::size_t l = 0; l < prefill.size(); ++l) {
    std::sort(prefill[l].begin(), prefill[l].end(),
              [](const routing& a, const routing& b) { return a.token < b.token; });
    REQUIRE(s.routed(L(l), span<const routing>(prefill[l])));
  }
  for (const routing& r : rs.routings) {
    if (r.phase != run_phase::decode) continue;
    if (to_index(r.layer) == 0) REQUIRE(s.begin_batch(r.phase, r.token));
    REQUIRE(s.routed(r));
  }
  prev_token_predictor p;
  frequency_predictor f;
  const prediction_report want = score_routings(t.shape(), span<const routing>(rs.routings), rs.declined, {}, p, f);
  const prediction_report got = s.report();
  for (std::size_t i = 0; i < 2; ++i) {
    CHECK(got.totals[i].slot_hits == want.totals[i].slot_hits);
    CHECK(got.totals[i].slots == want.totals[i].slots);
    CHECK(got.totals[i].whole_hits == want.totals[i].whole_hits);
  }
  CHECK(format_text(got).rfind("moe-predict: prev-token 17.9% of routed slots", 0) == 0);
}

TEST_CASE("score_routings and a session fed the same routings print identical reports") {
  // Both run detail::score_predictions and detail::observe_routings; this pins
  // that the offline path and the session agree on every figure and line.
  const model_shape shape("toy", 16, 4, {100, 100, 100});
  std::mt19937 gen(7);
  std::vector<routing> rs;
  for (std::uint32_t token = 0; token < 60; ++token)
    for (std::size_t l = 0; l < shape.n_layers(); ++l) {
      routing r;
      r.layer = L(l);
      r.token = token;
      r.phase = token < 5 ? run_phase::prefill : run_phase::decode;
      // A skewed draw, so the history predictors score neither 0 nor 100%.
      while (r.size() < shape.top_k()) {
        const auto e = expert_id(static_cast<std::uint16_t>(std::min<std::uint32_t>(gen() % 16, gen() % 16)));
        if (!r.contains(e)) r.push_back(e, static_cast<float>(gen() % 1000) / 1000.0f);
      }
      rs.push_back(r);
    }
  for (const bool prefill : {false, true}) {
    CAPTURE(prefill);
    scorer_options so;
    so.score_prefill = prefill;
    session_options o;
    o.scoring = so;
    session<predictor_set<prev_token_predictor, frequency_predictor>> s(shape, o);
    for (const routing& r : rs) {
      if (to_index(r.layer) == 0) REQUIRE(s.begin_batch(r.phase, r.token));
      REQUIRE(s.routed(r));
    }
    prev_token_predictor p;
    frequency_predictor f;
    const prediction_report want = score_routings(shape, span<const routing>(rs), 0, so, p, f);
    const prediction_report got = s.report();
    CHECK(got.totals[0].slots > 0);
    CHECK(got.totals[0].slot_hits > 0);
    CHECK(got.totals[0].slot_hits < got.totals[0].slots);
    CHECK(format_json(got) == format_json(want));
    CHECK(format_text(got) == format_text(want));
    CHECK(format_csv(got) == format_csv(want));
  }
}

TEST_CASE("docs/session.md integration") {
  const synthetic_model m(synthetic_presets::small(synthetic_router::qwen3moe, element_type::f16, 4, 128, 256, 8));
  synthetic_stream st(m);
  // --- as in docs/session.md ---
  standard_session s(m.shape());
  for (std::size_t l = 0; l < 4; ++l)
    s.set_router(L(l), matrix_view::f16(static_cast<const std::uint16_t*>(m.router(L(l)).data), 128, 256),
                 router_spec::qwen3moe(128, 8));
  for (std::uint32_t position = 0; position < 4; ++position) {
    st.next(1);
    s.begin_batch(run_phase::decode, position);
    for (std::size_t l = 0; l < 4; ++l) {
      const routing& r = st.routed(L(l), 0);
      s.gate_input(L(l), st.gate_inputs(L(l)), 256);
      s.routed(L(l), r.ids().data(), r.weights().data(), 8);
      s.layer_loaded(L(l));
    }
  }
  const std::string text = format_text(s.report());
  // ---
  CHECK(text.find("fresh-gate control 100.0% (100.0%)") != std::string::npos);
  CHECK(text.find("control 16 routings/128 slots; 4 routings the stale-gate could not rank, 4 the "
                  "prev-token could not rank\n") != std::string::npos);
}
