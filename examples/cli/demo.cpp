// `moe-residency demo`: a synthetic MoE workload (shaped like Qwen3-30B-A3B or
// gpt-oss-120b) run through a session with stale-gate, prev-token and the
// fresh-gate control; prints the prediction report.

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "command.hpp"
#include "moe_residency/score.hpp"
#include "moe_residency/session.hpp"
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
};

element_type parse_router(const std::string& s) {
  if (s == "f32") return element_type::f32;
  if (s == "f16") return element_type::f16;
  if (s == "bf16") return element_type::bf16;
  throw error("--router: '" + s + "'; expected f32, f16 or bf16");
}

void run_demo(const demo_args& a) {
  if (a.format != "table" && a.format != "csv" && a.format != "json")
    throw error("--format: '" + a.format + "'; expected table, csv or json");
  if (a.tokens == 0) throw error("--tokens: 0; expected at least 1 decode token");
  synthetic_config c;
  if (a.preset == "qwen3-30b")
    c = synthetic_presets::qwen3_30b(a.router.empty() ? element_type::f16 : parse_router(a.router),
                                     a.seed);
  else if (a.preset == "gpt-oss-120b")
    c = synthetic_presets::gpt_oss_120b(
        a.router.empty() ? element_type::f32 : parse_router(a.router), a.seed);
  else
    throw error("--preset: unknown preset '" + a.preset + "'; expected qwen3-30b or gpt-oss-120b");

  const auto t0 = std::chrono::steady_clock::now();
  const synthetic_model model(c);
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
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr,
               "demo: synthetic %s, %zu layers x %zu experts x %zu, top-%zu, %s routers (%s), "
               "%zu prompt + %zu decode tokens, seed %llu, %.1f s\n",
               model.shape().name().c_str(), model.shape().n_layers(), model.shape().n_experts(),
               model.n_embd(), model.shape().top_k(), to_string(c.router_type),
               to_string(c.rule), a.prompt, a.tokens, static_cast<unsigned long long>(a.seed),
               secs);
  const prediction_report r = s.report();
  const std::string out = a.format == "table" ? format_text(r)
                          : a.format == "csv" ? format_csv(r)
                                              : format_json(r);
  std::fputs(out.c_str(), stdout);
}

const moe_residency_cli::command_registrar reg{
    "demo",
    "Run a synthetic MoE workload through a session and print the prediction report",
    [](CLI::App& sub) {
      auto a = std::make_shared<demo_args>();
      sub.add_option("--preset", a->preset, "qwen3-30b | gpt-oss-120b")->capture_default_str();
      sub.add_option("--tokens", a->tokens, "decode tokens (scored)")->capture_default_str();
      sub.add_option("--prompt", a->prompt, "prompt tokens, one prefill batch (not scored)")
          ->capture_default_str();
      sub.add_option("--router", a->router,
                     "router element type f32 | f16 | bf16 (default: f16 for qwen3-30b, f32 for "
                     "gpt-oss-120b)");
      sub.add_option("--format", a->format, "table | json | csv")->capture_default_str();
      sub.add_option("--seed", a->seed, "workload seed")->capture_default_str();
      sub.callback([a] { run_demo(*a); });
    }};

}  // namespace
