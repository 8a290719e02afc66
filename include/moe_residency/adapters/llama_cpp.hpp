#pragma once
/// The llama.cpp adapter: observes an unmodified llama.cpp through its graph
/// eval callback (`cb_eval` in llama_context_params) and turns each MoE
/// layer's routing into library events; maps expert byte ranges in the GGUF
/// file; reads experts from it for a warm-up or a speculative read.
/// Not part of the umbrella header: it needs llama.h, ggml.h and gguf.h.
/// See docs/llama-cpp.md.
///
///   moe_residency::llama_cpp::observer obs(model);
///   llama_context_params cp = llama_context_default_params();
///   obs.install(cp);                       // chains any cb_eval already set
///   llama_context* ctx = llama_init_from_model(model, cp);
///   obs.set_sink(&my_sink);                // on_layer(layer_batch) per MoE layer
///
/// What the callback sees, per MoE layer il (every architecture built on
/// llama.cpp's build_moe_ffn): `ffn_moe_logits-il` (the router MUL_MAT: src[0]
/// the router weight, src[1] the gate input, one f32 column per token),
/// `ffn_moe_probs-il` (softmax, sigmoid, sqrt(softplus), or — softmax-weight
/// gating — the logits themselves or an ADD of the logit bias),
/// `ffn_moe_probs_biased-il` / `ffn_moe_group_topk-il` (DeepSeek-V3 selection
/// bias and expert groups), `ffn_moe_topk-il` (i32 [k, n_tokens], a view of
/// the argsort: row stride n_expert*4), the weights chain
/// (`ffn_moe_weights`, `_softmax`, `_norm`, `_scaled`), and the expert
/// matmuls, found by their op (MUL_MAT_ID, ids = the topk tensor) because
/// their names change when per-expert scales are present. The observer reads
/// the structure in the callback's ask phase (no data, no cost beyond a name
/// check) and asks for data once per MoE layer: at the layer's first expert
/// matmul, when the gate input, the ids and the final weights are all still
/// live. So it adds one graph split per MoE layer.

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"
#include "llama.h"
#include "moe_residency/cache/expert_cache.hpp"
#include "moe_residency/core.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/io.hpp"
#include "moe_residency/router.hpp"
#include "moe_residency/trace.hpp"

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#define MOE_RESIDENCY_LLAMA_CPP_POSIX 1
#else
#define MOE_RESIDENCY_LLAMA_CPP_POSIX 0
#endif

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
      throw error(std::string("llama_cpp observer: tensor '") + t->name + "' has type " +
                  ggml_type_name(t->type) + "; expected a type convertible to f32");
    tr->to_float(raw.data(), out.data(), static_cast<std::int64_t>(n));
  }
  return out;
}

inline std::string model_meta(const llama_model* m, const std::string& key) {
  char buf[256];
  const int32_t n = llama_model_meta_val_str(m, key.c_str(), buf, sizeof buf);
  return n < 0 ? std::string() : std::string(buf);
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
  matrix_view router;  ///< blk.il.ffn_gate_inp.weight, rows = experts
  bool router_readable = false;  ///< in host memory as f32/f16/bf16
  std::vector<expert_tensor> experts;
  std::uint64_t expert_bytes = 0;  ///< Σ bytes_per_expert: one expert of this layer
};

/// One MoE layer of one graph evaluation (a llama.cpp ubatch). Pointers are
/// valid only during observer_sink::on_layer. Token t (column t) has position
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
  std::uint32_t position(std::size_t t) const noexcept {
    return first_position + static_cast<std::uint32_t>(t);
  }
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

/// A graph evaluation (ubatch) begins: its phase, the position of its first
/// token and its token count.
struct batch_info {
  run_phase phase = run_phase::decode;
  std::uint32_t first_position = 0;
  std::size_t n_tokens = 0;
};

/// Receives the observer's events on the thread that calls llama_decode.
/// Exceptions are caught and counted by the observer, never passed to ggml.
class observer_sink {
 public:
  virtual ~observer_sink() = default;
  virtual void on_batch(const batch_info&) {}
  virtual void on_layer(const layer_batch& b) = 0;
};

/// Counters (never reset except by observer::reset_stats).
struct observer_stats {
  std::uint64_t graphs = 0;          ///< graph evaluations seen (ubatches)
  std::uint64_t layer_batches = 0;   ///< on_layer events delivered
  std::uint64_t data_calls = 0;      ///< non-ask callback calls for the observer
  std::uint64_t unreadable = 0;      ///< layers skipped: data not in host memory or unexpected layout
  std::uint64_t unsupported = 0;     ///< layers whose routing the spec cannot express (e.g. grovemoe)
  std::uint64_t exceptions = 0;      ///< exceptions caught (sink, spec derivation, allocation)
  std::uint64_t chained_calls = 0;   ///< calls forwarded to the user's own callback
  /// Layers whose graph-derived spec disagrees with a GGUF key that is present
  /// (expert_gating_func, expert_group_count, expert_group_used_count,
  /// expert_weights_scale, expert_count). The graph is what llama.cpp
  /// computes and wins; see observer::metadata_note().
  std::uint64_t metadata_mismatches = 0;
};

// ---------------------------------------------------------------------------
// The observer.

class observer {
 public:
  /// Reads the model's layer count and MoE metadata. The observer must
  /// outlive every context it is installed into.
  explicit observer(const llama_model* model) : model_(model) {
    if (model == nullptr) throw error("llama_cpp observer: model is null");
    n_layer_ = static_cast<std::size_t>(llama_model_n_layer(model));
    if (n_layer_ == 0 || n_layer_ > 65535)
      throw error("llama_cpp observer: model has " + std::to_string(n_layer_) +
                  " layers; expected [1, 65535]");
    arch_ = detail::model_meta(model, "general.architecture");
    name_ = detail::model_meta(model, "general.name");
    layers_.resize(n_layer_);
    graph_.resize(n_layer_);
    appeared_.assign(n_layer_, false);
    unsupported_.assign(n_layer_, false);
  }
  observer(const observer&) = delete;
  observer& operator=(const observer&) = delete;

  /// Installs the observer as `p.cb_eval`, keeping any callback already
  /// there: in the ask phase the node is requested when either wants it; in
  /// the data phase each is called for the nodes it asked for, and the user's
  /// answer is returned (the observer's own is always true). Call before
  /// llama_init_from_model. Throws `error` if installed twice.
  void install(llama_context_params& p) {
    if (p.cb_eval == &observer::eval_callback && p.cb_eval_user_data == this)
      throw error("llama_cpp observer: already installed in these context params");
    chained_ = p.cb_eval;
    chained_user_data_ = p.cb_eval_user_data;
    p.cb_eval = &observer::eval_callback;
    p.cb_eval_user_data = this;
  }

  /// Stops observing: the callback then only forwards to the chained one
  /// (llama.cpp offers no way to remove cb_eval from a live context).
  void detach() noexcept { attached_ = false; }
  void attach() noexcept { attached_ = true; }
  bool attached() const noexcept { return attached_; }

  /// Where events go (null: learn the structure only, ask for no data).
  void set_sink(observer_sink* s) noexcept { sink_ = s; }

  /// The next graph's first token has position `pos` (a new sequence: 0).
  /// The observer otherwise counts positions itself, ubatch after ubatch.
  void set_position(std::uint32_t pos) noexcept {
    next_position_ = pos;
    have_graph_ = false;
  }
  /// Forces the phase of the following graphs; by default a graph of more
  /// than one token is prefill and a single token is decode.
  void set_phase(run_phase p) noexcept {
    forced_phase_ = true;
    phase_ = p;
  }
  void clear_forced_phase() noexcept { forced_phase_ = false; }

  const llama_model* model() const noexcept { return model_; }
  const std::string& arch() const noexcept { return arch_; }
  const std::string& model_name() const noexcept { return name_; }
  std::size_t n_layer() const noexcept { return n_layer_; }
  /// True once a whole graph has been seen and every layer that routed in it
  /// has its structure (spec, router view, expert tensors) or was counted as
  /// unsupported. Query it between llama_decode calls.
  bool structure_known() const noexcept {
    if (n_structured_ == 0) return false;
    for (std::size_t l = 0; l < n_layer_; ++l)
      if (appeared_[l] && !layers_[l].moe && !unsupported_[l]) return false;
    return true;
  }
  const layer_structure& layer(layer_id l) const { return layers_.at(to_index(l)); }
  const std::vector<layer_structure>& layers() const noexcept { return layers_; }

  /// The model as the cache sees it: every layer, MoE ones with their expert
  /// bytes (Σ nb[2] of the layer's MUL_MAT_ID weights), top-k of the widest
  /// MoE layer. Throws `error` before the structure is known.
  model_shape shape() const {
    if (!structure_known())
      throw error("llama_cpp observer: the graph structure is not known yet; evaluate one batch first");
    std::vector<std::uint64_t> bytes(n_layer_, 0);
    std::vector<bool> moe(n_layer_, false);
    std::size_t n_expert = 0, k = 0;
    for (std::size_t l = 0; l < n_layer_; ++l) {
      if (!layers_[l].moe) continue;
      moe[l] = true;
      bytes[l] = layers_[l].expert_bytes;
      n_expert = std::max(n_expert, layers_[l].spec.n_experts);
      k = std::max(k, layers_[l].spec.top_k);
    }
    return model_shape(arch_, n_expert, k, std::move(bytes), std::move(moe));
  }

  const observer_stats& stats() const noexcept { return stats_; }
  /// The first disagreement between the graph and the GGUF metadata ("" if none).
  const std::string& metadata_note() const noexcept { return metadata_note_; }
  void reset_stats() noexcept { stats_ = observer_stats{}; }
  /// The last caught exception's message ("" if none).
  const char* last_error() const noexcept { return last_error_; }

  /// The cb_eval trampoline. noexcept: nothing crosses into ggml.
  static bool eval_callback(ggml_tensor* t, bool ask, void* user_data) noexcept {
    auto* self = static_cast<observer*>(user_data);
    return ask ? self->on_ask(t) : self->on_data(t);
  }

 private:
  // Per graph evaluation, per layer: the nodes seen so far in the ask phase.
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
  };

  bool on_ask(ggml_tensor* t) noexcept {
    bool mine = false;
    if (attached_) {
      try {
        mine = inspect(t);
      } catch (const std::exception& e) {
        note_exception(e.what());
      } catch (...) {
        note_exception("unknown exception");
      }
    }
    bool theirs = false;
    if (chained_ != nullptr) {
      ++stats_.chained_calls;
      theirs = chained_(t, true, chained_user_data_);
    }
    asked_node_ = t;
    asked_mine_ = mine;
    asked_theirs_ = theirs;
    return mine || theirs;
  }

  bool on_data(ggml_tensor* t) noexcept {
    const bool mine = asked_node_ == t ? asked_mine_ : false;
    const bool theirs = asked_node_ == t ? asked_theirs_ : chained_ != nullptr;
    if (mine) {
      ++stats_.data_calls;
      try {
        deliver(t);
      } catch (const std::exception& e) {
        note_exception(e.what());
      } catch (...) {
        note_exception("unknown exception");
      }
    }
    if (theirs && chained_ != nullptr) {
      ++stats_.chained_calls;
      return chained_(t, false, chained_user_data_);
    }
    return true;
  }

  void note_exception(const char* what) noexcept {
    ++stats_.exceptions;
    std::snprintf(last_error_, sizeof last_error_, "%s", what);
  }

  void begin_graph(std::size_t n_tokens) {
    if (have_graph_) next_position_ += static_cast<std::uint32_t>(graph_tokens_);
    have_graph_ = true;
    graph_tokens_ = n_tokens;
    graph_first_position_ = next_position_;
    if (!forced_phase_) phase_ = n_tokens > 1 ? run_phase::prefill : run_phase::decode;
    ++stats_.graphs;
    for (auto& g : graph_) g = graph_layer{};
    if (sink_ != nullptr) sink_->on_batch(batch_info{phase_, graph_first_position_, graph_tokens_});
  }

  // Ask phase: record the structure; true for the one node per MoE layer
  // whose data the observer wants.
  bool inspect(ggml_tensor* t) {
    if (t->op == GGML_OP_MUL_MAT_ID) return on_expert_matmul(t);
    if (t->name[0] != 'f') return false;
    int il = -1;
    const detail::moe_node kind = detail::parse_moe_node(t->name, il);
    if (kind == detail::moe_node::none || il < 0 || static_cast<std::size_t>(il) >= n_layer_)
      return false;
    const std::size_t l = static_cast<std::size_t>(il);
    graph_layer& g = graph_[l];
    switch (kind) {
      case detail::moe_node::logits:
        start_layer(l, t);
        break;
      case detail::moe_node::logits_biased:
        if (t->op == GGML_OP_ADD && t->src[0] == g.logits) g.logit_bias = t->src[1];
        break;
      case detail::moe_node::probs:
        on_probs(l, t);
        break;
      case detail::moe_node::probs_biased:
        if (t->op == GGML_OP_ADD && t->src[0] == g.probs)
          g.selection_bias = t->src[1];
        else
          g.unsupported = true;  // grovemoe: selection on a second sigmoid
        break;
      case detail::moe_node::group_topk:
        g.group_topk = t;
        break;
      case detail::moe_node::argsort:
        g.argsort_src = t->src[0];
        break;
      case detail::moe_node::topk:
        g.topk = t;
        break;
      case detail::moe_node::weights:
        g.weights = t;
        break;
      case detail::moe_node::weights_softmax:
        g.weights = t;
        g.weights_softmax = true;
        break;
      case detail::moe_node::weights_norm:
        g.weights = t;
        g.weights_norm = true;
        break;
      case detail::moe_node::weights_scaled:
        g.weights = t;
        if (t->op == GGML_OP_SCALE) {
          g.weights_scaled = true;
          std::memcpy(&g.scale, t->op_params, sizeof(float));
        } else {
          g.unsupported = true;
        }
        break;
      default:
        break;
    }
    return false;
  }

  void start_layer(std::size_t l, const ggml_tensor* logits) {
    if (logits->op != GGML_OP_MUL_MAT) return;
    const int il = static_cast<int>(l);
    if (!have_graph_ || il <= last_layer_in_graph_) begin_graph(static_cast<std::size_t>(logits->ne[1]));
    last_layer_in_graph_ = il;
    graph_layer& g = graph_[l];
    g = graph_layer{};
    g.logits = logits;
    appeared_[l] = true;
  }

  void on_probs(std::size_t l, const ggml_tensor* t) {
    graph_layer& g = graph_[l];
    if (t->op == GGML_OP_MUL_MAT) {
      // softmax-weight gating without a logit bias: the router matmul itself
      // carries the name ffn_moe_probs.
      start_layer(l, t);
      graph_[l].probs = t;
      graph_[l].gating = gating_function::softmax_weight;
      graph_[l].gating_known = true;
      return;
    }
    g.probs = t;
    g.gating_known = true;
    switch (t->op) {
      case GGML_OP_SOFT_MAX:
        g.gating = gating_function::softmax;
        break;
      case GGML_OP_UNARY:
        if (ggml_get_unary_op(t) == GGML_UNARY_OP_SIGMOID)
          g.gating = gating_function::sigmoid;
        else
          g.unsupported = true;
        break;
      case GGML_OP_SQRT:
        g.gating = gating_function::sqrt_softplus;
        break;
      case GGML_OP_ADD:
        // softmax-weight gating with a logit bias (gpt-oss): probs = logits + b.
        if (t->src[0] == g.logits) {
          g.gating = gating_function::softmax_weight;
          g.logit_bias = t->src[1];
        } else {
          g.unsupported = true;
        }
        break;
      default:
        g.unsupported = true;
        break;
    }
  }

  bool on_expert_matmul(const ggml_tensor* t) {
    const ggml_tensor* ids = t->src[2];
    if (ids == nullptr) return false;
    // The layer whose topk this matmul consumes; usually the last one started.
    std::size_t l = n_layer_;
    if (last_layer_in_graph_ >= 0 && graph_[static_cast<std::size_t>(last_layer_in_graph_)].topk == ids) {
      l = static_cast<std::size_t>(last_layer_in_graph_);
    } else {
      for (std::size_t i = 0; i < n_layer_; ++i)
        if (graph_[i].topk == ids) {
          l = i;
          break;
        }
    }
    if (l == n_layer_) return false;  // not a build_moe_ffn topk (e.g. a LoRA or a custom graph)
    record_expert_tensor(l, t->src[0]);
    graph_layer& g = graph_[l];
    if (g.trigger != nullptr || g.emitted) return false;
    g.trigger = t;
    ensure_structure(l);
    return sink_ != nullptr && layers_[l].moe;
  }

  void record_expert_tensor(std::size_t l, const ggml_tensor* w) {
    layer_structure& s = layers_[l];
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

  // The layer's router_spec, from the nodes this graph showed (once per layer:
  // the structure of a model's graph does not change between ubatches).
  void ensure_structure(std::size_t l) {
    layer_structure& s = layers_[l];
    if (s.moe) return;
    const graph_layer& g = graph_[l];
    if (g.logits == nullptr || g.topk == nullptr || g.weights == nullptr || !g.gating_known) return;
    if (g.unsupported) {
      if (!unsupported_[l]) ++stats_.unsupported;
      unsupported_[l] = true;
      return;
    }
    router_spec spec;
    spec.gating = g.gating;
    spec.n_experts = static_cast<std::size_t>(g.logits->ne[0]);
    spec.top_k = static_cast<std::size_t>(g.topk->ne[0]);
    if (g.logit_bias != nullptr) spec.logit_bias = detail::read_vector(g.logit_bias);
    if (g.selection_bias != nullptr) spec.selection_bias = detail::read_vector(g.selection_bias);
    if (g.group_topk != nullptr && g.group_topk->src[0] != nullptr) {
      spec.n_groups = static_cast<std::size_t>(g.group_topk->src[0]->ne[0]);
      spec.n_group_used = static_cast<std::size_t>(g.group_topk->ne[0]);
    }
    // llama4 ranks the raw logits while its weights come from the sigmoid.
    const ggml_tensor* raw = g.logit_bias != nullptr && g.gating != gating_function::softmax_weight
                                 ? nullptr
                                 : g.logits;
    spec.select_on_logits = g.gating != gating_function::softmax_weight && raw != nullptr &&
                            g.argsort_src == raw;
    spec.normalize_weights = g.weights_norm;
    spec.scale_weights = g.weights_scaled;
    spec.weight_scale = g.weights_scaled ? g.scale : 1.0f;
    if (g.weights_softmax != (g.gating == gating_function::softmax_weight)) {
      if (!unsupported_[l]) ++stats_.unsupported;
      unsupported_[l] = true;
      return;
    }
    spec.validate();

    const ggml_tensor* w = g.logits->src[0];
    s.router = matrix_view{};
    s.router_readable = false;
    element_type et{};
    if (w != nullptr && detail::to_element_type(w->type, et) && detail::host_readable(w)) {
      s.router.data = w->data;
      s.router.type = et;
      s.router.rows = static_cast<std::size_t>(w->ne[1]);
      s.router.cols = static_cast<std::size_t>(w->ne[0]);
      s.router.row_stride_bytes = static_cast<std::size_t>(w->nb[1]);
      s.router_readable = s.router.rows == spec.n_experts;
    }
    check_metadata(l, spec);
    s.spec = std::move(spec);
    s.moe = true;
    ++n_structured_;
  }

  // The GGUF keys, where present, must say what the graph does. llama.cpp
  // hard-codes some choices per architecture (qwen3moe always normalises,
  // gpt-oss always uses softmax_weight), so only keys that the graph
  // reflects directly are compared.
  void check_metadata(std::size_t l, const router_spec& spec) {
    auto key = [&](const char* suffix) { return detail::model_meta(model_, arch_ + "." + suffix); };
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
      const double v = std::strtod(scale.c_str(), nullptr);
      if (std::fabs(v - static_cast<double>(spec.weight_scale)) > 1e-6 * std::fabs(v))
        expect("expert_weights_scale", scale, moe_residency::detail::format_float(spec.weight_scale));
    }
    if (problem.empty()) return;
    ++stats_.metadata_mismatches;
    if (metadata_note_.empty()) metadata_note_ = "layer " + std::to_string(l) + ": " + problem;
  }

  // Data phase of a layer's first expert matmul.
  void deliver(const ggml_tensor* t) {
    std::size_t l = n_layer_;
    for (std::size_t i = 0; i < n_layer_; ++i)
      if (graph_[i].trigger == t) {
        l = i;
        break;
      }
    if (l == n_layer_ || sink_ == nullptr) return;
    graph_layer& g = graph_[l];
    g.emitted = true;
    const layer_structure& s = layers_[l];
    if (!s.moe) return;
    const ggml_tensor* x = g.logits->src[1];
    const ggml_tensor* ids = g.topk;
    const ggml_tensor* w = g.weights;
    const std::size_t n_tok = static_cast<std::size_t>(ids->ne[1]);
    const std::size_t k = static_cast<std::size_t>(ids->ne[0]);
    const bool ok = x != nullptr && x->type == GGML_TYPE_F32 && ids->type == GGML_TYPE_I32 &&
                    w->type == GGML_TYPE_F32 && static_cast<std::size_t>(x->ne[1]) == n_tok &&
                    x->nb[0] == sizeof(float) && ids->nb[0] == sizeof(std::int32_t) &&
                    x->nb[1] % sizeof(float) == 0 && ids->nb[1] % sizeof(std::int32_t) == 0 &&
                    detail::host_readable(x) && detail::host_readable(ids) &&
                    detail::host_readable(w) && n_tok <= graph_tokens_ && k == s.spec.top_k;
    if (!ok) {
      ++stats_.unreadable;
      return;
    }
    layer_batch b;
    b.layer = layer_id(static_cast<std::uint16_t>(l));
    b.phase = phase_;
    b.n_tokens = n_tok;
    b.outputs_only = n_tok < graph_tokens_;
    b.first_position = graph_first_position_ + static_cast<std::uint32_t>(graph_tokens_ - n_tok);
    b.structure = &s;
    b.gate_input = static_cast<const float*>(x->data);
    b.gate_input_stride = x->nb[1] / sizeof(float);
    b.ids = static_cast<const std::int32_t*>(ids->data);
    b.ids_stride = ids->nb[1] / sizeof(std::int32_t);
    b.weights = static_cast<const float*>(w->data);
    b.k = k;
    // [1, k, T] (get_rows / scale output) or [k, T] (norm, softmax reshaped)
    if (w->ne[0] == 1 && static_cast<std::size_t>(w->ne[1]) == k) {
      b.weight_slot_stride = w->nb[1] / sizeof(float);
      b.weight_token_stride = w->nb[2] / sizeof(float);
    } else if (static_cast<std::size_t>(w->ne[0]) == k) {
      b.weight_slot_stride = w->nb[0] / sizeof(float);
      b.weight_token_stride = w->nb[1] / sizeof(float);
    } else {
      ++stats_.unreadable;
      return;
    }
    ++stats_.layer_batches;
    sink_->on_layer(b);
  }

  const llama_model* model_;
  std::size_t n_layer_ = 0;
  std::string arch_, name_;
  std::vector<layer_structure> layers_;
  std::vector<graph_layer> graph_;
  std::vector<bool> appeared_, unsupported_;
  std::size_t n_structured_ = 0;

  ggml_backend_sched_eval_callback chained_ = nullptr;
  void* chained_user_data_ = nullptr;
  observer_sink* sink_ = nullptr;
  bool attached_ = true;

  const ggml_tensor* asked_node_ = nullptr;
  bool asked_mine_ = false, asked_theirs_ = false;

  bool have_graph_ = false;
  int last_layer_in_graph_ = -1;
  std::size_t graph_tokens_ = 0;
  std::uint32_t next_position_ = 0, graph_first_position_ = 0;
  bool forced_phase_ = false;
  run_phase phase_ = run_phase::prefill;

  observer_stats stats_;
  std::string metadata_note_;
  char last_error_[256] = {};
};

// ---------------------------------------------------------------------------
// Expert byte ranges in the GGUF file, and a read callback over them.

/// Where one expert tensor's experts lie in the file: expert e is the bytes
/// [offset + e * bytes_per_expert, offset + (e+1) * bytes_per_expert).
struct expert_file_range {
  std::string tensor;
  std::uint64_t offset = 0;  ///< gguf_get_data_offset + gguf_get_tensor_offset
  std::uint64_t bytes_per_expert = 0;
  std::size_t n_expert = 0;
};

/// The file ranges of every MoE layer's expert tensors.
class gguf_expert_map {
 public:
  gguf_expert_map() = default;

  /// Looks up, in the GGUF file at `path`, the expert tensors the observer
  /// found through MUL_MAT_ID. Throws `error` when the file cannot be parsed,
  /// a tensor is missing, or its size disagrees with the live tensor (a
  /// repacked or converted weight is not in the file's layout).
  gguf_expert_map(const std::string& path, const observer& obs) : path_(path) {
    auto ctx = open(path);
    layers_.resize(obs.n_layer());
    for (std::size_t l = 0; l < obs.n_layer(); ++l) {
      const layer_structure& s = obs.layers()[l];
      for (const expert_tensor& e : s.experts) {
        expert_file_range r = find(ctx.get(), path, e.name);
        if (r.bytes_per_expert != e.bytes_per_expert || r.n_expert != e.n_expert)
          throw error("gguf_expert_map: " + path + ": tensor '" + e.name + "' has " +
                      std::to_string(r.bytes_per_expert) + " bytes per expert in the file but " +
                      std::to_string(e.bytes_per_expert) +
                      " in memory; expected the same (repacked weights are not in the file layout)");
        layers_[l].push_back(std::move(r));
      }
    }
  }

  /// From the file alone: every 3-D tensor named "blk.N.*_exps.*". For tools
  /// that have no live graph; the observer's version is the reference.
  static gguf_expert_map by_name(const std::string& path) {
    gguf_expert_map m;
    m.path_ = path;
    auto ctx = open(path);
    const std::int64_t n = gguf_get_n_tensors(ctx.get());
    for (std::int64_t i = 0; i < n; ++i) {
      const char* name = gguf_get_tensor_name(ctx.get(), i);
      const int il = detail::parse_blk_layer(name);
      if (il < 0 || std::strstr(name, "_exps.") == nullptr) continue;
      const std::int64_t* ne = gguf_get_tensor_ne(ctx.get(), i);
      if (ne[2] < 2 || ne[3] != 1) continue;
      if (static_cast<std::size_t>(il) >= m.layers_.size()) m.layers_.resize(static_cast<std::size_t>(il) + 1);
      m.layers_[static_cast<std::size_t>(il)].push_back(find(ctx.get(), path, name));
    }
    return m;
  }

  const std::string& path() const noexcept { return path_; }
  std::size_t n_layer() const noexcept { return layers_.size(); }
  const std::vector<expert_file_range>& ranges(layer_id l) const { return layers_.at(to_index(l)); }
  /// Bytes of one expert of layer l in the file (0 for a dense layer).
  std::uint64_t expert_bytes(layer_id l) const {
    std::uint64_t b = 0;
    for (const auto& r : ranges(l)) b += r.bytes_per_expert;
    return b;
  }

 private:
  struct gguf_free_deleter {
    void operator()(gguf_context* c) const noexcept { gguf_free(c); }
  };
  using gguf_ptr = std::unique_ptr<gguf_context, gguf_free_deleter>;

  static gguf_ptr open(const std::string& path) {
    gguf_init_params p{};
    p.no_alloc = true;
    p.ctx = nullptr;
    gguf_ptr ctx(gguf_init_from_file(path.c_str(), p));
    if (!ctx) throw error("gguf_expert_map: " + path + ": not a readable GGUF file");
    return ctx;
  }

  static expert_file_range find(const gguf_context* ctx, const std::string& path,
                                const std::string& name) {
    const std::int64_t id = gguf_find_tensor(ctx, name.c_str());
    if (id < 0)
      throw error("gguf_expert_map: " + path + ": no tensor '" + name +
                  "'; expected the expert tensors the graph multiplies (split GGUFs are not supported)");
    const std::int64_t* ne = gguf_get_tensor_ne(ctx, id);
    const ggml_type type = gguf_get_tensor_type(ctx, id);
    expert_file_range r;
    r.tensor = name;
    r.offset = static_cast<std::uint64_t>(gguf_get_data_offset(ctx) + gguf_get_tensor_offset(ctx, id));
    r.bytes_per_expert = static_cast<std::uint64_t>(ggml_row_size(type, ne[0])) *
                         static_cast<std::uint64_t>(ne[1]);
    r.n_expert = static_cast<std::size_t>(ne[2]);
    return r;
  }

  std::string path_;
  std::vector<std::vector<expert_file_range>> layers_;
};

/// Makes one expert resident by reading its slices from the GGUF file:
/// `pread` into a buffer, or `fadvise` (POSIX_FADV_WILLNEED: the kernel reads
/// ahead into the page cache that llama.cpp's mmap then hits). `read` uses
/// the reader's own buffer (one reader per thread); `read_into` and
/// `callback()` are safe to call from several threads at once (pread on one
/// descriptor). Every read is noexcept and reports failure by its result.
class gguf_expert_reader {
 public:
  enum class mode : std::uint8_t { pread, fadvise };

  /// Opens the map's file. Throws `error` when it cannot be opened.
  explicit gguf_expert_reader(const gguf_expert_map& map, mode m = mode::pread) : map_(&map), mode_(m) {
#if MOE_RESIDENCY_LLAMA_CPP_POSIX
    fd_ = ::open(map.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0)
      throw error("gguf_expert_reader: " + map.path() + ": cannot open (" + std::strerror(errno) + ")");
#else
    throw error("gguf_expert_reader: needs POSIX pread");
#endif
    for (std::size_t l = 0; l < map.n_layer(); ++l)
      widest_ = std::max(widest_, map.expert_bytes(layer_id(static_cast<std::uint16_t>(l))));
    if (m == mode::pread) buffer_.resize(static_cast<std::size_t>(widest_));
  }
  ~gguf_expert_reader() {
#if MOE_RESIDENCY_LLAMA_CPP_POSIX
    if (fd_ >= 0) ::close(fd_);
#endif
  }
  gguf_expert_reader(const gguf_expert_reader&) = delete;
  gguf_expert_reader& operator=(const gguf_expert_reader&) = delete;

  /// Reads (or advises) every slice of expert e of layer l into the reader's
  /// buffer (see data()). False on an unknown layer or expert, an I/O error
  /// or a short read. Not for concurrent use: see read_into.
  bool read(layer_id l, expert_id e) noexcept {
    const bool ok = read_into(l, e, buffer_.data());
    if (ok) {
      ++reads_;
      bytes_ += map_->expert_bytes(l);
    }
    return ok;
  }

  /// Reads expert e of layer l into `dst` (at least widest_expert_bytes()
  /// bytes; ignored in fadvise mode): its slices back to back, in the order
  /// of gguf_expert_map::ranges. Thread-safe.
  bool read_into(layer_id l, expert_id e, unsigned char* dst) const noexcept {
    if (to_index(l) >= map_->n_layer()) return false;
    const std::vector<expert_file_range>& ranges = map_->ranges(l);
    if (ranges.empty()) return false;
    std::size_t at = 0;
    for (const expert_file_range& r : ranges) {
      if (to_index(e) >= r.n_expert) return false;
      const std::uint64_t off = r.offset + to_index(e) * r.bytes_per_expert;
#if MOE_RESIDENCY_LLAMA_CPP_POSIX
      if (mode_ == mode::fadvise) {
#if defined(POSIX_FADV_WILLNEED)
        if (::posix_fadvise(fd_, static_cast<off_t>(off), static_cast<off_t>(r.bytes_per_expert),
                            POSIX_FADV_WILLNEED) != 0)
          return false;
#endif
        continue;
      }
      std::uint64_t done = 0;
      while (done < r.bytes_per_expert) {
        const ssize_t n = ::pread(fd_, dst + at + done, static_cast<std::size_t>(r.bytes_per_expert - done),
                                  static_cast<off_t>(off + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        done += static_cast<std::uint64_t>(n);
      }
      at += static_cast<std::size_t>(r.bytes_per_expert);
#else
      (void)off;
      (void)dst;
      (void)at;
      return false;
#endif
    }
    return true;
  }

  /// A read callback for the speculative read scheduler (io.hpp's
  /// `read(layer, expert, reason) -> read_status`), callable from several
  /// lanes: each lane thread reads into its own thread-local buffer. The
  /// reader must outlive it.
  read_callback callback() const {
    return [this](layer_id l, expert_id e, read_reason) noexcept {
      thread_local std::vector<unsigned char> buf;
      if (mode_ == mode::pread && buf.size() < widest_) {
        try {
          buf.resize(static_cast<std::size_t>(widest_));
        } catch (...) {
          return read_status::failed;
        }
      }
      return read_into(l, e, buf.data()) ? read_status::ok : read_status::failed;
    };
  }

  /// The bytes of the last expert `read` (pread mode).
  const unsigned char* data() const noexcept { return buffer_.data(); }
  std::uint64_t widest_expert_bytes() const noexcept { return widest_; }
  std::uint64_t bytes_read() const noexcept { return bytes_; }
  std::uint64_t reads() const noexcept { return reads_; }

 private:
  const gguf_expert_map* map_;
  mode mode_;
  int fd_ = -1;
  std::uint64_t widest_ = 0;
  std::vector<unsigned char> buffer_;
  std::uint64_t bytes_ = 0, reads_ = 0;
};

// ---------------------------------------------------------------------------
// Wiring: a session fed from the observer, and a route-trace recorder that
// replays the engine's load batches through a cache as they happen.

/// Feeds a `session` (session.hpp) from the observer, then passes each event
/// on to `next` (e.g. a route_recorder). Per graph: begin_batch; per MoE
/// layer: gate_input, routed, layer_loaded. A prefill layer that saw only the
/// batch's output rows (llama.cpp's last layer of a prompt batch) is sent
/// with exactly those rows, as the batch's last tokens (the session accepts
/// 1 to n_tokens rows in a prefill batch), and counted in
/// `partial_layers()`. A decode layer with fewer rows than its batch cannot
/// happen with llama.cpp; one is not sent and is counted in `bad_layers()`.
/// `next` gets every layer. Session is any type with the session's event
/// members.
template <class Session>
class session_sink : public observer_sink {
 public:
  explicit session_sink(Session& s, observer_sink* next = nullptr) : session_(&s), next_(next) {}

  void on_batch(const batch_info& b) override {
    session_->begin_batch(b.phase, b.first_position, b.n_tokens);
    if (next_ != nullptr) next_->on_batch(b);
  }

  void on_layer(const layer_batch& b) override {
    if (b.n_tokens == 0 || (b.outputs_only && b.phase != run_phase::prefill)) {
      ++bad_;
    } else {
      // b.x(t), b.routing_of(t) and b.position(t) are already the layer's own
      // rows: for an outputs_only layer, the batch's last n_tokens tokens.
      const std::size_t n_embd = b.structure->router.cols != 0 ? b.structure->router.cols
                                                               : session_->routers().n_embd();
      session_->gate_input(b.layer, b.gate_input, n_embd, b.n_tokens,
                           b.gate_input_stride * sizeof(float));
      if (buffer_.size() < b.n_tokens) buffer_.resize(b.n_tokens);
      bool ok = true;
      for (std::size_t t = 0; t < b.n_tokens && ok; ++t) ok = b.routing_of(t, buffer_[t]);
      if (ok) {
        session_->routed(b.layer, span<const routing>(buffer_.data(), b.n_tokens));
        session_->layer_loaded(b.layer);
        if (b.outputs_only) ++partial_;
      } else {
        ++bad_;
      }
    }
    if (next_ != nullptr) next_->on_layer(b);
  }

  /// Prefill layers that saw only the batch's output rows and were sent to
  /// the session with those rows (one per prompt batch with llama.cpp).
  std::uint64_t partial_layers() const noexcept { return partial_; }
  /// Layers not sent: an id out of range, k > 32, no rows, or a decode layer
  /// with fewer rows than its batch.
  std::uint64_t bad_layers() const noexcept { return bad_; }

 private:
  Session* session_;
  observer_sink* next_;
  std::vector<routing> buffer_;
  std::uint64_t partial_ = 0, bad_ = 0;
};

/// Configures a session's routers from what the observer learned: every MoE
/// layer whose router is readable gets set_router(view, spec). Returns the
/// number of layers configured.
template <class Session>
std::size_t configure_routers(Session& s, const observer& obs) {
  std::size_t n = 0;
  for (std::size_t l = 0; l < obs.n_layer(); ++l) {
    const layer_structure& ls = obs.layers()[l];
    if (!ls.moe || !ls.router_readable) continue;
    s.set_router(layer_id(static_cast<std::uint16_t>(l)), ls.router, ls.spec);
    ++n;
  }
  return n;
}

/// Records every routing the engine made as route_trace v1 rows (turn 0,
/// step = token position, the final weights) and, given a budget, runs the
/// engine's load batches through an expert_cache<Policy> as they happen:
/// one batch per layer of a prompt graph (its tokens' ids token-major), one
/// per (token, layer) in decode. The residency column is the cache's answer
/// (0 miss, 1 hit; a duplicate within a batch is a hit), expert_bytes the
/// layer's bytes on a miss. Replaying the trace with the same policy and
/// budget gives the same counters.
template <class Policy>
class route_recorder : public observer_sink {
 public:
  /// `budget_bytes` 0: record only, no cache. Throws like expert_cache.
  route_recorder(const model_shape& shape, std::uint64_t budget_bytes,
                 cycle_guard guard = cycle_guard::warn)
      : shape_(shape) {
    trace_.header.model = shape.name();
    trace_.header.arch = shape.name();
    trace_.header.n_layer = shape.n_layers();
    trace_.header.n_expert = shape.n_experts();
    trace_.header.n_expert_used = shape.top_k();
    trace_.header.expert_bytes = shape.all_expert_bytes();
    trace_.header.dense_bytes.assign(shape.n_layers(), 0);
    if (budget_bytes != 0) {
      cache_options o;
      o.budget_bytes = budget_bytes;
      o.guard = guard;
      o.on_warning = [this](const std::string& m) { warning_ = m; };
      cache_ = std::make_unique<expert_cache<Policy>>(shape, std::move(o));
    }
  }

  /// The trace header's model name, architecture and per-layer dense bytes.
  void describe(std::string model, std::string arch, std::vector<std::uint64_t> dense_bytes) {
    if (dense_bytes.size() != shape_.n_layers())
      throw error("route_recorder: dense_bytes has " + std::to_string(dense_bytes.size()) +
                  " entries; expected " + std::to_string(shape_.n_layers()));
    trace_.header.model = std::move(model);
    trace_.header.arch = std::move(arch);
    trace_.header.dense_bytes = std::move(dense_bytes);
  }
  /// Called for every miss, after the cache counted it (e.g. a read from the file).
  void on_miss(std::function<void(layer_id, expert_id)> f) { on_miss_ = std::move(f); }

  void on_layer(const layer_batch& b) override {
    const std::uint64_t bytes = shape_.expert_bytes(b.layer);
    if (cache_) cache_->begin_batch(b.phase, b.layer);
    routing r;
    for (std::size_t t = 0; t < b.n_tokens; ++t) {
      if (!b.routing_of(t, r)) {
        ++bad_;
        continue;
      }
      for (std::size_t j = 0; j < r.size(); ++j) {
        trace_row row;
        row.turn = 0;
        row.phase = b.phase;
        row.step = b.position(t);
        row.layer = b.layer;
        row.slot = static_cast<std::uint8_t>(j);
        row.expert = r.id(j);
        row.weight = r.weight(j);
        row.residency = 1;
        if (cache_) {
          const lookup_result res = cache_->lookup(r.id(j));
          if (res == lookup_result::miss) {
            row.residency = 0;
            row.expert_bytes = bytes;
            if (on_miss_) on_miss_(b.layer, r.id(j));
          }
        } else {
          row.residency = 0;
          row.expert_bytes = bytes;
        }
        trace_.rows.push_back(row);
      }
    }
    if (cache_) cache_->end_batch();
  }

  const route_trace& trace() const noexcept { return trace_; }
  bool has_cache() const noexcept { return cache_ != nullptr; }
  const expert_cache<Policy>& cache() const { return *cache_; }
  /// The token-cycle guard's message, if the budget is below the cycle.
  const std::string& warning() const noexcept { return warning_; }
  std::uint64_t bad_routings() const noexcept { return bad_; }

  /// "cache lru 12 MiB: decode hit 43.21% (cumulative 40.02%), 123.4 MiB read, token cycle 3.0 MiB"
  std::string cache_line() const {
    if (!cache_) return "cache: none (give a budget)";
    const cache_stats& st = cache_->stats();
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "cache %s %g MiB: decode hit %.3f%% (cumulative %.3f%%), %.1f MiB read, token cycle %.1f MiB",
                  Policy::name, to_mib(cache_->budget_bytes()), st.decode.hit_pct(), st.all.hit_pct(),
                  to_mib(st.all.bytes_read), to_mib(token_cycle_bytes(shape_)));
    return buf;
  }

 private:
  model_shape shape_;
  route_trace trace_;
  std::unique_ptr<expert_cache<Policy>> cache_;
  std::function<void(layer_id, expert_id)> on_miss_;
  std::string warning_;
  std::uint64_t bad_ = 0;
};

/// Bytes of each layer's non-expert tensors in a GGUF file ("blk.N.*" minus
/// the expert tensors of `map`), for a route trace's dense_bytes column.
inline std::vector<std::uint64_t> gguf_dense_bytes(const std::string& path, const gguf_expert_map& map,
                                                   std::size_t n_layer) {
  gguf_init_params p{};
  p.no_alloc = true;
  p.ctx = nullptr;
  gguf_context* ctx = gguf_init_from_file(path.c_str(), p);
  if (ctx == nullptr) throw error("gguf_dense_bytes: " + path + ": not a readable GGUF file");
  std::vector<std::uint64_t> out(n_layer, 0);
  const std::int64_t n = gguf_get_n_tensors(ctx);
  for (std::int64_t i = 0; i < n; ++i) {
    const char* name = gguf_get_tensor_name(ctx, i);
    const int il = detail::parse_blk_layer(name);
    if (il < 0 || static_cast<std::size_t>(il) >= n_layer) continue;
    bool expert = false;
    if (static_cast<std::size_t>(il) < map.n_layer())
      for (const auto& r : map.ranges(layer_id(static_cast<std::uint16_t>(il))))
        expert = expert || r.tensor == name;
    if (!expert) out[static_cast<std::size_t>(il)] += gguf_get_tensor_size(ctx, i);
  }
  gguf_free(ctx);
  return out;
}

}  // namespace moe_residency::llama_cpp
