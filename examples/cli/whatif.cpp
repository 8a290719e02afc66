// `moe-residency whatif`: configurations side by side — a route trace through
// the dynamic replay (policy, budget, drop, speculation) and the timing model
// (a calibrated device config, at any number of lanes): predicted s/token,
// tok/s, MiB read per token, stall, hit rate, and the ratio to the first row.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "checked_options.hpp"
#include "command.hpp"
#include "gnuplot.hpp"
#include "output.hpp"
#include "moe_residency/timing.hpp"

namespace {

using namespace moe_residency;

struct whatif_args {
  std::string trace, config;
  std::string budgets = "4000";
  std::string policies = "lru";
  std::string lanes;  // empty: the config's
  std::string drops = "off";
  std::string speculate = "none";
  std::size_t spec_cap = speculation_planner::default_cap;
  std::size_t horizon = 1;
  std::uint64_t seed = 0x5eed;
  std::string format = "table";
  std::string plot;
};

struct cell {
  dynamic_replay_options replay;
  std::size_t lanes = 0;
  std::string speculate;  // as given (full, oracle:P, ...)
  timing_summary summary;
};

// The SVG of predicted tok/s against budget, one line per configuration other
// than the budget (gnuplot.hpp: the title and keys go to gnuplot as escaped text).
void write_plot(const std::string& svg, const std::string& title, const std::vector<cell>& cells) {
  auto key_of = [](const cell& c) {
    std::string k = c.replay.policy + ", " + std::to_string(c.lanes) + " lanes";
    if (c.replay.drop) k += ", drop " + std::to_string(*c.replay.drop).substr(0, 4);
    if (c.speculate != "none") k += ", " + c.speculate;
    return k;
  };
  std::vector<moe_residency_cli::gnuplot_series> lines;
  for (const auto& c : cells) {
    const std::string k = key_of(c);
    auto it = std::find_if(lines.begin(), lines.end(), [&](const auto& l) { return l.title == k; });
    if (it == lines.end()) it = lines.insert(lines.end(), {k, {}});
    it->points.emplace_back(c.replay.budget_mib, c.summary.tok_per_s);
  }
  moe_residency_cli::render_svg_plot(svg,
                                     "set title " + moe_residency_cli::gnuplot_text(title) +
                                         " noenhanced\nset xlabel 'cache budget (MiB)'\nset ylabel 'predicted decode "
                                         "tok/s'\nset key right bottom\nset grid\nset yrange [0:*]\n",
                                     lines);
  std::cerr << "moe-residency whatif: wrote " << svg << "\n";
}

// An option that only matters with another, given without it, is an error
// naming both: the configurations it asked for are not the ones that would run.
void check_option_effects(const CLI::App& sub, const whatif_args& a, const std::vector<std::string>& specs,
                          const std::vector<std::string>& policies) {
  auto given = [&sub](const char* name) { return sub.get_option(name)->count() > 0; };
  auto any_starts = [](const std::vector<std::string>& items, const char* prefix) {
    return std::any_of(items.begin(), items.end(), [prefix](const std::string& s) { return s.rfind(prefix, 0) == 0; });
  };
  const bool speculating = std::any_of(specs.begin(), specs.end(), [](const std::string& s) { return s != "none"; });
  const bool oracle = any_starts(specs, "oracle"), random = any_starts(policies, "random");
  for (const char* o : {"--spec-cap", "--horizon"})
    if (given(o) && !speculating)
      throw error(std::string(o) + ": has no effect without --speculate; --speculate is '" + a.speculate + "'");
  if (given("--seed") && !oracle && !random)
    throw error("--seed: has no effect without the random policy or --speculate oracle:P; --policies is '" +
                a.policies + "', --speculate '" + a.speculate + "'");
}

void run(const CLI::App& sub, const whatif_args& a) {
  if (!a.plot.empty()) {  // before the replays, not after them (an empty --plot is refused while parsing)
    moe_residency_cli::check_output_path(a.plot, "--plot", {{"--trace", a.trace}, {"--config", a.config}});
    moe_residency_cli::require_gnuplot("whatif");
  }
  const timing_params device = parse_timing_config(moe_residency_cli::read_whole_file(a.config, "--config"), a.config);
  const routed_replay_input in = routed_replay_input::from_trace(moe_residency_cli::read_trace(a.trace));
  moe_residency_cli::require_decode_tokens(in.decode_tokens(), a.trace);
  const model_shape& shape = in.shape();

  using moe_residency_cli::split_list;
  std::vector<double> budgets;
  for (const auto& b : split_list(a.budgets, "--budgets"))
    budgets.push_back(moe_residency_cli::parse_budget_mib(b, "--budgets (MiB)"));
  std::vector<std::size_t> lanes;  // none given: the config's
  for (const auto& l : a.lanes.empty() ? std::vector<std::string>() : split_list(a.lanes, "--lanes")) {
    lanes.push_back(detail::parse_whole<std::size_t>(l, "--lanes", 1, 64));
  }
  if (lanes.empty()) lanes.push_back(device.lanes);
  std::vector<std::optional<double>> drops;
  for (const auto& d : split_list(a.drops, "--drops"))
    drops.push_back(
        d == "off" ? std::optional<double>()
                   : detail::parse_real(d, "--drops (a fraction F, or off)", detail::real_domain::open_closed(0, 1)));
  const auto specs = split_list(a.speculate, "--speculate"), policies = split_list(a.policies, "--policies");
  check_option_effects(sub, a, specs, policies);

  std::vector<cell> cells;
  for (double b : budgets)
    for (const auto& p : policies)
      for (std::size_t l : lanes)
        for (const auto& d : drops)
          for (const auto& s : specs) {
            cell c;
            c.replay.policy = p;
            c.replay.budget_mib = b;
            c.replay.drop = d;
            c.replay.seed = a.seed;
            // "full": the true next routing, all of it (oracle:1 at cap k): the ceiling.
            c.replay.speculation = parse_replay_speculation(s == "full" ? "oracle:1" : s);
            c.replay.speculation.cap = s == "full" ? shape.top_k() : a.spec_cap;
            c.replay.speculation.horizon = a.horizon;
            c.replay.speculation.seed = a.seed;
            c.lanes = l;
            c.speculate = s;
            timing_params tp = device;
            tp.lanes = l;
            c.summary = predict_timing(in, c.replay, tp).summary;
            cells.push_back(std::move(c));
          }

  const bool csv = a.format == "csv";
  const double base = cells.front().summary.s_per_token;
  if (csv) {
    std::cout << "budget_mib,policy,lanes,drop,speculate,cap,s_per_token,tok_per_s,demanded_mib_per_token,"
                 "speculative_mib_per_token,stall_ms_per_token,mgmt_ms_per_token,hit_pct,cancelled_per_token,"
                 "speedup_vs_first\n";
  } else {
    std::cout << shape.name() << " (" << a.trace << "), " << in.decode_tokens() << " decode tokens; device " << a.config
              << "\n"
              << "budget  policy    lanes  drop  speculate        cap  s/token  tok/s  MiB/tok dem  MiB/tok spec  "
                 "stall ms  hit %  vs first\n";
  }
  char buf[400];
  for (const auto& c : cells) {
    const timing_summary& s = c.summary;
    const std::string drop = c.replay.drop ? std::to_string(*c.replay.drop).substr(0, 4) : "off";
    const std::size_t cap = c.speculate == "none" ? 0 : c.replay.speculation.cap;
    const double ratio = s.s_per_token > 0 ? base / s.s_per_token : 0.0;
    std::snprintf(buf, sizeof buf,
                  csv ? "%g,%s,%zu,%s,%s,%zu,%.4f,%.3f,%.2f,%.2f,%.2f,%.2f,%.2f,%.3f,%.3f\n"
                      : "%-7g %-9s %5zu  %-4s  %-15s %4zu  %7.3f  %5.2f  %11.1f  %12.1f  %8.1f  %5.1f  %7.2fx\n",
                  c.replay.budget_mib, c.replay.policy.c_str(), c.lanes, drop.c_str(), c.speculate.c_str(), cap,
                  s.s_per_token, s.tok_per_s, s.demanded_mib_per_token, s.speculative_mib_per_token,
                  s.stall_ms_per_token, csv ? s.mgmt_ms_per_token : s.hit_pct, csv ? s.hit_pct : ratio,
                  s.speculative_cancelled_per_token, ratio);
    std::cout << buf;
  }
  if (!csv && cells.size() == 2)
    std::printf("second / first: %.3fx the tok/s\n", cells[1].summary.tok_per_s / cells[0].summary.tok_per_s);
  if (!a.plot.empty()) write_plot(a.plot, shape.name() + ": predicted decode tok/s vs budget", cells);
}

const moe_residency_cli::command_registrar reg{
    "whatif", "Predicted decode s/token of configurations side by side (replay + timing model)", [](CLI::App& sub) {
      auto a = std::make_shared<whatif_args>();
      moe_residency_cli::add_trace_option(sub, a->trace);
      sub.add_option("--config", a->config, "timing config (key = value), e.g. from calibrate --write-config")
          ->required();
      sub.add_option("--budgets", a->budgets, "cache budgets, MiB, comma-separated")->capture_default_str();
      sub.add_option("--policies", a->policies, "cache policies, comma-separated: " + cache_policy_names())
          ->capture_default_str();
      sub.footer("Policies:\n" + cache_policy_help());
      sub.add_option("--lanes", a->lanes, "read lanes, comma-separated (default: the config's)");
      sub.add_option("--drops", a->drops, "drop fractions F or off, comma-separated")->capture_default_str();
      sub.add_option("--speculate", a->speculate,
                     "none, prev-token, frequency, oracle:P, full (oracle:1 at cap k), comma-separated")
          ->capture_default_str();
      sub.add_option("--spec-cap", a->spec_cap, "speculative reads per layer")
          ->check(moe_residency_cli::whole(0, 32))
          ->capture_default_str();
      sub.add_option("--horizon", a->horizon, "read for the MoE layer 1 or 2 ahead")
          ->check(moe_residency_cli::whole(1, 2))
          ->capture_default_str();
      sub.add_option("--seed", a->seed, "seed of the oracle and the random policy")
          ->check(moe_residency_cli::whole())
          ->capture_default_str();
      moe_residency_cli::add_format_option(sub, a->format, {"table", "csv"});
      sub.add_option("--plot", a->plot, "write an SVG of predicted tok/s vs budget per configuration (gnuplot)");
      sub.callback([a, &sub] { run(sub, *a); });
    }};

}  // namespace
