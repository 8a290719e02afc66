#include "moe_residency/synthetic.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "moe_residency/score.hpp"
#include "moe_residency/session.hpp"

using namespace moe_residency;

namespace {
layer_id L(std::size_t l) { return layer_id(static_cast<std::uint16_t>(l)); }

prediction_report run(const synthetic_model& m, std::size_t prompt, std::size_t tokens) {
  synthetic_stream st(m);
  standard_session s(m.shape());
  install_routers(s, m);
  if (prompt) {
    st.next(prompt);
    REQUIRE(feed_batch(s, st, run_phase::prefill));
  }
  for (std::size_t t = 0; t < tokens; ++t) {
    st.next(1);
    REQUIRE(feed_batch(s, st, run_phase::decode));
  }
  return s.report();
}

void check_control_exact(const prediction_report& r, std::size_t tokens) {
  const std::size_t c = r.control_index();
  REQUIRE(c == 2);
  CHECK(r.totals[c].slot_hits == r.totals[c].slots);
  CHECK(r.totals[c].whole_hits == r.totals[c].routings);
  CHECK(r.totals[c].unscored == 0);
  for (std::size_t l = 0; l < r.n_layers(); ++l) {
    if (r.offered[l] == 0) continue;
    CAPTURE(l);
    CHECK(r.layers[c][l].routings == tokens);
    CHECK(r.layers[c][l].slot_hits == r.layers[c][l].slots);
  }
  CHECK(format_text(r).find("fresh-gate control 100.0% (100.0%)") != std::string::npos);
}
}  // namespace

TEST_CASE("the control reads exactly 100.0% on every layer, for every router type and rule") {
  for (auto type : {element_type::f32, element_type::f16, element_type::bf16}) {
    for (auto rule : {synthetic_router::qwen3moe, synthetic_router::deepseek, synthetic_router::gpt_oss,
                      synthetic_router::llama4}) {
      CAPTURE(to_string(type));
      CAPTURE(to_string(rule));
      const bool dense_first = rule == synthetic_router::deepseek;
      const synthetic_model m(synthetic_presets::small(rule, type, 6, 64, 256, 6, dense_first));
      const prediction_report r = run(m, 8, 16);
      check_control_exact(r, 16);
      if (dense_first) CHECK(r.offered[0] == 0);
    }
  }
}

TEST_CASE("the control reads 100.0% on the model-shaped presets") {
  SUBCASE("qwen3-30b: 48 x 128 x 2048, top-8, f16") {
    const synthetic_model m(synthetic_presets::qwen3_30b());
    CHECK(m.shape().n_layers() == 48);
    CHECK(m.n_embd() == 2048);
    CHECK(m.router(L(0)).type == element_type::f16);
    CHECK(m.spec(L(0)).gating == gating_function::softmax);
    const prediction_report r = run(m, 2, 3);
    check_control_exact(r, 3);
    CHECK(r.totals[0].unscored == 3);  // layer 0 of each token
  }
  SUBCASE("gpt-oss-120b: 36 x 128 x 2880, top-4, biased softmax_weight") {
    const synthetic_model m(synthetic_presets::gpt_oss_120b());
    CHECK(m.shape().n_layers() == 36);
    CHECK(m.shape().top_k() == 4);
    CHECK(m.spec(L(0)).gating == gating_function::softmax_weight);
    CHECK(m.spec(L(0)).logit_bias.size() == 128);
    check_control_exact(run(m, 0, 2), 2);
  }
}

TEST_CASE("a wrong probe drives the control far below 100%") {
  const synthetic_model m(synthetic_presets::small(synthetic_router::qwen3moe, element_type::f32, 4, 64, 256, 6));
  const std::size_t E = 64, d = 256;

  SUBCASE("transposed matrix: the weight stored embd x experts, viewed as experts x embd") {
    std::vector<std::vector<float>> transposed(4, std::vector<float>(E * d));
    standard_session s(m.shape());
    for (std::size_t l = 0; l < 4; ++l) {
      const float* w = static_cast<const float*>(m.router(L(l)).data);
      for (std::size_t e = 0; e < E; ++e)
        for (std::size_t i = 0; i < d; ++i) transposed[l][i * E + e] = w[e * d + i];
      s.set_router(L(l), matrix_view::f32(transposed[l].data(), E, d), m.spec(L(l)));
    }
    synthetic_stream st(m);
    for (int t = 0; t < 16; ++t) {
      st.next(1);
      REQUIRE(feed_batch(s, st, run_phase::decode));
    }
    const prediction_report r = s.report();
    MESSAGE("transposed probe: control reads " << r.totals[2].slot_pct() << "%");
    CHECK(r.totals[2].slot_pct() < 40.0);
    CHECK(format_text(r).find("moe-predict: the control reads ") != std::string::npos);
  }
  SUBCASE("wrong token of the batch: token t's routing probed with token t+1's input") {
    synthetic_stream st(m);
    st.next(16);  // 16 tokens' inputs and routings
    standard_session s(m.shape());
    install_routers(s, m);
    for (std::size_t t = 0; t < 16; ++t) {
      REQUIRE(s.begin_batch(run_phase::decode, static_cast<std::uint32_t>(t)));
      for (std::size_t l = 0; l < 4; ++l) {
        const float* x = st.gate_inputs(L(l)) + ((t + 1) % 16) * d;  // off by one row
        REQUIRE(s.gate_input(L(l), x, d));
        REQUIRE(s.routed(st.routed(L(l), t)));
      }
    }
    MESSAGE("wrong-token probe: control reads " << s.report().totals[2].slot_pct() << "%");
    CHECK(s.report().totals[2].slot_pct() < 70.0);
    CHECK_FALSE(s.report().totals[2].perfect());
  }
  SUBCASE("the same feed with the right row reads 100.0%") {
    synthetic_stream st(m);
    st.next(16);
    standard_session s(m.shape());
    install_routers(s, m);
    for (std::size_t t = 0; t < 16; ++t) {
      REQUIRE(s.begin_batch(run_phase::decode, static_cast<std::uint32_t>(t)));
      for (std::size_t l = 0; l < 4; ++l) {
        REQUIRE(s.gate_input(L(l), st.gate_inputs(L(l)) + t * d, d));
        REQUIRE(s.routed(st.routed(L(l), t)));
      }
    }
    CHECK(s.report().totals[2].perfect());
  }
}

TEST_CASE(
    "the workload has structure: early layers less predictable, tokens correlated, "
    "popularity skewed") {
  synthetic_config c = synthetic_presets::small(synthetic_router::qwen3moe, element_type::f32, 16, 64, 256, 6);
  c.nudge_first = 0.5f;
  c.nudge_last = 0.05f;
  const prediction_report r = run(synthetic_model(c), 0, 40);
  overlap_counts early, late;
  for (std::size_t l = 1; l <= 4; ++l) early += r.layers[0][l];
  for (std::size_t l = 12; l < 16; ++l) late += r.layers[0][l];
  CHECK(early.slot_pct() + 5.0 < late.slot_pct());
  CHECK(late.slot_pct() > 80.0);
  // Random guessing names k/E = 9.4% of slots; the previous token does much better.
  CHECK(r.totals[1].slot_pct() > 20.0);
  CHECK(r.totals[1].slot_pct() < r.totals[0].slot_pct());

  SUBCASE("no correlation, no skew: the previous token is close to chance") {
    c.token_correlation = 0.0f;
    c.popularity_skew = 0.0f;
    const prediction_report u = run(synthetic_model(c), 0, 40);
    CHECK(u.totals[1].slot_pct() < 16.0);
  }
}

TEST_CASE("the workload is deterministic from its seed") {
  const auto cfg = [](std::uint64_t seed) {
    return synthetic_presets::small(synthetic_router::gpt_oss, element_type::bf16, 3, 32, 64, 4, false, seed);
  };
  const synthetic_model a(cfg(5)), b(cfg(5)), c(cfg(6));
  synthetic_stream sa(a), sb(b), sc(c);
  std::size_t differ = 0;
  for (int t = 0; t < 8; ++t) {
    sa.next(2);
    sb.next(2);
    sc.next(2);
    for (std::size_t l = 0; l < 3; ++l)
      for (std::size_t i = 0; i < 2; ++i) {
        const routing &ra = sa.routed(L(l), i), &rb = sb.routed(L(l), i), &rc = sc.routed(L(l), i);
        REQUIRE(ra.size() == 4);
        for (std::size_t s = 0; s < 4; ++s) {
          CHECK(ra.id(s) == rb.id(s));
          CHECK(ra.weight(s) == rb.weight(s));
          differ += ra.id(s) != rc.id(s);
        }
        CHECK(ra.token == sa.first_token() + i);
      }
  }
  CHECK(differ > 0);
  CHECK_THROWS_AS(synthetic_model(synthetic_config{}), error);
  synthetic_config bad = cfg(1);
  bad.token_correlation = 1.0f;
  CHECK_THROWS_AS(synthetic_model{bad}, error);
}

namespace {
// FNV-1a over little-endian words: a fingerprint of what the synthetic model
// generates, the same on every host.
struct fnv {
  std::uint64_t h = 1469598103934665603ull;
  void word(std::uint64_t v, std::size_t n_bytes) {
    for (std::size_t i = 0; i < n_bytes; ++i) h = (h ^ ((v >> (8 * i)) & 0xFFu)) * 1099511628211ull;
  }
  void f32(float f) {
    std::uint32_t b;
    std::memcpy(&b, &f, sizeof b);
    word(b, 4);
  }
};
}  // namespace

// The router storage is a typed buffer per element type; this pins what the
// generator produces (router bits, gate inputs, routings, per type and rule)
// so a change of storage cannot silently change a seed's routings. Golden
// values were recorded on x86-64 with the previous (byte-reinterpreting)
// storage; the gate-input hashes were added later, on x86-64.
//
// The routers and gate inputs must be the same bits on every platform: the
// generator rounds every product before it meets an addition, so a compiler
// that contracts a*b+c into a fused multiply-add (GCC on aarch64 by default)
// cannot change them (before that, it did: docs/reliability.md). The
// routings come from the GEMV, whose multiply-add is fused exactly where
// ggml's is (MOE_RESIDENCY_FUSED_MADD: x86 builds without FMA do not fuse,
// every aarch64 build does), so f32 logits one rounding apart give other
// weights (and may flip a near-tie): the routings have one golden per fusion
// mode. The fused f32 goldens were recorded under qemu-aarch64 (build/aarch64,
// GCC 12 cross), and hold on x86-64 too when the GEMV fuses there (this file
// built by hand with g++ 12 -O2 -march=native: fma3+avx2, GCC free to contract
// everything else; every case passes). For f16 and bf16 routers the two goldens are the same: the
// GEMV rounds x to the router's type, and a product of two f16 (or bf16)
// values is exact in float, so fusing it with the addition changes nothing —
// this test checks that too.
TEST_CASE("same seeds give bit-identical routers and routings for every router type") {
  struct golden {
    element_type type;
    synthetic_router rule;
    std::uint64_t routers, gate_inputs, routings_unfused, routings_fused;
  };
  const golden want[] = {
      {element_type::f32, synthetic_router::qwen3moe, 0xab11b1a972e66bedull, 0xea6fb0476e911624ull,
       0x21e4414b03d41826ull, 0x206e2ef40d5f79cdull},
      {element_type::f32, synthetic_router::deepseek, 0xaae02a80f879d5c3ull, 0x91bc1fe7a9c6cd95ull,
       0xb94127ca3a9b5af5ull, 0x51d456a64d63f926ull},
      {element_type::f32, synthetic_router::gpt_oss, 0x08daa00e5ad1b72eull, 0xea6fb0476e911624ull,
       0x8db6a5f8b03ab10full, 0xb99fc56c2ba9df82ull},
      {element_type::f32, synthetic_router::llama4, 0xab11b1a972e66bedull, 0xea6fb0476e911624ull, 0xc71cc48dbc9f9835ull,
       0x7eb12e5176e49b02ull},
      {element_type::f16, synthetic_router::qwen3moe, 0x3465eeae92a8cd0dull, 0xea6fb0476e911624ull,
       0x956414ccb571ecedull, 0x956414ccb571ecedull},
      {element_type::f16, synthetic_router::deepseek, 0xda9c972d370c3168ull, 0x91bc1fe7a9c6cd95ull,
       0x4a9aecf1f23add96ull, 0x4a9aecf1f23add96ull},
      {element_type::f16, synthetic_router::gpt_oss, 0xa7019b248e4ba3e4ull, 0xea6fb0476e911624ull,
       0x547e0982832ae848ull, 0x547e0982832ae848ull},
      {element_type::f16, synthetic_router::llama4, 0x3465eeae92a8cd0dull, 0xea6fb0476e911624ull, 0x3d4b67ae167e1833ull,
       0x3d4b67ae167e1833ull},
      {element_type::bf16, synthetic_router::qwen3moe, 0x7cdbc1f476e3be7full, 0xea6fb0476e911624ull,
       0x1f764b42a9d437d8ull, 0x1f764b42a9d437d8ull},
      {element_type::bf16, synthetic_router::deepseek, 0x2f9711fb5465a280ull, 0x91bc1fe7a9c6cd95ull,
       0x45e65dab6a8248c3ull, 0x45e65dab6a8248c3ull},
      {element_type::bf16, synthetic_router::gpt_oss, 0xc3a1baa49c267347ull, 0xea6fb0476e911624ull,
       0xdb2b24adb5129837ull, 0xdb2b24adb5129837ull},
      {element_type::bf16, synthetic_router::llama4, 0x7cdbc1f476e3be7full, 0xea6fb0476e911624ull,
       0x1053ce26b44a1fb2ull, 0x1053ce26b44a1fb2ull},
  };
  const bool fused = MOE_RESIDENCY_FUSED_MADD != 0;
  MESSAGE("GEMV multiply-add fused: " << fused << " (" << std::string(gemv_arch_name()) << ")");
  for (const golden& g : want) {
    const std::string type = to_string(g.type), rule = to_string(g.rule);
    CAPTURE(type);
    CAPTURE(rule);
    const bool dense_first = g.rule == synthetic_router::deepseek;
    const synthetic_model m(synthetic_presets::small(g.rule, g.type, 6, 64, 256, 6, dense_first));
    fnv routers;
    for (std::size_t l = 0; l < m.shape().n_layers(); ++l) {
      const matrix_view v = m.router(L(l));
      routers.word(static_cast<std::uint64_t>(v.type), 1);
      routers.word(v.rows, 8);
      routers.word(v.cols, 8);
      if (!v.data) continue;
      for (std::size_t i = 0; i < v.rows * v.cols; ++i) {
        if (v.type == element_type::f32) routers.f32(static_cast<const float*>(v.data)[i]);
        else routers.word(static_cast<const std::uint16_t*>(v.data)[i], 2);
      }
    }
    fnv gates, routed;
    synthetic_stream st(m, 5);
    for (std::size_t batch : {8u, 1u, 1u, 3u, 1u}) {
      st.next(batch);
      for (std::size_t l = 0; l < m.shape().n_layers(); ++l) {
        if (!m.shape().is_moe(L(l))) continue;
        const float* x = st.gate_inputs(L(l));
        for (std::size_t i = 0; i < batch * m.n_embd(); ++i) gates.f32(x[i]);
        for (std::size_t i = 0; i < batch; ++i) {
          const routing& r = st.routed(L(l), i);
          for (std::size_t s = 0; s < r.size(); ++s) {
            routed.word(to_index(r.id(s)), 2);
            routed.f32(r.weight(s));
          }
        }
      }
    }
    CAPTURE(routers.h);
    CAPTURE(gates.h);
    CAPTURE(routed.h);
    CHECK(routers.h == g.routers);
    CHECK(gates.h == g.gate_inputs);
    CHECK(routed.h == (fused ? g.routings_fused : g.routings_unfused));
  }
}
