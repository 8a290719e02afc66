#pragma once
/// The rules the llama.cpp observer reproduces from llama.cpp's build_moe_ffn,
/// kept beside the nodes they are read from: what each ffn_moe_* node of one
/// MoE layer tells (graph_layer, note_node, note_probs), the router_spec those
/// nodes make (spec_of), and the GGUF keys that must agree with the graph
/// (metadata_problem), and the layouts it reads (router view, expert tensors,
/// routing and weights strides, the model's shape). The observer (observer.hpp) calls them from its ask
/// phase; they hold no state of their own.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/adapters/llama_cpp/structure.hpp"
#include "moe_residency/detail/format.hpp"
#include "moe_residency/detail/numbers.hpp"

namespace moe_residency::llama_cpp::detail {

/// Per graph evaluation, per layer: the nodes seen so far in the ask phase.
struct graph_layer {
  const ggml_tensor* logits = nullptr;
  const ggml_tensor* logit_bias = nullptr;
  const ggml_tensor* probs = nullptr;
  const ggml_tensor* selection_bias = nullptr;
  const ggml_tensor* group_topk = nullptr;
  const ggml_tensor* argsort_src = nullptr;
  const ggml_tensor* topk = nullptr;
  const ggml_tensor* weights = nullptr;
  const ggml_tensor* trigger = nullptr;
  bool weights_softmax = false, weights_norm = false, weights_scaled = false;
  bool gating_known = false, unsupported = false;
  gating_function gating = gating_function::softmax;
  float scale = 1.0f;
  bool emitted = false;
  bool routed = false;  // on_routed delivered (or skipped) for this graph
};

/// A node of layer g that only adds to what the layer's nodes say: the logit
/// and selection biases, the expert groups, the argsort's input, the weights
/// chain (softmax, norm, scale). A shape build_moe_ffn does not make marks the
/// layer unsupported.
inline void note_node(graph_layer& g, moe_node kind, const ggml_tensor* t) {
  switch (kind) {
    case moe_node::logits_biased:
      if (t->op == GGML_OP_ADD && t->src[0] == g.logits) g.logit_bias = t->src[1];
      break;
    case moe_node::probs_biased:
      if (t->op == GGML_OP_ADD && t->src[0] == g.probs) g.selection_bias = t->src[1];
      else g.unsupported = true;  // grovemoe: selection on a second sigmoid
      break;
    case moe_node::group_topk: g.group_topk = t; break;
    case moe_node::argsort: g.argsort_src = t->src[0]; break;
    case moe_node::weights: g.weights = t; break;
    case moe_node::weights_softmax:
      g.weights = t;
      g.weights_softmax = true;
      break;
    case moe_node::weights_norm:
      g.weights = t;
      g.weights_norm = true;
      break;
    case moe_node::weights_scaled:
      g.weights = t;
      if (t->op == GGML_OP_SCALE) {
        g.weights_scaled = true;
        std::memcpy(&g.scale, t->op_params, sizeof(float));
      } else {
        g.unsupported = true;
      }
      break;
    default: break;
  }
}

/// The gating a layer's ffn_moe_probs node (not the router matmul itself)
/// says: softmax, sigmoid, sqrt(softplus), or softmax-weight over logits + a
/// bias (gpt-oss); anything else marks the layer unsupported.
inline void note_probs(graph_layer& g, const ggml_tensor* t) {
  g.probs = t;
  g.gating_known = true;
  switch (t->op) {
    case GGML_OP_SOFT_MAX: g.gating = gating_function::softmax; break;
    case GGML_OP_UNARY:
      if (ggml_get_unary_op(t) == GGML_UNARY_OP_SIGMOID) g.gating = gating_function::sigmoid;
      else g.unsupported = true;
      break;
    case GGML_OP_SQRT: g.gating = gating_function::sqrt_softplus; break;
    case GGML_OP_ADD:
      // softmax-weight gating with a logit bias (gpt-oss): probs = logits + b.
      if (t->src[0] == g.logits) {
        g.gating = gating_function::softmax_weight;
        g.logit_bias = t->src[1];
      } else {
        g.unsupported = true;
      }
      break;
    default: g.unsupported = true; break;
  }
}

/// The layer's router_spec from the nodes one graph showed; false when they
/// disagree with one another (a weights softmax without softmax-weight gating,
/// or the reverse). Throws like router_spec::validate.
inline bool spec_of(const graph_layer& g, router_spec& spec) {
  spec.gating = g.gating;
  spec.n_experts = static_cast<std::size_t>(g.logits->ne[0]);
  spec.top_k = static_cast<std::size_t>(g.topk->ne[0]);
  if (g.logit_bias != nullptr) spec.logit_bias = read_vector(g.logit_bias);
  if (g.selection_bias != nullptr) spec.selection_bias = read_vector(g.selection_bias);
  if (g.group_topk != nullptr && g.group_topk->src[0] != nullptr) {
    spec.n_groups = static_cast<std::size_t>(g.group_topk->src[0]->ne[0]);
    spec.n_group_used = static_cast<std::size_t>(g.group_topk->ne[0]);
  }
  // llama4 ranks the raw logits while its weights come from the sigmoid.
  const ggml_tensor* raw = g.logit_bias != nullptr && g.gating != gating_function::softmax_weight ? nullptr : g.logits;
  spec.select_on_logits = g.gating != gating_function::softmax_weight && raw != nullptr && g.argsort_src == raw;
  spec.normalize_weights = g.weights_norm;
  spec.scale_weights = g.weights_scaled;
  spec.weight_scale = g.weights_scaled ? g.scale : 1.0f;
  if (g.weights_softmax != (g.gating == gating_function::softmax_weight)) return false;
  spec.validate();
  return true;
}

/// What the GGUF keys say that the graph does not, or "": only the keys the
/// graph reflects directly are compared (llama.cpp hard-codes some choices per
/// architecture: qwen3moe always normalises, gpt-oss always uses softmax_weight).
inline std::string metadata_problem(const llama_model* model, const std::string& arch, const router_spec& spec) {
  auto key = [&](const char* suffix) { return model_meta(model, arch + "." + suffix); };
  std::string problem;
  auto expect = [&](const char* what, const std::string& meta, const std::string& graph) {
    if (problem.empty() && !meta.empty() && meta != graph)
      problem = std::string(what) + " is " + meta + " in the GGUF but " + graph + " in the graph";
  };
  const char* code = "1";  // llama_expert_gating_func_type
  switch (spec.gating) {
    case gating_function::softmax: code = "1"; break;
    case gating_function::sigmoid: code = "2"; break;
    case gating_function::softmax_weight: code = "3"; break;
    case gating_function::sqrt_softplus: code = "4"; break;
  }
  const std::string g = key("expert_gating_func");
  if (!g.empty() && g != "0") expect("expert_gating_func", g, code);
  const std::string groups = key("expert_group_count");
  if (!groups.empty() && groups != "0" && groups != "1") {
    expect("expert_group_count", groups, std::to_string(spec.n_groups));
    expect("expert_group_used_count", key("expert_group_used_count"), std::to_string(spec.n_group_used));
  }
  expect("expert_count", key("expert_count"), std::to_string(spec.n_experts));
  const std::string scale = key("expert_weights_scale");
  if (!scale.empty() && spec.scale_weights) {
    double v = 0;
    if (!moe_residency::detail::real_problem(scale, moe_residency::detail::real_domain::any(), &v).empty() ||
        std::fabs(v - static_cast<double>(spec.weight_scale)) > 1e-6 * std::fabs(v))
      expect("expert_weights_scale", scale, moe_residency::detail::format_number(spec.weight_scale));
  }
  return problem;
}

/// A layer's router matrix as a view (router_readable: a host tensor of a
/// type the GEMV reads, one row per expert), from the router matmul's weight.
inline void set_router_view(const ggml_tensor* w, std::size_t n_experts, layer_structure& s) {
  s.router = matrix_view{};
  s.router_readable = false;
  element_type et{};
  if (w != nullptr && to_element_type(w->type, et) && host_readable(w)) {
    s.router.data = w->data;
    s.router.type = et;
    s.router.rows = static_cast<std::size_t>(w->ne[1]);
    s.router.cols = static_cast<std::size_t>(w->ne[0]);
    s.router.row_stride_bytes = static_cast<std::size_t>(w->nb[1]);
    s.router_readable = s.router.rows == n_experts;
  }
}

/// An expert matmul's weight added to its layer's expert tensors (once; a
/// tensor of fewer than three dimensions is not a stack of experts).
inline void add_expert_tensor(layer_structure& s, const ggml_tensor* w) {
  for (const expert_tensor& e : s.experts)
    if (e.tensor == w) return;
  if (ggml_n_dims(w) < 3) return;
  expert_tensor e;
  e.name = w->name;
  e.tensor = w;
  e.bytes_per_expert = static_cast<std::uint64_t>(w->nb[2]);
  e.n_expert = static_cast<std::size_t>(w->ne[2]);
  s.experts.push_back(std::move(e));
  s.expert_bytes = 0;
  for (const expert_tensor& x : s.experts) s.expert_bytes += x.bytes_per_expert;
}

/// The gate input x (f32, one column per token) and the ids (i32 [k, tokens])
/// laid out as build_moe_ffn makes them, in host memory.
inline bool routing_layout_ok(const ggml_tensor* x, const ggml_tensor* ids) noexcept {
  return x != nullptr && x->type == GGML_TYPE_F32 && ids->type == GGML_TYPE_I32 && x->ne[1] == ids->ne[1] &&
         x->nb[0] == sizeof(float) && ids->nb[0] == sizeof(std::int32_t) && x->nb[1] % sizeof(float) == 0 &&
         ids->nb[1] % sizeof(std::int32_t) == 0 && host_readable(x) && host_readable(ids);
}

/// The final weights' strides in b (b.k already set): [1, k, T] (get_rows or
/// scale output) or [k, T] (norm, softmax reshaped); false for another shape.
inline bool set_weights(const ggml_tensor* w, layer_batch& b) noexcept {
  b.weights = static_cast<const float*>(w->data);
  if (w->ne[0] == 1 && static_cast<std::size_t>(w->ne[1]) == b.k) {
    b.weight_slot_stride = w->nb[1] / sizeof(float);
    b.weight_token_stride = w->nb[2] / sizeof(float);
  } else if (static_cast<std::size_t>(w->ne[0]) == b.k) {
    b.weight_slot_stride = w->nb[0] / sizeof(float);
    b.weight_token_stride = w->nb[1] / sizeof(float);
  } else {
    return false;
  }
  return true;
}

/// The model as the cache sees it: every layer, MoE ones with their expert
/// bytes, top-k of the widest MoE layer.
inline model_shape shape_of(const std::string& arch, const std::vector<layer_structure>& layers) {
  std::vector<std::uint64_t> bytes(layers.size(), 0);
  std::vector<bool> moe(layers.size(), false);
  std::size_t n_expert = 0, k = 0;
  for (std::size_t l = 0; l < layers.size(); ++l) {
    if (!layers[l].moe) continue;
    moe[l] = true;
    bytes[l] = layers[l].expert_bytes;
    n_expert = std::max(n_expert, layers[l].spec.n_experts);
    k = std::max(k, layers[l].spec.top_k);
  }
  return model_shape(arch, n_expert, k, std::move(bytes), std::move(moe));
}

}  // namespace moe_residency::llama_cpp::detail
