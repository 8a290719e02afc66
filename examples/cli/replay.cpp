// `moe-residency replay`: a route trace through policy x budget cells, in
// parallel; table, CSV (the reference curves' columns) or JSON; optional
// gnuplot SVG of hit % against budget with the token cycle marked.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checked_options.hpp"
#include "command.hpp"
#include "gnuplot.hpp"
#include "output.hpp"
#include "moe_residency/replay.hpp"
#include "moe_residency/replay/oracle_profile.hpp"

namespace {

using namespace moe_residency;

struct replay_args {
  std::string trace;
  std::string budgets = "250,500,750,1000,1500,2000,2500,3000,4000,6000,8000";
  std::string policies = "lru,lfu,layer,layerlfu,belady,cycle";
  std::string format = "table";
  std::string plot;
  unsigned threads = 0;
  std::uint64_t seed = 0x5eed;
  double decay = cycle_policy_options{}.decay;
  // the adaptive policy's tuning (adaptive_policy_options)
  double adaptive_window = adaptive_policy_options{}.window_tokens;
  double adaptive_margin = adaptive_policy_options{}.margin;
  std::string adaptive_objective_name = "bytes";
  std::string adaptive_first = adaptive_rule_names()[adaptive_policy_options{}.first_leader];
  std::string adaptive_scope_name = "global";
  // dynamic drop and speculation
  double drop = 0;
  std::string speculate;
  std::size_t spec_cap = speculation_planner::default_cap;
  std::size_t horizon = 1;
  std::string oracle_profile;
  bool decode_only = false;  // prompt batches skip the cache (the live manager's rule)
};

std::vector<double> parse_budgets(const std::string& s) {
  std::vector<double> out;
  for (const auto& item : moe_residency_cli::split_list(s, "--budgets")) {
    out.push_back(moe_residency_cli::parse_budget_mib(item, "--budgets (MiB)"));
  }
  return out;
}

std::string fmt_mib(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// The SVG of hit % against budget, one line per policy, the token cycle
// marked; the title (the trace's arch) goes to gnuplot as escaped text.
void write_plot(const std::string& svg, const std::string& title, const std::vector<replay_result>& rs) {
  std::vector<moe_residency_cli::gnuplot_series> lines;
  for (const auto& r : rs) {
    auto it = std::find_if(lines.begin(), lines.end(), [&](const auto& l) { return l.title == r.policy; });
    if (it == lines.end()) it = lines.insert(lines.end(), {r.policy, {}});
    it->points.emplace_back(r.budget_mib, r.hit_pct_decode());
  }
  const std::string cycle = moe_residency_cli::gnuplot_number(rs.empty() ? 0 : to_mib(rs.front().token_cycle_bytes));
  const std::string settings =
      "set title " + moe_residency_cli::gnuplot_text(title) +
      " noenhanced\n"
      "set xlabel 'cache budget (MiB)'\nset ylabel 'decode hit rate (%)'\n"
      "set key right bottom\nset grid\nset yrange [0:100]\n"
      "set arrow from " +
      cycle + ", graph 0 to " + cycle + ", graph 1 nohead dt 2 lw 2 lc rgb '#aa0000'\n" + "set label " +
      moe_residency_cli::gnuplot_text("token cycle " + fmt_mib(rs.empty() ? 0 : to_mib(rs.front().token_cycle_bytes)) +
                                      " MiB") +
      " at " + cycle + ", graph 0.95 offset 0.5,0 tc rgb '#aa0000' noenhanced\n";
  moe_residency_cli::render_svg_plot(svg, settings, lines);
  std::cerr << "moe-residency replay: wrote " << svg << "\n";
}

// The adaptive policy's options from the --adaptive-* flags (each checked by
// its validator).
adaptive_policy_options adaptive_options(const replay_args& a) {
  adaptive_policy_options o;
  o.window_tokens = a.adaptive_window;
  o.margin = a.adaptive_margin;
  o.objective = a.adaptive_objective_name == "misses" ? adaptive_objective::misses : adaptive_objective::bytes;
  const auto& names = adaptive_rule_names();
  o.first_leader = static_cast<std::uint32_t>(std::find(names.begin(), names.end(), a.adaptive_first) - names.begin());
  o.scope = a.adaptive_scope_name == "layer" ? adaptive_scope::layer : adaptive_scope::global;
  return o;
}

// replay/oracle_profile.hpp has the two forms and their checks.
std::vector<double> read_oracle_profile(const std::string& path, std::size_t n_layers) {
  return parse_oracle_profile(moe_residency_cli::read_whole_file(path, "--oracle-profile"), "--oracle-profile: " + path,
                              n_layers);
}

// What an out-of-memory error names while the cells run.
std::string cells_activity(const model_shape& s, std::size_t cells) {
  return "replaying " + std::to_string(cells) + " cells of " + s.name() + " (tables of " +
         std::to_string(s.n_layers()) + " layers x " + std::to_string(s.n_experts()) + " experts a cell)";
}

// `replay --drop F` and/or `--speculate P`: one dynamic replay per cell.
void run_dynamic(const replay_args& a, const std::vector<double>& budgets, const std::vector<std::string>& policies) {
  const routed_replay_input in = [&a] {
    const validated_route_trace t = moe_residency_cli::read_trace(a.trace);
    const moe_residency_cli::activity doing("grouping the load batches of " + a.trace);
    return routed_replay_input::from_trace(t.trace());
  }();
  const moe_residency_cli::activity replaying(cells_activity(in.shape(), budgets.size() * policies.size()));
  moe_residency_cli::require_decode_tokens(in.decode_tokens(), a.trace);
  dynamic_replay_options base;
  if (a.drop != 0) base.drop = a.drop;
  base.prefill_cached = !a.decode_only;
  // `oracle:P,FILE` is `--speculate oracle:P --oracle-profile FILE`.
  std::string speculate = a.speculate.empty() ? "none" : a.speculate, profile = a.oracle_profile;
  if (const auto comma = speculate.find(','); comma != std::string::npos && speculate.rfind("oracle:", 0) == 0) {
    if (!profile.empty()) throw error("--speculate " + a.speculate + " and --oracle-profile: give the profile once");
    profile = speculate.substr(comma + 1);
    speculate.erase(comma);
    if (profile.empty())
      throw error("--speculate: '" + a.speculate + "' has an empty FILE; expected oracle:P,FILE (a per-layer profile)");
  }
  base.speculation = parse_replay_speculation(speculate);
  base.speculation.cap = a.spec_cap;
  base.speculation.horizon = a.horizon;
  base.speculation.seed = a.seed;
  if (!profile.empty()) {
    if (base.speculation.source != speculation_source::oracle)
      throw error("--oracle-profile needs --speculate oracle:P");
    base.speculation.oracle_profile = read_oracle_profile(profile, in.shape().n_layers());
  }
  base.seed = a.seed;
  base.cycle.decay = a.decay;
  base.adaptive = adaptive_options(a);
  std::vector<dynamic_replay_result> rs;
  for (double b : budgets)
    for (const auto& p : policies) {
      dynamic_replay_options o = base;
      o.policy = p;
      o.budget_mib = b;
      rs.push_back(replay_dynamic(in, o));
      if (!rs.back().warning.empty())
        std::cerr << "note: " << p << " at " << b << " MiB: " << rs.back().warning << "\n";
    }
  const bool csv = a.format == "csv";
  if (!csv)
    std::cout << in.shape().name() << " (" << a.trace << "): " << in.decode_tokens() << " decode tokens; drop "
              << (base.drop ? "F = " + std::to_string(*base.drop).substr(0, 4) : std::string("off")) << ", speculate "
              << base.speculation.name() << " (cap " << a.spec_cap << ", horizon " << a.horizon << ")"
              << (a.decode_only ? "; the cache sees decode only" : "") << "\n";
  std::cout << (csv ? "budget_mib,policy,hit_pct_decode,demanded_mib_per_token,speculative_mib_per_token,"
                      "spec_issued,spec_useful,experts_dropped,io_saved_pct,mass_lost_pct\n"
                    : "budget MiB  policy      decode hit %  demanded MiB/tok  spec MiB/tok  spec issued  useful  "
                      "dropped  io saved %  weight lost %\n");
  char buf[320];
  for (const auto& r : rs) {
    const double io = 100.0 * r.drops.miss_bytes_avoided_fraction(), w = 100.0 * r.drops.weight_discarded_fraction();
    std::snprintf(buf, sizeof buf,
                  csv ? "%g,%s,%.3f,%.3f,%.3f,%llu,%llu,%llu,%.3f,%.3f\n"
                      : "%-11g %-11s %12.1f  %16.1f  %12.1f  %11llu  %6llu  %7llu  %10.1f  %13.2f\n",
                  r.options.budget_mib, r.options.policy.c_str(), r.hit_pct_decode(), r.demanded_mib_per_token(),
                  r.speculative_mib_per_token(), static_cast<unsigned long long>(r.reads.issued),
                  static_cast<unsigned long long>(r.speculation.useful),
                  static_cast<unsigned long long>(r.drops.experts_dropped), io, w);
    std::cout << buf;
  }
}

// An option that only matters with another, given without it, is an error
// naming both: the run it asked for is not the run that would happen.
void check_option_effects(const CLI::App& sub, const replay_args& a, const std::vector<std::string>& policies) {
  auto given = [&sub](const char* name) { return sub.get_option(name)->count() > 0; };
  auto any_policy = [&policies](const char* name) {
    return std::any_of(policies.begin(), policies.end(),
                       [name](const std::string& p) { return p.rfind(name, 0) == 0; });
  };
  const bool oracle = a.speculate.rfind("oracle", 0) == 0;
  const bool speculating = !a.speculate.empty() && a.speculate != "none";
  for (const char* o : {"--spec-cap", "--horizon"})
    if (given(o) && !speculating)
      throw error(std::string(o) +
                  ": has no effect without --speculate; expected --speculate prev-token, frequency "
                  "or oracle:P with it");
  if (given("--oracle-profile") && !oracle)
    throw error("--oracle-profile: has no effect without --speculate oracle:P; expected them together");
  if (given("--decay") && !any_policy("cycle") && !any_policy("adaptive"))
    throw error("--decay: has no effect without the cycle or adaptive policy; --policies is '" + a.policies + "'");
  for (const char* o :
       {"--adaptive-window", "--adaptive-margin", "--adaptive-objective", "--adaptive-first", "--adaptive-scope"})
    if (given(o) && !any_policy("adaptive"))
      throw error(std::string(o) + ": has no effect without the adaptive policy; --policies is '" + a.policies + "'");
  if (given("--seed") && !any_policy("random") && !oracle)
    throw error("--seed: has no effect without the random policy or --speculate oracle:P; --policies is '" +
                a.policies + "'");
  if (given("--threads") && (a.drop != 0 || !a.speculate.empty() || a.decode_only))
    throw error(
        "--threads: has no effect with --drop, --speculate or --decode-only (those cells run one after the other)");
}

void run(const CLI::App& sub, const replay_args& a) {
  const bool given_plot = !a.plot.empty();  // an empty --plot is refused while parsing
  const auto budgets = parse_budgets(a.budgets);
  const auto policies = moe_residency_cli::split_list(a.policies, "--policies");
  check_option_effects(sub, a, policies);
  for (const auto& p : policies) check_replay_cell(p, budgets.front());
  if (a.drop != 0 || !a.speculate.empty() || a.decode_only) {
    if (a.format == "json" || given_plot)
      throw error(std::string(given_plot ? "--plot" : "--format json") +
                  ": not with --drop, --speculate or --decode-only; expected table or csv output, no --plot");
    run_dynamic(a, budgets, policies);
    return;
  }
  if (given_plot) {  // before the replay, not after it
    moe_residency_cli::check_output_path(a.plot, "--plot", {{"--trace", a.trace}});
    moe_residency_cli::require_gnuplot("replay");
  }
  const replay_input in = [&a] {
    const validated_route_trace t = moe_residency_cli::read_trace(a.trace);
    const moe_residency_cli::activity doing("grouping the load batches of " + a.trace);
    return replay_input::from_trace(t.trace());
  }();
  const moe_residency_cli::activity replaying(cells_activity(in.shape(), budgets.size() * policies.size()));
  moe_residency_cli::require_decode_tokens(
      static_cast<std::size_t>(std::count_if(in.batches().batches.begin(), in.batches().batches.end(),
                                             [](const load_batch& b) { return b.phase == run_phase::decode; })),
      a.trace);

  replay_options o;
  o.threads = a.threads;
  o.seed = a.seed;
  o.cycle.decay = a.decay;
  o.adaptive = adaptive_options(a);
  const auto t0 = std::chrono::steady_clock::now();
  double last = 0;  // progress is called under the grid's lock
  o.progress = [&](std::size_t done, std::size_t total) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s < 0.5) return;  // short runs stay quiet
    if (done != total && s - last < 0.25) return;
    last = s;
    std::fprintf(stderr, "\rreplay: %zu/%zu cells, %.1f s", done, total, s);
    if (done == total) std::fprintf(stderr, "\n");
  };
  const auto rs = replay_grid(in, budgets, policies, o);

  std::set<std::string> collapsing;
  std::string over;  // cells that held more than their budget: "layer at 250 MiB (785.0), ..."
  for (const auto& r : rs) {
    if (r.below_cycle_warned) collapsing.insert(r.policy);
    if (r.stats.peak_bytes > r.budget_bytes)
      over += (over.empty() ? "" : ", ") + r.policy + " at " + detail::show_number(r.budget_mib) + " MiB (" +
              fmt_mib(to_mib(r.stats.peak_bytes)) + ")";
  }
  if (!over.empty())
    std::cerr << "note: cells that held more than their budget (peak resident MiB): " << over
              << "; their hit rates are for that memory, not the budget (a batch's own experts are never evicted, "
                 "and the per-layer policies evict only inside the layer being loaded and keep top-k experts a "
                 "layer); see peak_resident_mib in --format json\n";
  if (!collapsing.empty()) {
    std::string names;
    for (const auto& p : collapsing) names += (names.empty() ? "" : ", ") + p;
    std::cerr << "note: budgets below the token cycle (" << fmt_mib(to_mib(token_cycle_bytes(in.shape())))
              << " MiB) collapse recency policies (" << names << ") to ~0% hit; see docs/replay.md\n";
  }

  if (a.format == "csv") {
    std::cout << replay_csv(rs);
  } else if (a.format == "json") {
    nlohmann::json j;
    j["trace"] = a.trace;
    j["model"] = in.shape().name();
    j["token_cycle_mib"] = to_mib(token_cycle_bytes(in.shape()));
    j["cells"] = nlohmann::json::array();
    for (const auto& r : rs)
      j["cells"].push_back({{"budget_mib", r.budget_mib},
                            {"policy", r.policy},
                            {"hit_pct_cum", r.hit_pct_cum()},
                            {"hit_pct_decode", r.hit_pct_decode()},
                            {"read_mib", r.read_mib()},
                            {"lookups", r.stats.all.lookups},
                            {"decode_lookups", r.stats.decode.lookups},
                            {"evictions", r.stats.all.evictions},
                            {"peak_resident_mib", to_mib(r.stats.peak_bytes)},
                            {"below_token_cycle", r.budget_bytes < r.token_cycle_bytes},
                            {"seconds", r.seconds}});
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << in.shape().name() << " (" << a.trace << "): " << in.batches().batches.size() << " load batches, "
              << in.batches().experts.size() << " routed ids\n"
              << replay_table(rs);
  }
  if (given_plot) write_plot(a.plot, in.shape().name() + ": decode hit rate vs budget", rs);
}

const moe_residency_cli::command_registrar reg{
    "replay", "Replay a route trace through cache policies x budgets (hit %, MiB read)", [](CLI::App& sub) {
      auto a = std::make_shared<replay_args>();
      moe_residency_cli::add_trace_option(sub, a->trace);
      sub.add_option("--budgets", a->budgets, "cache budgets in MiB (1 MiB = 1048576 bytes), comma-separated")
          ->check(moe_residency_cli::non_empty("cache budgets in MiB, comma-separated"))
          ->capture_default_str();
      sub.add_option("--policies", a->policies,
                     "comma-separated: " + cache_policy_names() + "; <policy>+prev or <policy>+oracle adds retention")
          ->check(moe_residency_cli::non_empty("cache policies, comma-separated"))
          ->capture_default_str();
      sub.footer("Policies:\n" + cache_policy_help());
      moe_residency_cli::add_format_option(sub, a->format, {"table", "csv", "json"});
      sub.add_option("--plot", a->plot, "write an SVG of hit % vs budget (needs gnuplot)")
          ->check(moe_residency_cli::non_empty("a file to write the SVG to"));
      sub.add_option("--threads", a->threads, "worker threads (0 = all cores)")
          ->check(moe_residency_cli::whole(0, 4096))
          ->capture_default_str();
      sub.add_option("--seed", a->seed, "seed of the random policy")
          ->check(moe_residency_cli::whole())
          ->capture_default_str();
      sub.add_option("--decay", a->decay, "usage decay per token of the cycle policy, in (0, 1)")
          ->check(moe_residency_cli::real(detail::real_domain::open(0, 1)))
          ->capture_default_str();
      sub.add_option("--adaptive-window", a->adaptive_window,
                     "adaptive: memory of the rules' costs, in tokens (0 = the whole run)")
          ->check(moe_residency_cli::non_negative())
          ->capture_default_str();
      sub.add_option("--adaptive-margin", a->adaptive_margin,
                     "adaptive: a rule takes the lead when cheaper than the leader by this fraction, in [0, 1)")
          ->check(moe_residency_cli::real(detail::real_domain{0.0, 1.0, false, true}))
          ->capture_default_str();
      sub.add_option("--adaptive-objective", a->adaptive_objective_name,
                     "adaptive: what a rule's cost is: the bytes it reads or its misses")
          ->check(moe_residency_cli::one_of({"bytes", "misses"}))
          ->capture_default_str();
      sub.add_option("--adaptive-first", a->adaptive_first, "adaptive: the rule that leads before any cost is known")
          ->check(moe_residency_cli::one_of(adaptive_rule_names()))
          ->capture_default_str();
      sub.add_option("--adaptive-scope", a->adaptive_scope_name, "adaptive: one leader for the cache, or one per layer")
          ->check(moe_residency_cli::one_of({"global", "layer"}))
          ->capture_default_str();
      sub.add_option("--drop", a->drop,
                     "cache-aware drop at fraction F (0 < F <= 1): a dropped expert is never "
                     "read and never enters the cache; 0 = off")
          ->check(moe_residency_cli::real(detail::real_domain::closed(0, 1)));
      sub.add_option("--speculate", a->speculate,
                     "speculative reads from prev-token, frequency, oracle:P or oracle:P,FILE (a per-layer profile)")
          ->check(moe_residency_cli::non_empty("none, prev-token, frequency, oracle:P or oracle:P,FILE"));
      sub.add_option("--spec-cap", a->spec_cap, "speculative reads per layer (the planner's cap)")
          ->check(moe_residency_cli::whole(0, 32))
          ->capture_default_str();
      sub.add_option("--horizon", a->horizon, "read for the MoE layer 1 or 2 ahead")
          ->check(moe_residency_cli::whole(1, 2))
          ->capture_default_str();
      sub.add_option("--oracle-profile", a->oracle_profile,
                     "oracle: per-layer P from a file (one P per line, or layer,P lines; every layer)")
          ->check(moe_residency_cli::non_empty("an oracle profile file"));
      sub.add_flag("--decode-only", a->decode_only,
                   "prompt batches skip the cache (the live residency manager's rule); predictors still "
                   "learn from them");
      sub.callback([a, &sub] { run(sub, *a); });
    }};

}  // namespace
