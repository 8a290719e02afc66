// `moe-residency calibrate`: fits the timing model's free parameters to a
// recorded per-token metrics file over the replay of the same run (decode
// tokens), on one set of tokens, and scores it on the other.

#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "checked_options.hpp"
#include "command.hpp"
#include "output.hpp"
#include "moe_residency/timing.hpp"
#include "moe_residency/timing/calibrate.hpp"

namespace {

using namespace moe_residency;

struct calibrate_args {
  std::string trace, metrics, config, write_config;
  double budget = 0;
  std::string policy = "lru";
  std::string format = "table";
  std::string split = "halves";
  bool fit_io = false;
};

void run(const calibrate_args& a) {
  if (!a.write_config.empty())  // before the work, not after it
    moe_residency_cli::check_output_path(a.write_config, "--write-config",
                                         {{"--trace", a.trace}, {"--metrics", a.metrics}, {"--config", a.config}});
  timing_params start;
  if (!a.config.empty())
    start = parse_timing_config(moe_residency_cli::read_whole_file(a.config, "--config"), a.config);
  const token_metrics m = parse_token_metrics(moe_residency_cli::read_whole_file(a.metrics, "--metrics"), a.metrics);
  const routed_replay_input in = routed_replay_input::from_trace(moe_residency_cli::read_trace(a.trace));
  dynamic_replay_options o;
  o.policy = a.policy;
  o.budget_mib = a.budget;
  const dynamic_replay_result r = replay_dynamic(in, o);
  calibration_options co;
  co.split = a.split == "halves" ? calibration_split::halves
             : a.split == "all"  ? calibration_split::all
                                 : calibration_split::interleaved;
  if (a.fit_io) {
    co.fit_io = true;
    co.free |= static_cast<unsigned>(timing_param::bandwidth_scale);
  }
  calibration_result c;
  try {
    c = calibrate_timing(in.shape(), r.decode_loads, m, start, co);
  } catch (const error& e) {  // name the files it paired
    throw error("--metrics " + a.metrics + " with --trace " + a.trace + ": " + e.what());
  }
  if (!a.write_config.empty())
    moe_residency_cli::write_output_file(
        a.write_config, "--write-config", {{"--trace", a.trace}, {"--metrics", a.metrics}, {"--config", a.config}},
        [&](std::ostream& f) {
          f << "# moe-residency calibrate --trace " << a.trace << " --metrics " << a.metrics << " --budget " << a.budget
            << " --policy " << a.policy << " --split " << a.split << "\n"
            << format_timing_config(c.params);
        });
  std::string fitted;
  for (const auto& n : c.free) fitted += (fitted.empty() ? "" : ", ") + n;
  if (a.format == "csv") {
    std::cout << calibration_csv(c);
    std::cerr << "fitted (" << fitted << "), " << c.iterations << " iterations, rms " << c.rms_ms << " ms:\n"
              << format_timing_config(c.params);
    return;
  }
  char buf[256];
  std::cout << in.shape().name() << " (" << a.trace << "), " << a.policy << " at " << a.budget << " MiB: " << m.size()
            << " decode tokens; "
            << (co.split == calibration_split::halves ? "fitted on the first half, scored on the second"
                : co.split == calibration_split::all  ? "every token fitted, none held out"
                                                      : "fitted on even tokens, scored on odd ones")
            << "\n";
  std::cout << "set        tokens  mean recorded ms  mean predicted ms  median |err| %\n";
  for (const calibration_score* s : {&c.fit, &c.held_out}) {
    std::snprintf(buf, sizeof buf, "%-9s  %6zu  %16.1f  %17.1f  %14.1f\n", s->set.c_str(), s->tokens,
                  s->mean_recorded_ms, s->mean_predicted_ms, s->median_abs_err_pct);
    std::cout << buf;
  }
  std::snprintf(buf, sizeof buf, "held-out mean s/token: predicted %.3f, recorded %.3f (%+.1f%%)\n",
                c.held_out.mean_predicted_ms / 1000, c.held_out.mean_recorded_ms / 1000,
                100.0 * (c.held_out.mean_predicted_ms / c.held_out.mean_recorded_ms - 1.0));
  std::cout << buf;
  if (c.compute_floor_pct == c.compute_floor_pct) {
    std::snprintf(buf, sizeof buf,
                  "recorded compute alone: held-out median |compute - mean fitted compute| / wall = %.1f%% "
                  "(the compute time's own variation, which a routing trace cannot explain)\n",
                  c.compute_floor_pct);
    std::cout << buf;
  }
  std::cout << "fitted (" << fitted << "), " << c.iterations << " iterations, rms residual " << c.rms_ms
            << " ms (wall, stall, management" << (a.fit_io ? ", io" : "") << " residuals of the fitted tokens):\n"
            << format_timing_config(c.params);
}

const moe_residency_cli::command_registrar reg{
    "calibrate", "Fit the timing model to recorded per-token metrics; score it on held-out tokens", [](CLI::App& sub) {
      auto a = std::make_shared<calibrate_args>();
      moe_residency_cli::add_trace_option(sub, a->trace, "route trace of the run");
      sub.add_option("--metrics", a->metrics, "the run's per-token metrics CSV (wall_ms, stall_ms, mgmt_ms, ...)")
          ->required();
      sub.add_option("--budget", a->budget, "the run's cache budget, MiB")
          ->required()
          ->check(moe_residency_cli::budget_mib());
      sub.add_option("--policy", a->policy, "the run's cache policy")->capture_default_str();
      sub.add_option("--config", a->config, "timing config (key = value) with the fixed parameters: lanes, curve, ...");
      sub.add_option("--split", a->split,
                     "halves (first half fitted, second held out), interleaved, or all (every token fitted)")
          ->check(moe_residency_cli::one_of({"halves", "interleaved", "all"}))
          ->capture_default_str();
      sub.add_flag("--fit-io", a->fit_io, "also fit the recorded io_ms, and the bandwidth scale with it");
      sub.add_option("--write-config", a->write_config, "write the fitted parameters as a timing config");
      moe_residency_cli::add_format_option(sub, a->format, {"table", "csv"});
      sub.callback([a] { run(*a); });
    }};

}  // namespace
