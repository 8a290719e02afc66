// `moe-residency whatif`: configurations side by side — a route trace through
// the dynamic replay (policy, budget, drop, speculation) and the timing model
// (a calibrated device config, at any number of lanes): predicted s/token,
// tok/s, MiB read per token, stall, hit rate, the ratio to the first row, and
// against a baseline configuration the time ratio and the verdict (faster,
// slower, within noise) with the noise band it assumes. Top-k is a lever:
// narrower replays each routing's first K slots, wider is modelled
// (timing/top_k.hpp) and says so.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "checked_options.hpp"
#include "command.hpp"
#include "gnuplot.hpp"
#include "output.hpp"
#include "moe_residency/timing.hpp"
#include <nlohmann/json.hpp>

namespace {

using namespace moe_residency;

struct whatif_args {
  std::string trace, config;
  std::string budgets = "4000";
  std::string policies = "lru";
  std::string lanes;  // empty: the config's
  std::string drops = "off";
  std::string k;  // empty: the trace's
  std::string baseline;
  double noise = -1;  // < 0: the config's noise_pct, else 5 (assumed)
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
  std::size_t k = 0;
  bool k_modelled = false;
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
  const bool wider = !a.k.empty();  // a wider top-k draws its added experts with the seed (checked in run)
  if (given("--seed") && !oracle && !random && !wider)
    throw error(
        "--seed: has no effect without the random policy, --speculate oracle:P or a wider --k; --policies is '" +
        a.policies + "', --speculate '" + a.speculate + "'");
}

void run(const CLI::App& sub, const whatif_args& a) {
  if (!a.plot.empty()) {  // before the replays, not after them (an empty --plot is refused while parsing)
    moe_residency_cli::check_output_path(a.plot, "--plot", {{"--trace", a.trace}, {"--config", a.config}});
    moe_residency_cli::require_gnuplot("whatif");
  }
  const timing_params device = parse_timing_config(moe_residency_cli::read_whole_file(a.config, "--config"), a.config);
  const route_trace trace = moe_residency_cli::read_trace(a.trace);
  const routed_replay_input in = routed_replay_input::from_trace(trace);
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
  // Top-k: the trace's, or each --k (a trace per k: narrower replayed, wider modelled).
  const route_trace& base_trace = trace;
  std::vector<std::size_t> ks;
  for (const auto& k : a.k.empty() ? std::vector<std::string>() : split_list(a.k, "--k"))
    ks.push_back(detail::parse_whole<std::size_t>(k, "--k", 1, 32));
  if (ks.empty()) ks.push_back(shape.top_k());
  std::map<std::size_t, routed_replay_input> inputs;
  std::map<std::size_t, top_k_change> changes;
  for (std::size_t k : ks) {
    if (inputs.count(k)) continue;
    if (k == shape.top_k()) {
      inputs.emplace(k, in);
      changes[k] = top_k_change{k, k, false, a.seed, 0, 0};
    } else {
      top_k_change c;
      inputs.emplace(k, routed_replay_input::from_trace(with_top_k(base_trace, k, a.seed, &c).trace()));
      changes[k] = c;
    }
  }
  if (sub.get_option("--seed")->count() && a.k.size() &&
      std::none_of(ks.begin(), ks.end(), [&](std::size_t k) { return k > shape.top_k(); }) &&
      std::none_of(specs.begin(), specs.end(), [](const std::string& x) { return x.rfind("oracle", 0) == 0; }) &&
      std::none_of(policies.begin(), policies.end(), [](const std::string& x) { return x.rfind("random", 0) == 0; }))
    throw error("--seed: has no effect: --k '" + a.k + "' is not wider than the trace's top-" +
                std::to_string(shape.top_k()) + ", and neither the random policy nor --speculate oracle:P is asked");

  std::vector<cell> cells;
  for (double b : budgets)
    for (const auto& p : policies)
      for (std::size_t l : lanes)
        for (const auto& d : drops)
          for (const auto& s : specs)
            for (std::size_t k : ks) {
              const routed_replay_input& kin = inputs.at(k);
              cell c;
              c.replay.policy = p;
              c.replay.budget_mib = b;
              c.replay.drop = d;
              c.replay.seed = a.seed;
              // "full": the true next routing, all of it (oracle:1 at cap k): the ceiling.
              c.replay.speculation = parse_replay_speculation(s == "full" ? "oracle:1" : s);
              c.replay.speculation.cap = s == "full" ? k : a.spec_cap;
              c.replay.speculation.horizon = a.horizon;
              c.replay.speculation.seed = a.seed;
              c.lanes = l;
              c.k = k;
              c.k_modelled = changes.at(k).modelled;
              c.speculate = s;
              timing_params tp = device;
              tp.lanes = l;
              // k_c: a device config without one measured C at the trace's top-k.
              if (tp.compute_top_k == 0) tp.compute_top_k = shape.top_k();
              c.summary = predict_timing(kin, c.replay, tp).summary;
              cells.push_back(std::move(c));
            }

  // The baseline: the first row, or the row --baseline names (key=value,...; keys left out: each list's first).
  std::size_t base_i = 0;
  if (!a.baseline.empty()) {
    std::map<std::string, std::string> want;
    for (const auto& item : split_list(a.baseline, "--baseline")) {
      const auto eq = item.find('=');
      const std::string key = eq == std::string::npos ? std::string() : item.substr(0, eq);
      if (key != "budget" && key != "policy" && key != "lanes" && key != "drop" && key != "speculate" && key != "k")
        throw error("--baseline: '" + item + "' in '" + a.baseline +
                    "'; expected key=value items of budget, policy, lanes, drop, speculate and k, e.g. lanes=8,k=2");
      if (!want.emplace(key, item.substr(eq + 1)).second)
        throw error("--baseline: " + key + " given twice in '" + a.baseline + "'; expected each key once");
    }
    const cell& first = cells.front();
    auto drop_text = [](const cell& c) {
      return c.replay.drop ? detail::show_number(*c.replay.drop) : std::string("off");
    };
    auto matches = [&](const cell& c) {
      auto eq_num = [](const std::string& text, double v, const char* what) {
        return detail::parse_real(text, std::string("--baseline ") + what) == v;
      };
      const auto get = [&](const char* key) { return want.count(key) ? want.at(key) : std::string(); };
      return (want.count("budget") ? eq_num(get("budget"), c.replay.budget_mib, "budget")
                                   : c.replay.budget_mib == first.replay.budget_mib) &&
             (want.count("policy") ? get("policy") == c.replay.policy : c.replay.policy == first.replay.policy) &&
             (want.count("lanes") ? eq_num(get("lanes"), static_cast<double>(c.lanes), "lanes")
                                  : c.lanes == first.lanes) &&
             (want.count("drop") ? (get("drop") == "off" ? !c.replay.drop
                                                         : c.replay.drop && eq_num(get("drop"), *c.replay.drop, "drop"))
                                 : drop_text(c) == drop_text(first)) &&
             (want.count("speculate") ? get("speculate") == c.speculate : c.speculate == first.speculate) &&
             (want.count("k") ? eq_num(get("k"), static_cast<double>(c.k), "k") : c.k == first.k);
    };
    base_i = cells.size();
    for (std::size_t i = 0; i < cells.size() && base_i == cells.size(); ++i)
      if (matches(cells[i])) base_i = i;
    if (base_i == cells.size())
      throw error("--baseline: '" + a.baseline +
                  "' is none of the configurations asked; expected one of them (keys left out take each list's "
                  "first value): add it to --budgets, --policies, --lanes, --drops, --speculate or --k");
  }
  const cell& bc = cells[base_i];
  // The noise band: given, the calibration's measurement, or an assumed 5%.
  const double noise = a.noise >= 0 ? a.noise : device.noise_pct > 0 ? device.noise_pct : 5.0;
  const char* noise_from = a.noise >= 0           ? "given (--noise)"
                           : device.noise_pct > 0 ? "measured by calibrate (the config's noise_pct)"
                                                  : "assumed (the config has no noise_pct; --noise sets one)";
  auto describe = [&](const cell& c) {
    const std::string drop = c.replay.drop ? std::to_string(*c.replay.drop).substr(0, 4) : "off";
    char b[200];
    std::snprintf(b, sizeof b, "budget %g, %s, %zu lanes, drop %s, speculate %s, top-%zu", c.replay.budget_mib,
                  c.replay.policy.c_str(), c.lanes, drop.c_str(), c.speculate.c_str(), c.k);
    return std::string(b);
  };

  const bool csv = a.format == "csv", json = a.format == "json";
  const double base = cells.front().summary.s_per_token;
  if (csv) {
    std::cout << "budget_mib,policy,lanes,drop,speculate,cap,s_per_token,tok_per_s,demanded_mib_per_token,"
                 "speculative_mib_per_token,stall_ms_per_token,mgmt_ms_per_token,hit_pct,cancelled_per_token,"
                 "speedup_vs_first,top_k,top_k_modelled,time_vs_baseline,verdict,noise_pct\n";
  } else if (!json) {
    std::cout << shape.name() << " (" << a.trace << "), " << in.decode_tokens() << " decode tokens; device " << a.config
              << "\n"
              << "budget  policy    lanes  drop  speculate        cap  s/token  tok/s  MiB/tok dem  MiB/tok spec  "
                 "stall ms  hit %  vs first    k  x base  verdict\n";
  }
  nlohmann::json jcells = nlohmann::json::array();
  char buf[480];
  for (const auto& c : cells) {
    const timing_summary& s = c.summary;
    const std::string drop = c.replay.drop ? std::to_string(*c.replay.drop).substr(0, 4) : "off";
    const std::size_t cap = c.speculate == "none" ? 0 : c.replay.speculation.cap;
    const double ratio = s.s_per_token > 0 ? base / s.s_per_token : 0.0;
    const ratio_verdict v = judge_ratio(s.s_per_token, bc.summary.s_per_token, noise);
    if (json) {
      jcells.push_back({{"budget_mib", c.replay.budget_mib},
                        {"policy", c.replay.policy},
                        {"lanes", c.lanes},
                        {"drop", c.replay.drop ? nlohmann::json(*c.replay.drop) : nlohmann::json(nullptr)},
                        {"speculate", c.speculate},
                        {"cap", cap},
                        {"top_k", c.k},
                        {"top_k_modelled", c.k_modelled},
                        {"s_per_token", s.s_per_token},
                        {"tok_per_s", s.tok_per_s},
                        {"compute_ms_per_token", s.compute_ms_per_token},
                        {"fault_ms_per_token", s.fault_ms_per_token},
                        {"contention_ms_per_token", s.contention_ms_per_token},
                        {"mgmt_ms_per_token", s.mgmt_ms_per_token},
                        {"stall_ms_per_token", s.stall_ms_per_token},
                        {"demanded_mib_per_token", s.demanded_mib_per_token},
                        {"speculative_mib_per_token", s.speculative_mib_per_token},
                        {"cancelled_per_token", s.speculative_cancelled_per_token},
                        {"hit_pct", s.hit_pct},
                        {"speedup_vs_first", ratio},
                        {"time_vs_baseline", v.ratio},
                        {"verdict", to_string(v.verdict)},
                        {"baseline", &c == &bc}});
      continue;
    }
    if (csv)
      std::snprintf(buf, sizeof buf,
                    "%g,%s,%zu,%s,%s,%zu,%.4f,%.3f,%.2f,%.2f,%.2f,%.2f,%.2f,%.3f,%.3f,%zu,%s,%.4f,%s,%.2f\n",
                    c.replay.budget_mib, c.replay.policy.c_str(), c.lanes, drop.c_str(), c.speculate.c_str(), cap,
                    s.s_per_token, s.tok_per_s, s.demanded_mib_per_token, s.speculative_mib_per_token,
                    s.stall_ms_per_token, s.mgmt_ms_per_token, s.hit_pct, s.speculative_cancelled_per_token, ratio, c.k,
                    c.k_modelled ? "yes" : "no", v.ratio, to_string(v.verdict), noise);
    else
      std::snprintf(buf, sizeof buf,
                    "%-7g %-9s %5zu  %-4s  %-15s %4zu  %7.3f  %5.2f  %11.1f  %12.1f  %8.1f  %5.1f  %7.2fx  %3zu%s  "
                    "%5.3f  %s\n",
                    c.replay.budget_mib, c.replay.policy.c_str(), c.lanes, drop.c_str(), c.speculate.c_str(), cap,
                    s.s_per_token, s.tok_per_s, s.demanded_mib_per_token, s.speculative_mib_per_token,
                    s.stall_ms_per_token, s.hit_pct, ratio, c.k, c.k_modelled ? "*" : " ", v.ratio,
                    &c == &bc ? "baseline" : to_string(v.verdict));
    std::cout << buf;
  }
  if (json) {
    nlohmann::json j;
    j["trace"] = a.trace;
    j["model"] = shape.name();
    j["decode_tokens"] = in.decode_tokens();
    j["device"] = a.config;
    j["trace_top_k"] = shape.top_k();
    j["baseline"] = describe(bc);
    j["noise_pct"] = noise;
    j["noise_source"] = noise_from;
    nlohmann::json mod = nlohmann::json::array();
    for (const auto& [k, ch] : changes)
      if (ch.modelled) mod.push_back({{"top_k", k}, {"seed", ch.seed}, {"added_slots", ch.added_slots}});
    j["top_k_modelled"] = mod;
    j["cells"] = jcells;
    std::cout << j.dump(2) << "\n";
  }
  if (!csv && !json) {
    std::snprintf(
        buf, sizeof buf,
        "x base: s/token over the baseline's (%s); verdict: slower above 1 + %.1f%%, faster below 1 - %.1f%%, "
        "else within noise; the band %s\n",
        describe(bc).c_str(), noise, noise, noise_from);
    std::cout << buf;
    for (const auto& [k, ch] : changes)
      if (ch.modelled) {
        std::snprintf(buf, sizeof buf,
                      "k* top-%zu is modelled, not replayed: wider than the trace's top-%zu, each routing gains %zu "
                      "experts drawn from its layer's routing frequency (seed %llu; docs/wall-clock.md)\n",
                      k, shape.top_k(), k - shape.top_k(), static_cast<unsigned long long>(ch.seed));
        std::cout << buf;
      }
  }
  if (!csv && !json && cells.size() == 2)
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
      sub.add_option("--k", a->k,
                     "experts per routing (top-k), comma-separated (default: the trace's); narrower replays each "
                     "routing's first K slots, wider adds modelled experts (docs/wall-clock.md)");
      sub.add_option("--baseline", a->baseline,
                     "the configuration the ratios and verdicts are against, key=value,... of budget, policy, lanes, "
                     "drop, speculate, k (keys left out: each list's first; default: the first row)");
      sub.add_option("--noise", a->noise,
                     "the verdict's noise band, % of the baseline's time (default: the config's noise_pct, else 5)")
          ->check(moe_residency_cli::non_negative());
      moe_residency_cli::add_format_option(sub, a->format, {"table", "csv", "json"});
      sub.add_option("--plot", a->plot, "write an SVG of predicted tok/s vs budget per configuration (gnuplot)");
      sub.callback([a, &sub] { run(sub, *a); });
    }};

}  // namespace
