// `moe-residency demo`: a synthetic MoE workload (shaped like Qwen3-30B-A3B or
// gpt-oss-120b) run through a session with stale-gate, prev-token and the
// fresh-gate control; prints the prediction report.

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <tuple>

#include "checked_options.hpp"
#include "command.hpp"
#include "moe_residency/cache/lru.hpp"
#include "moe_residency/score.hpp"
#include "moe_residency/session.hpp"
#include "moe_residency/simulated_flash.hpp"
#include "moe_residency/speculation.hpp"
#include "moe_residency/synthetic.hpp"

namespace {

using namespace moe_residency;

struct demo_args {
  std::string preset = "qwen3-30b";
  std::size_t tokens = 128;
  std::size_t prompt = 16;
  std::string router;  // empty: the preset's own
  std::string format = "table";
  std::uint64_t seed = 1;
  // --streamed: experts read from a simulated flash through a cache, with speculation.
  bool streamed = false;
  double budget_mib = 2000;
  std::size_t lanes = 2;
  std::size_t cap = 2;
  std::size_t horizon = 1;
  double drop = 0;              // F; 0 = dropping off
  bool no_speculation = false;  // the control arm of a matched pair
  double compute_ms = 0;        // simulated compute per MoE layer (what speculation overlaps)
  double flash_mibps = 2459.8;
  double lane_mibps = 1809.9;
};

// The streamed mode: the synthetic workload through a session that owns an LRU
// cache and speculation (stale-gate's ranking, predictor 0), reading experts from
// a simulated flash; prints the prediction report, then the cache, drop and
// prefetch lines, then the decode speed.
using streamed_speculation = speculation<expert_cache<lru_policy>, 0>;
using streamed_session =
    session<predictor_set<stale_gate_predictor, prev_token_predictor, fresh_gate_control>, streamed_speculation>;

void run_streamed(const demo_args& a, const synthetic_model& model) {
  const model_shape& shape = model.shape();
  simulated_flash_options fo;
  fo.device_mib_per_s = a.flash_mibps;
  fo.lane_mib_per_s = a.lane_mibps;
  simulated_flash flash(shape, fo);
  speculation_options o;
  o.enabled = !a.no_speculation;
  o.cap = a.cap;
  o.horizon = a.horizon;
  o.scheduler.lanes = a.lanes;
  if (a.drop > 0) {
    o.drop = drop_options{};
    o.drop->fraction = a.drop;
    o.drop->on_warning = [](const std::string& w) { std::fprintf(stderr, "demo: %s\n", w.c_str()); };
  }
  streamed_session s(shape, session_options{}, {},
                     std::tuple<streamed_speculation>{streamed_speculation(
                         shape, expert_cache<lru_policy>(shape, {from_mib(a.budget_mib), cycle_guard::refuse, {}}),
                         flash.callback(), o)});
  install_routers(s, model);
  synthetic_stream stream(model);
  auto feed = [&](run_phase phase, std::size_t n) {
    stream.next(n);
    s.begin_batch(phase, stream.first_token(), n);
    for (std::size_t l = 0; l < shape.n_layers(); ++l) {
      const layer_id lid = layer_id(static_cast<std::uint16_t>(l));
      if (!shape.is_moe(lid)) continue;
      s.gate_input(lid, stream.gate_inputs(lid), model.n_embd(), n, model.n_embd() * sizeof(float));
      s.routed(lid, span<const routing>(&stream.routed(lid, 0), n));  // demanded load (+ drops)
      s.layer_loaded(lid);   // speculative reads for the next layer handed to the lanes
      if (a.compute_ms > 0)  // the layer's compute, which speculation overlaps
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(a.compute_ms));
    }
    s.end_batch();
  };
  if (a.prompt) feed(run_phase::prefill, a.prompt);
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t t = 0; t < a.tokens; ++t) feed(run_phase::decode, 1);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  s.extension<0>().finish();
  const prediction_report r = s.report();
  std::fputs((a.format == "table" ? format_text(r)
              : a.format == "csv" ? format_csv(r)
                                  : format_json(r))
                 .c_str(),
             stdout);
  if (a.format != "table") return;
  for (const std::string& line : s.extension<0>().lines()) std::printf("%s\n", line.c_str());
  const double tokens = static_cast<double>(a.tokens);
  std::printf(
      "moe-stream: decode %.1f ms/token (%.2f tokens/s); flash %.1f MiB demanded + %.1f "
      "MiB speculative per token (prefill included), %.0f MiB/s device, %zu lanes\n",
      1e3 * secs / tokens, tokens / secs, to_mib(flash.demanded_bytes()) / tokens,
      to_mib(flash.speculative_bytes()) / tokens, a.flash_mibps, a.lanes);
}

// --router's names (its validator takes only these); empty: the preset's own type.
element_type router_type(const std::string& s, element_type preset_own) {
  return s.empty() ? preset_own : s == "f32" ? element_type::f32 : s == "f16" ? element_type::f16 : element_type::bf16;
}

void run_demo(const demo_args& a) {
  // --preset, --router, --format and --tokens are checked by their validators.
  const synthetic_config c = a.preset == "qwen3-30b"
                                 ? synthetic_presets::qwen3_30b(router_type(a.router, element_type::f16), a.seed)
                                 : synthetic_presets::gpt_oss_120b(router_type(a.router, element_type::f32), a.seed);

  const auto t0 = std::chrono::steady_clock::now();
  const synthetic_model model(c);
  if (a.streamed) return run_streamed(a, model);
  synthetic_stream stream(model);
  standard_session s(model.shape());
  install_routers(s, model);
  if (a.prompt) {
    stream.next(a.prompt);
    feed_batch(s, stream, run_phase::prefill);  // accepted, not scored
  }
  for (std::size_t t = 0; t < a.tokens; ++t) {
    stream.next(1);
    feed_batch(s, stream, run_phase::decode);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr,
               "demo: synthetic %s, %zu layers x %zu experts x %zu, top-%zu, %s routers (%s), "
               "%zu prompt + %zu decode tokens, seed %llu, %.1f s\n",
               model.shape().name().c_str(), model.shape().n_layers(), model.shape().n_experts(), model.n_embd(),
               model.shape().top_k(), to_string(c.router_type), to_string(c.rule), a.prompt, a.tokens,
               static_cast<unsigned long long>(a.seed), secs);
  const prediction_report r = s.report();
  const std::string out = a.format == "table" ? format_text(r) : a.format == "csv" ? format_csv(r) : format_json(r);
  std::fputs(out.c_str(), stdout);
}

const moe_residency_cli::command_registrar reg{
    "demo", "Run a synthetic MoE workload through a session and print the prediction report", [](CLI::App& sub) {
      auto a = std::make_shared<demo_args>();
      moe_residency_cli::add_preset_option(sub, a->preset, {"qwen3-30b", "gpt-oss-120b"});
      sub.add_option("--tokens", a->tokens, "decode tokens (scored)")
          ->check(moe_residency_cli::whole(1, 10000000))
          ->capture_default_str();
      sub.add_option("--prompt", a->prompt, "prompt tokens, one prefill batch (not scored)")
          ->check(moe_residency_cli::whole(0, 1000000))
          ->capture_default_str();
      sub.add_option("--router", a->router,
                     "router element type f32, f16 or bf16 (default: f16 for qwen3-30b, f32 for gpt-oss-120b)")
          ->check(moe_residency_cli::one_of({"f32", "f16", "bf16"}));
      moe_residency_cli::add_format_option(sub, a->format, {"table", "csv", "json"});
      sub.add_option("--seed", a->seed, "workload seed")->check(moe_residency_cli::whole())->capture_default_str();
      CLI::Option* streamed = sub.add_flag("--streamed", a->streamed,
                                           "read experts from a simulated flash through a cache, with speculation");
      sub.add_option("--budget", a->budget_mib, "--streamed: cache budget, MiB")
          ->check(moe_residency_cli::real(moe_residency::detail::real_domain::open_closed(0, 1e12)))
          ->capture_default_str();
      sub.add_option("--lanes", a->lanes, "--streamed: read lanes (0 = synchronous)")
          ->check(moe_residency_cli::whole(0, 64))
          ->capture_default_str();
      sub.add_option("--cap", a->cap, "--streamed: speculative reads per layer")
          ->check(moe_residency_cli::whole(0, 32))
          ->capture_default_str();
      sub.add_option("--horizon", a->horizon,
                     "--streamed: speculate this many MoE layers ahead (the stale-gate ranks only the next one, so 2 "
                     "is refused)")
          ->check(moe_residency_cli::whole(1, 2))
          ->capture_default_str();
      sub.add_option("--drop", a->drop, "--streamed: drop fraction F in (0, 1]; 0 = off")
          ->check(moe_residency_cli::real(moe_residency::detail::real_domain::closed(0, 1)))
          ->capture_default_str();
      sub.add_flag("--no-speculation", a->no_speculation,
                   "--streamed: the control arm (same cache and drops, no speculative reads)");
      sub.add_option("--compute-ms", a->compute_ms, "--streamed: simulated compute per MoE layer, ms")
          ->check(moe_residency_cli::real(moe_residency::detail::real_domain::closed(0, 1000)))
          ->capture_default_str();
      sub.add_option("--flash-mibps", a->flash_mibps, "--streamed: device bandwidth, MiB/s")
          ->check(moe_residency_cli::positive())
          ->capture_default_str();
      sub.add_option("--lane-mibps", a->lane_mibps, "--streamed: bandwidth of one lane alone, MiB/s")
          ->check(moe_residency_cli::positive())
          ->capture_default_str();
      // The --streamed options do nothing without it: "--budget requires --streamed".
      for (const char* o : {"--budget", "--lanes", "--cap", "--horizon", "--drop", "--no-speculation", "--compute-ms",
                            "--flash-mibps", "--lane-mibps"})
        sub.get_option(o)->needs(streamed);
      sub.callback([a] { run_demo(*a); });
    }};

}  // namespace
