#pragma once
/// Predictors that need only routing history: previous token, running
/// frequency (with optional exponential decay), and a static hot list.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/predict/contract.hpp"
#include "moe_residency/score.hpp"

namespace moe_residency {

namespace detail {

/// Fills `out` with the experts of `counts` ranked by count (descending, then
/// by id ascending), at most `n`, only those with a positive count. `order` is
/// scratch of counts.size() entries. Allocation-free.
inline void predict_rank_counts(const float* counts, std::size_t n_experts, std::size_t n, std::uint16_t* order,
                                ranking& out) noexcept {
  out.clear();
  std::size_t m = 0;
  for (std::size_t e = 0; e < n_experts; ++e)
    if (counts[e] > 0.0f) order[m++] = static_cast<std::uint16_t>(e);
  const std::size_t take = std::min(n, m);
  auto better = [counts](std::uint16_t a, std::uint16_t b) {
    return counts[a] > counts[b] || (counts[a] == counts[b] && a < b);
  };
  std::partial_sort(order, order + take, order + m, better);
  for (std::size_t i = 0; i < take; ++i) out.push_back(expert_id(order[i]), counts[order[i]]);
}

}  // namespace detail

/// Options of `prev_token_predictor`.
struct prev_token_options {
  /// Also remember the last prefill token's routing, so the first decode token
  /// is predicted. Off by default: "the previous decode token", as published.
  bool include_prefill = false;
};

/// Predicts that layer l routes, for this token, what it routed for the
/// previous token. Ranks in the previous routing's rank order, with the
/// previous weights as predicted weights. Cannot rank a layer's first token.
class prev_token_predictor {
 public:
  static constexpr prediction_timing timing = prediction_timing::history;
  static constexpr bool tie_aware = false;
  static predictor_label label() { return {"prev-token", "prev-token", "prev", 7, false}; }

  prev_token_predictor() = default;
  explicit prev_token_predictor(prev_token_options o) : options_(o) {}

  void reset(const model_shape& shape) {
    last_.assign(shape.n_layers(), routing{});
    have_.assign(shape.n_layers(), 0);
  }
  bool predict(layer_id target, ranking& out) noexcept {
    const std::size_t l = to_index(target);
    out.clear();
    if (l >= have_.size() || !have_[l]) return false;
    const routing& r = last_[l];
    for (std::size_t i = 0; i < r.size(); ++i) out.push_back(r.id(i), static_cast<float>(r.size() - i), r.weight(i));
    return true;
  }
  void observe(const routing& r) noexcept {
    const std::size_t l = to_index(r.layer);
    if (l >= have_.size()) return;
    if (r.phase != run_phase::decode && !options_.include_prefill) return;
    last_[l] = r;
    have_[l] = 1;
  }

 private:
  prev_token_options options_;
  std::vector<routing> last_;
  std::vector<std::uint8_t> have_;
};

/// Options of `frequency_predictor`.
struct frequency_options {
  /// Per observed routing of a layer, that layer's counts are multiplied by
  /// `decay` before the routed experts get +1. 1 = plain running counts;
  /// must be in (0, 1].
  float decay = 1.0f;
  /// Count prefill routings too (off: only decode routings are counted).
  bool count_prefill = false;
  /// Experts ranked per prediction; 0 = the model's top-k. At most 32.
  std::size_t ranked = 0;
};

/// A per-layer hot list from running routing counts, optionally decayed
/// exponentially. Ranks by count (ties by lower id); no predicted weights
/// (NaN). Cannot rank a layer before its first counted routing.
class frequency_predictor {
 public:
  static constexpr prediction_timing timing = prediction_timing::history;
  static constexpr bool tie_aware = false;
  static predictor_label label() { return {"frequency", "frequency", "freq", 7, false}; }

  frequency_predictor() = default;
  /// Throws `error` when decay is outside (0, 1] or ranked > 32.
  explicit frequency_predictor(frequency_options o) : options_(o) { validate(); }

  const frequency_options& options() const noexcept { return options_; }

  void reset(const model_shape& shape) {
    validate();
    n_experts_ = shape.n_experts();
    ranked_ = options_.ranked ? options_.ranked : shape.top_k();
    counts_.assign(shape.n_layers() * n_experts_, 0.0f);
    seen_.assign(shape.n_layers(), 0);
    order_.assign(n_experts_, 0);
  }
  bool predict(layer_id target, ranking& out) noexcept {
    const std::size_t l = to_index(target);
    out.clear();
    if (l >= seen_.size() || !seen_[l]) return false;
    detail::predict_rank_counts(&counts_[l * n_experts_], n_experts_, ranked_, order_.data(), out);
    return !out.empty();
  }
  void observe(const routing& r) noexcept {
    const std::size_t l = to_index(r.layer);
    if (l >= seen_.size()) return;
    if (r.phase != run_phase::decode && !options_.count_prefill) return;
    float* c = &counts_[l * n_experts_];
    if (options_.decay != 1.0f) {
      // Counts of experts that stop being routed decay geometrically; flush
      // them to 0 before they turn subnormal (slow arithmetic on x86). Far
      // below any count that could still reach a top-k.
      for (std::size_t e = 0; e < n_experts_; ++e) {
        c[e] *= options_.decay;
        if (c[e] < 1e-30f) c[e] = 0.0f;
      }
    }
    for (std::size_t i = 0; i < r.size(); ++i)
      if (to_index(r.id(i)) < n_experts_) c[to_index(r.id(i))] += 1.0f;
    seen_[l] = 1;
  }
  /// The current (decayed) count of expert e on layer l.
  float count(layer_id l, expert_id e) const noexcept {
    const std::size_t i = to_index(l) * n_experts_ + to_index(e);
    return i < counts_.size() ? counts_[i] : 0.0f;
  }

 private:
  void validate() const {
    if (!(options_.decay > 0.0f && options_.decay <= 1.0f))
      throw error("frequency_predictor: decay " + std::to_string(options_.decay) + " out of range; expected (0, 1]");
    if (options_.ranked > max_top_k)
      throw error("frequency_predictor: ranked " + std::to_string(options_.ranked) + " exceeds " +
                  std::to_string(max_top_k));
  }

  frequency_options options_;
  std::size_t n_experts_ = 0;
  std::size_t ranked_ = 0;
  std::vector<float> counts_;
  std::vector<std::uint8_t> seen_;
  std::vector<std::uint16_t> order_;
};

/// The run's hottest experts per layer, counted over a whole recorded run
/// before scoring it (an oracle: it knows the future of the run it is scored
/// on). "Static hottest-k" in the engine authors' figures. Build it with
/// `from_routings`; cannot rank a layer with no counted routing.
class static_hot_list_predictor {
 public:
  static constexpr prediction_timing timing = prediction_timing::history;
  static constexpr bool tie_aware = false;
  static predictor_label label() { return {"static hottest-k", "static-hottest", "hot", 7, false}; }

  static_hot_list_predictor() = default;

  /// Counts the routings of `phase` per layer (ties by lower id) and keeps
  /// each layer's top `ranked` (0 = the model's top-k). Throws `error` on a
  /// routing whose layer or expert lies outside `shape`.
  static static_hot_list_predictor from_routings(const model_shape& shape, span<const routing> routings,
                                                 run_phase phase = run_phase::decode, std::size_t ranked = 0) {
    if (ranked > max_top_k)
      throw error("static_hot_list_predictor: ranked " + std::to_string(ranked) + " exceeds " +
                  std::to_string(max_top_k));
    const std::size_t n = shape.n_experts();
    std::vector<float> counts(shape.n_layers() * n, 0.0f);
    for (const routing& r : routings) {
      if (r.phase != phase) continue;
      if (to_index(r.layer) >= shape.n_layers())
        throw error("static_hot_list_predictor: layer " + std::to_string(to_index(r.layer)) + " out of range [0, " +
                    std::to_string(shape.n_layers()) + ")");
      for (std::size_t i = 0; i < r.size(); ++i) {
        if (to_index(r.id(i)) >= n)
          throw error("static_hot_list_predictor: expert " + std::to_string(to_index(r.id(i))) + " out of range [0, " +
                      std::to_string(n) + ")");
        counts[to_index(r.layer) * n + to_index(r.id(i))] += 1.0f;
      }
    }
    static_hot_list_predictor p;
    std::vector<std::uint16_t> order(n);
    p.lists_.resize(shape.n_layers());
    for (std::size_t l = 0; l < shape.n_layers(); ++l)
      detail::predict_rank_counts(&counts[l * n], n, ranked ? ranked : shape.top_k(), order.data(), p.lists_[l]);
    return p;
  }

  void reset(const model_shape& shape) {
    if (lists_.size() != shape.n_layers())
      throw error("static_hot_list_predictor: built for " + std::to_string(lists_.size()) + " layers, session has " +
                  std::to_string(shape.n_layers()) + "; build it with from_routings for this shape");
  }
  bool predict(layer_id target, ranking& out) noexcept {
    const std::size_t l = to_index(target);
    out.clear();
    if (l >= lists_.size() || lists_[l].empty()) return false;
    out = lists_[l];
    return true;
  }
  void observe(const routing&) noexcept {}
  /// Layer l's hot list (empty for a layer outside the shape or never routed).
  const ranking& hot_list(layer_id l) const noexcept {
    static const ranking none;
    return to_index(l) < lists_.size() ? lists_[to_index(l)] : none;
  }

 private:
  std::vector<ranking> lists_;
};

namespace detail {

template <class... P, class Rank, std::size_t... I>
void score_predictions_impl(slot_overlap_scorer& scorer, const routing& r,
                            std::array<const ranking*, sizeof...(P)>& ptrs, Rank& rank,
                            std::index_sequence<I...>) noexcept {
  static constexpr std::array<bool, sizeof...(P)> ties{P::tie_aware...};
  ((ptrs[I] = rank(std::integral_constant<std::size_t, I>{})), ...);
  scorer.record(r, span<const ranking* const>(ptrs.data(), ptrs.size()), span<const bool>(ties.data(), ties.size()));
}

/// The scoring rule the session and score_routings share, for one routing:
/// `rank(std::integral_constant<std::size_t, I>)` is predictor I's ranking of
/// r's layer (null when it has none); the scorer records them all against r,
/// each scored tie-aware as its predictor's `tie_aware` says.
template <class... P, class Rank>
void score_predictions(slot_overlap_scorer& scorer, const routing& r, std::array<const ranking*, sizeof...(P)>& ptrs,
                       Rank&& rank) noexcept {
  score_predictions_impl<P...>(scorer, r, ptrs, rank, std::index_sequence_for<P...>{});
}

/// Every predictor observes the routings, routing by routing (after they were scored).
template <class... P>
void observe_routings(span<const routing> routings, P&... predictors) noexcept {
  for (const routing& r : routings) (predictors.observe(r), ...);
}

}  // namespace detail

/// Scores history predictors on recorded routings, in order: for each
/// routing every predictor predicts, the scorer records, then every predictor
/// observes it: the session's rule (detail::score_predictions), so a trace
/// scores as the same routings fed to a session one token at a time.
/// `declined` (routings wider than 32 the reader set aside) is added to the
/// report. Predictors are reset to `shape` first. Throws `error` when a
/// routing's layer lies outside the shape.
template <class... P>
prediction_report score_routings(const model_shape& shape, span<const routing> routings, std::size_t declined,
                                 scorer_options options, P&... predictors) {
  static_assert(sizeof...(P) > 0, "score_routings: give at least one predictor");
  static_assert((is_history_predictor_v<P> && ...),
                "score_routings: only history predictors (they need no gate input)");
  slot_overlap_scorer scorer({P::label()...}, shape.n_layers(), options);
  (predictors.reset(shape), ...);
  std::array<ranking, sizeof...(P)> rankings{};
  std::array<const ranking*, sizeof...(P)> ptrs{};
  std::tuple<P&...> ps(predictors...);
  for (const routing& r : routings) {
    if (to_index(r.layer) >= shape.n_layers())
      throw error("score_routings: layer " + std::to_string(to_index(r.layer)) + " out of range [0, " +
                  std::to_string(shape.n_layers()) + ")");
    detail::score_predictions<P...>(scorer, r, ptrs, [&](auto i) -> const ranking* {
      constexpr std::size_t I = decltype(i)::value;
      return std::get<I>(ps).predict(r.layer, rankings[I]) ? &rankings[I] : nullptr;
    });
    detail::observe_routings(span<const routing>(&r, 1), predictors...);
  }
  scorer.add_declined(declined);
  return scorer.report();
}

/// The history predictors score_history_predictors knows, by name.
inline const char* history_predictor_names() noexcept { return "prev-token, frequency, static-hottest"; }

namespace detail {

struct history_score_inputs {
  const model_shape& shape;
  span<const routing> routings;
  std::size_t declined;
  scorer_options options;
  frequency_options frequency;
};

// Builds the named predictors one name at a time, so the set stays a
// compile-time composition (no virtual call per expert).
template <class... Chosen>
prediction_report score_named(const history_score_inputs& in, const std::vector<std::string>& names, std::size_t i,
                              Chosen&... chosen) {
  if constexpr (sizeof...(Chosen) < 3) {
    if (i < names.size()) {
      const std::string& n = names[i];
      if (n == "prev-token") {
        prev_token_predictor p;
        return score_named(in, names, i + 1, chosen..., p);
      }
      if (n == "frequency") {
        frequency_predictor p(in.frequency);
        return score_named(in, names, i + 1, chosen..., p);
      }
      if (n == "static-hottest") {
        // Counted over the scored phases of the whole run (an oracle, by definition).
        std::vector<routing> counted(in.routings.begin(), in.routings.end());
        if (in.options.score_prefill)
          for (auto& r : counted) r.phase = run_phase::decode;
        auto p = static_hot_list_predictor::from_routings(in.shape, span<const routing>(counted), run_phase::decode);
        return score_named(in, names, i + 1, chosen..., p);
      }
      throw error("predictors: unknown predictor '" + n + "'; expected " + history_predictor_names());
    }
  }
  if constexpr (sizeof...(Chosen) == 0) {
    throw error(std::string("predictors: none given; expected one or more of ") + history_predictor_names());
  } else {
    return score_routings(in.shape, in.routings, in.declined, in.options, chosen...);
  }
}

}  // namespace detail

/// Throws `error` ("predictors: ...") unless `names` lists 1 to 3 of
/// prev-token, frequency and static-hottest, each at most once.
inline void check_history_predictor_names(const std::vector<std::string>& names) {
  if (names.empty())
    throw error(std::string("predictors: none given; expected one or more of ") + history_predictor_names());
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (names[i] != "prev-token" && names[i] != "frequency" && names[i] != "static-hottest")
      throw error("predictors: unknown predictor '" + names[i] + "'; expected " + history_predictor_names());
    for (std::size_t j = 0; j < i; ++j)
      if (names[i] == names[j]) throw error("predictors: '" + names[i] + "' listed twice");
  }
  if (names.size() > 3)
    throw error("predictors: " + std::to_string(names.size()) + " given; at most 3 (" + history_predictor_names() +
                ")");
}

/// Scores the history predictors named in `names` (see
/// check_history_predictor_names) on recorded routings, as score_routings
/// does. static-hottest counts the scored phases of the whole run (an
/// oracle). Throws `error` on bad names and as score_routings does.
inline prediction_report score_history_predictors(const model_shape& shape, span<const routing> routings,
                                                  std::size_t declined, const std::vector<std::string>& names,
                                                  scorer_options options = {}, frequency_options frequency = {}) {
  check_history_predictor_names(names);
  return detail::score_named(detail::history_score_inputs{shape, routings, declined, options, frequency}, names, 0);
}

static_assert(is_history_predictor_v<prev_token_predictor>, "contract");
static_assert(is_history_predictor_v<frequency_predictor>, "contract");
static_assert(is_history_predictor_v<static_hot_list_predictor>, "contract");

}  // namespace moe_residency
