// `moe-residency score`: scores the predictors that need only routing history
// (prev-token, frequency, static hottest-k) on a recorded route trace.

#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "command.hpp"
#include "moe_residency/predict/history.hpp"
#include "moe_residency/score.hpp"
#include "moe_residency/trace.hpp"

namespace {

using namespace moe_residency;

struct score_args {
  std::string trace;
  std::vector<std::string> predictors{"prev-token", "frequency", "static-hottest"};
  std::string format = "table";
  float decay = 1.0f;
  bool unpaired = false;
  bool include_prefill = false;
  bool no_layers = false;
};

struct score_inputs {
  model_shape shape;
  trace_routings routings;
  scorer_options options;
  frequency_options frequency;
};

// Builds the chosen predictors one name at a time so the set stays a
// compile-time composition (no virtual call per expert).
template <class... Chosen>
prediction_report run_chosen(const score_inputs& in, const std::vector<std::string>& names,
                             std::size_t i, Chosen&... chosen) {
  if constexpr (sizeof...(Chosen) < 3) {
    if (i < names.size()) {
      const std::string& n = names[i];
      if (n == "prev-token") {
        prev_token_predictor p;
        return run_chosen(in, names, i + 1, chosen..., p);
      }
      if (n == "frequency") {
        frequency_predictor p(in.frequency);
        return run_chosen(in, names, i + 1, chosen..., p);
      }
      if (n == "static-hottest") {
        // Counted over the scored phases of the whole run (an oracle, by definition).
        std::vector<routing> counted = in.routings.routings;
        if (in.options.score_prefill)
          for (auto& r : counted) r.phase = run_phase::decode;
        auto p = static_hot_list_predictor::from_routings(in.shape, counted, run_phase::decode);
        return run_chosen(in, names, i + 1, chosen..., p);
      }
      throw error("--predictors: unknown predictor '" + n +
                  "'; expected prev-token, frequency or static-hottest");
    }
  }
  if constexpr (sizeof...(Chosen) == 0) {
    throw error("--predictors: empty; expected one or more of prev-token, frequency, static-hottest");
  } else {
    return score_routings(in.shape, span<const routing>(in.routings.routings), in.routings.declined,
                          in.options, chosen...);
  }
}

void run_score(const score_args& a) {
  if (a.format != "table" && a.format != "csv" && a.format != "json")
    throw error("--format: '" + a.format + "'; expected table, csv or json");
  std::set<std::string> seen;
  for (const auto& n : a.predictors)
    if (!seen.insert(n).second) throw error("--predictors: '" + n + "' listed twice");
  if (a.predictors.size() > 3)
    throw error("--predictors: at most 3 (prev-token, frequency, static-hottest)");
  const route_trace t = read_route_trace(a.trace);
  score_inputs in{t.shape(), collect_routings(t), {}, {}};
  in.options.paired = !a.unpaired;
  in.options.score_prefill = a.include_prefill;
  in.frequency.decay = a.decay;
  const prediction_report r = run_chosen(in, a.predictors, 0);
  std::string out;
  if (a.format == "table") {
    std::printf("trace: %s (%s, %zu layers, %zu experts, top-%zu)\n", a.trace.c_str(),
                t.header.arch.c_str(), in.shape.n_layers(), in.shape.n_experts(),
                in.shape.top_k());
    out = format_text(r, !a.no_layers);
  } else if (a.format == "csv") {
    out = format_csv(r);
  } else {
    out = format_json(r);
  }
  std::fputs(out.c_str(), stdout);
}

const moe_residency_cli::command_registrar reg{
    "score", "Score routing-history predictors on a recorded route trace (decode, slot overlap)",
    [](CLI::App& sub) {
      auto a = std::make_shared<score_args>();
      sub.add_option("--trace", a->trace, "route_trace v1 file (CSV or binary)")
          ->required()
          ->check(CLI::ExistingFile);
      sub.add_option("--predictors", a->predictors,
                     "comma-separated: prev-token, frequency, static-hottest")
          ->delimiter(',')
          ->capture_default_str();
      sub.add_option("--format", a->format, "table | csv | json")->capture_default_str();
      sub.add_option("--decay", a->decay,
                     "frequency: per-routing decay of the counts, (0, 1]; 1 = running counts")
          ->capture_default_str();
      sub.add_flag("--unpaired", a->unpaired,
                   "offer every routing to every predictor; by default a routing is scored only "
                   "when every listed predictor could rank it (the published figures' comparison)");
      sub.add_flag("--include-prefill", a->include_prefill, "score prefill routings too");
      sub.add_flag("--no-layers", a->no_layers, "table: leave out the per-layer table");
      sub.callback([a] { run_score(*a); });
    }};

}  // namespace
