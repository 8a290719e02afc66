#pragma once
/// Routing from a recorded trace, in an unmodified llama.cpp: at each MoE
/// layer's routing node (`ffn_moe_topk-il`, the ids the layer selected, before
/// any node consumes them) the observer overwrites the ids with the trace's
/// routing of that token and layer, slot order kept. llama.cpp then gathers
/// that layer's weights from its own router's probabilities for the recorded
/// experts and multiplies exactly those experts: a random-weight model of the
/// trace's shape reads, caches and computes what the recorded model routed.
///
///   auto trace = moe_residency::read_route_trace("qwen.route.csv");
///   mrl::forced_routing routes(trace, "qwen.route.csv");
///   obs.force_routing(&routes);   // refuses a model of another MoE shape, naming both
///
/// Prompt tokens take the trace's prefill routings by position (token p of a
/// sequence: the p-th prompt token the trace recorded); decode tokens its
/// decode routings in order, counted from the sequence's start (a graph at
/// position 0). A run longer than the trace cycles, and says so (`note()`).
/// A prompt token the trace has no routing of for a layer (llama.cpp computes
/// a prompt's last layer for its output rows only, so a trace's prompt rows
/// stop there too) keeps the model's own routing, counted as unforced.
///
/// `trace_oracle` is the residency manager's predictor under forced routing:
/// the next layer's true routing from the trace, each slot kept with
/// probability P, by the replay's own draw (replay/dynamic.hpp's
/// oracle_ranking, same seed, same order), so `moe-residency replay
/// --decode-only --speculate oracle:P --seed S` of the run's recorded trace
/// plans the same reads.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/adapters/llama_cpp/residency/predictor.hpp"
#include "moe_residency/adapters/llama_cpp/structure.hpp"
#include "moe_residency/core.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/replay/dynamic.hpp"
#include "moe_residency/trace.hpp"

namespace moe_residency::llama_cpp {

/// Counters of a forced run (host thread; read between llama_decode calls).
struct forced_routing_stats {
  std::uint64_t forced_routings = 0;    ///< (token, layer) routings overwritten with the trace's
  std::uint64_t unforced_routings = 0;  ///< left as the model routed (no routing of that layer in the trace)
  std::uint64_t refused_layers = 0;     ///< routing nodes whose layout was not build_moe_ffn's (not touched)
  std::uint64_t prefill_tokens = 0;     ///< prompt tokens forced (at their first layer)
  std::uint64_t decode_tokens = 0;      ///< decode tokens forced (at their first layer)
  std::uint64_t prefill_wraps = 0;      ///< prompt positions past the trace's prompt (cycled)
  std::uint64_t decode_wraps = 0;       ///< decode tokens past the trace's decode tokens (cycled)
};

class forced_routing final : public routing_override {
 public:
  /// Every routing of `trace` (validated: whole tokens, k slots each), by
  /// phase and token. `source` names it in messages (the file).
  forced_routing(const validated_route_trace& trace, std::string source)
      : source_(std::move(source)), header_(trace.header()), shape_(trace.shape()) {
    n_layer_ = header_.n_layer;
    k_ = header_.n_expert_used;
    if (k_ > max_top_k)
      throw error(source_ + ": top-k " + std::to_string(k_) + "; expected at most " + std::to_string(max_top_k) +
                  " to force a routing");
    // Tokens in (turn, step) order, per phase; each token's routings by layer.
    std::map<std::pair<std::uint32_t, std::uint32_t>, std::size_t> index[2];
    for (const trace_row& r : trace.rows()) {
      auto& ix = index[r.phase == run_phase::decode ? 1 : 0];
      ix.emplace(std::make_pair(r.turn, r.step), 0);
    }
    for (int p = 0; p < 2; ++p) {
      std::size_t i = 0;
      for (auto& kv : index[p]) kv.second = i++;
      (p == 0 ? prefill_ : decode_).assign(index[p].size() * n_layer_, routing{});
    }
    for (const trace_row& r : trace.rows()) {
      const bool dec = r.phase == run_phase::decode;
      const std::size_t t = index[dec ? 1 : 0].at(std::make_pair(r.turn, r.step));
      routing& rt = (dec ? decode_ : prefill_)[t * n_layer_ + to_index(r.layer)];
      rt.layer = r.layer;
      rt.phase = r.phase;
      rt.token = r.step;
      rt.push_back(r.expert, r.weight);  // rows in slot order (validated)
    }
    n_prefill_ = index[0].size();
    n_decode_ = index[1].size();
    if (n_decode_ == 0)
      throw error(source_ + ": no decode routing; expected at least one decode token to force (prompt tokens " +
                  std::to_string(n_prefill_) + ")");
  }
  // The observer keeps a pointer: never copied or moved while installed.
  forced_routing(const forced_routing&) = delete;
  forced_routing& operator=(const forced_routing&) = delete;

  /// The trace's MoE shape: layers, experts, top-k, expert bytes per layer.
  const model_shape& shape() const noexcept { return shape_; }
  const trace_header& header() const noexcept { return header_; }
  const std::string& source() const noexcept { return source_; }
  std::size_t prefill_tokens() const noexcept { return n_prefill_; }
  std::size_t decode_tokens() const noexcept { return n_decode_; }

  /// "48 layers x 128 experts, top-6": a MoE shape for messages.
  static std::string describe(std::size_t layers, std::size_t experts, std::size_t k) {
    return std::to_string(layers) + " layers x " + std::to_string(experts) + " experts, top-" + std::to_string(k);
  }

  /// Throws `error` naming both shapes when the model's (its layer count and
  /// its GGUF's `<arch>.expert_count` and `.expert_used_count`) is not the
  /// trace's. Called by observer::force_routing, before any graph runs.
  void check_model(const llama_model* m, const std::string& arch) const override {
    const std::size_t layers = static_cast<std::size_t>(llama_model_n_layer(m));
    const std::string experts = detail::model_meta(m, arch + ".expert_count");
    const std::string used = detail::model_meta(m, arch + ".expert_used_count");
    const std::string mine = describe(header_.n_layer, header_.n_expert, header_.n_expert_used);
    if (experts.empty() || used.empty())
      throw error("forced routing from " + source_ + " (" + mine + "): the model (" + arch + ", " +
                  std::to_string(layers) + " layers) has no " + arch + ".expert_count or .expert_used_count; " +
                  "expected a MoE model of the trace's shape");
    const std::string theirs =
        describe(layers, std::strtoull(experts.c_str(), nullptr, 10), std::strtoull(used.c_str(), nullptr, 10));
    if (theirs != mine)
      throw error("forced routing from " + source_ + ": the trace is " + mine + " but the model is " + theirs +
                  "; expected the same MoE shape (a random model of the trace's shape: --shape-from)");
  }

  /// Throws `error` naming both lists when the model's MoE layers (the
  /// observer's, once it knows the structure) are not the trace's.
  void check_layers(const model_shape& model) const {
    auto list = [](const model_shape& s) {
      std::string out;
      for (std::size_t l = 0; l < s.n_layers(); ++l)
        if (s.is_moe(layer_id(static_cast<std::uint16_t>(l)))) out += (out.empty() ? "" : ",") + std::to_string(l);
      return out;
    };
    if (list(model) != list(shape_) || model.n_layers() != shape_.n_layers())
      throw error("forced routing from " + source_ + ": the trace routes layers " + list(shape_) +
                  " but the model's MoE layers are " + list(model) + "; expected the same layers");
  }

  // ---- the observer's calls (its thread) -----------------------------------

  /// A graph begins: a graph at position 0 starts a sequence (decode tokens
  /// counted from 0 again); a decode graph takes the next decode routings.
  void begin_graph(const batch_info& b) noexcept override {
    if (b.first_position == 0) decode_next_ = 0;
    phase_ = b.phase;
    if (b.phase == run_phase::decode) {
      decode_base_ = decode_next_;
      decode_next_ += b.n_tokens;
    }
    first_layer_ = true;
  }

  /// Overwrites the ids of one routing node: `n_tokens` rows of `k` ids, row
  /// stride `stride` int32s, token t at position `first_position + t`. False
  /// (nothing touched, counted) when k or the layer is not the trace's.
  bool rewrite(std::size_t layer, std::uint32_t first_position, std::size_t n_tokens, std::int32_t* ids,
               std::size_t stride, std::size_t k) noexcept override {
    if (k != k_ || layer >= n_layer_ || ids == nullptr) {
      ++stats_.refused_layers;
      return false;
    }
    const bool dec = phase_ == run_phase::decode;
    if (first_layer_) {
      first_layer_ = false;
      (dec ? stats_.decode_tokens : stats_.prefill_tokens) += n_tokens;
    }
    for (std::size_t t = 0; t < n_tokens; ++t) {
      const std::size_t i = dec ? decode_base_ + t : first_position + t;
      const std::size_t have = dec ? n_decode_ : n_prefill_;
      if (have != 0 && i >= have) ++(dec ? stats_.decode_wraps : stats_.prefill_wraps);
      const routing* r = dec ? at_decode(i, layer) : at_prefill(i, layer);
      if (r == nullptr || r->size() != k) {
        ++stats_.unforced_routings;
        continue;
      }
      for (std::size_t j = 0; j < k; ++j) ids[t * stride + j] = static_cast<std::int32_t>(to_index(r->id(j)));
      ++stats_.forced_routings;
    }
    return true;
  }

  /// The trace's routing of MoE layer `l` for token `t` of the current decode
  /// graph (null outside decode, or when the trace has none): what a forced
  /// decode token routes at `l`.
  const routing* current_decode(layer_id l, std::size_t t = 0) const noexcept {
    if (phase_ != run_phase::decode) return nullptr;
    const routing* r = at_decode(decode_base_ + t, to_index(l));
    return r != nullptr && !r->empty() ? r : nullptr;
  }
  /// The decode token (from 0 at the sequence's start) of the current graph's first token.
  std::size_t current_decode_index() const noexcept { return decode_base_; }

  const forced_routing_stats& stats() const noexcept { return stats_; }
  void reset_stats() noexcept { stats_ = forced_routing_stats{}; }

  /// What was forced, and what was not: one line.
  std::string note() const {
    std::string s = "routing forced from " + source_ + ": " + std::to_string(stats_.forced_routings) + " routings (" +
                    std::to_string(stats_.prefill_tokens) + " prompt, " + std::to_string(stats_.decode_tokens) +
                    " decode tokens; the trace has " + std::to_string(n_prefill_) + " and " +
                    std::to_string(n_decode_) + ")";
    if (stats_.decode_wraps != 0)
      s += "; the run decoded past the trace's " + std::to_string(n_decode_) +
           " decode tokens: " + std::to_string(stats_.decode_wraps) + " routings cycled from its first";
    if (stats_.prefill_wraps != 0)
      s += "; the prompt ran past the trace's " + std::to_string(n_prefill_) +
           " prompt tokens: " + std::to_string(stats_.prefill_wraps) + " routings cycled from its first";
    if (stats_.unforced_routings != 0)
      s += "; " + std::to_string(stats_.unforced_routings) + " routings left as the model routed (none in the trace)";
    if (stats_.refused_layers != 0)
      s +=
          "; " + std::to_string(stats_.refused_layers) + " routing nodes not touched (layout or top-k not the trace's)";
    return s;
  }

 private:
  const routing* at_decode(std::size_t i, std::size_t layer) const noexcept {
    const routing& r = decode_[(i % n_decode_) * n_layer_ + layer];
    return r.empty() ? nullptr : &r;
  }
  const routing* at_prefill(std::size_t position, std::size_t layer) const noexcept {
    if (n_prefill_ == 0) return nullptr;
    const routing& r = prefill_[(position % n_prefill_) * n_layer_ + layer];
    return r.empty() ? nullptr : &r;
  }

  std::string source_;
  trace_header header_;
  model_shape shape_;
  std::size_t n_layer_ = 0, k_ = 0, n_prefill_ = 0, n_decode_ = 0;
  std::vector<routing> prefill_, decode_;  // [token * n_layer + layer]
  run_phase phase_ = run_phase::prefill;
  std::size_t decode_base_ = 0, decode_next_ = 0;
  bool first_layer_ = true;
  forced_routing_stats stats_;
};

/// The residency manager's predictor under forced routing: MoE layer
/// `target`'s routing of the current decode token, from the trace, each slot
/// kept with probability P (per target layer with a profile), else replaced
/// by an expert the layer does not route — the replay's oracle_ranking, with
/// its seed, called in the replay's order (every decode MoE layer that has a
/// layer ahead, token by token). So a run with `--predictor oracle:P --seed S`
/// plans the reads `replay --decode-only --speculate oracle:P --seed S` plans
/// on the run's recorded trace.
class trace_oracle final : public routing_predictor {
 public:
  /// `p` in [0, 1]; `profile`: empty, or one P per layer of the trace's shape
  /// (replay/oracle_profile.hpp's parse_oracle_profile). Throws `error` otherwise.
  trace_oracle(const forced_routing& routes, double p, std::vector<double> profile = {},
               std::uint64_t seed = replay_speculation{}.seed)
      : routes_(&routes), p_(p), profile_(std::move(profile)), rng_(seed) {
    if (!(p >= 0.0 && p <= 1.0)) throw error("trace_oracle: P " + std::to_string(p) + "; expected [0, 1]");
    if (!profile_.empty() && profile_.size() != routes.shape().n_layers())
      throw error("trace_oracle: profile has " + std::to_string(profile_.size()) + " entries; expected " +
                  std::to_string(routes.shape().n_layers()) + " (one P per layer of " + routes.source() + ")");
    for (double q : profile_)
      if (!(q >= 0.0 && q <= 1.0))
        throw error("trace_oracle: a profile P is " + std::to_string(q) + "; expected [0, 1]");
    replay_speculation s;
    s.source = speculation_source::oracle;
    s.oracle_p = p;
    s.oracle_profile = profile_;
    name_ = s.name();
  }

  bool rank(const layer_batch& b, layer_id target, ranking& out) override {
    out.clear();
    if (b.n_tokens == 0) return false;
    const routing* truth = routes_->current_decode(target, b.n_tokens - 1);
    if (truth == nullptr) return false;
    const double p = profile_.empty() ? p_ : profile_[to_index(target)];
    moe_residency::detail::oracle_ranking(*truth, p, routes_->shape().n_experts(), rng_, out);
    ++ranked_;
    return !out.empty();
  }
  const char* name() const noexcept override { return name_.c_str(); }
  /// Rankings made so far.
  std::uint64_t ranked() const noexcept { return ranked_; }

 private:
  const forced_routing* routes_;
  double p_;
  std::vector<double> profile_;
  std::uint64_t rng_;
  std::uint64_t ranked_ = 0;
  std::string name_;
};

}  // namespace moe_residency::llama_cpp
