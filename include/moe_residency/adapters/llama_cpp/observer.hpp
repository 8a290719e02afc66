#pragma once
/// The llama.cpp graph observer: observes an unmodified llama.cpp through its graph
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
///   obs.set_sink(&my_sink);                // on_layer_loaded(layer_batch) per MoE layer
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
///
/// The observer is one state machine over ggml's callback order (the ask
/// phase learns the structure, the data phase reads the layer once, an
/// anomaly or a throwing sink resets it at the next graph). The rules it
/// reproduces from llama.cpp's build_moe_ffn (probabilities, biases, groups,
/// weights, the GGUF keys that must agree) are in observer_graph.hpp; its
/// vocabulary is structure.hpp, the GGUF map gguf.hpp.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "moe_residency/adapters/llama_cpp/observer_graph.hpp"
#include "moe_residency/adapters/llama_cpp/structure.hpp"
#include "moe_residency/detail/format.hpp"
#include "moe_residency/detail/numbers.hpp"

namespace moe_residency::llama_cpp {

class observer {
 public:
  /// Reads the model's layer count and MoE metadata. The observer must
  /// outlive every context it is installed into.
  explicit observer(const llama_model* model) : model_(model) {
    if (model == nullptr) throw error("llama_cpp observer: model is null");
    n_layer_ = static_cast<std::size_t>(llama_model_n_layer(model));
    if (n_layer_ == 0 || n_layer_ > 65535)
      throw error("llama_cpp observer: model has " + std::to_string(n_layer_) + " layers; expected [1, 65535]");
    arch_ = detail::model_meta(model, "general.architecture");
    name_ = detail::model_meta(model, "general.name");
    layers_.resize(n_layer_);
    graph_.resize(n_layer_);
    appeared_.assign(n_layer_, false);
    unsupported_.assign(n_layer_, false);
  }
  // Installed contexts call back with `this` as their user data: never copied or moved.
  observer(const observer&) = delete;
  observer& operator=(const observer&) = delete;
  observer(observer&&) = delete;
  observer& operator=(observer&&) = delete;

  /// Installs the observer as `p.cb_eval`, keeping any callback already
  /// there: in the ask phase the node is requested when either wants it; in
  /// the data phase each is called for the nodes it asked for, and the user's
  /// answer is returned (the observer's own is always true). Call before
  /// llama_init_from_model. Throws `error` if installed twice.
  ///
  /// One observer serves one live context: it keeps one chained callback and
  /// one graph's state. Installing it again (for a context that replaces a
  /// freed one) is fine; installing it over a different chained callback
  /// than before throws, since the first context's callback would be lost.
  void install(llama_context_params& p) {
    if (p.cb_eval == &observer::eval_callback && p.cb_eval_user_data == this)
      throw error("llama_cpp observer: already installed in these context params");
    if (installed_ && (p.cb_eval != chained_ || p.cb_eval_user_data != chained_user_data_))
      throw error(
          "llama_cpp observer: already installed over another chained cb_eval; it keeps one chained "
          "callback and one graph's state: use one observer per live context");
    installed_ = true;
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

  /// Routes every MoE layer as `o` says (forced_routing.hpp: a recorded
  /// trace's routing), from the next graph on, the first one included: at
  /// each layer's routing node the observer asks ggml for the ids (one graph
  /// split a layer) and `o` overwrites them before any node consumes them,
  /// so the layer's weights and expert matmuls follow them, and so does
  /// every event a sink gets. Throws `error` (nothing installed) when `o`
  /// refuses the model (routing_override::check_model). Null: the model's
  /// own routing again. `o` must outlive its installation.
  void force_routing(routing_override* o) {
    if (o != nullptr) o->check_model(model_, arch_);
    override_ = o;
  }
  routing_override* forced() const noexcept { return override_; }

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
    return detail::shape_of(arch_, layers_);
  }

  /// The counters. Read them between llama_decode calls, from the thread
  /// that makes them.
  const observer_stats& stats() const noexcept {
    stats_.concurrent_calls = concurrent_calls_.load(std::memory_order_relaxed);
    return stats_;
  }
  /// The model's weight tensors the first graph read (sources of its nodes
  /// in buffers llama.cpp marked as weights, views resolved), as llama.cpp
  /// placed them: in the file's mapping, a repacked copy or on a device.
  /// Empty before a graph has been evaluated.
  const std::vector<const ggml_tensor*>& weights() const noexcept { return weights_; }
  /// The first disagreement between the graph and the GGUF metadata ("" if none).
  const std::string& metadata_note() const noexcept { return metadata_note_; }
  void reset_stats() noexcept {
    stats_ = observer_stats{};
    concurrent_calls_.store(0, std::memory_order_relaxed);
  }
  /// The last caught exception's message ("" if none).
  const char* last_error() const noexcept { return last_error_; }

  /// The cb_eval trampoline. noexcept: nothing crosses into ggml.
  ///
  /// One thread at a time: a call that arrives while another thread is
  /// inside the observer (one context decoded from two threads at once, or
  /// one observer installed in two live contexts) does not touch the
  /// observer's state; it is counted (observer_stats::concurrent_calls) and
  /// only forwarded to the chained callback. Calls from different threads
  /// one after another are fine.
  static bool eval_callback(ggml_tensor* t, bool ask, void* user_data) noexcept {
    auto* self = static_cast<observer*>(user_data);
    if (self->busy_.exchange(true, std::memory_order_acquire)) {
      self->concurrent_calls_.fetch_add(1, std::memory_order_relaxed);
      const auto chained = self->chained_;
      if (chained != nullptr) return chained(t, ask, self->chained_user_data_);
      return !ask;  // ask: not wanted; data: go on
    }
    const bool r = ask ? self->on_ask(t) : self->on_data(t);
    self->busy_.store(false, std::memory_order_release);
    return r;
  }

 private:
  using graph_layer = detail::graph_layer;

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

  // The first graph's weights: until its first node's name comes round again
  // (the next graph; a dense model has no router to count graphs by), or a
  // MoE model's second graph begins.
  void note_weights(const ggml_tensor* t) {
    if (!first_node_seen_) {
      first_node_seen_ = true;
      first_node_name_ = t->name;
    } else if (first_node_name_ == t->name) {
      weights_done_ = true;
      return;
    }
    for (const ggml_tensor* src : t->src) {
      if (src == nullptr) continue;
      const ggml_tensor* w = src->view_src != nullptr ? src->view_src : src;
      if (w->op != GGML_OP_NONE || w->buffer == nullptr ||
          ggml_backend_buffer_get_usage(w->buffer) != GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
        continue;
      if (weight_seen_.insert(w).second) weights_.push_back(w);
    }
  }

  void begin_graph(std::size_t n_tokens) {
    ++weight_graphs_;
    if (have_graph_) next_position_ += static_cast<std::uint32_t>(graph_tokens_);
    have_graph_ = true;
    graph_tokens_ = n_tokens;
    graph_first_position_ = next_position_;
    if (!forced_phase_) phase_ = n_tokens > 1 ? run_phase::prefill : run_phase::decode;
    ++stats_.graphs;
    for (auto& g : graph_) g = graph_layer{};
    if (override_ != nullptr) override_->begin_graph(batch_info{phase_, graph_first_position_, graph_tokens_});
    // The sink's exception is counted here, not in the ask phase that called
    // us: the structure bookkeeping of this node must still run.
    if (sink_ == nullptr) return;
    try {
      sink_->on_begin_batch(batch_info{phase_, graph_first_position_, graph_tokens_});
    } catch (const std::exception& e) {
      note_exception(e.what());
    } catch (...) {
      note_exception("unknown exception");
    }
  }

  // Ask phase: record the structure; true for the one node per MoE layer
  // whose data the observer wants.
  bool inspect(ggml_tensor* t) {
    if (weight_graphs_ <= 1 && !weights_done_) note_weights(t);
    if (t->op == GGML_OP_MUL_MAT_ID) return on_expert_matmul(t);
    if (t->name[0] != 'f') return false;
    int il = -1;
    const detail::moe_node kind = detail::parse_moe_node(t->name, il);
    if (kind == detail::moe_node::none || il < 0 || static_cast<std::size_t>(il) >= n_layer_) return false;
    const std::size_t l = static_cast<std::size_t>(il);
    graph_layer& g = graph_[l];
    switch (kind) {
      case detail::moe_node::logits: start_layer(l, t); break;
      case detail::moe_node::probs: on_probs(l, t); break;
      case detail::moe_node::topk:
        g.topk = t;
        // The routing is known here, before the expert matmuls: ask for it
        // when it is forced (every graph, the first included), or when a
        // sink acts on it and the layer's structure is already known. Only in
        // host memory: a router on a GPU (experts on the CPU) is not split
        // out of its fused graph for a routing nobody could read or write.
        if (g.logits == nullptr || !detail::host_readable(t)) return false;
        return override_ != nullptr || (sink_ != nullptr && sink_->wants(engine_event::routed) && layers_[l].moe);
      default: detail::note_node(g, kind, t); break;
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
    detail::note_probs(g, t);
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
    detail::add_expert_tensor(layers_[l], t->src[0]);
    graph_layer& g = graph_[l];
    if (g.trigger != nullptr || g.emitted) return false;
    g.trigger = t;
    ensure_structure(l);
    return sink_ != nullptr && sink_->wants(engine_event::layer_loaded) && layers_[l].moe;
  }

  // The layer's router_spec, from the nodes this graph showed (once per layer:
  // the structure of a model's graph does not change between ubatches).
  void ensure_structure(std::size_t l) {
    layer_structure& s = layers_[l];
    if (s.moe) return;
    const graph_layer& g = graph_[l];
    if (g.logits == nullptr || g.topk == nullptr || g.weights == nullptr || !g.gating_known) return;
    router_spec spec;
    if (g.unsupported || !detail::spec_of(g, spec)) {
      if (!unsupported_[l]) ++stats_.unsupported;
      unsupported_[l] = true;
      return;
    }

    detail::set_router_view(g.logits->src[0], spec.n_experts, s);
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
    const std::string problem = detail::metadata_problem(model_, arch_, spec);
    if (problem.empty()) return;
    ++stats_.metadata_mismatches;
    if (metadata_note_.empty()) metadata_note_ = "layer " + std::to_string(l) + ": " + problem;
  }

  // Data phase: a layer's topk (its routing, before the expert matmuls) or
  // its first expert matmul (the routing with its final weights).
  void deliver(ggml_tensor* t) {
    for (std::size_t i = 0; i < n_layer_; ++i) {
      if (graph_[i].trigger == t) {
        if (sink_ != nullptr) deliver_layer(i);
        return;
      }
      if (graph_[i].topk == t && !graph_[i].routed) {
        if (override_ != nullptr) force(i, t);
        if (sink_ != nullptr && sink_->wants(engine_event::routed)) deliver_routing(i);
        graph_[i].routed = true;
        return;
      }
    }
  }

  // The routing override rewrites layer l's ids in place (the topk view of
  // the argsort: i32, k per token, rows n_expert apart), before the
  // weights' get_rows and the expert matmuls read them.
  void force(std::size_t l, ggml_tensor* ids) {
    const std::size_t n_tok = static_cast<std::size_t>(ids->ne[1]);
    if (ids->type != GGML_TYPE_I32 || ids->nb[0] != sizeof(std::int32_t) || ids->ne[2] != 1 || ids->ne[3] != 1 ||
        n_tok > graph_tokens_ || ids->nb[1] % sizeof(std::int32_t) != 0) {
      ++stats_.unreadable;
      return;
    }
    const std::uint32_t first = graph_first_position_ + static_cast<std::uint32_t>(graph_tokens_ - n_tok);
    override_->rewrite(l, first, n_tok, static_cast<std::int32_t*>(ids->data), ids->nb[1] / sizeof(std::int32_t),
                       static_cast<std::size_t>(ids->ne[0]));
  }

  // The gate input and the ids of layer l, checked; false (counted as
  // unreadable) when their layout is not the one build_moe_ffn makes.
  bool fill_routing(std::size_t l, layer_batch& b) {
    const graph_layer& g = graph_[l];
    const layer_structure& s = layers_[l];
    if (g.logits == nullptr || g.topk == nullptr) {  // this graph never showed the layer's router
      ++stats_.unreadable;
      return false;
    }
    const ggml_tensor* x = g.logits->src[1];
    const ggml_tensor* ids = g.topk;
    const std::size_t n_tok = static_cast<std::size_t>(ids->ne[1]);
    const std::size_t k = static_cast<std::size_t>(ids->ne[0]);
    if (!detail::routing_layout_ok(x, ids) || n_tok > graph_tokens_ || k != s.spec.top_k) {
      ++stats_.unreadable;
      return false;
    }
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
    b.k = k;
    return true;
  }

  void deliver_routing(std::size_t l) {
    graph_[l].routed = true;
    if (!layers_[l].moe) return;
    layer_batch b;
    if (!fill_routing(l, b)) return;
    ++stats_.routing_events;
    sink_->on_routed(b);
  }

  void deliver_layer(std::size_t l) {
    graph_layer& g = graph_[l];
    g.emitted = true;
    if (!layers_[l].moe) return;
    const ggml_tensor* w = g.weights;
    if (w == nullptr || w->type != GGML_TYPE_F32 || !detail::host_readable(w)) {  // null: no weights node
      ++stats_.unreadable;
      return;
    }
    layer_batch b;
    if (!fill_routing(l, b)) return;
    if (!detail::set_weights(w, b)) {
      ++stats_.unreadable;
      return;
    }
    ++stats_.layer_batches;
    sink_->on_layer_loaded(b);
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
  routing_override* override_ = nullptr;
  bool attached_ = true;
  bool installed_ = false;

  const ggml_tensor* asked_node_ = nullptr;
  bool asked_mine_ = false, asked_theirs_ = false;

  bool have_graph_ = false;
  int last_layer_in_graph_ = -1;
  std::size_t graph_tokens_ = 0;
  std::uint32_t next_position_ = 0, graph_first_position_ = 0;
  bool forced_phase_ = false;
  run_phase phase_ = run_phase::prefill;

  mutable observer_stats stats_;  // concurrent_calls synced from the atomic in stats()
  std::atomic<bool> busy_{false};
  std::atomic<std::uint64_t> concurrent_calls_{0};
  std::string metadata_note_;
  char last_error_[256] = {};
  std::vector<const ggml_tensor*> weights_;
  std::unordered_set<const ggml_tensor*> weight_seen_;
  std::size_t weight_graphs_ = 0;  // graphs begun (a MoE graph begins at its first router)
  bool first_node_seen_ = false, weights_done_ = false;
  std::string first_node_name_;
};

}  // namespace moe_residency::llama_cpp
