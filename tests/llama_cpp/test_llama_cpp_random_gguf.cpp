// The random model streamed to disk (save_random_gguf, which never holds the
// model in memory) against its slow obvious twin: the same spec built in
// memory by llama.cpp and saved by llama.cpp's own llama_model_save_to_file.
// Every tensor must have the same name, type, shape and bytes; the streamed
// file must load through mmap and give bit-identical logits; quantised experts
// must be the type asked for and come from ggml's quantiser (a pool).

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <vector>

#include "llama_support.hpp"

using namespace moe_residency_test;

namespace {

mre::random_model_spec small_spec(const std::string& arch, ggml_type experts) {
  mre::random_model_spec s = spec_for(arch, arch == "deepseek2" ? GGML_TYPE_BF16 : GGML_TYPE_F32);
  s.n_layer = 3;
  s.expert_type = experts;
  s.expert_pool = 5;
  if (experts == GGML_TYPE_Q4_K) {  // rows must be multiples of 256
    s.n_embd = 256;
    s.n_ff_exp = 256;
  }
  return s;
}

}  // namespace

TEST_CASE("random model: the streamed GGUF holds llama.cpp's own saved tensors, byte for byte") {
  llama_init_once();
  struct case_t {
    const char* arch;
    ggml_type experts;
    ggml_type dense = GGML_TYPE_F32;  // q4_K: the named shapes' dense rows from a pool, real attention heads
    bool mixed = false;               // layer_expert_types: f16, `experts`, f32
  };
  const case_t cases[] = {{"qwen3moe", GGML_TYPE_Q4_K},
                          {"qwen3moe", GGML_TYPE_F32},
                          {"deepseek2", GGML_TYPE_Q8_0},
                          {"gpt-oss", GGML_TYPE_F16},
                          {"qwen3moe", GGML_TYPE_Q4_K, GGML_TYPE_Q4_K},
                          {"qwen3moe", GGML_TYPE_Q4_K, GGML_TYPE_F32, true}};
  for (const auto& [arch, experts, dense, mixed] : cases) {
    const std::string config = std::string(arch) + " experts " + ggml_type_name(experts) + " dense " +
                               ggml_type_name(dense) + (mixed ? " per layer f16, it, f32" : "");
    CAPTURE(config);
    mre::random_model_spec spec = small_spec(arch, experts);
    if (dense != GGML_TYPE_F32) {
      spec.dense_type = dense;
      spec.n_embd = 256;  // q4_K rows: multiples of 256
      spec.n_ff_exp = 256;
      spec.n_head = 4;
      spec.n_head_kv = 2;
      spec.head_dim = 64;
    }
    const std::vector<ggml_type> layer_types{GGML_TYPE_F16, experts, GGML_TYPE_F32};
    if (mixed) spec.layer_expert_types = layer_types;
    temp_file saved(std::string(arch) + "_saved"), streamed(std::string(arch) + "_streamed");
    auto built = mre::make_random_model(spec);
    llama_model_save_to_file(built.get(), saved.path.c_str());
    mre::save_random_gguf(spec, streamed.path);

    gguf_file a(saved.path), b(streamed.path);
    REQUIRE(gguf_get_n_tensors(a.g) == gguf_get_n_tensors(b.g));
    std::size_t experts_seen = 0;
    for (std::int64_t i = 0; i < gguf_get_n_tensors(a.g); ++i) {
      const char* name = gguf_get_tensor_name(a.g, i);
      const std::string tensor = name;
      CAPTURE(tensor);
      const ggml_tensor* ta = ggml_get_tensor(a.data, name);
      const ggml_tensor* tb = ggml_get_tensor(b.data, name);
      REQUIRE(ta != nullptr);
      REQUIRE_MESSAGE(tb != nullptr, "the streamed file lacks " << name);
      CHECK(ta->type == tb->type);
      for (int d = 0; d < GGML_MAX_DIMS; ++d) CHECK(ta->ne[d] == tb->ne[d]);
      REQUIRE(ggml_nbytes(ta) == ggml_nbytes(tb));
      CHECK(std::memcmp(ta->data, tb->data, ggml_nbytes(ta)) == 0);
      if (tensor.find("_exps.weight") != std::string::npos) {
        ++experts_seen;
        CHECK(tb->type == (mixed ? layer_types[static_cast<std::size_t>(std::atoi(name + 4))] : experts));
      } else if (ggml_n_dims(tb) == 2 && tensor.find("ffn_gate_inp") == std::string::npos) {
        CHECK(tb->type == dense);  // attention, token embedding, output
      }
    }
    // deepseek2: layer 0 dense, gate and up fused (ffn_gate_up_exps) in the others.
    const std::size_t expected = std::string(arch) == "deepseek2" ? 2 * (spec.n_layer - 1) : 3 * spec.n_layer;
    CHECK(experts_seen == expected);

    // The streamed file runs through mmap to the in-memory model's logits, bit for bit.
    mre::model_ptr loaded = load_mmap(streamed.path);
    auto c1 = make_context(built.get(), test_context_params());
    auto c2 = make_context(loaded.get(), test_context_params());
    const auto r1 = run_tokens(c1.get(), built.get(), 6, 4);
    const auto r2 = run_tokens(c2.get(), loaded.get(), 6, 4);
    REQUIRE(r1.logits.size() == r2.logits.size());
    CHECK(std::memcmp(r1.logits.data(), r2.logits.data(), r1.logits.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("random model: a named shape is the real model's sizes, and a wrong name lists the names") {
  const mre::random_model_spec q = mre::shape_by_name("qwen3-30b-a3b");
  CHECK(q.n_layer == 48);
  CHECK(q.n_expert == 128);
  CHECK(q.n_expert_used == 8);
  CHECK(q.n_embd == 2048);
  CHECK(q.n_ff_exp == 768);
  CHECK(q.n_head == 32);
  CHECK(q.n_head_kv == 4);
  CHECK(q.head_dim == 128);
  CHECK(q.n_vocab == 151936);
  CHECK(q.expert_type == GGML_TYPE_Q4_K);
  CHECK(q.dense_type == GGML_TYPE_Q4_K);
  CHECK(mre::shape_by_name("qwen3-30b-a3b-half").n_layer == 24);
  try {
    mre::shape_by_name("qwen3-31b");
    FAIL("no error");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()) == "shape 'qwen3-31b'; expected one of qwen3-30b-a3b, qwen3-30b-a3b-half");
  }
  // A quantised dense type needs rows of whole blocks.
  mre::random_model_spec bad = q;
  bad.n_layer = 2;
  bad.n_head = 3;
  bad.n_head_kv = 1;
  bad.head_dim = 64;  // 3 x 64 = 192 columns of attn_output: not a q4_K row
  CHECK_THROWS_WITH_AS(
      mre::random_model_tensors(bad),
      "random model: heads x head width 192 must be a multiple of 256 for q4_K dense weights (its block size)",
      std::invalid_argument);
}

TEST_CASE("random model: quantised experts are ggml's quantisation of a pool of random experts") {
  llama_init_once();
  const mre::random_model_spec spec = small_spec("qwen3moe", GGML_TYPE_Q8_0);
  temp_file streamed("qwen3moe_q8_pool");
  mre::save_random_gguf(spec, streamed.path);
  gguf_file f(streamed.path);
  const ggml_tensor* t = ggml_get_tensor(f.data, "blk.1.ffn_up_exps.weight");
  REQUIRE(t != nullptr);
  REQUIRE(t->type == GGML_TYPE_Q8_0);
  // Every expert slice is one of at most expert_pool distinct byte strings,
  // and more than one of them is used.
  std::map<std::string, int> distinct;
  for (std::int64_t e = 0; e < t->ne[2]; ++e)
    ++distinct[std::string(static_cast<const char*>(t->data) + e * t->nb[2], t->nb[2])];
  CHECK(distinct.size() <= spec.expert_pool);
  CHECK(distinct.size() > 1);
  // Dequantised, a slice has the fan-in scale 1/sqrt(n_embd) of the f32 weights.
  const auto* traits = ggml_get_type_traits(GGML_TYPE_Q8_0);
  std::vector<float> x(static_cast<std::size_t>(t->ne[0] * t->ne[1]));
  traits->to_float(t->data, x.data(), static_cast<std::int64_t>(x.size()));
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  const double sd = std::sqrt(ss / static_cast<double>(x.size()));
  CHECK(sd == doctest::Approx(1.0 / std::sqrt(double(spec.n_embd))).epsilon(0.05));
}

TEST_CASE("random model: expert types are parsed and checked against the block size") {
  CHECK(mre::parse_expert_type("q4_K") == GGML_TYPE_Q4_K);
  CHECK(mre::parse_expert_type("q8_0") == GGML_TYPE_Q8_0);
  CHECK(mre::parse_expert_type("f16") == GGML_TYPE_F16);
  CHECK(mre::parse_expert_type("q6_K") == GGML_TYPE_Q6_K);
  CHECK(mre::parse_expert_type("q6_k") == GGML_TYPE_Q6_K);
  CHECK(mre::parse_expert_type("mxfp4") == GGML_TYPE_MXFP4);
  CHECK_THROWS_WITH_AS(mre::parse_expert_type("q9_K"),
                       "expert type 'q9_K'; expected one of q4_K, q6_K, q8_0, mxfp4, q5_K, q4_0, q5_0, q3_K, q2_K, "
                       "f16, bf16, f32",
                       std::invalid_argument);
  mre::random_model_spec s = small_spec("qwen3moe", GGML_TYPE_Q4_K);
  s.n_ff_exp = 128;
  CHECK_THROWS_WITH_AS(mre::save_random_gguf(s, "never-written.gguf"),
                       "random model: --expert-ff 128 must be a multiple of 256 for q4_K experts (its block size)",
                       std::invalid_argument);
  s = small_spec("qwen3moe", GGML_TYPE_F32);
  s.layer_expert_types = {GGML_TYPE_F16, GGML_TYPE_F16};
  CHECK_THROWS_WITH_AS(mre::save_random_gguf(s, "never-written.gguf"),
                       "random model: 2 per-layer expert types for 3 layers; expected one type, or one per layer",
                       std::invalid_argument);
  s.layer_expert_types = {GGML_TYPE_F16, GGML_TYPE_Q4_K, GGML_TYPE_F16};  // --embd 128: not a multiple of 256
  CHECK_THROWS_WITH_AS(mre::save_random_gguf(s, "never-written.gguf"),
                       "random model: --embd 128 must be a multiple of 256 for q4_K experts (its block size)",
                       std::invalid_argument);
}
