#pragma once
/// The slot-overlap scorer: how much of each routing a predictor named ahead
/// of time, per predictor and per layer, and the report an engine prints.
///
/// For a routing of k selected experts and a predictor's ranking, *slot
/// overlap* is |selected ∩ predicted top-k| / k summed over routings as slots;
/// a *whole routing* is one whose predicted top-k set equals the selected set.
/// Every predictor is offered the same routings (one `record` call carries
/// them all); a routing a predictor could not rank is *unscored* (counted,
/// never in a denominator); routings wider than 32 are *declined* (counted).
/// Decode only unless `scorer_options::score_prefill`.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/detail/format.hpp"
#include "moe_residency/error.hpp"

namespace moe_residency {

/// How a predictor appears in the report.
struct predictor_label {
  std::string name;         ///< first report line, e.g. "stale-gate", "fresh-gate control"
  std::string short_name;   ///< second line and CSV/JSON, e.g. "stale-gate", "control"
  std::string column;       ///< per-layer table header, e.g. "stale"
  int column_width = 7;     ///< characters after the one-space separator
  bool is_control = false;  ///< a fresh-gate control: below 100% the report warns
};

/// Relative tolerance under which two selection scores are the same score
/// (ggml's argsort is unstable, so an expert tied with the k-th is not a miss).
inline constexpr float tie_relative_tolerance = 1e-6f;

/// Counters for one predictor on one layer (or summed over layers).
struct overlap_counts {
  std::uint64_t routings = 0;      ///< routings scored
  std::uint64_t slots = 0;         ///< Σ k over scored routings
  std::uint64_t slot_hits = 0;     ///< Σ |selected ∩ predicted top-k|
  std::uint64_t whole_hits = 0;    ///< scored routings predicted exactly (as sets)
  std::uint64_t unscored = 0;      ///< routings offered that the predictor could not rank
  std::uint64_t tie_forgiven = 0;  ///< slot hits credited only through a score tie

  /// Slot overlap in percent; NaN when nothing was scored.
  double slot_pct() const noexcept {
    return slots ? 100.0 * static_cast<double>(slot_hits) / static_cast<double>(slots) : std::nan("");
  }
  /// Whole-routing exact rate in percent; NaN when nothing was scored.
  double whole_pct() const noexcept {
    return routings ? 100.0 * static_cast<double>(whole_hits) / static_cast<double>(routings) : std::nan("");
  }
  bool perfect() const noexcept { return slots > 0 && slot_hits == slots; }
  overlap_counts& operator+=(const overlap_counts& o) noexcept {
    routings += o.routings;
    slots += o.slots;
    slot_hits += o.slot_hits;
    whole_hits += o.whole_hits;
    unscored += o.unscored;
    tie_forgiven += o.tie_forgiven;
    return *this;
  }
};

/// The result of comparing one routing with one ranking.
struct overlap_result {
  std::size_t hits = 0;          ///< routed experts named (including tie-forgiven)
  std::size_t tie_forgiven = 0;  ///< of those, named only through a tie with the k-th score
  bool whole = false;            ///< predicted top-k set == selected set
};

/// Compares the selected experts (distinct ids) with the first k =
/// selected.size() entries of `predicted`. With `tie_aware`, ties with the
/// k-th predicted score are broken in the prediction's favour: an entry
/// (anywhere in the ranking) whose predicted score equals the k-th predicted
/// score within relative `rel_tol` is *tied*, and a selected expert ranked
/// below k that is tied counts as named, but only as many of them as there
/// are tied entries in the predicted top-k that were not selected (the slots
/// another tie-break of the ranking could have given them). So `hits` is the
/// largest overlap of `selected` with the top k of any tie-break of the
/// ranking, and `whole` says the selected set is the predicted top-k under
/// some tie-break. The scores must be the selection scores the engine's top-k
/// ran on. Allocation-free; O(k × ranking size).
inline overlap_result slot_overlap(span<const expert_id> selected, const ranking& predicted, bool tie_aware,
                                   float rel_tol = tie_relative_tolerance) noexcept {
  overlap_result r;
  const std::size_t k = selected.size();
  const std::size_t top = std::min(k, predicted.size());
  const bool can_tie = tie_aware && top == k && k > 0 && std::isfinite(predicted.score(k - 1));
  const float kth = can_tie ? predicted.score(k - 1) : 0.0f;
  auto tied = [&](float s) {
    return std::isfinite(s) && std::fabs(s - kth) <= rel_tol * std::max(std::fabs(s), std::fabs(kth));
  };
  std::size_t forgivable = 0;  // selected, ranked below k, tied with the k-th
  for (std::size_t i = 0; i < k; ++i) {
    const expert_id e = selected[i];
    std::size_t rank = predicted.size();
    for (std::size_t j = 0; j < predicted.size(); ++j)
      if (predicted.id(j) == e) {
        rank = j;
        break;
      }
    if (rank < top) ++r.hits;
    else if (can_tie && rank < predicted.size() && tied(predicted.score(rank))) ++forgivable;
  }
  if (forgivable > 0) {
    // Tied top-k slots held by an expert that was not selected: each can go
    // to one forgivable expert under another tie-break, and no more can.
    std::size_t open = 0;
    for (std::size_t j = 0; j < k; ++j) {
      if (!tied(predicted.score(j))) continue;
      bool in_selected = false;
      for (std::size_t i = 0; i < k && !in_selected; ++i) in_selected = selected[i] == predicted.id(j);
      if (!in_selected) ++open;
    }
    r.tie_forgiven = std::min(forgivable, open);
    r.hits += r.tie_forgiven;
  }
  // Whole: every selected expert named. With distinct selected ids, k hits
  // means the predicted top-k of some tie-break is exactly the selected set.
  r.whole = k > 0 && r.hits == k;
  return r;
}

/// Which routings the scorer counts.
struct scorer_options {
  bool score_prefill = false;  ///< also score prefill routings (decode only by default)
  /// Score a routing only when every predictor could rank it (a paired
  /// comparison); a routing any predictor could not rank is then unscored for all.
  bool paired = false;
};

/// What the scorer measured, ready to print: one row per predictor, per layer.
struct prediction_report {
  std::vector<predictor_label> predictors;
  std::vector<overlap_counts> totals;               ///< [predictor]
  std::vector<std::vector<overlap_counts>> layers;  ///< [predictor][layer]
  std::vector<std::uint64_t> offered;               ///< [layer] routings offered (scorable phase, ≤ 32 wide)
  std::vector<std::uint64_t> declined_by_layer;     ///< [layer] routings wider than 32
  std::uint64_t declined = 0;
  std::uint64_t ignored_phase = 0;  ///< routings of a phase not scored (prefill by default)
  /// Lines the session appends (anomalies, unscored batches); printed verbatim.
  std::vector<std::string> notes;

  std::size_t n_layers() const noexcept { return offered.size(); }
  /// Index of the first control predictor, or npos.
  std::size_t control_index() const noexcept {
    for (std::size_t p = 0; p < predictors.size(); ++p)
      if (predictors[p].is_control) return p;
    return static_cast<std::size_t>(-1);
  }
};

/// Accumulates slot overlap per predictor and layer. Not thread-safe; one
/// scorer per host thread. `record` is noexcept and allocation-free.
class slot_overlap_scorer {
 public:
  slot_overlap_scorer() = default;
  /// Throws `error` when there is no predictor or no layer.
  slot_overlap_scorer(std::vector<predictor_label> predictors, std::size_t n_layers, scorer_options options = {})
      : options_(options) {
    if (predictors.empty()) throw error("slot_overlap_scorer: no predictor; expected at least one");
    if (n_layers == 0) throw error("slot_overlap_scorer: 0 layers; expected at least one");
    report_.predictors = std::move(predictors);
    report_.totals.assign(report_.predictors.size(), {});
    report_.layers.assign(report_.predictors.size(), std::vector<overlap_counts>(n_layers));
    report_.offered.assign(n_layers, 0);
    report_.declined_by_layer.assign(n_layers, 0);
  }

  const scorer_options& options() const noexcept { return options_; }
  std::size_t n_predictors() const noexcept { return report_.predictors.size(); }
  std::size_t n_layers() const noexcept { return report_.offered.size(); }

  /// True when a routing of this phase is scored.
  bool scores_phase(run_phase p) const noexcept { return p == run_phase::decode || options_.score_prefill; }

  /// Scores one routing against every predictor's ranking. `predicted[p]` is
  /// null when predictor p could not rank it (unscored); `tie_aware[p]` says
  /// whether p's scores are the engine's selection scores. Both spans have one
  /// entry per predictor. `selected` must hold distinct expert ids (a routing
  /// naming an expert twice would be credited twice; the session checks this
  /// before it records). Returns false (recording nothing) when the routing's
  /// layer is out of range or the spans are the wrong size.
  bool record(const routing& selected, span<const ranking* const> predicted, span<const bool> tie_aware) noexcept {
    const std::size_t l = to_index(selected.layer);
    if (l >= n_layers() || predicted.size() != n_predictors() || tie_aware.size() != n_predictors()) return false;
    if (!scores_phase(selected.phase)) {
      ++report_.ignored_phase;
      return true;
    }
    ++report_.offered[l];
    bool all = true;
    for (std::size_t p = 0; p < n_predictors(); ++p) all = all && predicted[p] != nullptr;
    for (std::size_t p = 0; p < n_predictors(); ++p) {
      overlap_counts& c = report_.layers[p][l];
      overlap_counts& t = report_.totals[p];
      if (!predicted[p] || (options_.paired && !all) || selected.empty()) {
        ++c.unscored;
        ++t.unscored;
        continue;
      }
      const overlap_result r = slot_overlap(selected.ids(), *predicted[p], tie_aware[p]);
      for (overlap_counts* x : {&c, &t}) {
        ++x->routings;
        x->slots += selected.size();
        x->slot_hits += r.hits;
        x->whole_hits += r.whole ? 1 : 0;
        x->tie_forgiven += r.tie_forgiven;
      }
    }
    return true;
  }

  /// Counts a routing wider than 32 on layer l (never scored).
  void decline(layer_id l, run_phase p) noexcept {
    if (!scores_phase(p)) {
      ++report_.ignored_phase;
      return;
    }
    ++report_.declined;
    if (to_index(l) < n_layers()) ++report_.declined_by_layer[to_index(l)];
  }

  /// Counts n routings of a phase the scorer does not score (prefill by default).
  void ignore_phase(std::uint64_t n) noexcept { report_.ignored_phase += n; }
  /// Counts n routings wider than 32 whose layer is not known (a trace reader
  /// set them aside).
  void add_declined(std::uint64_t n) noexcept { report_.declined += n; }

  const prediction_report& report() const noexcept { return report_; }
  /// Appends a line the text report prints after the summary.
  void add_note(std::string note) { report_.notes.push_back(std::move(note)); }
  /// Forgets every count (labels and layers stay).
  void reset() noexcept {
    for (auto& t : report_.totals) t = {};
    for (auto& v : report_.layers)
      for (auto& c : v) c = {};
    for (auto& o : report_.offered) o = 0;
    for (auto& d : report_.declined_by_layer) d = 0;
    report_.declined = 0;
    report_.ignored_phase = 0;
    report_.notes.clear();
  }

 private:
  scorer_options options_;
  prediction_report report_;
};

// ---------------------------------------------------------------------------
// Formatting

namespace detail {

/// A percentage with one decimal that never shows 100.0 unless every slot hit
/// and never shows 0.0 for nothing scored ("-").
inline std::string score_pct(std::uint64_t hits, std::uint64_t total) {
  if (total == 0) return "-";
  if (hits == total) return "100.0";
  double v = 100.0 * static_cast<double>(hits) / static_cast<double>(total);
  std::string s = format_printf("%.1f", v);
  if (s == "100.0") s = "99.9";
  return s;
}

inline std::string score_json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          out += format_printf("\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
        else out += c;
    }
  }
  return out + "\"";
}

inline std::string score_json_number(double v) {
  if (!std::isfinite(v)) return "null";
  return format_printf("%.4f", v);
}

}  // namespace detail

/// The report as text, in the engine's format:
/// ```
/// moe-predict: stale-gate 88.6% of routed slots (41.2% whole routings) | prev-token 43.3% (1.9%) | ...
/// moe-predict: scored — stale-gate 6016 routings/48128 slots, ...; 128 routings the stale-gate could not rank
///   layer   stale    prev   ctrl   routings
///       0       -    41.0  100.0        128
/// ```
/// With `per_layer` false the table is left out. A control below 100.0% adds
/// a line saying so.
inline std::string format_text(const prediction_report& r, bool per_layer = true) {
  using detail::format_printf;
  using detail::score_pct;
  std::string out = "moe-predict: ";
  for (std::size_t p = 0; p < r.predictors.size(); ++p) {
    const overlap_counts& t = r.totals[p];
    if (p) out += " | ";
    const std::string slot = score_pct(t.slot_hits, t.slots);
    const std::string whole = score_pct(t.whole_hits, t.routings);
    out += r.predictors[p].name + " " + slot + (t.slots ? "%" : "");
    out += p == 0 ? " of routed slots (" : " (";
    out += whole + (t.routings ? "%" : "");
    out += p == 0 ? " whole routings)" : ")";
  }
  out += "\nmoe-predict: scored \xE2\x80\x94 ";
  for (std::size_t p = 0; p < r.predictors.size(); ++p) {
    const overlap_counts& t = r.totals[p];
    if (p) out += ", ";
    out += format_printf("%s %llu routings/%llu slots", r.predictors[p].short_name.c_str(),
                         static_cast<unsigned long long>(t.routings), static_cast<unsigned long long>(t.slots));
  }
  bool first_unscored = true;
  for (std::size_t p = 0; p < r.predictors.size(); ++p) {
    const overlap_counts& t = r.totals[p];
    if (!t.unscored) continue;
    out += first_unscored ? "; " : ", ";
    out += format_printf(first_unscored ? "%llu routings the %s could not rank" : "%llu the %s could not rank",
                         static_cast<unsigned long long>(t.unscored), r.predictors[p].short_name.c_str());
    first_unscored = false;
  }
  if (r.declined)
    out += format_printf("; %llu routings wider than %zu declined", static_cast<unsigned long long>(r.declined),
                         max_top_k);
  out += "\n";
  const std::size_t c = r.control_index();
  if (c != static_cast<std::size_t>(-1)) {
    const overlap_counts& t = r.totals[c];
    if (t.slots == 0) {
      out += "moe-predict: the " + r.predictors[c].short_name +
             " scored nothing, so nothing proves the probe reproduces the engine's selection\n";
    } else if (!t.perfect()) {
      out += "moe-predict: the " + r.predictors[c].short_name + " reads " + score_pct(t.slot_hits, t.slots) +
             "%, not 100.0%: the probe does not reproduce the engine's selection (transposed or "
             "mis-strided matrix, wrong token of the batch, different rounding, or a selection "
             "rule not reproduced); read the other predictors against the control, not "
             "against 100%\n";
    }
  }
  for (const std::string& n : r.notes) out += "moe-predict: " + n + "\n";
  if (per_layer) {
    out += "  layer";
    for (const auto& p : r.predictors) out += format_printf(" %*s", p.column_width, p.column.c_str());
    out += "   routings\n";
    for (std::size_t l = 0; l < r.n_layers(); ++l) {
      if (r.offered[l] == 0 && r.declined_by_layer[l] == 0) continue;  // a dense or silent layer
      out += format_printf("%7zu", l);
      for (std::size_t p = 0; p < r.predictors.size(); ++p) {
        const overlap_counts& x = r.layers[p][l];
        out += format_printf(" %*s", r.predictors[p].column_width, score_pct(x.slot_hits, x.slots).c_str());
      }
      out += format_printf(" %10llu\n", static_cast<unsigned long long>(r.offered[l]));
    }
  }
  return out;
}

/// One line per predictor: `predictor,slot_pct,whole_pct,routings,slots,unscored`
/// (percent with 4 decimals; empty when nothing was scored).
inline std::string format_csv(const prediction_report& r) {
  std::string out = "predictor,slot_pct,whole_pct,routings,slots,unscored\n";
  for (std::size_t p = 0; p < r.predictors.size(); ++p) {
    const overlap_counts& t = r.totals[p];
    const std::string slot = t.slots ? detail::format_printf("%.4f", t.slot_pct()) : "";
    const std::string whole = t.routings ? detail::format_printf("%.4f", t.whole_pct()) : "";
    out += detail::format_printf("%s,%s,%s,%llu,%llu,%llu\n", r.predictors[p].short_name.c_str(), slot.c_str(),
                                 whole.c_str(), static_cast<unsigned long long>(t.routings),
                                 static_cast<unsigned long long>(t.slots), static_cast<unsigned long long>(t.unscored));
  }
  return out;
}

/// The whole report as one JSON object: per predictor totals and per-layer
/// rows (`null` percentages where nothing was scored), declined, notes.
inline std::string format_json(const prediction_report& r) {
  using detail::score_json_number;
  using detail::score_json_string;
  auto counts = [](const overlap_counts& c) {
    return detail::format_printf(
        "\"slot_pct\":%s,\"whole_pct\":%s,\"routings\":%llu,\"slots\":%llu,"
        "\"slot_hits\":%llu,\"whole_hits\":%llu,\"unscored\":%llu,\"tie_forgiven\":%llu",
        score_json_number(c.slot_pct()).c_str(), score_json_number(c.whole_pct()).c_str(),
        static_cast<unsigned long long>(c.routings), static_cast<unsigned long long>(c.slots),
        static_cast<unsigned long long>(c.slot_hits), static_cast<unsigned long long>(c.whole_hits),
        static_cast<unsigned long long>(c.unscored), static_cast<unsigned long long>(c.tie_forgiven));
  };
  std::string out = "{\"predictors\":[";
  for (std::size_t p = 0; p < r.predictors.size(); ++p) {
    if (p) out += ",";
    out += "{\"name\":" + score_json_string(r.predictors[p].short_name) +
           ",\"label\":" + score_json_string(r.predictors[p].name) +
           ",\"control\":" + (r.predictors[p].is_control ? "true" : "false") + "," + counts(r.totals[p]) +
           ",\"layers\":[";
    bool first = true;
    for (std::size_t l = 0; l < r.n_layers(); ++l) {
      if (r.offered[l] == 0 && r.declined_by_layer[l] == 0) continue;
      if (!first) out += ",";
      first = false;
      out += detail::format_printf("{\"layer\":%zu,", l) + counts(r.layers[p][l]) + "}";
    }
    out += "]}";
  }
  out += "],\"layers\":[";
  bool first = true;
  for (std::size_t l = 0; l < r.n_layers(); ++l) {
    if (r.offered[l] == 0 && r.declined_by_layer[l] == 0) continue;
    if (!first) out += ",";
    first = false;
    out += detail::format_printf("{\"layer\":%zu,\"routings\":%llu,\"declined\":%llu}", l,
                                 static_cast<unsigned long long>(r.offered[l]),
                                 static_cast<unsigned long long>(r.declined_by_layer[l]));
  }
  const std::size_t c = r.control_index();
  const bool control_ok = c != static_cast<std::size_t>(-1) && r.totals[c].perfect();
  out += detail::format_printf("],\"declined\":%llu,\"control_exact\":%s,\"notes\":[",
                               static_cast<unsigned long long>(r.declined),
                               c == static_cast<std::size_t>(-1) ? "null"
                               : control_ok                      ? "true"
                                                                 : "false");
  for (std::size_t i = 0; i < r.notes.size(); ++i) out += (i ? "," : "") + score_json_string(r.notes[i]);
  out += "]}\n";
  return out;
}

}  // namespace moe_residency
