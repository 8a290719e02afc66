#pragma once
/// A random-weight Mixture-of-Experts model of a real llama.cpp architecture,
/// built in memory with the public gguf API and llama_model_init_from_user —
/// no download. Used by moe-llama-probe --random and by the adapter's tests.
///
/// The weights are scaled like a trained network's, so routing is not
/// degenerate: linear weights N(0, 1/fan_in) keep activations at unit scale
/// through the residual stream, norms are ≈1, the router gives logits with a
/// standard deviation of about `router_logit_std`, and DeepSeek's selection
/// bias is small next to the probabilities it is added to. Accuracies of any
/// predictor on such a model are not claims about real models.

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"
#include "llama.h"

namespace moe_residency::llama_cpp::examples {

/// What to build. Architectures: "qwen3moe", "deepseek2" (8 expert groups, 4
/// used, sigmoid gating, selection bias, weight norm and scale, first layer
/// dense), "gpt-oss" (router bias, softmax over the selected logits).
struct random_model_spec {
  std::string arch = "qwen3moe";
  std::uint32_t n_layer = 4;
  std::uint32_t n_expert = 32;
  std::uint32_t n_expert_used = 4;
  std::uint32_t n_embd = 128;
  std::uint32_t n_ff_exp = 64;  ///< width of one expert
  std::uint32_t n_vocab = 512;
  std::uint32_t n_ctx_train = 4096;
  ggml_type router_type = GGML_TYPE_F32;  ///< type of blk.*.ffn_gate_inp.weight
  std::uint64_t seed = 42;
  float router_logit_std = 2.0f;
  /// Non-zero: written as <arch>.expert_gating_func (deepseek2 writes 2 itself).
  /// qwen3moe and gpt-oss ignore the key, so a value that disagrees with their
  /// hard-coded gating is a metadata/graph disagreement the observer reports.
  std::uint32_t gating_func_key = 0;
};

inline ggml_type parse_router_type(const std::string& s) {
  if (s == "f32") return GGML_TYPE_F32;
  if (s == "f16") return GGML_TYPE_F16;
  if (s == "bf16") return GGML_TYPE_BF16;
  throw std::invalid_argument("router type '" + s + "'; expected f32, f16 or bf16");
}

struct llama_model_deleter {
  void operator()(llama_model* m) const noexcept { llama_model_free(m); }
};
using model_ptr = std::unique_ptr<llama_model, llama_model_deleter>;

namespace detail {

inline std::uint64_t fnv1a(const char* s) noexcept {
  std::uint64_t h = 1469598103934665603ull;
  for (; *s; ++s) h = (h ^ static_cast<unsigned char>(*s)) * 1099511628211ull;
  return h;
}

inline bool ends_with(const std::string& s, const char* suffix) {
  const std::size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

struct fill_context {
  const random_model_spec* spec;
};

/// The standard deviation (and mean) a trained network would have for this tensor.
inline void init_scale(const ggml_tensor* t, const random_model_spec& spec, float& mean,
                       float& stddev) {
  const std::string name = t->name;
  const bool one_dim = ggml_n_dims(t) == 1;
  mean = 0.0f;
  if (name.find("ffn_gate_inp.weight") != std::string::npos) {
    stddev = spec.router_logit_std / std::sqrt(static_cast<float>(t->ne[0]));
  } else if (name.find("exp_probs_b") != std::string::npos) {
    stddev = 0.1f;  // selection bias: matters at the margin, does not dominate
  } else if (name.find("ffn_gate_inp.bias") != std::string::npos) {
    stddev = 0.5f;
  } else if (name == "token_embd.weight") {
    stddev = 1.0f;
  } else if (one_dim && name.find("norm") != std::string::npos) {
    mean = 1.0f;
    stddev = 0.05f;
  } else if (name.find("attn_sinks") != std::string::npos) {
    stddev = 1.0f;
  } else if (ends_with(name, ".bias") || one_dim) {
    stddev = 0.02f;
  } else {
    stddev = 1.0f / std::sqrt(static_cast<float>(t->ne[0]));  // fan-in
  }
}

inline void fill_tensor(ggml_tensor* t, void* user) {
  const auto& spec = *static_cast<fill_context*>(user)->spec;
  float mean = 0, stddev = 1;
  init_scale(t, spec, mean, stddev);
  std::mt19937_64 gen(spec.seed ^ fnv1a(t->name));
  std::normal_distribution<float> dist(mean, stddev);
  const std::int64_t n = ggml_nelements(t);
  std::vector<float> f(static_cast<std::size_t>(n));
  for (auto& v : f) v = dist(gen);
  switch (t->type) {
    case GGML_TYPE_F32:
      ggml_backend_tensor_set(t, f.data(), 0, ggml_nbytes(t));
      break;
    case GGML_TYPE_F16: {
      std::vector<ggml_fp16_t> h(f.size());
      ggml_fp32_to_fp16_row(f.data(), h.data(), n);
      ggml_backend_tensor_set(t, h.data(), 0, ggml_nbytes(t));
      break;
    }
    case GGML_TYPE_BF16: {
      std::vector<ggml_bf16_t> h(f.size());
      ggml_fp32_to_bf16_row(f.data(), h.data(), n);
      ggml_backend_tensor_set(t, h.data(), 0, ggml_nbytes(t));
      break;
    }
    default:
      // Other types are never requested by make_random_model; leave zeros.
      break;
  }
}

struct gguf_deleter {
  void operator()(gguf_context* g) const noexcept { gguf_free(g); }
};

}  // namespace detail

/// Builds the model in memory. Throws std::invalid_argument on a spec llama.cpp
/// would reject, std::runtime_error when llama.cpp fails to build it.
/// The CPU backend must be loaded (llama_backend_init / ggml_backend_load_all).
inline model_ptr make_random_model(const random_model_spec& spec,
                                   llama_model_params params = llama_model_default_params()) {
  const std::string& a = spec.arch;
  if (a != "qwen3moe" && a != "deepseek2" && a != "gpt-oss")
    throw std::invalid_argument("random model: architecture '" + a +
                                "'; expected qwen3moe, deepseek2 or gpt-oss");
  if (spec.n_layer < 2) throw std::invalid_argument("random model: --layers must be >= 2");
  if (spec.n_expert_used < 1 || spec.n_expert_used > spec.n_expert)
    throw std::invalid_argument("random model: --k " + std::to_string(spec.n_expert_used) +
                                " out of range [1, " + std::to_string(spec.n_expert) + "]");
  if (a == "deepseek2" && (spec.n_expert % 8 != 0 || spec.n_expert / 8 < 2))
    throw std::invalid_argument("random model: deepseek2 uses 8 expert groups; --experts " +
                                std::to_string(spec.n_expert) + " must be a multiple of 8, >= 16");
  if (spec.n_embd % 64 != 0)
    throw std::invalid_argument("random model: --embd " + std::to_string(spec.n_embd) +
                                " must be a multiple of 64");

  std::unique_ptr<gguf_context, detail::gguf_deleter> g(gguf_init_empty());
  auto key = [&](const char* suffix) { return a + "." + suffix; };
  auto u32 = [&](const char* suffix, std::uint32_t v) { gguf_set_val_u32(g.get(), key(suffix).c_str(), v); };
  auto f32 = [&](const char* suffix, float v) { gguf_set_val_f32(g.get(), key(suffix).c_str(), v); };

  gguf_set_val_str(g.get(), "general.architecture", a.c_str());
  gguf_set_val_str(g.get(), "general.name", ("random-" + a).c_str());
  gguf_set_val_str(g.get(), "tokenizer.ggml.model", "no_vocab");
  u32("vocab_size", spec.n_vocab);
  u32("context_length", spec.n_ctx_train);
  u32("embedding_length", spec.n_embd);
  u32("block_count", spec.n_layer);
  u32("feed_forward_length", 2 * spec.n_embd);
  u32("expert_feed_forward_length", spec.n_ff_exp);
  u32("expert_count", spec.n_expert);
  u32("expert_used_count", spec.n_expert_used);
  f32("attention.layer_norm_rms_epsilon", 1e-6f);
  f32("rope.freq_base", 10000.0f);

  if (a == "qwen3moe") {
    u32("attention.head_count", spec.n_embd / 64);
    u32("attention.head_count_kv", 1);
    u32("attention.key_length", 64);
    u32("attention.value_length", 64);
  } else if (a == "gpt-oss") {
    u32("attention.head_count", spec.n_embd / 64);
    u32("attention.head_count_kv", 1);
    u32("attention.key_length", 64);
    u32("attention.value_length", 64);
    u32("attention.sliding_window", 128);
    f32("expert_weights_scale", 1.0f);
  } else {  // deepseek2, MLA attention as in DeepSeek-V3 but small
    u32("attention.head_count", 2);
    u32("attention.head_count_kv", 1);
    u32("leading_dense_block_count", 1);
    u32("attention.q_lora_rank", 64);
    u32("attention.kv_lora_rank", 64);
    u32("attention.key_length", 64 + 32);
    u32("attention.value_length", 64);
    u32("attention.key_length_mla", 64);
    u32("attention.value_length_mla", 64);
    u32("rope.dimension_count", 32);
    u32("expert_shared_count", 1);
    u32("expert_group_count", 8);
    u32("expert_group_used_count", 4);
    u32("expert_gating_func", 2);  // sigmoid
    gguf_set_val_bool(g.get(), key("expert_weights_norm").c_str(), true);
    f32("expert_weights_scale", 2.5f);
  }

  if (spec.gating_func_key != 0) u32("expert_gating_func", spec.gating_func_key);

  // A tensor entry with only a name and a type makes llama.cpp create that
  // tensor with that type (F32 otherwise).
  if (spec.router_type != GGML_TYPE_F32) {
    for (std::uint32_t il = 0; il < spec.n_layer; ++il) {
      ggml_tensor t;
      std::memset(&t, 0, sizeof t);
      t.type = spec.router_type;
      std::snprintf(t.name, sizeof t.name, "blk.%u.ffn_gate_inp.weight", il);
      gguf_add_tensor(g.get(), &t);
    }
  }

  detail::fill_context fc{&spec};
  params.progress_callback = [](float, void*) { return true; };
  params.progress_callback_user_data = nullptr;
  model_ptr m(llama_model_init_from_user(g.get(), detail::fill_tensor, &fc, params));
  if (!m) throw std::runtime_error("random model: llama_model_init_from_user failed for " + a);
  return m;
}

}  // namespace moe_residency::llama_cpp::examples
