#pragma once
/// Sinks of the llama.cpp observer: a session fed from the graph, router
/// configuration from what the observer learned, and a route-trace recorder.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/adapters/llama_cpp/observer.hpp"
#include "moe_residency/cache/expert_cache.hpp"
#include "moe_residency/trace.hpp"

namespace moe_residency::llama_cpp {

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

  /// Begins the session's batch even after an anomaly left the previous one
  /// open in throw mode (a layer of the last graph routed no further): each
  /// retry of begin_batch reports one such layer, so at most a layer count of
  /// retries begins it. The first anomaly is then rethrown, for the observer
  /// to count, with this graph's batch already begun.
  void on_begin_batch(const batch_info& b) override {
    std::exception_ptr first;
    const std::size_t attempts = session_->shape().n_layers() + 2;
    for (std::size_t i = 0; i < attempts; ++i) {
      try {
        session_->begin_batch(b.phase, b.first_position, b.n_tokens);
        break;
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    }
    if (next_ != nullptr) next_->on_begin_batch(b);
    if (first) std::rethrow_exception(first);
  }

  void on_layer_loaded(const layer_batch& b) override {
    if (b.n_tokens == 0 || (b.outputs_only && b.phase != run_phase::prefill)) {
      ++bad_;
    } else {
      // b.x(t), b.routing_of(t) and b.position(t) are already the layer's own
      // rows: for an outputs_only layer, the batch's last n_tokens tokens.
      const std::size_t n_embd =
          b.structure->router.cols != 0 ? b.structure->router.cols : session_->routers().n_embd();
      session_->gate_input(b.layer, b.gate_input, n_embd, b.n_tokens, b.gate_input_stride * sizeof(float));
      if (buffer_.size() < b.n_tokens) buffer_.resize(b.n_tokens);
      bool ok = true;
      for (std::size_t t = 0; t < b.n_tokens && ok; ++t) ok = b.routing_of(t, buffer_[t]);
      if (ok) {
        session_->routed(b.layer, span<const routing>(buffer_.data(), b.n_tokens));
        // llama.cpp computes every routed expert: a drop the session's policy
        // asked for did not happen, and its cache counted it as skipped.
        std::size_t dropped = 0;
        for (std::size_t t = 0; t < b.n_tokens; ++t) dropped += popcount(session_->drop_mask(t));
        session_->layer_loaded(b.layer);
        if (b.outputs_only) ++partial_;
        if (dropped != 0) {
          ignored_drops_ += dropped;
          if (next_ != nullptr) next_->on_layer_loaded(b);
          if (ignored_drops_ == dropped)  // loud once; counted always
            throw error("session_sink: the session's drop policy asked to skip " + std::to_string(dropped) +
                        " routed expert(s) of layer " + std::to_string(to_index(b.layer)) +
                        "; llama.cpp computes every routed expert, so the session's cache now counts "
                        "reads that happened as skipped: disarm dropping for a session fed from llama.cpp");
          return;
        }
      } else {
        ++bad_;
      }
    }
    if (next_ != nullptr) next_->on_layer_loaded(b);
  }

  /// Routed experts the session's drop policy asked to skip, which llama.cpp
  /// computed anyway (the first time, the sink also throws, and the observer
  /// counts it with the message in last_error()).
  std::uint64_t ignored_drops() const noexcept { return ignored_drops_; }

  /// Prefill layers that saw only the batch's output rows and were sent to
  /// the session with those rows (one per prompt batch with llama.cpp).
  std::uint64_t partial_layers() const noexcept { return partial_; }
  /// Layers not sent: an id out of range, k > 32, no rows, or a decode layer
  /// with fewer rows than its batch.
  std::uint64_t bad_layers() const noexcept { return bad_; }

 private:
  Session* session_;
  observer_sink* next_;
  static std::size_t popcount(std::uint32_t m) noexcept {
    std::size_t n = 0;
    for (; m != 0; m &= m - 1) ++n;
    return n;
  }

  std::vector<routing> buffer_;
  std::uint64_t partial_ = 0, bad_ = 0, ignored_drops_ = 0;
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
  /// The header's arch is the shape's name (the observer names a shape by its
  /// architecture); its model stays empty until describe() gives it.
  route_recorder(const model_shape& shape, std::uint64_t budget_bytes, cycle_guard guard = cycle_guard::warn)
      : shape_(shape) {
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
  // The cache's warning sink captures `this`: never copied or moved.
  route_recorder(const route_recorder&) = delete;
  route_recorder& operator=(const route_recorder&) = delete;
  route_recorder(route_recorder&&) = delete;
  route_recorder& operator=(route_recorder&&) = delete;

  /// The trace header's model name, architecture and per-layer dense bytes.
  void describe(std::string model, std::string arch, std::vector<std::uint64_t> dense_bytes) {
    if (dense_bytes.size() != shape_.n_layers())
      throw error("route_recorder: dense_bytes has " + std::to_string(dense_bytes.size()) + " entries; expected " +
                  std::to_string(shape_.n_layers()));
    trace_.header.model = std::move(model);
    trace_.header.arch = std::move(arch);
    trace_.header.dense_bytes = std::move(dense_bytes);
  }
  /// Called for every miss, after the cache counted it (e.g. a read from the file).
  void on_miss(std::function<void(layer_id, expert_id)> f) { on_miss_ = std::move(f); }

  void on_layer_loaded(const layer_batch& b) override {
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
}  // namespace moe_residency::llama_cpp
