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
/// Why this header is long: the session class is one state machine. Its
/// event checks (order, shape, NaN, duplicates), the predictors' calls and
/// the extensions' hooks run in an order that is its contract: a routing is
/// checked before it is scored, scored before any extension sees it, and an
/// anomaly loses nothing already accounted. Split across headers, that order
/// could not be read in one place.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/detail/format.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/predict.hpp"
#include "moe_residency/predict/router_bank.hpp"
#include "moe_residency/router.hpp"
#include "moe_residency/score.hpp"
#include "moe_residency/session_hook.hpp"
#include "moe_residency/session_types.hpp"

namespace moe_residency {

/// A session owning predictors P... and extensions X....
///
/// Extensions (issue 5's cache, drop policy, planner, scheduler; a trace
/// recorder) receive the events after the session checked them, through the
/// members they declare in `static constexpr session_hook hooks` (checked at
/// compile time: see session_hook):
/// ```
///   void on_begin_batch(Session&, run_phase, std::uint32_t first_token, std::size_t n_tokens);
///   void on_gate_input(Session&, layer_id, const gate_input_view&);
///   void on_routings(Session&, layer_id, span<const routing>, span<std::uint32_t> drop_masks);
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
    static_assert((check_extension<X>() && ...), "session: extension contract");
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
    if (!g.data || g.length == 0 || !batch_size_ok(g.n_tokens) || stride < g.length * sizeof(float) ||
        stride % sizeof(float) != 0 || (bank_.n_embd() != 0 && g.length != bank_.n_embd()))
      return anomaly(anomaly_kind::gate_input_shape, [&] {
        return where(l) + "gate_input: " + describe(g, stride) + "; expected " + std::to_string(n_tokens_) +
               " token(s)" +
               (phase_ == run_phase::prefill && n_tokens_ > 1
                    ? " (or the batch's last 1.." + std::to_string(n_tokens_) + ")"
                    : std::string()) +
               " of " + (bank_.n_embd() ? std::to_string(bank_.n_embd()) : std::string("> 0")) +
               " floats, stride >= a row, non-null data";
      });
    st |= gate_seen;
    if (options_.check_gate_inputs) {
      for (std::size_t t = 0; t < g.n_tokens; ++t) {
        const float* x = row(g.data, t, stride);
        for (std::size_t i = 0; i < g.length; ++i)
          if (!std::isfinite(x[i]))
            return anomaly(anomaly_kind::nan_gate_input, [&] {
              return where(l) + "gate_input: token " + std::to_string(token_of_row(g.n_tokens, t)) + " element " +
                     std::to_string(i) + " is " + detail::format_number(x[i]) + "; expected a finite value";
            });
      }
    }
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
  bool routed(layer_id l, const expert_id* ids, const float* weights, std::size_t k) {
    if (!check_routing_event(l, 1)) return false;
    if (!ids)
      return anomaly(anomaly_kind::routing_shape, [&] { return where(l) + "routed: ids is null; expected k ids"; });
    if (k == 0)
      return anomaly(anomaly_kind::routing_shape, [&] { return where(l) + "routed: k is 0; expected k >= 1"; });
    bool declined = false;
    if (k > max_top_k) {
      declined = true;
    } else {
      buffer_[0].assign(ids, weights, k);
      buffer_[0].layer = l;
    }
    return accept_routings(l, 1, declined ? &declined : nullptr);
  }
  /// A batch of routings as the engine stores them (see routing_batch_view).
  bool routed(layer_id l, const routing_batch_view& b) {
    if (!check_routing_event(l, b.n_tokens)) return false;
    if (!b.ids)
      return anomaly(anomaly_kind::routing_shape,
                     [&] { return where(l) + "routed: routing_batch_view::ids is null; expected k ids per token"; });
    if (b.k == 0)
      return anomaly(anomaly_kind::routing_shape,
                     [&] { return where(l) + "routed: routing_batch_view::k is 0; expected k >= 1"; });
    const std::size_t is = b.ids_row_stride_bytes ? b.ids_row_stride_bytes : b.k * 4;
    const std::size_t ws = b.weights_row_stride_bytes ? b.weights_row_stride_bytes : b.k * 4;
    if (is < b.k * 4 || is % 4)
      return anomaly(anomaly_kind::routing_shape, [&] {
        return where(l) + "routed: ids_row_stride_bytes " + std::to_string(is) + " for k " + std::to_string(b.k) +
               "; expected a multiple of 4 >= k * 4 = " + std::to_string(b.k * 4) + " (or 0 = packed)";
      });
    if (b.weights && (ws < b.k * 4 || ws % 4))
      return anomaly(anomaly_kind::routing_shape, [&] {
        return where(l) + "routed: weights_row_stride_bytes " + std::to_string(ws) + " for k " + std::to_string(b.k) +
               "; expected a multiple of 4 >= k * 4 = " + std::to_string(b.k * 4) + " (or 0 = packed)";
      });
    const std::size_t n = b.n_tokens;
    if (b.k > max_top_k) {
      bool declined = true;
      return accept_routings(l, n, &declined);
    }
    for (std::size_t t = 0; t < n; ++t) {
      const auto* ids = reinterpret_cast<const std::int32_t*>(reinterpret_cast<const unsigned char*>(b.ids) + t * is);
      const float* w = b.weights ? row(b.weights, t, ws) : nullptr;
      routing& r = buffer_[t];
      r.clear();
      r.layer = l;
      for (std::size_t i = 0; i < b.k; ++i) {
        if (ids[i] < 0 || static_cast<std::size_t>(ids[i]) >= shape_.n_experts())
          return anomaly(anomaly_kind::expert_out_of_range, [&] {
            return where(l) + "routed: token " + std::to_string(token_of_row(n, t)) + " slot " + std::to_string(i) +
                   ": expert " + std::to_string(ids[i]) + " out of range [0, " + std::to_string(shape_.n_experts()) +
                   ")";
          });
        r.push_back(expert_id(static_cast<std::uint16_t>(ids[i])), w ? w[i] : std::numeric_limits<float>::quiet_NaN());
      }
    }
    return accept_routings(l, n, nullptr);
  }

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
  const ranking* prediction(layer_id target) noexcept {
    using PI = std::tuple_element_t<I, std::tuple<P...>>;
    const std::size_t l = to_index(target);
    if (!in_batch_ || n_tokens_ != 1 || l >= shape_.n_layers()) return nullptr;
    if (stamp_[I][l] == serial_) return &board_[I][l];
    if constexpr (is_history_predictor_v<PI>) {
      if (std::get<I>(predictors_).predict(target, board_[I][l])) {
        stamp_[I][l] = serial_;
        return &board_[I][l];
      }
    }
    return nullptr;
  }

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
    if (anomalies_.total()) {
      std::string s = std::to_string(anomalies_.total()) + " anomalies ignored (";
      bool first = true;
      for (std::size_t k = 0; k < anomaly_kind_count; ++k) {
        if (!anomalies_.by_kind[k]) continue;
        s +=
            (first ? "" : ", ") + std::to_string(anomalies_.by_kind[k]) + " " + to_string(static_cast<anomaly_kind>(k));
        first = false;
      }
      s += "); first: " + anomalies_.first_message;
      r.notes.push_back(std::move(s));
    }
    if (unscored_batched_)
      r.notes.push_back(std::to_string(unscored_batched_) +
                        " decode routings came in multi-token batches and were not scored");
    for_each_extension_const([&](const auto& x) {
      if constexpr (has_append_notes<decltype(x)>::value) x.append_notes(r.notes);
    });
    return r;
  }

 private:
  enum : std::uint8_t { gate_seen = 1, gate_ok = 2, routed_seen = 4, loaded_seen = 8 };

  // Extension hook detection.
  template <class T, class = void>
  struct has_on_begin_batch : std::false_type {};
  template <class T>
  struct has_on_begin_batch<T, std::void_t<decltype(std::declval<T>().on_begin_batch(
                                   std::declval<session&>(), run_phase{}, std::uint32_t{}, std::size_t{}))>>
      : std::true_type {};
  template <class T, class = void>
  struct has_on_gate_input : std::false_type {};
  template <class T>
  struct has_on_gate_input<T, std::void_t<decltype(std::declval<T>().on_gate_input(
                                  std::declval<session&>(), layer_id{}, std::declval<const gate_input_view&>()))>>
      : std::true_type {};
  template <class T, class = void>
  struct has_on_routings : std::false_type {};
  template <class T>
  struct has_on_routings<T, std::void_t<decltype(std::declval<T>().on_routings(
                                std::declval<session&>(), layer_id{}, span<const routing>{}, span<std::uint32_t>{}))>>
      : std::true_type {};
  template <class T, class = void>
  struct has_on_layer_loaded : std::false_type {};
  template <class T>
  struct has_on_layer_loaded<
      T, std::void_t<decltype(std::declval<T>().on_layer_loaded(std::declval<session&>(), layer_id{}))>>
      : std::true_type {};
  template <class T, class = void>
  struct has_on_end_batch : std::false_type {};
  template <class T>
  struct has_on_end_batch<T, std::void_t<decltype(std::declval<T>().on_end_batch(std::declval<session&>()))>>
      : std::true_type {};
  template <class T, class = void>
  struct has_on_attach : std::false_type {};
  template <class T>
  struct has_on_attach<T, std::void_t<decltype(std::declval<T>().on_attach(std::declval<const session&>()))>>
      : std::true_type {};
  template <class T, class = void>
  struct has_append_notes : std::false_type {};
  template <class T>
  struct has_append_notes<
      T, std::void_t<decltype(std::declval<T>().append_notes(std::declval<std::vector<std::string>&>()))>>
      : std::true_type {};

  template <class T, class = void>
  struct declares_hooks : std::false_type {};
  template <class T>
  struct declares_hooks<T, std::void_t<decltype(T::hooks)>>
      : std::is_same<std::remove_cv_t<decltype(T::hooks)>, session_hook> {};

  // One static_assert per hook: declared <=> callable with the exact arguments.
  template <class Ext>
  static constexpr bool check_extension() {
    static_assert(declares_hooks<Ext>::value,
                  "session: an extension must declare the hooks it implements, e.g. "
                  "`static constexpr session_hook hooks = session_hook::routings | session_hook::layer_loaded;` "
                  "(session_hook::none for none), so that a misspelt or mistyped hook does not compile");
    if constexpr (declares_hooks<Ext>::value) {
      constexpr session_hook h = Ext::hooks;
      static_assert(declares_hook(h, session_hook::begin_batch) == has_on_begin_batch<Ext&>::value,
                    "session: an extension's hooks and its members disagree on session_hook::begin_batch: "
                    "expected on_begin_batch(Session&, run_phase, std::uint32_t, std::size_t) exactly when "
                    "declared (misspelt or mistyped hook?)");
      static_assert(declares_hook(h, session_hook::gate_input) == has_on_gate_input<Ext&>::value,
                    "session: an extension's hooks and its members disagree on session_hook::gate_input: "
                    "expected on_gate_input(Session&, layer_id, const gate_input_view&) exactly when "
                    "declared (misspelt or mistyped hook?)");
      static_assert(declares_hook(h, session_hook::routings) == has_on_routings<Ext&>::value,
                    "session: an extension's hooks and its members disagree on session_hook::routings: "
                    "expected on_routings(Session&, layer_id, span<const routing>, span<std::uint32_t>) "
                    "exactly when declared (misspelt or mistyped hook?)");
      static_assert(declares_hook(h, session_hook::layer_loaded) == has_on_layer_loaded<Ext&>::value,
                    "session: an extension's hooks and its members disagree on session_hook::layer_loaded: "
                    "expected on_layer_loaded(Session&, layer_id) exactly when declared (misspelt or "
                    "mistyped hook?)");
      static_assert(declares_hook(h, session_hook::end_batch) == has_on_end_batch<Ext&>::value,
                    "session: an extension's hooks and its members disagree on session_hook::end_batch: "
                    "expected on_end_batch(Session&) exactly when declared (misspelt or mistyped hook?)");
      static_assert(declares_hook(h, session_hook::attach) == has_on_attach<const Ext&>::value,
                    "session: an extension's hooks and its members disagree on session_hook::attach: "
                    "expected on_attach(const Session&) const exactly when declared (misspelt or "
                    "mistyped hook?)");
      static_assert(declares_hook(h, session_hook::append_notes) == has_append_notes<const Ext&>::value,
                    "session: an extension's hooks and its members disagree on session_hook::append_notes: "
                    "expected append_notes(std::vector<std::string>&) const exactly when declared "
                    "(misspelt or mistyped hook?)");
    }
    return true;
  }

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

  std::string where(layer_id l) const {
    std::string s = "session: " + std::string(to_string(phase_)) + " token";
    if (n_tokens_ > 1)
      s += "s " + std::to_string(first_token_) + ".." + std::to_string(token_of_row(n_tokens_, n_tokens_ - 1));
    else s += " " + std::to_string(first_token_);
    return s + " layer " + std::to_string(to_index(l)) + ": ";
  }
  static std::string describe(const gate_input_view& g, std::size_t stride) {
    return std::string(g.data ? "" : "null data, ") + std::to_string(g.n_tokens) + " token(s) of " +
           std::to_string(g.length) + " floats, stride " + std::to_string(stride) + " bytes";
  }

  // `message()` builds the anomaly's text. It runs only to throw, or to keep
  // the first counted anomaly's text: counting allocates nothing afterwards,
  // an engine repeating an anomaly every token stays allocation-free, and
  // count mode never throws (a message that cannot be built is not kept, and
  // the next anomaly tries again).
  template <class Message>
  bool anomaly(anomaly_kind k, Message&& message) {
    if (options_.on_anomaly == anomaly_action::throw_error) throw error(message());
    ++anomalies_.by_kind[static_cast<std::size_t>(k)];
    if (anomalies_.first_message.empty()) {
      try {
        anomalies_.first_message = message();
      } catch (...) {  // bad_alloc: the count stands, the text is lost
      }
    }
    return false;
  }

  bool check_layer(layer_id l, const char* event) {
    if (!in_batch_)
      return anomaly(anomaly_kind::no_batch, [&] {
        return std::string("session: ") + event + "(layer " + std::to_string(to_index(l)) +
               "): no batch has begun; call begin_batch first";
      });
    if (to_index(l) >= shape_.n_layers())
      return anomaly(anomaly_kind::layer_out_of_range, [&] {
        return where(l) + event + ": layer out of range [0, " + std::to_string(shape_.n_layers()) + ")";
      });
    if (!shape_.is_moe(l))
      return anomaly(anomaly_kind::dense_layer,
                     [&] { return where(l) + event + ": the layer is dense in model '" + shape_.name() + "'"; });
    return true;
  }

  // A batch's event covers every token, except that a prefill batch's layer
  // may see only its last rows (llama.cpp computes the last layer of a prompt
  // for the output rows only): those are the batch's last n tokens.
  bool batch_size_ok(std::size_t n) const noexcept {
    return n == n_tokens_ || (phase_ == run_phase::prefill && n >= 1 && n < n_tokens_);
  }

  bool check_routing_event(layer_id l, std::size_t n_tokens) {
    if (!check_layer(l, "routed")) return false;
    const std::uint8_t st = layer_state_[to_index(l)];
    if (st & routed_seen)
      return anomaly(anomaly_kind::duplicate_routing,
                     [&] { return where(l) + "routed: a second routing for this layer in one batch"; });
    if (!batch_size_ok(n_tokens))
      return anomaly(anomaly_kind::routing_shape, [&] {
        return where(l) + "routed: " + std::to_string(n_tokens) + " token(s); expected the batch's " +
               std::to_string(n_tokens_) +
               (phase_ == run_phase::prefill && n_tokens_ > 1 ? " (or its last 1.." + std::to_string(n_tokens_) + ")"
                                                              : std::string());
      });
    if (gate_required_ && !(st & gate_seen))
      return anomaly(anomaly_kind::routing_without_gate_input, [&] {
        return where(l) +
               "routed: the layer's gate input never came; expected "
               "gate_input before routed";
      });
    return true;
  }

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

  template <std::size_t I>
  void predict_one_from_gate(layer_id source, const float* x) noexcept {
    using PI = std::tuple_element_t<I, std::tuple<P...>>;
    if constexpr (is_gate_predictor_v<PI>) {
      layer_id target{};
      if (!moe_layer_ahead(shape_, source, PI::horizon, target)) return;
      const std::size_t t = to_index(target);
      if (std::get<I>(predictors_).predict(bank_, source, target, x, board_[I][t])) stamp_[I][t] = serial_;
    }
  }
  template <std::size_t... I>
  void predict_from_gate_impl(layer_id source, const float* x, std::index_sequence<I...>) noexcept {
    (predict_one_from_gate<I>(source, x), ...);
  }
  void predict_from_gate(layer_id source, const float* x) noexcept {
    predict_from_gate_impl(source, x, std::index_sequence_for<P...>{});
  }

  /// Predictor I's ranking of layer l for the routing being scored.
  template <std::size_t I>
  const ranking* gathered(layer_id l) noexcept {
    using PI = std::tuple_element_t<I, std::tuple<P...>>;
    const std::size_t t = to_index(l);
    if constexpr (is_gate_predictor_v<PI>) {
      // Only a ranking made from this batch's gate input, and only when
      // this layer's own input was sound (a NaN input is no prediction).
      return stamp_[I][t] == serial_ ? &board_[I][t] : nullptr;
    } else {
      return prediction<I>(l);
    }
  }

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
      for (std::size_t i = 0; i < r.size(); ++i) {
        if (to_index(r.id(i)) >= shape_.n_experts())
          return anomaly(anomaly_kind::expert_out_of_range, [&] {
            return where(l) + "routed: token " + std::to_string(r.token) + " slot " + std::to_string(i) + ": expert " +
                   std::to_string(to_index(r.id(i))) + " out of range [0, " + std::to_string(shape_.n_experts()) + ")";
          });
        for (std::size_t j = 0; j < i; ++j)
          if (r.id(j) == r.id(i))
            return anomaly(anomaly_kind::duplicate_expert, [&] {
              return where(l) + "routed: token " + std::to_string(r.token) + ": expert " +
                     std::to_string(to_index(r.id(i))) + " in slots " + std::to_string(j) + " and " + std::to_string(i);
            });
      }
      if (r.empty())
        return anomaly(anomaly_kind::routing_shape,
                       [&] { return where(l) + "routed: token " + std::to_string(r.token) + ": an empty routing"; });
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
      if constexpr (has_on_routings<decltype(x)>::value)
        x.on_routings(*this, l, span<const routing>(buffer_.data(), n), span<std::uint32_t>(drop_masks_.data(), n));
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
