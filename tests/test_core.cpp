#include "moe_residency/core.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "support.hpp"

using namespace moe_residency;

TEST_CASE("model_shape validates its input") {
  SUBCASE("k above 32") {
    CHECK_THROWS_WITH_AS(model_shape("m", 128, 33, {1, 1}), "model_shape 'm': top-k 33 out of range; expected [1, 32]",
                         error);
  }
  SUBCASE("k of zero") {
    CHECK_THROWS_WITH_AS(model_shape("m", 128, 0, {1}), "model_shape 'm': top-k 0 out of range; expected [1, 32]",
                         error);
  }
  SUBCASE("k above the expert count") {
    CHECK_THROWS_WITH_AS(model_shape("m", 4, 6, {1}), "model_shape 'm': top-k 6 exceeds n_experts 4", error);
  }
  SUBCASE("zero expert bytes on a MoE layer") {
    CHECK_THROWS_WITH_AS(model_shape("m", 8, 2, {10, 0, 10}),
                         "model_shape 'm': layer 1 is MoE but has zero or unknown expert bytes; expected > 0", error);
  }
  SUBCASE("dense layer with bytes") {
    CHECK_THROWS_WITH_AS(model_shape("m", 8, 2, {10, 5}, {true, false}),
                         "model_shape 'm': layer 1 is dense but has expert bytes 5; expected 0", error);
  }
  SUBCASE("mismatched is_moe") { CHECK_THROWS_AS(model_shape("m", 8, 2, {10, 10}, {true}), error); }
  SUBCASE("no layers") { CHECK_THROWS_AS(model_shape("m", 8, 2, {}), error); }
  SUBCASE("no expert") { CHECK_THROWS_AS(model_shape("m", 0, 1, {1}), error); }
  SUBCASE("every layer dense") {
    CHECK_THROWS_WITH_AS(model_shape("m", 8, 2, {0}, {false}), "model_shape 'm': no MoE layer; expected at least one",
                         error);
  }
}

TEST_CASE("model_shape answers per layer") {
  const model_shape s("m", 16, 4, {0, 100, 200}, {false, true, true});
  CHECK(s.n_layers() == 3);
  CHECK(s.n_moe_layers() == 2);
  CHECK_FALSE(s.is_moe(layer_id{0}));
  CHECK(s.is_moe(layer_id{2}));
  CHECK_FALSE(s.is_moe(layer_id{3}));
  CHECK(s.expert_bytes(layer_id{2}) == 200);
  CHECK(s.expert_bytes(layer_id{9}) == 0);
  CHECK(s.contains(layer_id{1}, expert_id{15}));
  CHECK_FALSE(s.contains(layer_id{1}, expert_id{16}));
  CHECK_FALSE(s.contains(layer_id{0}, expert_id{1}));
  // The slow obvious twin of token_cycle_bytes: (100 + 200) × 4.
  CHECK(token_cycle_bytes(s) == 1200);
  CHECK(token_cycle_bytes(s.with_top_k(1)) == 300);
  CHECK_THROWS_AS(s.with_top_k(17), error);
}

TEST_CASE("presets have the shapes of the real models") {
  CHECK(presets::qwen3_30b_a3b().n_layers() == 48);
  CHECK(presets::qwen3_30b_a3b().n_experts() == 128);
  CHECK(presets::qwen3_30b_a3b().top_k() == 8);
  CHECK(presets::gpt_oss_120b().n_layers() == 36);
  CHECK(presets::gpt_oss_120b().top_k() == 4);
  CHECK(presets::qwen3_6_35b_a3b().n_layers() == 40);
  CHECK(presets::qwen3_6_35b_a3b().n_experts() == 256);
  CHECK(presets::qwen3_6_35b_a3b().top_k() == 8);

  // Token cycle of the traces' shapes, as recorded in shared/traces/README.md:
  // Qwen at k=6 is 785 MiB, gpt-oss at k=2 is 908 MiB (rounded).
  CHECK(std::lround(to_mib(token_cycle_bytes(presets::qwen3_30b_a3b(6)))) == 785);
  CHECK(std::lround(to_mib(token_cycle_bytes(presets::gpt_oss_120b(2)))) == 908);
}

TEST_CASE("qwen preset expert bytes equal the trace header, layer by layer") {
  const std::string path = moe_residency_test::real_trace("qwen.route.csv");
  if (path.empty()) return;
  std::ifstream in(path);
  std::string line;
  const model_shape q = presets::qwen3_30b_a3b(6);
  std::size_t seen = 0;
  while (std::getline(in, line) && line.rfind('#', 0) == 0) {
    if (line.rfind("# layer=", 0) != 0) continue;
    std::size_t layer = 0;
    unsigned long long bytes = 0;
    REQUIRE(std::sscanf(line.c_str(), "# layer=%zu expert_bytes=%llu", &layer, &bytes) == 2);
    CHECK(q.expert_bytes(layer_id(static_cast<std::uint16_t>(layer))) == bytes);
    ++seen;
  }
  CHECK(seen == 48);
}

TEST_CASE("routing holds at most 32 experts in rank order") {
  routing r;
  for (std::uint16_t i = 0; i < 32; ++i) CHECK(r.push_back(expert_id{i}, 1.0f / (i + 1)));
  CHECK_FALSE(r.push_back(expert_id{99}, 0.0f));
  CHECK(r.size() == 32);
  CHECK(r.id(0) == expert_id{0});
  CHECK(r.weight(1) == doctest::Approx(0.5));
  CHECK(r.contains(expert_id{31}));
  CHECK_FALSE(r.contains(expert_id{99}));

  std::vector<expert_id> wide(33, expert_id{1});
  CHECK_FALSE(r.assign(wide.data(), nullptr, wide.size()));
  CHECK(r.empty());
  CHECK(r.assign(wide.data(), nullptr, 3));
  CHECK(r.size() == 3);
  CHECK(std::isnan(r.weight(2)));
}

TEST_CASE("ranking contains looks only at the first n") {
  ranking k;
  CHECK(k.push_back(expert_id{5}, 3.0f, 0.6f));
  CHECK(k.push_back(expert_id{2}, 2.0f));
  CHECK(k.push_back(expert_id{9}, 1.0f));
  CHECK(k.contains(expert_id{9}));
  CHECK_FALSE(k.contains(expert_id{9}, 2));
  CHECK(k.contains(expert_id{2}, 2));
  CHECK(std::isnan(k.weight(1)));
  k.set_weight(1, 0.25f);
  CHECK(k.weight(1) == 0.25f);
}
