#pragma once
/// A random-weight Mixture-of-Experts model of a real llama.cpp architecture,
/// built in memory with the public gguf API and llama_model_init_from_user —
/// no download — or streamed straight to a GGUF file (save_random_gguf) with
/// the same weights, tensor by tensor, so a model larger than memory can be
/// written without ever being held in memory. The memory lab's model writer
/// (moe-lab-model), moe-llama-probe --random (in memory) and the adapter's tests
/// use it; it is the lab's, not the library's, and never installed.
///
/// Experts can be f32, f16, q8_0 or q4_K (`expert_type`); quantised experts
/// use ggml's own quantiser (ggml_quantize_chunk), so bytes per expert and
/// compute per byte resemble a Q4_K_M file. Quantising gigabytes of random
/// floats takes minutes on a small machine, so quantised expert tensors are
/// filled from a *pool*: `expert_pool` random experts per kind (gate, up,
/// down) are drawn and quantised once, and every expert slice of every layer
/// is a seeded pick from that pool. Each expert still has its own bytes in the
/// file (its own pages to fault in, read and cache), and the routers, which
/// decide the routing, are drawn per layer as before; only the experts'
/// values repeat. f32/f16 experts are drawn element by element, unpooled.
///
/// The weights are scaled like a trained network's, so routing is not
/// degenerate: linear weights N(0, 1/fan_in) keep activations at unit scale
/// through the residual stream, norms are ≈1, the router gives logits with a
/// standard deviation of about `router_logit_std`, and DeepSeek's selection
/// bias is small next to the probabilities it is added to. Accuracies of any
/// predictor on such a model are not claims about real models.

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"
#include "llama.h"
#include "moe_residency/adapters/llama_cpp/gguf.hpp"

namespace moe_residency::llama_cpp::lab {

/// What to build. Architectures: "qwen3moe", "deepseek2" (8 expert groups, 4
/// used, sigmoid gating, selection bias, weight norm and scale, first layer
/// dense), "gpt-oss" (router bias, softmax over the selected logits), and
/// "qwen3", a dense model with no experts (what a residency manager must
/// recognise and leave alone).
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
  /// Type of the expert weights (blk.*.ffn_{gate,up,down,gate_up}_exps.weight):
  /// f32, f16, bf16, q8_0 or q4_K. A quantised type needs the rows (--embd and
  /// --expert-ff) to be multiples of its block (32 for q8_0, 256 for q4_K).
  ggml_type expert_type = GGML_TYPE_F32;
  /// Per layer, the type of that layer's expert weights (empty: every layer
  /// `expert_type`; else one entry per layer). A real Q4_K_M mixes types by
  /// layer, and llama.cpp's CPU backend repacks some types and not others.
  std::vector<ggml_type> layer_expert_types;
  /// Quantised experts: distinct random experts per kind (see the file comment).
  std::uint32_t expert_pool = 32;
  /// Attention (qwen3moe, gpt-oss): query heads (0: n_embd / 64), key/value
  /// heads and the width of one head. A real model's attention sets the dense
  /// bytes and the compute a token costs besides its experts.
  std::uint32_t n_head = 0;
  std::uint32_t n_head_kv = 1;
  std::uint32_t head_dim = 64;
  /// Type of the 2-D dense weights (attention, token embedding, output): f32,
  /// or a quantised type whose rows are drawn from a seeded pool of
  /// `expert_pool` x 8 random rows per tensor (their values do not matter to
  /// bytes or time; a real model's Q4_K_M keeps these at 4-6 bits).
  ggml_type dense_type = GGML_TYPE_F32;
  /// Per tensor name ("blk.3.ffn_down_exps.weight", "output.weight", …), a
  /// type that overrides the rules above: a real Q4_K_M file mixes q4_K and
  /// q6_K by tensor and by layer (trace_shape.hpp sets them from a trace).
  /// A name the architecture does not create is ignored.
  std::map<std::string, ggml_type> tensor_types;
  /// A text vocabulary (a SentencePiece "llama" one: <unk>, <s>, </s>, the
  /// 256 byte tokens, then letter pieces), so prompts tokenize and tokens
  /// print as text; needs n_vocab >= 512. Off: "no_vocab" (token ids only).
  bool text_vocab = false;
};

/// A named shape of a real model, for the memory lab: its layers, experts,
/// widths, attention and vocabulary, random weights in q4_K.
struct named_shape {
  const char* name;
  const char* what;
  random_model_spec spec;
};

/// The shapes `--shape` knows (docs/memlab.md has their sizes).
inline std::vector<named_shape> named_shapes() {
  std::vector<named_shape> v;
  random_model_spec q;
  q.arch = "qwen3moe";
  q.n_layer = 48;
  q.n_expert = 128;
  q.n_expert_used = 8;
  q.n_embd = 2048;
  q.n_ff_exp = 768;
  q.n_vocab = 151936;
  q.n_ctx_train = 40960;
  q.n_head = 32;
  q.n_head_kv = 4;
  q.head_dim = 128;
  q.expert_type = GGML_TYPE_Q4_K;
  q.dense_type = GGML_TYPE_Q4_K;
  v.push_back({"qwen3-30b-a3b",
               "Qwen3-30B-A3B: 48 MoE layers x 128 experts, top-8, embedding 2048, expert ff 768, "
               "32/4 heads of 128, vocabulary 151936",
               q});
  random_model_spec h = q;  // the same widths, half the layers: about half the file, for quicker runs
  h.n_layer = 24;
  v.push_back({"qwen3-30b-a3b-half", "Qwen3-30B-A3B's layers and widths, 24 of its 48 layers", h});
  return v;
}

/// The named shape `name`; throws std::invalid_argument listing the names.
inline random_model_spec shape_by_name(const std::string& name) {
  std::string names;
  for (const auto& s : named_shapes()) {
    if (name == s.name) return s.spec;
    names += (names.empty() ? "" : ", ") + std::string(s.name);
  }
  throw std::invalid_argument("shape '" + name + "'; expected one of " + names);
}

/// The weight types a random model can hold: ggml quantises each without an
/// importance matrix (ggml_quantize_chunk), and llama.cpp's CPU backend
/// multiplies each. In order of preference where several fit (trace_shape.hpp).
inline const std::vector<ggml_type>& weight_types() {
  static const std::vector<ggml_type> t = {GGML_TYPE_Q4_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0, GGML_TYPE_MXFP4,
                                           GGML_TYPE_Q5_K, GGML_TYPE_Q4_0, GGML_TYPE_Q5_0, GGML_TYPE_Q3_K,
                                           GGML_TYPE_Q2_K, GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_F32};
  return t;
}

/// A weight type by ggml's name ("q4_K", "q6_K", "mxfp4", "f16", …; the K
/// types also in lower case).
inline ggml_type parse_expert_type(const std::string& s) {
  std::string names;
  for (ggml_type t : weight_types()) {
    const std::string n = ggml_type_name(t);
    std::string lower = n;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (s == n || s == lower) return t;
    names += (names.empty() ? "" : ", ") + n;
  }
  throw std::invalid_argument("expert type '" + s + "'; expected one of " + names);
}

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

inline bool is_expert_weight(const std::string& name) { return ends_with(name, "_exps.weight"); }

/// The standard deviation (and mean) a trained network would have for this tensor.
inline void init_scale(const std::string& name, bool one_dim, std::int64_t fan_in, const random_model_spec& spec,
                       float& mean, float& stddev) {
  mean = 0.0f;
  if (name.find("ffn_gate_inp.weight") != std::string::npos) {
    stddev = spec.router_logit_std / std::sqrt(static_cast<float>(fan_in));
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
    stddev = 1.0f / std::sqrt(static_cast<float>(fan_in));  // fan-in
  }
}

/// `n` floats (`rows` rows of `n_per_row`) in `type`, appended to `out`.
inline void convert_rows(ggml_type type, const float* f, std::int64_t rows, std::int64_t n_per_row,
                         std::vector<std::uint8_t>& out) {
  const std::size_t bytes = ggml_row_size(type, n_per_row) * static_cast<std::size_t>(rows);
  out.resize(bytes);
  const std::int64_t n = rows * n_per_row;
  switch (type) {
    case GGML_TYPE_F32: std::memcpy(out.data(), f, bytes); break;
    case GGML_TYPE_F16: ggml_fp32_to_fp16_row(f, reinterpret_cast<ggml_fp16_t*>(out.data()), n); break;
    case GGML_TYPE_BF16: ggml_fp32_to_bf16_row(f, reinterpret_cast<ggml_bf16_t*>(out.data()), n); break;
    default:
      if (ggml_quantize_chunk(type, f, out.data(), 0, rows, n_per_row, nullptr) != bytes)
        throw std::runtime_error(std::string("random model: ggml_quantize_chunk to ") + ggml_type_name(type) +
                                 " wrote an unexpected size");
  }
}

inline std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Every weight of a random model, generated tensor by tensor and handed out
/// in file order through a sink (void(const void*, std::size_t)), so the
/// in-memory model and the streamed GGUF get the same bytes.
class weight_source {
 public:
  explicit weight_source(const random_model_spec& spec) : spec_(spec) {}

  template <class Sink>
  void generate(const std::string& name, ggml_type type, const std::int64_t* ne, int n_dims, Sink&& sink) {
    if (is_expert_weight(name) && ggml_is_quantized(type) && n_dims == 3) {
      const auto& pool = pool_for(name, type, ne[0], ne[1]);
      for (std::int64_t e = 0; e < ne[2]; ++e) {
        const std::uint64_t pick =
            splitmix64(spec_.seed ^ fnv1a(name.c_str()) ^ splitmix64(static_cast<std::uint64_t>(e)));
        const auto& slice = pool[static_cast<std::size_t>(pick % pool.size())];
        sink(slice.data(), slice.size());
      }
      return;
    }
    if (!is_expert_weight(name) && ggml_is_quantized(type) && n_dims == 2) {
      // A quantised dense matrix: each row a seeded pick from a pool of random rows.
      const auto& pool = pool_for(name, type, ne[0], dense_pool_rows(), true);
      const std::size_t row = ggml_row_size(type, ne[0]);
      const std::size_t per_chunk = std::max<std::size_t>(1, (1u << 20) / row);
      buf_.resize(per_chunk * row);
      std::size_t in_buf = 0;
      for (std::int64_t r = 0; r < ne[1]; ++r) {
        const std::uint64_t pick =
            splitmix64(spec_.seed ^ fnv1a(name.c_str()) ^ splitmix64(static_cast<std::uint64_t>(r)));
        std::memcpy(buf_.data() + in_buf * row, pool[0].data() + (pick % dense_pool_rows()) * row, row);
        if (++in_buf == per_chunk) {
          sink(buf_.data(), in_buf * row);
          in_buf = 0;
        }
      }
      if (in_buf > 0) sink(buf_.data(), in_buf * row);
      return;
    }
    // Element by element from one seeded stream per tensor, one 2-D slice at a time.
    float mean = 0, stddev = 1;
    init_scale(name, n_dims == 1, ne[0], spec_, mean, stddev);
    std::mt19937_64 gen(spec_.seed ^ fnv1a(name.c_str()));
    std::normal_distribution<float> dist(mean, stddev);
    const std::int64_t rows = n_dims == 1 ? 1 : ne[1];
    const std::int64_t slices = (n_dims > 2 ? ne[2] : 1) * (n_dims > 3 ? ne[3] : 1);
    std::vector<float> f(static_cast<std::size_t>(ne[0] * rows));
    for (std::int64_t s = 0; s < slices; ++s) {
      for (auto& v : f) v = dist(gen);
      convert_rows(type, f.data(), rows, ne[0], buf_);
      sink(buf_.data(), buf_.size());
    }
  }

 private:
  using pool_t = std::vector<std::vector<std::uint8_t>>;

  std::uint32_t dense_pool_rows() const noexcept { return std::max<std::uint32_t>(1, spec_.expert_pool) * 8; }

  /// The pool of one expert kind ("ffn_gate_exps.weight", …) in one type and
  /// shape; `single`: one entry of ne1 rows (a quantised dense matrix's rows).
  const pool_t& pool_for(const std::string& name, ggml_type type, std::int64_t ne0, std::int64_t ne1,
                         bool single = false) {
    const std::size_t dot = name.find('.', name.find('.') + 1);  // after "blk.N."
    const std::string kind = name.compare(0, 4, "blk.") == 0 && dot != std::string::npos ? name.substr(dot + 1) : name;
    const std::string key = kind + "/" + ggml_type_name(type) + "/" + std::to_string(ne0) + "x" + std::to_string(ne1);
    auto it = pools_.find(key);
    if (it != pools_.end()) return it->second;
    float mean = 0, stddev = 1;
    init_scale(kind, false, ne0, spec_, mean, stddev);
    const std::uint32_t n = single ? 1 : std::max<std::uint32_t>(1, std::min(spec_.expert_pool, spec_.n_expert));
    pool_t pool(n);
    std::vector<float> f(static_cast<std::size_t>(ne0 * ne1));
    for (std::uint32_t p = 0; p < n; ++p) {
      std::mt19937_64 gen(spec_.seed ^ fnv1a(kind.c_str()) ^ splitmix64(p + 1));
      std::normal_distribution<float> dist(mean, stddev);
      for (auto& v : f) v = dist(gen);
      convert_rows(type, f.data(), ne1, ne0, pool[p]);
    }
    return pools_.emplace(key, std::move(pool)).first->second;
  }

  random_model_spec spec_;
  std::map<std::string, pool_t> pools_;
  std::vector<std::uint8_t> buf_;
};

inline void fill_tensor(ggml_tensor* t, void* user) {
  auto& src = *static_cast<weight_source*>(user);
  std::size_t offset = 0;
  src.generate(t->name, t->type, t->ne, ggml_n_dims(t), [&](const void* p, std::size_t n) {
    ggml_backend_tensor_set(t, p, offset, n);
    offset += n;
  });
}

struct gguf_deleter {
  void operator()(gguf_context* g) const noexcept { gguf_free(g); }
};

}  // namespace detail

namespace detail {

using gguf_ptr = std::unique_ptr<gguf_context, gguf_deleter>;

inline void validate(const random_model_spec& spec) {
  const std::string& a = spec.arch;
  if (a != "qwen3moe" && a != "deepseek2" && a != "gpt-oss" && a != "qwen3")
    throw std::invalid_argument("random model: architecture '" + a +
                                "'; expected qwen3moe, deepseek2, gpt-oss or qwen3 (dense)");
  if (spec.n_layer < 2) throw std::invalid_argument("random model: --layers must be >= 2");
  if (spec.n_expert_used < 1 || spec.n_expert_used > spec.n_expert)
    throw std::invalid_argument("random model: --k " + std::to_string(spec.n_expert_used) + " out of range [1, " +
                                std::to_string(spec.n_expert) + "]");
  if (a == "deepseek2" && (spec.n_expert % 8 != 0 || spec.n_expert / 8 < 2))
    throw std::invalid_argument("random model: deepseek2 uses 8 expert groups; --experts " +
                                std::to_string(spec.n_expert) + " must be a multiple of 8, >= 16");
  if (spec.n_embd % 64 != 0)
    throw std::invalid_argument("random model: --embd " + std::to_string(spec.n_embd) + " must be a multiple of 64");

  if (spec.head_dim == 0 || spec.n_head_kv == 0 || (spec.n_head != 0 && spec.n_head % spec.n_head_kv != 0))
    throw std::invalid_argument("random model: heads " + std::to_string(spec.n_head) + "/" +
                                std::to_string(spec.n_head_kv) + " of width " + std::to_string(spec.head_dim) +
                                "; expected a head width > 0 and query heads a multiple of the key/value heads");
  if (spec.dense_type != GGML_TYPE_F32 && a != "deepseek2") {
    const std::int64_t blck = ggml_blck_size(spec.dense_type);
    const std::uint32_t q_width = (spec.n_head != 0 ? spec.n_head : spec.n_embd / 64) * spec.head_dim;
    for (auto [what, v] : {std::pair<const char*, std::uint32_t>{"--embd", spec.n_embd},
                           std::pair<const char*, std::uint32_t>{"heads x head width", q_width}})
      if (v % blck != 0)
        throw std::invalid_argument(std::string("random model: ") + what + " " + std::to_string(v) +
                                    " must be a multiple of " + std::to_string(blck) + " for " +
                                    ggml_type_name(spec.dense_type) + " dense weights (its block size)");
  } else if (spec.dense_type != GGML_TYPE_F32) {
    throw std::invalid_argument("random model: a quantised dense type is for qwen3moe and gpt-oss, not " + a);
  }
  if (!spec.layer_expert_types.empty() && spec.layer_expert_types.size() != spec.n_layer)
    throw std::invalid_argument("random model: " + std::to_string(spec.layer_expert_types.size()) +
                                " per-layer expert types for " + std::to_string(spec.n_layer) +
                                " layers; expected one type, or one per layer");
  std::vector<ggml_type> types = spec.layer_expert_types;
  types.push_back(spec.expert_type);
  for (ggml_type t : types) {
    if (t == GGML_TYPE_F32) continue;
    const std::int64_t blck = ggml_blck_size(t);
    for (auto [what, v] : {std::pair<const char*, std::uint32_t>{"--embd", spec.n_embd},
                           std::pair<const char*, std::uint32_t>{"--expert-ff", spec.n_ff_exp}})
      if (v % blck != 0)
        throw std::invalid_argument(std::string("random model: ") + what + " " + std::to_string(v) +
                                    " must be a multiple of " + std::to_string(blck) + " for " + ggml_type_name(t) +
                                    " experts (its block size)");
  }
}

/// The type of layer `il`'s expert weights.
inline ggml_type expert_type_of(const random_model_spec& spec, std::uint32_t il) {
  return spec.layer_expert_types.empty() ? spec.expert_type : spec.layer_expert_types[il];
}

/// The model's GGUF key/values; with `type_entries`, also the tensor entries
/// that give llama_model_init_from_user each non-f32 tensor's type.
inline gguf_ptr metadata(const random_model_spec& spec, bool type_entries) {
  const std::string& a = spec.arch;
  std::unique_ptr<gguf_context, detail::gguf_deleter> g(gguf_init_empty());
  auto key = [&](const char* suffix) { return a + "." + suffix; };
  auto u32 = [&](const char* suffix, std::uint32_t v) { gguf_set_val_u32(g.get(), key(suffix).c_str(), v); };
  auto f32 = [&](const char* suffix, float v) { gguf_set_val_f32(g.get(), key(suffix).c_str(), v); };

  gguf_set_val_str(g.get(), "general.architecture", a.c_str());
  gguf_set_val_str(g.get(), "general.name", ("random-" + a).c_str());
  if (spec.text_vocab) {
    if (spec.n_vocab < 512)
      throw std::invalid_argument("random model: a text vocabulary of " + std::to_string(spec.n_vocab) +
                                  " tokens; expected at least 512 (3 special, 256 bytes, pieces)");
    std::vector<std::string> text;
    std::vector<float> scores;
    std::vector<std::int32_t> types;
    auto add = [&](std::string t, std::int32_t type) {
      text.push_back(std::move(t));
      scores.push_back(-static_cast<float>(text.size()));
      types.push_back(type);
    };
    add("<unk>", 2);  // llama_token_type: 1 normal, 2 unknown, 3 control, 6 byte
    add("<s>", 3);
    add("</s>", 3);
    for (int b = 0; b < 256; ++b) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "<0x%02X>", b);
      add(hex, 6);
    }
    // Pieces: "▁" and the letters, then "▁" + one or two letters, until full.
    const std::string sp = "\xe2\x96\x81";
    add(sp, 1);
    for (char c = 'a'; c <= 'z'; ++c) add(std::string(1, c), 1);
    for (int i = 0; text.size() < spec.n_vocab; ++i) {
      std::string w = sp + static_cast<char>('a' + i % 26);
      if (i >= 26) w += static_cast<char>('a' + (i / 26 - 1) % 26);
      if (i >= 26 * 27) w += std::to_string(i);
      add(w, 1);
    }
    std::vector<const char*> ptrs;
    for (const auto& t : text) ptrs.push_back(t.c_str());
    gguf_set_val_str(g.get(), "tokenizer.ggml.model", "llama");
    gguf_set_arr_str(g.get(), "tokenizer.ggml.tokens", ptrs.data(), ptrs.size());
    gguf_set_arr_data(g.get(), "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores.data(), scores.size());
    gguf_set_arr_data(g.get(), "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types.data(), types.size());
    gguf_set_val_u32(g.get(), "tokenizer.ggml.unknown_token_id", 0);
    gguf_set_val_u32(g.get(), "tokenizer.ggml.bos_token_id", 1);
    gguf_set_val_u32(g.get(), "tokenizer.ggml.eos_token_id", 2);
  } else {
    gguf_set_val_str(g.get(), "tokenizer.ggml.model", "no_vocab");
  }
  u32("vocab_size", spec.n_vocab);
  u32("context_length", spec.n_ctx_train);
  u32("embedding_length", spec.n_embd);
  u32("block_count", spec.n_layer);
  u32("feed_forward_length", 2 * spec.n_embd);
  if (a != "qwen3") {  // qwen3: dense, no experts
    u32("expert_feed_forward_length", spec.n_ff_exp);
    u32("expert_count", spec.n_expert);
    u32("expert_used_count", spec.n_expert_used);
  }
  f32("attention.layer_norm_rms_epsilon", 1e-6f);
  f32("rope.freq_base", 10000.0f);

  const std::uint32_t n_head = spec.n_head != 0 ? spec.n_head : spec.n_embd / 64;
  if (a == "qwen3moe" || a == "qwen3") {
    u32("attention.head_count", n_head);
    u32("attention.head_count_kv", spec.n_head_kv);
    u32("attention.key_length", spec.head_dim);
    u32("attention.value_length", spec.head_dim);
  } else if (a == "gpt-oss") {
    u32("attention.head_count", n_head);
    u32("attention.head_count_kv", spec.n_head_kv);
    u32("attention.key_length", spec.head_dim);
    u32("attention.value_length", spec.head_dim);
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

  if (!type_entries) return g;
  // A tensor entry with only a name and a type makes llama.cpp create that
  // tensor with that type (F32 otherwise). Collected by name first, so that
  // spec.tensor_types overrides a rule's type instead of adding a second entry.
  std::map<std::string, ggml_type> entries;
  auto entry = [&](ggml_type type, const char* fmt, std::uint32_t il) {
    char name[GGML_MAX_NAME];
    std::snprintf(name, sizeof name, fmt, il);
    entries[name] = type;
  };
  if (spec.dense_type != GGML_TYPE_F32) {
    entry(spec.dense_type, "token_embd.weight", 0);
    entry(spec.dense_type, "output.weight", 0);
  }
  for (std::uint32_t il = 0; il < spec.n_layer; ++il) {
    if (spec.dense_type != GGML_TYPE_F32)
      for (const char* fmt :
           {"blk.%u.attn_q.weight", "blk.%u.attn_k.weight", "blk.%u.attn_v.weight", "blk.%u.attn_output.weight"})
        entry(spec.dense_type, fmt, il);
    if (spec.router_type != GGML_TYPE_F32) entry(spec.router_type, "blk.%u.ffn_gate_inp.weight", il);
    const ggml_type et = expert_type_of(spec, il);
    if (et != GGML_TYPE_F32 && !(a == "deepseek2" && il == 0)) {
      entry(et, "blk.%u.ffn_gate_exps.weight", il);
      entry(et, "blk.%u.ffn_up_exps.weight", il);
      entry(et, "blk.%u.ffn_down_exps.weight", il);
      // Where the architecture fuses gate and up (deepseek2 here), llama.cpp
      // creates this one instead; an entry for a tensor not created is ignored.
      entry(et, "blk.%u.ffn_gate_up_exps.weight", il);
    }
  }
  for (const auto& [name, type] : spec.tensor_types) entries[name] = type;
  for (const auto& [name, type] : entries) {
    if (type == GGML_TYPE_F32) continue;
    ggml_tensor t;
    std::memset(&t, 0, sizeof t);
    t.type = type;
    std::snprintf(t.name, sizeof t.name, "%s", name.c_str());
    gguf_add_tensor(g.get(), &t);
  }
  return g;
}

}  // namespace detail

/// Builds the model in memory. Throws std::invalid_argument on a spec llama.cpp
/// would reject, std::runtime_error when llama.cpp fails to build it.
/// The CPU backend must be loaded (llama_backend_init / ggml_backend_load_all).
inline model_ptr make_random_model(const random_model_spec& spec,
                                   llama_model_params params = llama_model_default_params()) {
  detail::validate(spec);
  detail::gguf_ptr g = detail::metadata(spec, true);
  detail::weight_source src(spec);
  params.progress_callback = [](float, void*) { return true; };
  params.progress_callback_user_data = nullptr;
  model_ptr m(llama_model_init_from_user(g.get(), detail::fill_tensor, &src, params));
  if (!m) throw std::runtime_error("random model: llama_model_init_from_user failed for " + spec.arch);
  return m;
}

/// One tensor of a random model: name, type and shape, as llama.cpp creates it.
struct tensor_entry {
  std::string name;
  ggml_type type = GGML_TYPE_F32;
  int n_dims = 1;
  std::int64_t ne[GGML_MAX_DIMS] = {1, 1, 1, 1};
};

/// The tensors llama.cpp creates for `spec`, in layer order. Taken from
/// llama.cpp itself rather than written out per architecture: a two-layer
/// model of the same spec is built with a callback that records each tensor
/// and fills nothing (its buffers are never touched, so never resident), and
/// its last layer stands for every later one (layers of these architectures
/// differ only in their index and, with layer_expert_types, their experts' type;
/// deepseek2's dense layer 0 is kept as layer 0).
inline std::vector<tensor_entry> random_model_tensors(const random_model_spec& spec) {
  detail::validate(spec);
  random_model_spec two = spec;
  two.n_layer = 2;
  two.layer_expert_types.clear();  // set per layer below
  two.tensor_types.clear();        // likewise
  detail::gguf_ptr g = detail::metadata(two, true);
  std::vector<tensor_entry> seen;
  llama_model_params params = llama_model_default_params();
  params.progress_callback = [](float, void*) { return true; };
  params.progress_callback_user_data = nullptr;
  model_ptr m(llama_model_init_from_user(
      g.get(),
      [](ggml_tensor* t, void* user) {
        auto& seen = *static_cast<std::vector<tensor_entry>*>(user);
        for (const auto& s : seen)
          if (s.name == t->name) return;  // a tensor llama.cpp uses twice (tied output)
        tensor_entry e;
        e.name = t->name;
        e.type = t->type;
        e.n_dims = ggml_n_dims(t);
        for (int i = 0; i < GGML_MAX_DIMS; ++i) e.ne[i] = t->ne[i];
        seen.push_back(std::move(e));
      },
      &seen, params));
  if (!m) throw std::runtime_error("random model: llama_model_init_from_user failed for " + spec.arch);
  m.reset();

  auto layer_of = [](const std::string& name) -> int {
    if (name.compare(0, 4, "blk.") != 0) return -1;
    return std::atoi(name.c_str() + 4);
  };
  std::vector<tensor_entry> out;
  for (const auto& e : seen)
    if (layer_of(e.name) < 0 && e.name.find("output") == std::string::npos) out.push_back(e);
  for (std::uint32_t il = 0; il < spec.n_layer; ++il) {
    const int from = il == 0 ? 0 : 1;
    const std::string from_prefix = "blk." + std::to_string(from) + ".";
    const std::string to_prefix = "blk." + std::to_string(il) + ".";
    for (const auto& e : seen)
      if (layer_of(e.name) == from) {
        tensor_entry c = e;
        c.name = to_prefix + e.name.substr(from_prefix.size());
        if (detail::is_expert_weight(c.name)) c.type = detail::expert_type_of(spec, il);
        out.push_back(std::move(c));
      }
  }
  for (const auto& e : seen)
    if (layer_of(e.name) < 0 && e.name.find("output") != std::string::npos) out.push_back(e);
  for (auto& e : out) {
    const auto it = spec.tensor_types.find(e.name);
    if (it != spec.tensor_types.end()) e.type = it->second;
    if (e.ne[0] % ggml_blck_size(e.type) != 0)
      throw std::invalid_argument("random model: tensor " + e.name + " has rows of " + std::to_string(e.ne[0]) + "; " +
                                  ggml_type_name(e.type) + " needs a multiple of " +
                                  std::to_string(ggml_blck_size(e.type)) + " (its block size)");
  }
  return out;
}

/// The bytes of each layer's non-expert tensors in the file save_random_gguf(spec)
/// writes (what gguf_dense_bytes reads of it), from the tensor list alone: a
/// route trace's dense_bytes for a model built in memory.
inline std::vector<std::uint64_t> random_model_dense_bytes(const random_model_spec& spec) {
  std::vector<std::uint64_t> out(spec.n_layer, 0);
  for (const tensor_entry& e : random_model_tensors(spec)) {
    if (e.name.compare(0, 4, "blk.") != 0 || detail::is_expert_weight(e.name)) continue;
    const long il = std::strtol(e.name.c_str() + 4, nullptr, 10);
    if (il < 0 || static_cast<std::uint64_t>(il) >= spec.n_layer) continue;
    std::uint64_t rows = 1;
    for (int i = 1; i < GGML_MAX_DIMS; ++i) rows *= static_cast<std::uint64_t>(e.ne[i]);
    out[static_cast<std::size_t>(il)] += ggml_row_size(e.type, e.ne[0]) * rows;
  }
  return out;
}

/// Writes the random model of `spec` to `path` as a GGUF file, streaming:
/// the metadata first, then each tensor's bytes as they are generated, so at
/// most one expert slice (or one small dense tensor) and the quantised expert
/// pools are in memory at a time. The weights are those of
/// make_random_model(spec), byte for byte. Writes `path`.part and renames it
/// when complete, so an interrupted run never leaves a truncated model.
/// `progress`, if given, is called with (bytes written, total bytes).
///
/// `splits` > 1: the same model as that many files, as llama.cpp's
/// gguf-split writes them: `path` must end in "-00001-of-0000N.gguf" (N =
/// splits; detail::split_path names the others); the tensors, in the same
/// order, cut into runs of about equal bytes; the first file holds every
/// metadata key, each file split.no, split.count and split.tensors.count.
inline void save_random_gguf(const random_model_spec& spec, const std::string& path,
                             const std::function<void(std::uint64_t, std::uint64_t)>& progress = {}, int splits = 1) {
  const std::vector<tensor_entry> tensors = random_model_tensors(spec);
  if (splits < 1 || static_cast<std::size_t>(splits) > tensors.size() || splits > 99999)
    throw std::invalid_argument("random model: " + std::to_string(splits) + " splits; expected 1 to " +
                                std::to_string(std::min<std::size_t>(tensors.size(), 99999)) +
                                " (one tensor a split at least)");
  const std::string first_tail = moe_residency::llama_cpp::detail::split_path("", 0, splits);
  if (splits > 1 && (path.size() <= first_tail.size() ||
                     path.compare(path.size() - first_tail.size(), first_tail.size(), first_tail) != 0))
    throw std::invalid_argument("random model: '" + path + "' for " + std::to_string(splits) +
                                " splits; expected a name ending in '" + first_tail + "' (llama.cpp's split names)");
  const std::string prefix = splits > 1 ? path.substr(0, path.size() - first_tail.size()) : path;
  ggml_init_params ip{};
  ip.mem_size = (tensors.size() + 1) * ggml_tensor_overhead();
  ip.mem_buffer = nullptr;
  ip.no_alloc = true;
  std::unique_ptr<ggml_context, void (*)(ggml_context*)> ctx(ggml_init(ip), ggml_free);
  if (!ctx) throw std::runtime_error("random model: ggml_init failed");
  std::vector<ggml_tensor*> made;
  std::uint64_t total = 0;
  for (const auto& e : tensors) {
    ggml_tensor* t = ggml_new_tensor(ctx.get(), e.type, e.n_dims, e.ne);
    ggml_set_name(t, e.name.c_str());
    made.push_back(t);
    total += ggml_nbytes(t);
  }
  // Split i holds tensors [cut[i], cut[i+1]): runs of about total / splits bytes.
  std::vector<std::size_t> cut{0};
  {
    std::uint64_t acc = 0;
    for (std::size_t i = 0; i < tensors.size() && cut.size() < static_cast<std::size_t>(splits); ++i) {
      acc += ggml_nbytes(made[i]);
      const std::size_t left_tensors = tensors.size() - (i + 1),
                        left_splits = static_cast<std::size_t>(splits) - cut.size();
      if (acc * static_cast<std::uint64_t>(splits) >= total * cut.size() || left_tensors == left_splits)
        cut.push_back(i + 1);
    }
    cut.push_back(tensors.size());
  }
  std::uint64_t written = 0;
  detail::weight_source src(spec);
  for (int sp = 0; sp < splits; ++sp) {
    const std::string file = splits > 1 ? moe_residency::llama_cpp::detail::split_path(prefix, sp, splits) : path;
    detail::gguf_ptr g = sp == 0 ? detail::metadata(spec, false) : detail::gguf_ptr(gguf_init_empty());
    if (splits > 1) {
      gguf_set_val_u16(g.get(), "split.no", static_cast<std::uint16_t>(sp));
      gguf_set_val_u16(g.get(), "split.count", static_cast<std::uint16_t>(splits));
      gguf_set_val_i32(g.get(), "split.tensors.count", static_cast<std::int32_t>(tensors.size()));
    }
    for (std::size_t i = cut[static_cast<std::size_t>(sp)]; i < cut[static_cast<std::size_t>(sp) + 1]; ++i)
      gguf_add_tensor(g.get(), made[i]);
    const std::string part = file + ".part";
    std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(part.c_str(), "wb"), std::fclose);
    if (!f) throw std::runtime_error("random model: cannot write '" + part + "': " + std::strerror(errno));
    auto fail = [&](const char* what) {
      f.reset();
      std::remove(part.c_str());
      throw std::runtime_error(std::string("random model: ") + what + " '" + part +
                               "' failed: " + std::strerror(errno));
    };
    if (!gguf_write_to_file_ptr(g.get(), f.get(), true)) fail("writing the metadata of");
    const long data_start = std::ftell(f.get());
    std::uint64_t pos = static_cast<std::uint64_t>(data_start);
    static const char zeros[64] = {};
    for (std::int64_t j = 0; j < gguf_get_n_tensors(g.get()); ++j) {
      const std::uint64_t at = static_cast<std::uint64_t>(data_start) + gguf_get_tensor_offset(g.get(), j);
      if (at < pos || at - pos > sizeof zeros) fail("laying out the tensors of");
      if (at > pos && std::fwrite(zeros, 1, at - pos, f.get()) != at - pos) fail("writing");
      pos = at;
      const auto& e = tensors[cut[static_cast<std::size_t>(sp)] + static_cast<std::size_t>(j)];
      std::uint64_t n = 0;
      src.generate(e.name, e.type, e.ne, e.n_dims, [&](const void* p, std::size_t bytes) {
        if (std::fwrite(p, 1, bytes, f.get()) != bytes) fail("writing");
        n += bytes;
      });
      if (n != gguf_get_tensor_size(g.get(), j)) fail("sizing a tensor of");
      pos += n;
      written += n;
      if (progress) progress(written, total);
    }
    if (std::fflush(f.get()) != 0) fail("flushing");
    f.reset();
    if (std::rename(part.c_str(), file.c_str()) != 0)
      throw std::runtime_error("random model: cannot rename '" + part + "' to '" + file + "': " + std::strerror(errno));
  }
}

}  // namespace moe_residency::llama_cpp::lab
