#pragma once
/// A random-weight model in a recorded trace's shape (`--shape-from TRACE`):
/// the trace's layers, experts and top-k, each layer's expert bytes exactly
/// the header's `expert_bytes` (one expert's tensors, as the engine counted
/// what a miss reads), each layer's dense bytes as near the header's
/// `dense_bytes` as the attention's types allow, for any `route_trace v1`
/// file, not only the shared ones.
///
/// How: a real quantised file mixes weight types by tensor and by layer
/// (Qwen3-30B-A3B Q4_K_M: q4_K experts, the down projection in q6_K on some
/// layers: 2 654 208 and 3 059 712 bytes). One expert is gate and up
/// (expert-ff rows of the embedding) and down (embedding rows of expert-ff),
/// so its bytes are 2 · ff · row(gate type, embd) + embd · row(down type, ff).
/// The embedding and expert width are the architecture's where a known model
/// has the trace's architecture and experts and its widths reproduce every
/// layer's bytes (`known_models()`); otherwise they are searched: the widths
/// whose product makes the most common layer's bytes with one type, then a
/// (gate = up, down) type pair for every other layer. The dense tensors'
/// types (attention q, k, v, output) are searched per layer against
/// `dense_bytes`, with llama.cpp's own tensor list for the architecture.
///
/// What it cannot match, said in `notes`: the vocabulary, embedding and
/// output (a trace does not record them; a known model's are used, else
/// 32000 tokens); the attention's widths for an unknown architecture (heads
/// of 128 over the embedding); dense bytes no type mix reaches; an
/// architecture the random writer does not build (then qwen3moe, whose
/// compute per expert byte is a SwiGLU FFN's like most MoE models');
/// layers a trace marks dense (only deepseek2's first layer can be); and the
/// weights' values, which are random: routing comes from the trace
/// (`--route-from`), never from the model.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "ggml.h"
#include "moe_residency/trace.hpp"
#include "random_model.hpp"

namespace moe_residency::llama_cpp::lab {

/// A released model whose widths a trace of its architecture and expert
/// count most likely has.
struct known_model {
  const char* name;
  const char* arch;
  std::uint32_t n_expert;
  std::uint32_t n_embd, n_ff_exp, n_head, n_head_kv, head_dim, n_vocab, n_ctx_train;
  ggml_type embd_type, output_type;  ///< as the common Q4_K_M file has them
};

inline const std::vector<known_model>& known_models() {
  static const std::vector<known_model> v = {
      {"Qwen3-30B-A3B", "qwen3moe", 128, 2048, 768, 32, 4, 128, 151936, 40960, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K},
      {"Qwen3-235B-A22B", "qwen3moe", 128, 4096, 1536, 64, 4, 128, 151936, 40960, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K},
      {"gpt-oss-120b", "gpt-oss", 128, 2880, 2880, 64, 8, 64, 201088, 131072, GGML_TYPE_Q8_0, GGML_TYPE_Q8_0},
      {"gpt-oss-20b", "gpt-oss", 32, 2880, 2880, 64, 8, 64, 201088, 131072, GGML_TYPE_Q8_0, GGML_TYPE_Q8_0},
  };
  return v;
}

/// A trace's shape as a random model: the spec, and what it does not match.
struct trace_shape {
  random_model_spec spec;
  std::string model;               ///< the known model whose widths it took, or "" (searched)
  std::vector<std::string> notes;  ///< what it cannot match, and why
};

namespace detail {

/// Bytes of `n` elements of type t in one row; 0 when n is not a whole number of its blocks.
inline std::uint64_t row_bytes(ggml_type t, std::uint64_t n) {
  const std::uint64_t b = static_cast<std::uint64_t>(ggml_blck_size(t));
  return n % b == 0 ? n / b * ggml_type_size(t) : 0;
}

/// One expert's bytes: gate and up (ff rows of embd, type g), down (embd rows of ff, type d); 0 if a block does not fit.
inline std::uint64_t expert_bytes_of(std::uint64_t embd, std::uint64_t ff, ggml_type g, ggml_type d) {
  const std::uint64_t gu = row_bytes(g, embd), dn = row_bytes(d, ff);
  return gu == 0 || dn == 0 ? 0 : 2 * ff * gu + embd * dn;
}

/// The (gate = up, down) types making `bytes` at these widths, preferring
/// the gate type `prefer`, then down = gate, then weight_types()' order.
inline bool types_for(std::uint64_t bytes, std::uint64_t embd, std::uint64_t ff, ggml_type prefer, ggml_type& g,
                      ggml_type& d) {
  int best = -1;
  const auto& types = weight_types();
  for (std::size_t i = 0; i < types.size(); ++i)
    for (std::size_t j = 0; j < types.size(); ++j) {
      if (expert_bytes_of(embd, ff, types[i], types[j]) != bytes) continue;
      const int score = (types[i] == prefer ? 4000 : 0) + (i == j ? 2000 : 0) - static_cast<int>(i * 20 + j);
      if (score > best) {
        best = score;
        g = types[i];
        d = types[j];
      }
    }
  return best >= 0;
}

/// Widths (embd, ff) whose every layer's bytes some type pair makes: one layer's bytes
/// (the most common first) made by one type throughout fixes embd x ff; among the
/// fits, the ratio ff/embd nearest 0.375 (a fine-grained MoE's, as Qwen3's 768/2048).
inline bool search_widths(const std::map<std::uint64_t, std::size_t>& counts, std::uint64_t& embd, std::uint64_t& ff,
                          ggml_type& primary) {
  std::vector<std::pair<std::size_t, std::uint64_t>> anchors;  // (count, bytes), most common first
  for (const auto& [v, n] : counts) anchors.emplace_back(n, v);
  std::stable_sort(anchors.begin(), anchors.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& anchor : anchors) {
    const std::uint64_t common = anchor.second;
    double best = 1e300;
    for (ggml_type t : weight_types()) {
      const std::uint64_t per = 3 * static_cast<std::uint64_t>(ggml_type_size(t)),
                          blck = static_cast<std::uint64_t>(ggml_blck_size(t));
      if ((common * blck) % per != 0) continue;
      const std::uint64_t product = common * blck / per;  // embd * ff
      for (std::uint64_t e = 256; e <= 32768 && e <= product; e += 64) {
        if (product % e != 0) continue;
        const std::uint64_t f = product / e;
        if (expert_bytes_of(e, f, t, t) != common) continue;
        bool all = true;
        for (const auto& kv : counts) {
          ggml_type g, d;
          all = all && types_for(kv.first, e, f, t, g, d);
        }
        if (!all) continue;
        const double score = std::abs(std::log(static_cast<double>(f) / static_cast<double>(e) / 0.375));
        if (score < best) {
          best = score;
          embd = e;
          ff = f;
          primary = t;
        }
      }
      if (best < 1e300) return true;  // the first type (in preference order) that fits decides
    }
  }
  return false;
}

}  // namespace detail

/// The architecture the random writer builds a trace of architecture `arch` as:
/// its own (qwen3moe, gpt-oss, deepseek2), else qwen3moe.
inline std::string random_arch_for(const std::string& arch) {
  return arch == "gpt-oss" || arch == "deepseek2" ? arch : "qwen3moe";
}

/// The random model of `h`'s shape. Throws std::invalid_argument when the
/// trace's layers cannot be built (dense layers the writer does not make),
/// or no widths and types make every layer's expert bytes.
inline trace_shape shape_from_trace(const trace_header& h) {
  trace_shape out;
  random_model_spec& s = out.spec;
  const std::string where = "--shape-from: a trace of " + std::to_string(h.n_layer) + " layers x " +
                            std::to_string(h.n_expert) + " experts, top-" + std::to_string(h.n_expert_used) + " (" +
                            h.arch + ")";
  if (h.n_layer < 2) throw std::invalid_argument(where + ": the random writer builds at least 2 layers");
  s.arch = random_arch_for(h.arch);
  if (s.arch != h.arch)
    out.notes.push_back("architecture " + h.arch +
                        " is built as qwen3moe (the random writer's MoE architectures are qwen3moe, gpt-oss and "
                        "deepseek2): a SwiGLU expert FFN and grouped-query attention");
  s.n_layer = static_cast<std::uint32_t>(h.n_layer);
  s.n_expert = static_cast<std::uint32_t>(h.n_expert);
  s.n_expert_used = static_cast<std::uint32_t>(h.n_expert_used);

  // MoE layers: qwen3moe and gpt-oss make every layer MoE, deepseek2 its first dense.
  std::string dense;
  for (std::size_t l = 0; l < h.n_layer; ++l)
    if (h.expert_bytes[l] == 0) dense += (dense.empty() ? "" : ",") + std::to_string(l);
  const std::string writable = s.arch == "deepseek2" ? "0" : "";
  if (dense != writable)
    throw std::invalid_argument(where + ": its dense layers are {" + dense + "} but a random " + s.arch +
                                " model's are {" + writable +
                                "}; expected every layer MoE (deepseek2: all but the "
                                "first)");

  std::map<std::uint64_t, std::size_t> counts;
  for (std::size_t l = 0; l < h.n_layer; ++l)
    if (h.expert_bytes[l] != 0) ++counts[h.expert_bytes[l]];

  // Widths: a known model's when they make every layer's bytes, else searched.
  std::uint64_t embd = 0, ff = 0;
  ggml_type primary = GGML_TYPE_Q4_K;
  const known_model* known = nullptr;
  for (const known_model& k : known_models()) {
    if (k.arch != h.arch || k.n_expert != h.n_expert) continue;
    bool all = true;
    ggml_type first = GGML_TYPE_COUNT;
    for (ggml_type t : weight_types())
      if (first == GGML_TYPE_COUNT && counts.count(detail::expert_bytes_of(k.n_embd, k.n_ff_exp, t, t))) first = t;
    for (const auto& kv : counts) {
      ggml_type g, d;
      all = all && detail::types_for(kv.first, k.n_embd, k.n_ff_exp, first, g, d);
    }
    if (all && first != GGML_TYPE_COUNT) {
      known = &k;
      embd = k.n_embd;
      ff = k.n_ff_exp;
      primary = first;
      break;
    }
  }
  if (known == nullptr && !detail::search_widths(counts, embd, ff, primary)) {
    std::string values;
    for (const auto& kv : counts) values += (values.empty() ? "" : ", ") + std::to_string(kv.first);
    throw std::invalid_argument(where +
                                ": no embedding and expert width with the random writer's weight types "
                                "make every layer's expert bytes (" +
                                values + ")");
  }
  s.n_embd = static_cast<std::uint32_t>(embd);
  s.n_ff_exp = static_cast<std::uint32_t>(ff);
  s.expert_type = primary;
  if (known != nullptr) {
    out.model = known->name;
    s.n_head = known->n_head;
    s.n_head_kv = known->n_head_kv;
    s.head_dim = known->head_dim;
    s.n_vocab = known->n_vocab;
    s.n_ctx_train = known->n_ctx_train;
    s.dense_type = known->embd_type;
    s.tensor_types["output.weight"] = known->output_type;
    out.notes.push_back(std::string("widths, attention heads, vocabulary, embedding and output are ") + known->name +
                        "'s (" + h.arch + " with " + std::to_string(h.n_expert) +
                        " experts): a trace does not record them");
  } else {
    s.head_dim = 128;
    s.n_head = std::max<std::uint32_t>(1, s.n_embd / 128);
    s.n_head_kv = std::max<std::uint32_t>(1, s.n_head / 8);
    while (s.n_head % s.n_head_kv != 0) --s.n_head_kv;
    s.n_vocab = 32000;
    s.n_ctx_train = 4096;
    s.dense_type = detail::row_bytes(GGML_TYPE_Q4_K, s.n_embd) != 0 ? GGML_TYPE_Q4_K : GGML_TYPE_Q8_0;
    out.notes.push_back("embedding " + std::to_string(embd) + " and expert width " + std::to_string(ff) +
                        " are searched (no known model of this architecture and expert count has widths that make "
                        "its bytes); attention " +
                        std::to_string(s.n_head) + "/" + std::to_string(s.n_head_kv) +
                        " heads of 128 and a 32000-token vocabulary are assumed: a trace does not record them");
  }
  if (s.arch == "deepseek2") s.dense_type = GGML_TYPE_F32;  // the writer quantises no deepseek2 dense weight

  // Each layer's expert types.
  for (std::size_t l = 0; l < h.n_layer; ++l) {
    if (h.expert_bytes[l] == 0) continue;
    ggml_type g = primary, d = primary;
    detail::types_for(h.expert_bytes[l], embd, ff, primary, g, d);  // found above for every value
    const std::string blk = "blk." + std::to_string(l) + ".";
    s.tensor_types[blk + "ffn_gate_exps.weight"] = g;
    s.tensor_types[blk + "ffn_up_exps.weight"] = g;
    s.tensor_types[blk + "ffn_down_exps.weight"] = d;
  }

  // Each layer's dense bytes: the attention's types searched against the header.
  bool any_dense = false;
  for (std::uint64_t b : h.dense_bytes) any_dense = any_dense || b != 0;
  if (!any_dense || s.arch == "deepseek2") {
    out.notes.push_back(any_dense ? "dense bytes: deepseek2's attention (MLA) is the writer's small one"
                                  : "dense bytes: the trace records none; the attention's types are the default");
    return out;
  }
  const std::vector<tensor_entry> tensors = random_model_tensors(s);
  const char* attn[] = {"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight"};
  std::vector<ggml_type> candidates;
  for (ggml_type t : weight_types())
    if (t != GGML_TYPE_F32 && t != GGML_TYPE_BF16) candidates.push_back(t);
  std::uint64_t off_layers = 0, worst_gap = 0, worst_target = 0;
  std::map<std::uint64_t, std::vector<ggml_type>> solved;  // per target value
  for (std::size_t l = 0; l < h.n_layer; ++l) {
    const std::uint64_t target = h.dense_bytes[l];
    if (target == 0) continue;
    const std::string blk = "blk." + std::to_string(l) + ".";
    std::uint64_t fixed = 0;
    std::vector<const tensor_entry*> att(4, nullptr);
    for (const tensor_entry& e : tensors) {
      if (e.name.compare(0, blk.size(), blk) != 0 || detail::is_expert_weight(e.name)) continue;
      const std::string tail = e.name.substr(blk.size());
      bool is_attn = false;
      for (int i = 0; i < 4; ++i)
        if (tail == attn[i]) {
          att[static_cast<std::size_t>(i)] = &e;
          is_attn = true;
        }
      if (!is_attn) {
        std::uint64_t n = 1;
        for (int i = 1; i < GGML_MAX_DIMS; ++i) n *= static_cast<std::uint64_t>(e.ne[i]);
        fixed += n * detail::row_bytes(e.type, static_cast<std::uint64_t>(e.ne[0]));
      }
    }
    if (std::find(att.begin(), att.end(), nullptr) != att.end()) continue;
    auto it = solved.find(target);
    if (it == solved.end()) {
      // The mix nearest the header's bytes; among mixes within 0.5% of them
      // (the random model also carries llama.cpp's optional bias and scale
      // tensors, which a real file may not), the most usual types
      // (weight_types()' order), so the attention's compute stays a real file's.
      const std::size_t n = candidates.size();
      auto bytes_of = [&](std::size_t i, std::vector<ggml_type>& pick) -> std::uint64_t {
        pick = {candidates[i % n], candidates[i / n % n], candidates[i / n / n % n], candidates[i / n / n / n]};
        std::uint64_t bytes = fixed;
        for (int k = 0; k < 4; ++k) {
          const std::uint64_t r = detail::row_bytes(
              pick[static_cast<std::size_t>(k)], static_cast<std::uint64_t>(att[static_cast<std::size_t>(k)]->ne[0]));
          if (r == 0) return UINT64_MAX;
          bytes += r * static_cast<std::uint64_t>(att[static_cast<std::size_t>(k)]->ne[1]);
        }
        return bytes;
      };
      std::uint64_t min_gap = UINT64_MAX;
      std::vector<ggml_type> pick;
      for (std::size_t i = 0; i < n * n * n * n; ++i) {
        const std::uint64_t b = bytes_of(i, pick);
        if (b != UINT64_MAX) min_gap = std::min(min_gap, b > target ? b - target : target - b);
      }
      const std::uint64_t allowed = std::max(min_gap, target / 200);
      std::vector<ggml_type> best(4, s.dense_type);
      std::uint64_t best_gap = UINT64_MAX;
      std::size_t best_rank = SIZE_MAX;
      for (std::size_t i = 0; i < n * n * n * n; ++i) {
        const std::uint64_t b = bytes_of(i, pick);
        if (b == UINT64_MAX) continue;
        const std::uint64_t gap = b > target ? b - target : target - b;
        if (gap > allowed) continue;
        const std::size_t rank = i % n + i / n % n + i / n / n % n + i / n / n / n;
        if (rank < best_rank || (rank == best_rank && gap < best_gap)) {
          best_rank = rank;
          best_gap = gap;
          best = pick;
        }
      }
      it = solved.emplace(target, best).first;
      if (best_gap != 0) {
        ++off_layers;
        if (best_gap > worst_gap) {
          worst_gap = best_gap;
          worst_target = target;
        }
      }
    } else {
      std::uint64_t bytes = fixed;
      for (int k = 0; k < 4; ++k)
        bytes += detail::row_bytes(it->second[static_cast<std::size_t>(k)],
                                   static_cast<std::uint64_t>(att[static_cast<std::size_t>(k)]->ne[0])) *
                 static_cast<std::uint64_t>(att[static_cast<std::size_t>(k)]->ne[1]);
      if (bytes != target) ++off_layers;
    }
    for (int k = 0; k < 4; ++k) s.tensor_types[blk + attn[k]] = it->second[static_cast<std::size_t>(k)];
  }
  if (off_layers != 0)
    out.notes.push_back("dense bytes: " + std::to_string(off_layers) + " layers off the header's, at most by " +
                        std::to_string(worst_gap) + " of " + std::to_string(worst_target) +
                        " bytes: the random model carries llama.cpp's optional bias and scale tensors, and no "
                        "usual mix of the attention's types makes up the rest exactly");
  return out;
}

}  // namespace moe_residency::llama_cpp::lab
