// `moe-residency score`: scores the predictors that need only routing history
// (prev-token, frequency, static hottest-k) on a recorded route trace.

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "checked_options.hpp"
#include "command.hpp"
#include "moe_residency/predict/history.hpp"
#include "moe_residency/score.hpp"
#include "moe_residency/trace.hpp"

namespace {

using namespace moe_residency;

struct score_args {
  std::string trace;
  std::string predictors = "prev-token,frequency,static-hottest";
  std::string format = "table";
  float decay = 1.0f;
  bool unpaired = false;
  bool include_prefill = false;
  bool no_layers = false;
};

void run_score(const CLI::App& sub, const score_args& a) {
  const std::vector<std::string> predictors = moe_residency_cli::split_list(a.predictors, "--predictors");
  // An option that only matters with another, given without it, is an error naming both.
  if (sub.get_option("--decay")->count() > 0 &&
      std::find(predictors.begin(), predictors.end(), "frequency") == predictors.end())
    throw error("--decay: has no effect without the frequency predictor; --predictors is '" + a.predictors + "'");
  try {
    check_history_predictor_names(predictors);
  } catch (const error& e) {
    throw error(std::string("--") + e.what());  // "predictors: ..." names the option
  }
  const route_trace t = moe_residency_cli::read_trace(a.trace);
  const trace_routings routings = collect_routings(t);
  const model_shape shape = t.shape();
  scorer_options options;
  options.paired = !a.unpaired;
  options.score_prefill = a.include_prefill;
  frequency_options frequency;
  frequency.decay = a.decay;
  const prediction_report r = score_history_predictors(shape, span<const routing>(routings.routings), routings.declined,
                                                       predictors, options, frequency);
  std::string out;
  if (a.format == "table") {
    std::printf("trace: %s (%s, %zu layers, %zu experts, top-%zu)\n", a.trace.c_str(), t.header.arch.c_str(),
                shape.n_layers(), shape.n_experts(), shape.top_k());
    out = format_text(r, !a.no_layers);
  } else if (a.format == "csv") {
    out = format_csv(r);
  } else {
    out = format_json(r);
  }
  std::fputs(out.c_str(), stdout);
}

const moe_residency_cli::command_registrar reg{
    "score", "Score routing-history predictors on a recorded route trace (decode, slot overlap)", [](CLI::App& sub) {
      auto a = std::make_shared<score_args>();
      moe_residency_cli::add_trace_option(sub, a->trace);
      sub.add_option("--predictors", a->predictors, "comma-separated: prev-token, frequency, static-hottest")
          ->capture_default_str();
      moe_residency_cli::add_format_option(sub, a->format, {"table", "csv", "json"});
      sub.add_option("--decay", a->decay, "frequency: per-routing decay of the counts, (0, 1]; 1 = running counts")
          ->check(moe_residency_cli::real_float(moe_residency::detail::real_domain::open_closed(0, 1)))
          ->capture_default_str();
      sub.add_flag("--unpaired", a->unpaired,
                   "offer every routing to every predictor; by default a routing is scored only "
                   "when every listed predictor could rank it (the published figures' comparison)");
      sub.add_flag("--include-prefill", a->include_prefill, "score prefill routings too");
      sub.add_flag("--no-layers", a->no_layers, "table: leave out the per-layer table");
      sub.callback([a, &sub] { run_score(sub, *a); });
    }};

}  // namespace
