#include "moe_residency/predict.hpp"

#include <doctest/doctest.h>

#include <random>
#include <vector>

#include "moe_residency/synthetic.hpp"

using namespace moe_residency;

namespace {
layer_id L(std::size_t l) { return layer_id(static_cast<std::uint16_t>(l)); }
expert_id E(std::size_t e) { return expert_id(static_cast<std::uint16_t>(e)); }
routing R(std::size_t layer, std::vector<int> ids, run_phase p = run_phase::decode) {
  routing r;
  r.layer = L(layer);
  r.phase = p;
  float w = 0.5f;
  for (int e : ids) r.push_back(E(static_cast<std::size_t>(e)), w /= 2);
  return r;
}
model_shape shape4() { return model_shape("t", 16, 2, {1, 1, 1, 1}); }
}  // namespace

TEST_CASE("prev_token_predictor") {
  prev_token_predictor p;
  p.reset(shape4());
  ranking out;
  SUBCASE("cannot rank a layer's first token") { CHECK_FALSE(p.predict(L(1), out)); }
  SUBCASE("predicts the previous decode routing, in rank order, with its weights") {
    p.observe(R(1, {5, 3}));
    REQUIRE(p.predict(L(1), out));
    REQUIRE(out.size() == 2);
    CHECK(out.id(0) == E(5));
    CHECK(out.id(1) == E(3));
    CHECK(out.weight(0) == 0.25f);
    CHECK_FALSE(p.predict(L(2), out));
  }
  SUBCASE("prefill is ignored unless asked") {
    p.observe(R(1, {5, 3}, run_phase::prefill));
    CHECK_FALSE(p.predict(L(1), out));
    prev_token_predictor q({true});
    q.reset(shape4());
    q.observe(R(1, {5, 3}, run_phase::prefill));
    CHECK(q.predict(L(1), out));
  }
}

TEST_CASE("frequency_predictor: running counts, decay, ties by lower id") {
  frequency_predictor f;
  f.reset(shape4());
  ranking out;
  CHECK_FALSE(f.predict(L(0), out));
  f.observe(R(0, {7, 2}));
  f.observe(R(0, {2, 9}));
  f.observe(R(0, {9, 4}));
  REQUIRE(f.predict(L(0), out));
  REQUIRE(out.size() == 2);
  CHECK(out.id(0) == E(2));  // 2 and 9 both counted twice: lower id first
  CHECK(out.id(1) == E(9));
  CHECK(out.score(0) == 2.0f);
  CHECK(std::isnan(out.weight(0)));

  SUBCASE("decay favours recent routings") {
    frequency_predictor d({0.5f, false, 0});
    d.reset(shape4());
    d.observe(R(0, {7, 2}));
    d.observe(R(0, {7, 2}));
    d.observe(R(0, {3, 4}));
    REQUIRE(d.predict(L(0), out));
    // counts: 7,2 -> 0.5*1.5 = 0.75 after the third; 3,4 -> 1.0
    CHECK(out.id(0) == E(3));
    CHECK(out.id(1) == E(4));
    CHECK(d.count(L(0), E(7)) == doctest::Approx(0.75f));
    // An expert no longer routed decays to exactly 0, never into subnormals.
    // (0.75 × 0.5^130 ≈ 5e-40 would be a subnormal float without the flush.)
    for (int i = 0; i < 130; ++i) d.observe(R(0, {3, 4}));
    CHECK(d.count(L(0), E(7)) == 0.0f);
    CHECK(d.count(L(0), E(3)) == doctest::Approx(2.0f));
  }
  SUBCASE("bad options throw") {
    CHECK_THROWS_WITH_AS(frequency_predictor({0.0f, false, 0}),
                         "frequency_predictor: decay 0.000000 out of range; expected (0, 1]", error);
    CHECK_THROWS_AS(frequency_predictor({1.5f, false, 0}), error);
  }
}

TEST_CASE("static_hot_list_predictor counts the whole run of one phase") {
  const std::vector<routing> rs = {R(0, {1, 2}), R(0, {1, 3}), R(0, {3, 1}), R(0, {5, 6}, run_phase::prefill),
                                   R(0, {5, 6}, run_phase::prefill)};
  auto p = static_hot_list_predictor::from_routings(shape4(), rs);
  ranking out;
  REQUIRE(p.predict(L(0), out));
  CHECK(out.id(0) == E(1));
  CHECK(out.id(1) == E(3));
  CHECK_FALSE(p.predict(L(1), out));
  CHECK(p.hot_list(L(0)).id(0) == E(1));  // layer 0's list
  CHECK(p.hot_list(L(1)).empty());        // never routed
  CHECK(p.hot_list(L(999)).empty());      // outside the shape: empty, not out of bounds
  const std::vector<routing> bad = {R(7, {1})};
  CHECK_THROWS_AS(static_hot_list_predictor::from_routings(shape4(), bad), error);
}

TEST_CASE("moe_layer_ahead counts MoE layers, skipping dense ones") {
  const model_shape s("d", 8, 2, {0, 1, 0, 1, 1}, {false, true, false, true, true});
  layer_id t{};
  CHECK(moe_layer_ahead(s, L(1), 1, t));
  CHECK(t == L(3));
  CHECK(moe_layer_ahead(s, L(1), 2, t));
  CHECK(t == L(4));
  CHECK_FALSE(moe_layer_ahead(s, L(4), 1, t));
  CHECK(moe_layer_ahead(s, L(3), 0, t));
  CHECK(t == L(3));
  CHECK_FALSE(moe_layer_ahead(s, L(0), 0, t));
}

TEST_CASE_TEMPLATE("gate predictors rank the target layer exactly as the router would", T, gate_predictor<0>,
                   gate_predictor<1>, gate_predictor<2>) {
  for (auto rule : {synthetic_router::qwen3moe, synthetic_router::deepseek, synthetic_router::gpt_oss}) {
    CAPTURE(to_string(rule));
    const synthetic_model m(synthetic_presets::small(rule, element_type::f16, 4, 32, 64, 4));
    synthetic_stream st(m);
    st.next(1);
    router_bank bank(m.shape());
    install_routers(bank, m);
    T p;
    p.reset(m.shape());
    ranking out;
    layer_id target{};
    REQUIRE(moe_layer_ahead(m.shape(), L(0), T::horizon, target));
    REQUIRE(p.predict(bank, L(0), target, st.gate_inputs(L(0)), out));
    CHECK(out.size() == 32);
    // The twin: route_token of the target's router on layer 0's input.
    router_workspace ws(m.shape().n_experts());
    routing want;
    REQUIRE(route_token(m.router(target), st.gate_inputs(L(0)), m.spec(target), want, ws));
    for (std::size_t i = 0; i < want.size(); ++i) {
      CHECK(out.id(i) == want.id(i));
      CHECK(out.weight(i) == doctest::Approx(want.weight(i)));
    }
    for (std::size_t i = 1; i < out.size(); ++i) CHECK(out.score(i - 1) >= out.score(i));
    if (T::horizon == 0) {
      CHECK(T::label().is_control);
      CHECK(T::label().name == "fresh-gate control");
    }
  }
}

TEST_CASE("router_bank rejects routers that do not fit the model") {
  const synthetic_model m(synthetic_presets::small(synthetic_router::qwen3moe, element_type::f32, 3, 16, 32, 2, true));
  router_bank bank(m.shape());
  CHECK_THROWS_WITH_AS(bank.set(L(0), m.router(L(1)), m.spec(L(1))),
                       "router_bank: layer 0: is dense; expected a MoE layer", error);
  CHECK_THROWS_AS(bank.set(L(9), m.router(L(1)), m.spec(L(1))), error);
  std::vector<float> wide(16 * 40, 0.0f);
  bank.set(L(1), m.router(L(1)), m.spec(L(1)));
  CHECK_THROWS_WITH_AS(bank.set(L(2), matrix_view::f32(wide.data(), 16, 40), m.spec(L(2))),
                       "router_bank: layer 2: router has 40 columns; expected the embedding "
                       "length 32 of the routers set before",
                       error);
  CHECK(bank.find(L(2)) == nullptr);
  CHECK(bank.find(L(1)) != nullptr);
}
