#pragma once
/// The session: the one object an engine feeds events to. It owns the
/// configured predictors (a compile-time set, no virtual call per expert),
/// the slot-overlap scorer, the router views, and any extensions (a cache,
/// a planner, a read scheduler in later components) — all on the host's
/// thread. See docs/session.md.
///
/// Events, per batch (a decode token is a batch of one):
/// ```
///   s.begin_batch(run_phase::decode, position);        // token boundary
///   for each MoE layer l:
///     s.gate_input(l, x, n_embd);                       // what the router multiplies
///     s.routed(l, ids, weights, k);                     // what the layer chose
///     s.layer_loaded(l);                                // its demanded experts are in
///   s.end_batch();                                      // optional
/// ```
/// Out-of-order or malformed events are anomalies: with
/// `anomaly_action::throw_error` (the default) they throw `error` naming the
/// event; with `anomaly_action::count` they are counted, reported, and the
/// event is ignored — never scored wrongly. Counting allocates nothing after
/// the first anomaly's message is stored (messages are built only to throw
/// or to keep the first one), and never throws.
///
/// The session's vocabulary (options, views, anomaly kinds) is
/// session_types.hpp, which needs no SIMD.
///
/// This header is the class and its state machine: the events in the order
/// that is their contract (a routing is checked before it is scored, scored
/// before any extension sees it, and an anomaly loses nothing already
/// accounted). Beside it, in session/: the checks each event calls and the
/// anomaly policy (checks.hpp), the `routed` overloads that read an engine's
/// layouts (routing_layouts.hpp), the predictors' calls (predictions.hpp) —
/// these three define members declared here and are included at the end —
/// the extension hooks' compile-time contract (extension_hooks.hpp) and the
/// session's report lines (report.hpp).

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/events.hpp"
#include "moe_residency/predict.hpp"
#include "moe_residency/predict/router_bank.hpp"
#include "moe_residency/router.hpp"
#include "moe_residency/score.hpp"
#include "moe_residency/session/extension_hooks.hpp"
#include "moe_residency/session/report.hpp"
#include "moe_residency/session_hook.hpp"
#include "moe_residency/session_types.hpp"

namespace moe_residency {

/// A session owning predictors P... and extensions X....
///
/// Extensions (the cache, drop policy, planner, scheduler; a trace
/// recorder) receive the events after the session checked them, through the
/// members they declare in `static constexpr session_hook hooks` (checked at
/// compile time: see session_hook):
/// ```
///   void on_begin_batch(Session&, run_phase, std::uint32_t first_token, std::size_t n_tokens);
///   void on_gate_input(Session&, layer_id, const gate_input_view&);
///   void on_routed(Session&, layer_id, span<const routing>, span<std::uint32_t> drop_masks);
///   void on_layer_loaded(Session&, layer_id);
///   void on_end_batch(Session&);
///   void append_notes(std::vector<std::string>& report_lines) const;
///   void on_attach(const Session&) const;   // once, from the constructor; may throw to refuse
/// ```
/// `drop_masks[t]` bit i set = the extension asks the host to skip slot i of
/// token t's routing; the host reads them with `drop_mask(t)` after `routed`.
template <class... P, class... X>
class session<predictor_set<P...>, X...> {
  static_assert(sizeof...(P) > 0, "session: give at least one predictor");
  static_assert(((is_history_predictor_v<P> || is_gate_predictor_v<P>)&&...),
                "session: every predictor must satisfy the predictor contract "
                "(predict/contract.hpp)");

 public:
  static constexpr std::size_t n_predictors = sizeof...(P);
  static constexpr bool has_gate_predictor = (is_gate_predictor_v<P> || ...);

  /// Predictors and extensions default-constructed. Throws `error` on a bad shape.
  explicit session(model_shape shape, session_options options = {})
      : session(std::move(shape), options, std::tuple<P...>{}, std::tuple<X...>{}) {}

  /// Predictors (and extensions) given, e.g. a configured frequency_predictor.
  session(model_shape shape, session_options options, std::tuple<P...> predictors, std::tuple<X...> extensions = {})
      : shape_(std::move(shape)),
        options_(options),
        bank_(shape_),
        predictors_(std::move(predictors)),
        extensions_(std::move(extensions)),
        scorer_({P::label()...}, shape_.n_layers(), options.scoring) {
    static_assert((detail::check_session_extension<X, session>() && ...), "session: extension contract");
    std::apply([this](auto&... p) { (p.reset(shape_), ...); }, predictors_);
    for (std::size_t i = 0; i < n_predictors; ++i) {
      board_[i].assign(shape_.n_layers(), ranking{});
      stamp_[i].assign(shape_.n_layers(), 0);
    }
    layer_state_.assign(shape_.n_layers(), 0);
    const std::size_t reserved = options_.max_batch_tokens ? options_.max_batch_tokens : 1;
    buffer_.resize(reserved);
    drop_masks_.assign(reserved, 0);
    gate_required_ = options_.gate_inputs == gate_input_requirement::required ||
                     (options_.gate_inputs == gate_input_requirement::automatic && has_gate_predictor);
    for_each_extension_const([&](const auto& x) {
      if constexpr (has_on_attach<decltype(x)>::value) x.on_attach(*this);
    });
  }

  // ---- configuration ------------------------------------------------------

  /// Describes MoE layer l's router: a view of the dense weight (never
  /// copied; keep it alive) and its selection rule. Layers without one are
  /// not ranked by gate predictors. Throws `error` (see router_bank::set).
  void set_router(layer_id l, const matrix_view& w, router_spec spec) { bank_.set(l, w, std::move(spec)); }
  const router_bank& routers() const noexcept { return bank_; }
  const model_shape& shape() const noexcept { return shape_; }
  const session_options& options() const noexcept { return options_; }

  /// The type of predictor I.
  template <std::size_t I>
  using predictor_type = std::tuple_element_t<I, std::tuple<P...>>;
  template <std::size_t I>
  auto& predictor() noexcept {
    return std::get<I>(predictors_);
  }
  template <std::size_t I>
  const auto& predictor() const noexcept {
    return std::get<I>(predictors_);
  }
  template <std::size_t I>
  auto& extension() noexcept {
    return std::get<I>(extensions_);
  }
  template <std::size_t I>
  const auto& extension() const noexcept {
    return std::get<I>(extensions_);
  }

  // ---- events ---------------------------------------------------------------

  /// A token boundary: a batch of `n_tokens` tokens starting at position
  /// `first_token` begins (decode: one token). Ends the previous batch first;
  /// a token boundary mid-layer found there belongs to that batch (see
  /// close_batch). Returns false when this batch did not begin (0 tokens).
  /// A batch larger than every earlier one (and than max_batch_tokens)
  /// allocates once.
  bool begin_batch(run_phase phase, std::uint32_t first_token, std::size_t n_tokens = 1) {
    // A mid-layer boundary of the previous batch: with count it is counted
    // and this batch begins; with throw_error close_batch throws, the previous
    // batch stays current and this one does not begin (calling begin_batch
    // again reports the next such layer, or begins the batch).
    if (in_batch_) {
      close_batch("begin_batch");
      in_batch_ = false;  // ended even if this batch is refused below
    }
    if (n_tokens == 0)
      return anomaly(anomaly_kind::bad_batch,
                     [] { return std::string("session: begin_batch: 0 tokens; expected >= 1"); });
    // Positions are 32-bit: a batch that would pass 2^32 - 1 is refused, not
    // wrapped to 0 (its tokens would be reported at the wrong positions).
    if (n_tokens - 1 > static_cast<std::size_t>(std::numeric_limits<std::uint32_t>::max() - first_token))
      return anomaly(anomaly_kind::position_overflow, [&] {
        return "session: begin_batch: " + std::to_string(n_tokens) + " tokens from position " +
               std::to_string(first_token) +
               " pass 2^32 - 1; expected the last position to fit in 32 bits "
               "(start a new sequence at 0)";
      });
    in_batch_ = true;
    phase_ = phase;
    first_token_ = first_token;
    n_tokens_ = n_tokens;
    ++serial_;
    std::memset(layer_state_.data(), 0, layer_state_.size());
    // The session's only growth after construction (see max_batch_tokens).
    if (buffer_.size() < n_tokens) buffer_.resize(n_tokens);
    if (drop_masks_.size() < n_tokens) drop_masks_.resize(n_tokens);
    std::fill(drop_masks_.begin(), drop_masks_.begin() + static_cast<std::ptrdiff_t>(n_tokens), 0u);
    if (phase == run_phase::decode) decode_tokens_ += n_tokens;
    else prefill_tokens_ += n_tokens;
    for_each_extension([&](auto& x) {
      if constexpr (has_on_begin_batch<decltype(x)>::value) x.on_begin_batch(*this, phase, first_token, n_tokens);
    });
    return true;
  }

  /// The same, from the event's record (events.hpp).
  bool begin_batch(const batch_info& b) { return begin_batch(b.phase, b.first_position, b.n_tokens); }

  /// Ends the current batch (optional: the next begin_batch ends it too).
  bool end_batch() {
    if (!in_batch_)
      return anomaly(anomaly_kind::no_batch, [] { return std::string("session: end_batch: no batch has begun"); });
    const bool ok = close_batch("end_batch");
    in_batch_ = false;
    return ok;
  }

  /// The gate input of MoE layer l for every token of the batch.
  bool gate_input(layer_id l, const gate_input_view& g) {
    if (!check_layer(l, "gate_input")) return false;
    std::uint8_t& st = layer_state_[to_index(l)];
    if (st & gate_seen)
      return anomaly(anomaly_kind::duplicate_gate_input,
                     [&] { return where(l) + "gate_input: a second gate input for this layer in one batch"; });
    const std::size_t stride = g.row_stride_bytes ? g.row_stride_bytes : g.length * sizeof(float);
    if (!check_gate_input_shape(l, g, stride)) return false;
    st |= gate_seen;
    if (options_.check_gate_inputs && !check_gate_input_finite(l, g, stride)) return false;
    st |= gate_ok;
    if (n_tokens_ == 1 && g.n_tokens == 1 && scorer_.scores_phase(phase_)) predict_from_gate(l, g.data);
    for_each_extension([&](auto& x) {
      if constexpr (has_on_gate_input<decltype(x)>::value) x.on_gate_input(*this, l, g);
    });
    return true;
  }
  /// One token's gate input (`length` floats).
  bool gate_input(layer_id l, const float* x, std::size_t length) {
    return gate_input(l, gate_input_view{x, length, 1, 0});
  }
  /// A batch's gate inputs, row t at x + t·row_stride_bytes.
  bool gate_input(layer_id l, const float* x, std::size_t length, std::size_t n_tokens, std::size_t row_stride_bytes) {
    return gate_input(l, gate_input_view{x, length, n_tokens, row_stride_bytes});
  }

  /// What MoE layer l routed for the batch's tokens (token-major). Each
  /// routing's layer must be l; phase and token come from the batch. A
  /// prefill layer may give only the batch's last rows (see batch_size_ok).
  bool routed(layer_id l, span<const routing> routings) {
    if (!check_routing_event(l, routings.size())) return false;
    const std::size_t n = routings.size();
    for (std::size_t t = 0; t < n; ++t) {
      if (routings[t].layer != l)
        return anomaly(anomaly_kind::routing_shape, [&] {
          return where(l) + "routed: token " + std::to_string(token_of_row(n, t)) + " carries layer " +
                 std::to_string(to_index(routings[t].layer)) + "; expected the event's layer";
        });
      buffer_[t] = routings[t];
    }
    return accept_routings(l, n, nullptr);
  }
  /// One token's routing (its layer field names the layer).
  bool routed(const routing& r) { return routed(r.layer, span<const routing>(&r, 1)); }
  /// One token's routing as ids (rank order) and weights (may be null). A
  /// routing wider than 32 is declined (counted, not scored).
  bool routed(layer_id l, const expert_id* ids, const float* weights, std::size_t k);
  /// A batch of routings as the engine stores them (see routing_batch_view).
  bool routed(layer_id l, const routing_batch_view& b);

  /// Layer l's demanded experts are loaded (the point where a read scheduler
  /// may start speculating on later layers).
  bool layer_loaded(layer_id l) {
    if (!check_layer(l, "layer_loaded")) return false;
    std::uint8_t& st = layer_state_[to_index(l)];
    if (!(st & routed_seen))
      return anomaly(anomaly_kind::loaded_without_routing,
                     [&] { return where(l) + "layer_loaded: the layer's routing has not arrived"; });
    st |= loaded_seen;
    for_each_extension([&](auto& x) {
      if constexpr (has_on_layer_loaded<decltype(x)>::value) x.on_layer_loaded(*this, l);
    });
    return true;
  }

  // ---- state for extensions and hosts ----------------------------------------

  bool in_batch() const noexcept { return in_batch_; }
  run_phase phase() const noexcept { return phase_; }
  std::uint32_t first_token() const noexcept { return first_token_; }
  std::size_t batch_tokens() const noexcept { return n_tokens_; }
  /// Slots of token t's last routing an extension asked to skip (bit i = slot i).
  std::uint32_t drop_mask(std::size_t t = 0) const noexcept { return t < drop_masks_.size() ? drop_masks_[t] : 0u; }

  /// Predictor I's ranking of MoE layer `target` for the current one-token
  /// batch, or null when it cannot rank it (yet). A gate predictor's ranking
  /// exists once the gate input `horizon` MoE layers earlier arrived; a
  /// history predictor ranks on demand. noexcept, allocation-free.
  template <std::size_t I>
  const ranking* prediction(layer_id target) noexcept;

  // ---- results ----------------------------------------------------------------

  const anomaly_counts& anomalies() const noexcept { return anomalies_; }
  /// Decode routings in batches of more than one token (accepted, not scored).
  std::uint64_t unscored_batched() const noexcept { return unscored_batched_; }
  std::uint64_t decode_tokens() const noexcept { return decode_tokens_; }
  std::uint64_t prefill_tokens() const noexcept { return prefill_tokens_; }
  const slot_overlap_scorer& scorer() const noexcept { return scorer_; }

  /// The scorer's report plus the session's own lines (anomalies, unscored
  /// batches) and the extensions' notes.
  prediction_report report() const {
    prediction_report r = scorer_.report();
    detail::append_session_notes(r.notes, anomalies_, unscored_batched_);
    for_each_extension_const([&](const auto& x) {
      if constexpr (has_append_notes<decltype(x)>::value) x.append_notes(r.notes);
    });
    return r;
  }

 private:
  enum : std::uint8_t { gate_seen = 1, gate_ok = 2, routed_seen = 4, loaded_seen = 8 };

  // Extension hook detection (session/extension_hooks.hpp).
  template <class T>
  using has_on_begin_batch = detail::session_has_on_begin_batch<T, session>;
  template <class T>
  using has_on_gate_input = detail::session_has_on_gate_input<T, session>;
  template <class T>
  using has_on_routed = detail::session_has_on_routed<T, session>;
  template <class T>
  using has_on_layer_loaded = detail::session_has_on_layer_loaded<T, session>;
  template <class T>
  using has_on_end_batch = detail::session_has_on_end_batch<T, session>;
  template <class T>
  using has_on_attach = detail::session_has_on_attach<T, session>;
  template <class T>
  using has_append_notes = detail::session_has_append_notes<T>;

  template <class F>
  void for_each_extension(F&& f) {
    std::apply([&](auto&... x) { (f(x), ...); }, extensions_);
  }
  template <class F>
  void for_each_extension_const(F&& f) const {
    std::apply([&](const auto&... x) { (f(x), ...); }, extensions_);
  }

  static const float* row(const float* base, std::size_t t, std::size_t stride_bytes) noexcept {
    return reinterpret_cast<const float*>(reinterpret_cast<const unsigned char*>(base) + t * stride_bytes);
  }

  // Position of row t of a layer event that carries n rows: a prefill layer
  // may see only the batch's last n tokens (batch_size_ok), so its row 0 is
  // token first_token_ + n_tokens_ - n. Call only after batch_size_ok(n).
  std::uint32_t token_of_row(std::size_t n, std::size_t t) const noexcept {
    return first_token_ + static_cast<std::uint32_t>(n_tokens_ - n + t);
  }

  // ---- event checks (defined in session/checks.hpp) ---------------------------
  // Each returns true when the event may go on, else raises the anomaly
  // (throws or counts it: see anomaly) and returns false.

  template <class Message>
  bool anomaly(anomaly_kind k, Message&& message);
  std::string where(layer_id l) const;
  static std::string describe(const gate_input_view& g, std::size_t stride);
  bool check_layer(layer_id l, const char* event);
  bool batch_size_ok(std::size_t n) const noexcept;
  bool check_routing_event(layer_id l, std::size_t n_tokens);
  bool check_gate_input_shape(layer_id l, const gate_input_view& g, std::size_t stride);
  bool check_gate_input_finite(layer_id l, const gate_input_view& g, std::size_t stride);
  bool check_routing(layer_id l, const routing& r);

  // Ends the batch: a layer with a gate input but no routing is a token
  // boundary mid-layer. Each such layer is reported once; in throw mode the
  // first one throws before the extensions' on_end_batch, so the batch stays
  // open and a second call reports the next layer or ends it.
  bool close_batch(const char* event) {
    bool ok = true;
    for (std::size_t l = 0; l < layer_state_.size(); ++l) {
      if ((layer_state_[l] & gate_seen) && !(layer_state_[l] & routed_seen)) {
        layer_state_[l] |= routed_seen;  // report each layer once
        const layer_id lid = layer_id(static_cast<std::uint16_t>(l));
        ok = anomaly(anomaly_kind::token_boundary_mid_layer,
                     [&] { return where(lid) + event + ": the layer's gate input came but its routing did not"; }) &&
             ok;
      }
    }
    for_each_extension([&](auto& x) {
      if constexpr (has_on_end_batch<decltype(x)>::value) x.on_end_batch(*this);
    });
    return ok;
  }

  // ---- the predictors' calls (defined in session/predictions.hpp) ---------------

  // Each gate predictor ranks the MoE layer `horizon` ahead of `source` from its gate input.
  template <std::size_t I>
  void predict_one_from_gate(layer_id source, const float* x) noexcept;
  template <std::size_t... I>
  void predict_from_gate_impl(layer_id source, const float* x, std::index_sequence<I...>) noexcept;
  void predict_from_gate(layer_id source, const float* x) noexcept;
  /// Predictor I's ranking of layer l for the routing being scored.
  template <std::size_t I>
  const ranking* gathered(layer_id l) noexcept;

  // buffer_[0, n) holds the routings; begin_batch sized buffer_ and
  // drop_masks_ for the batch, and check_routing_event bounded n by it.
  bool accept_routings(layer_id l, std::size_t n, const bool* declined) {
    MOE_RESIDENCY_ASSERT(n <= buffer_.size() && n <= drop_masks_.size());
    const std::size_t li = to_index(l);
    if (declined) {
      for (std::size_t t = 0; t < n; ++t) scorer_.decline(l, phase_);
      layer_state_[li] |= routed_seen;
      return true;
    }
    for (std::size_t t = 0; t < n; ++t) {
      routing& r = buffer_[t];
      r.phase = phase_;
      r.token = token_of_row(n, t);
      if (!check_routing(l, r)) return false;
    }
    layer_state_[li] |= routed_seen;
    if (scorer_.scores_phase(phase_)) {
      if (n == 1) {
        detail::score_predictions<P...>(scorer_, buffer_[0], ptrs_,
                                        [&](auto i) { return gathered<decltype(i)::value>(l); });
      } else {
        unscored_batched_ += n;
      }
    } else {
      scorer_.ignore_phase(n);
    }
    // Each layer's drop decisions start clean: a mask must never carry over
    // from the previous layer of the same batch.
    std::fill(drop_masks_.begin(), drop_masks_.begin() + static_cast<std::ptrdiff_t>(n), 0u);
    for_each_extension([&](auto& x) {
      if constexpr (has_on_routed<decltype(x)>::value)
        x.on_routed(*this, l, span<const routing>(buffer_.data(), n), span<std::uint32_t>(drop_masks_.data(), n));
    });
    std::apply([&](auto&... p) { detail::observe_routings(span<const routing>(buffer_.data(), n), p...); },
               predictors_);
    return true;
  }

  model_shape shape_;
  session_options options_;
  router_bank bank_;
  std::tuple<P...> predictors_;
  std::tuple<X...> extensions_;
  slot_overlap_scorer scorer_;
  bool gate_required_ = false;

  std::array<std::vector<ranking>, sizeof...(P)> board_;
  std::array<std::vector<std::uint64_t>, sizeof...(P)> stamp_;
  std::array<const ranking*, sizeof...(P)> ptrs_{};

  bool in_batch_ = false;
  run_phase phase_ = run_phase::decode;
  std::uint32_t first_token_ = 0;
  std::size_t n_tokens_ = 0;
  std::uint64_t serial_ = 0;
  std::vector<std::uint8_t> layer_state_;
  std::vector<routing> buffer_;
  std::vector<std::uint32_t> drop_masks_;

  anomaly_counts anomalies_;
  std::uint64_t unscored_batched_ = 0;
  std::uint64_t decode_tokens_ = 0;
  std::uint64_t prefill_tokens_ = 0;
};

/// The session of the demo and the published measurement: stale-gate,
/// prev-token and the fresh-gate control, in report order.
using standard_session = session<predictor_set<stale_gate_predictor, prev_token_predictor, fresh_gate_control>>;

}  // namespace moe_residency

// The member definitions kept beside the class (each of these includes this
// header too, so including any one of them gives the whole session).
#include "moe_residency/session/checks.hpp"
#include "moe_residency/session/predictions.hpp"
#include "moe_residency/session/routing_layouts.hpp"
