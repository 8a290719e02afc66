#pragma once
/// What the llama.cpp observer learns and reports: graph node names, the
/// structure of each MoE layer, the per-layer event a sink receives, and the
/// observer's counters. See observer.hpp and docs/llama-cpp.md.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"
#include "moe_residency/core.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/events.hpp"
#include "moe_residency/router.hpp"

namespace moe_residency::llama_cpp {

// ---------------------------------------------------------------------------
// Graph node names.

namespace detail {

/// The build_moe_ffn nodes the observer reads, by the name llama.cpp's `cb`
/// gives them ("ffn_moe_<stage>-<il>").
enum class moe_node : std::uint8_t {
  none,
  logits,
  logits_biased,
  probs,
  probs_biased,
  group_topk,
  probs_masked,
  argsort,
  topk,
  weights,
  weights_softmax,
  weights_norm,
  weights_scaled,
};

/// Parses "ffn_moe_<stage>-<il>" exactly (names with a suffix such as
/// " (reshaped)" are ggml's derived views and are not matched). noexcept.
inline moe_node parse_moe_node(const char* name, int& layer) noexcept {
  if (std::strncmp(name, "ffn_moe_", 8) != 0) return moe_node::none;
  const char* s = name + 8;
  const char* dash = std::strrchr(s, '-');
  if (dash == nullptr || dash[1] == '\0') return moe_node::none;
  int il = 0;
  for (const char* p = dash + 1; *p; ++p) {
    if (*p < '0' || *p > '9' || il > 1000000) return moe_node::none;
    il = il * 10 + (*p - '0');
  }
  const std::size_t n = static_cast<std::size_t>(dash - s);
  struct entry {
    const char* stage;
    moe_node node;
  };
  static constexpr entry table[] = {
      {"logits", moe_node::logits},
      {"logits_biased", moe_node::logits_biased},
      {"probs", moe_node::probs},
      {"probs_biased", moe_node::probs_biased},
      {"group_topk", moe_node::group_topk},
      {"probs_masked", moe_node::probs_masked},
      {"argsort", moe_node::argsort},
      {"topk", moe_node::topk},
      {"weights", moe_node::weights},
      {"weights_softmax", moe_node::weights_softmax},
      {"weights_norm", moe_node::weights_norm},
      {"weights_scaled", moe_node::weights_scaled},
  };
  for (const entry& e : table) {
    if (std::strlen(e.stage) == n && std::strncmp(s, e.stage, n) == 0) {
      layer = il;
      return e.node;
    }
  }
  return moe_node::none;
}

/// "blk.12.ffn_up_exps.weight" -> 12; -1 when the name has no "blk.N." prefix.
inline int parse_blk_layer(const char* name) noexcept {
  if (std::strncmp(name, "blk.", 4) != 0) return -1;
  int il = 0;
  const char* p = name + 4;
  if (*p < '0' || *p > '9') return -1;
  for (; *p >= '0' && *p <= '9'; ++p) {
    if (il > 1000000) return -1;
    il = il * 10 + (*p - '0');
  }
  return *p == '.' ? il : -1;
}

/// True when the tensor's bytes can be read through `data` on this thread.
inline bool host_readable(const ggml_tensor* t) noexcept {
  if (t == nullptr || t->data == nullptr) return false;
  const ggml_backend_buffer_t buf = t->view_src != nullptr ? t->view_src->buffer : t->buffer;
  return buf == nullptr || ggml_backend_buffer_is_host(buf);
}

inline bool to_element_type(ggml_type t, element_type& out) noexcept {
  switch (t) {
    case GGML_TYPE_F32: out = element_type::f32; return true;
    case GGML_TYPE_F16: out = element_type::f16; return true;
    case GGML_TYPE_BF16: out = element_type::bf16; return true;
    default: return false;
  }
}

/// A 1-D parameter tensor (a bias) as floats, whatever its type and buffer.
inline std::vector<float> read_vector(const ggml_tensor* t) {
  const std::size_t n = static_cast<std::size_t>(ggml_nelements(t));
  std::vector<unsigned char> raw(ggml_nbytes(t));
  ggml_backend_tensor_get(t, raw.data(), 0, raw.size());
  std::vector<float> out(n);
  if (t->type == GGML_TYPE_F32) {
    std::memcpy(out.data(), raw.data(), n * sizeof(float));
  } else {
    const ggml_type_traits* tr = ggml_get_type_traits(t->type);
    if (tr == nullptr || tr->to_float == nullptr)
      throw error(std::string("llama_cpp observer: tensor '") + t->name + "' has type " + ggml_type_name(t->type) +
                  "; expected a type convertible to f32");
    tr->to_float(raw.data(), out.data(), static_cast<std::int64_t>(n));
  }
  return out;
}

/// A GGUF metadata value as a string ("" when absent), whole: llama.cpp
/// returns the full length, so a value longer than the first buffer is read again.
inline std::string model_meta(const llama_model* m, const std::string& key) {
  std::string buf(256, '\0');
  int32_t n = llama_model_meta_val_str(m, key.c_str(), buf.data(), buf.size());
  if (n < 0) return std::string();
  if (static_cast<std::size_t>(n) >= buf.size()) {
    buf.assign(static_cast<std::size_t>(n) + 1, '\0');
    n = llama_model_meta_val_str(m, key.c_str(), buf.data(), buf.size());
    if (n < 0) return std::string();
  }
  buf.resize(static_cast<std::size_t>(n));
  return buf;
}

}  // namespace detail

// ---------------------------------------------------------------------------
// What the observer learns and reports.

/// One tensor of a layer's experts (found as src[0] of a MUL_MAT_ID): expert
/// e occupies bytes [e * bytes_per_expert, (e+1) * bytes_per_expert) of it.
struct expert_tensor {
  std::string name;
  const ggml_tensor* tensor = nullptr;
  std::uint64_t bytes_per_expert = 0;  ///< nb[2]
  std::size_t n_expert = 0;            ///< ne[2]
};

/// One MoE layer as the graph defines it. `spec` and `router` are what the
/// layer's routing is computed from; `experts` the weights its matmuls read.
struct layer_structure {
  bool moe = false;
  router_spec spec;
  matrix_view router;            ///< blk.il.ffn_gate_inp.weight, rows = experts
  bool router_readable = false;  ///< in host memory as f32/f16/bf16
  std::vector<expert_tensor> experts;
  std::uint64_t expert_bytes = 0;  ///< Σ bytes_per_expert: one expert of this layer
};

/// One MoE layer of one graph evaluation (a llama.cpp ubatch). Pointers are
/// valid only during observer_sink::on_layer_loaded. Token t (column t) has position
/// `first_position + t`.
struct layer_batch {
  layer_id layer{};
  run_phase phase = run_phase::decode;
  std::uint32_t first_position = 0;
  std::size_t n_tokens = 0;  ///< columns this layer saw
  /// True when the layer saw only the batch's output rows (llama.cpp's last
  /// layer of a prompt batch): the columns are then the last n_tokens tokens.
  bool outputs_only = false;
  const layer_structure* structure = nullptr;
  const float* gate_input = nullptr;  ///< n_embd floats per token (normalised, as the router sees it)
  std::size_t gate_input_stride = 0;  ///< floats between tokens
  const std::int32_t* ids = nullptr;  ///< k ids per token, rank order
  std::size_t ids_stride = 0;         ///< int32s between tokens (n_expert for llama.cpp)
  const float* weights = nullptr;     ///< k final weights per token
  std::size_t weight_slot_stride = 0, weight_token_stride = 0;  ///< floats
  std::size_t k = 0;

  const float* x(std::size_t t) const noexcept { return gate_input + t * gate_input_stride; }
  std::uint32_t position(std::size_t t) const noexcept { return first_position + static_cast<std::uint32_t>(t); }
  /// The engine's routing of token t (ids and weights in rank order).
  /// False (and `out` empty) when an id is out of range or k > 32.
  bool routing_of(std::size_t t, routing& out) const noexcept {
    out.clear();
    out.layer = layer;
    out.phase = phase;
    out.token = position(t);
    if (k > max_top_k) return false;
    const std::size_t n_expert = structure->spec.n_experts;
    for (std::size_t j = 0; j < k; ++j) {
      const std::int32_t id = ids[t * ids_stride + j];
      if (id < 0 || static_cast<std::size_t>(id) >= n_expert) {
        out.clear();
        return false;
      }
      out.push_back(expert_id(static_cast<std::uint16_t>(id)),
                    weights[t * weight_token_stride + j * weight_slot_stride]);
    }
    return true;
  }
};

/// Receives the observer's events (events.hpp) on the thread that calls
/// llama_decode. Exceptions are caught and counted by the observer, never
/// passed to ggml.
///
/// - `on_begin_batch`, at every graph (a llama.cpp ubatch), always delivered.
/// - `on_routed`, as soon as a MoE layer's routing is computed and before its
///   expert matmuls run (data asked at `ffn_moe_topk-il`: `ids` and
///   `gate_input` are set, `weights` is null), for sinks that act on the
///   experts about to be read. Only for layers whose structure is already
///   known (the first graph teaches the structure).
/// - `on_layer_loaded`, at the layer's first expert matmul, with the final
///   weights and the gate input (the session's `gate_input`, `routed` and
///   `layer_loaded` in one).
///
/// There is no `end_batch`: the next `on_begin_batch` implies it. Each event
/// the sink does not want costs nothing: the observer asks ggml only for the
/// data some sink wants (every asked node is one more graph split).
class observer_sink {
 public:
  virtual ~observer_sink() = default;
  virtual void on_begin_batch(const batch_info&) {}
  virtual void on_routed(const layer_batch&) {}
  virtual void on_layer_loaded(const layer_batch& b) = 0;
  /// True to receive event `e`: by default `begin_batch` and `layer_loaded`,
  /// not `routed`. (The observer delivers `begin_batch` whatever the answer.)
  virtual bool wants(engine_event e) const noexcept {
    return e == engine_event::begin_batch || e == engine_event::layer_loaded;
  }
};

/// Replaces the routing llama.cpp selected at a MoE layer's routing node
/// (`ffn_moe_topk-il`), before any node consumes it: the observer asks for
/// that node in every graph while one is installed (observer::force_routing)
/// and hands it the ids in place. forced_routing.hpp's `forced_routing`
/// (a recorded trace's routing) is the one this project has.
class routing_override {
 public:
  virtual ~routing_override() = default;
  /// Throws `error` when the model cannot take this override's routings
  /// (another MoE shape), naming both; called once, at installation.
  virtual void check_model(const llama_model* m, const std::string& arch) const = 0;
  /// A graph begins (every graph, in order, before its first routing node).
  virtual void begin_graph(const batch_info& b) noexcept = 0;
  /// Overwrites one routing node's ids in place: `n_tokens` rows of `k` ids,
  /// `stride` int32s apart, token t at position `first_position + t`. False:
  /// left untouched (counted by the override).
  virtual bool rewrite(std::size_t layer, std::uint32_t first_position, std::size_t n_tokens, std::int32_t* ids,
                       std::size_t stride, std::size_t k) noexcept = 0;
};

/// The event's record, where an observer_sink meets it (events.hpp).
using moe_residency::batch_info;

/// Counters (never reset except by observer::reset_stats).
struct observer_stats {
  std::uint64_t graphs = 0;          ///< graph evaluations seen (ubatches)
  std::uint64_t layer_batches = 0;   ///< on_layer_loaded events delivered
  std::uint64_t routing_events = 0;  ///< on_routed events delivered
  std::uint64_t data_calls = 0;      ///< non-ask callback calls for the observer
  std::uint64_t unreadable = 0;      ///< layers skipped: data not in host memory or unexpected layout
  std::uint64_t unsupported = 0;     ///< layers whose routing the spec cannot express (e.g. grovemoe)
  std::uint64_t exceptions = 0;      ///< exceptions caught (sink, spec derivation, allocation)
  std::uint64_t chained_calls = 0;   ///< calls forwarded to the user's own callback
  /// Callback calls refused because another thread was inside the observer
  /// (one context decoded from two threads at once); only forwarded to the
  /// chained callback. See observer::eval_callback.
  std::uint64_t concurrent_calls = 0;
  /// Layers whose graph-derived spec disagrees with a GGUF key that is present
  /// (expert_gating_func, expert_group_count, expert_group_used_count,
  /// expert_weights_scale, expert_count). The graph is what llama.cpp
  /// computes and wins; see observer::metadata_note().
  std::uint64_t metadata_mismatches = 0;
};
}  // namespace moe_residency::llama_cpp
