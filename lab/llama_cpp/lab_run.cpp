// moe-lab-run: the memory lab's run instrument. One run of an unmodified
// llama.cpp on a GGUF file, as one cell of the lab (lab/memlab.sh,
// docs/memlab.md) makes it: plain llama.cpp (--no-observer, any of its load
// modes: the stock baselines), the observer alone, or the residency manager
// with any of its parts; every llama_decode call timed and counted (wall and
// CPU time, page faults of the process and of the engine's threads, bytes
// read, the manager's reads and waits) into --per-token-csv and --metrics-csv,
// the digest of every decode token's logits printed, and the route trace
// written (--trace-out).
//
//   moe-lab-run --model lab.gguf --no-observer --per-token-csv run.csv
//   moe-lab-run --model lab.gguf --residency all --residency-budget 141 --per-token-csv run.csv
//               --metrics-csv run.metrics.csv --trace-out run.route.csv
//   moe-lab-run --model qwen-shape.gguf --route-from qwen.route.csv --residency all --predictor oracle:0.886
//               (real routing: llama.cpp routes as the trace did; the manager predicts from the trace)
//
// The options are grouped (add_*_options) and an option that acts only with
// another names it (option_needs): a new option is one line in its group and,
// if it needs another, one in option_needs.

#include <CLI/CLI.hpp>

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "moe_residency/adapters/llama_cpp.hpp"
#include "moe_residency/adapters/llama_cpp/forced_routing.hpp"
#include "moe_residency/adapters/llama_cpp/residency.hpp"
#include "moe_residency/cache/lru.hpp"
#include "moe_residency/replay/oracle_profile.hpp"
#include "moe_residency/score.hpp"
#include "moe_residency/session.hpp"
#include "checked_options.hpp"
#include "degraded_ranking.hpp"
#include "proc_counters.hpp"
#include "timed_decode.hpp"
#include "token_records.hpp"

namespace {

using namespace moe_residency;
namespace mrl = moe_residency::llama_cpp;
namespace lab = moe_residency::llama_cpp::lab;

using lab_session =
    session<predictor_set<stale_gate_predictor, prev_token_predictor, frequency_predictor, fresh_gate_control>>;

struct lab_run_args {
  // The model and the run.
  std::string model_path;
  std::string load_mode = "mmap";  // llama.cpp's own load modes, for the lab's stock baselines
  std::size_t tokens = 32;         // random prompt tokens
  std::size_t decode = 64;
  int threads = 2;
  std::uint64_t seed = 7;
  // What is observed and what is recorded.
  bool no_observer = false;
  bool score = false;  // with --residency: also the session's scoring (the observer alone always scores)
  std::string per_token_csv;
  std::string metrics_csv;  // the phone's metrics format (timing.hpp's parse_token_metrics)
  std::string trace_out;
  double budget_mib = 0;  // the route recorder's LRU cache line; 0: half of all experts' bytes
  // The residency manager (mmap_residency): parts, budget, lanes.
  std::string residency = "off";
  std::string residency_budget = "auto";
  std::string policy = "lru";  // the cache policy (live_cache_policies())
  bool policy_given = false;   // --policy on the command line: refused without the cache
  std::size_t lanes = 2;
  std::size_t spec_cap = 2;
  bool serial = false;       // overlap off: the eval thread waits for each layer's reads
  bool owned_reads = false;  // lanes read themselves (advice::read) instead of willneed + populate_read
  bool pool = false;         // the cache's experts in an expert pool (O_DIRECT reads, mapped over the file's pages)
  double degrade = 0.0;
  bool no_hit_measure = false;
  std::string when_fits = "stand-down";  // act: manage a model that fits (the manager's own cost, no reads)
  // Real routing: llama.cpp's routing replaced by a recorded trace's (forced_routing.hpp).
  std::string route_from;
  std::size_t trace_layers = 0;          // 0: every layer of the trace
  std::string predictor = "stale-gate";  // or oracle:P[,PROFILE] (needs --route-from)
  std::uint64_t oracle_seed = replay_speculation{}.seed;
  bool tokens_given = false, decode_given = false;
};

/// --route-from's trace, cut to --trace-layers.
validated_route_trace load_trace(const std::string& path, std::size_t layers) {
  validated_route_trace t = read_route_trace(path);
  if (layers != 0) return first_layers(t, layers, path);
  return t;
}

void add_run_options(CLI::App& app, lab_run_args& a) {
  namespace opt = moe_residency_cli;  // checked_options.hpp: the numbers every option takes
  app.add_option("--model", a.model_path, "The GGUF model file (the lab's: moe-lab-model writes one)")->required();
  app.add_option("--load-mode", a.load_mode,
                 "How llama.cpp loads --model: mmap (default), or a stock baseline: no-mmap (read into memory), "
                 "mlock (mmap and lock it all), direct-io (O_DIRECT reads into memory)")
      ->check(CLI::IsMember({"mmap", "no-mmap", "mlock", "direct-io"}))
      ->capture_default_str();
  app.add_option("--tokens", a.tokens, "Prompt length in random tokens (drawn with --seed)")
      ->check(opt::whole(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--decode", a.decode, "Tokens to decode after the prompt")
      ->check(opt::whole(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--threads", a.threads, "llama.cpp threads")->check(opt::whole(1, 1024))->capture_default_str();
  app.add_option("--seed", a.seed, "Seed of the prompt and of the sampler")->check(opt::whole())->capture_default_str();
  app.add_option("--route-from", a.route_from,
                 "Route every MoE layer as this recorded trace did (forced_routing.hpp), the stock runs too: prompt "
                 "tokens take its prompt routings, decode tokens its decode routings in order (cycling past its "
                 "end); the model must have its MoE shape (moe-lab-model --shape-from). --tokens and --decode "
                 "default to the trace's");
  app.add_option("--trace-layers", a.trace_layers, "Only the first N layers of --route-from's trace (a cut model)")
      ->check(opt::whole(1, 65535));
}

void add_record_options(CLI::App& app, lab_run_args& a) {
  namespace opt = moe_residency_cli;
  using moe_residency::detail::real_domain;
  app.add_flag("--no-observer", a.no_observer,
               "Plain llama.cpp: no observer, no report; only the run's digest, summary and records");
  app.add_option(
      "--per-token-csv", a.per_token_csv,
      "Write one row per llama_decode call: token,phase,wall_ms,majflt,minflt,read_bytes,"
      "prefetch_issued,prefetch_useful,prefetch_late,pinned_mib,hit_pct,engine_majflt,proc_cpu_ms,proc_sys_ms,"
      "read_wait_ms,read_waits,manage_ms (proc_*: every thread of the process; read_wait*: the eval thread waiting "
      "for the manager's demanded reads, and the layers it had to; manage_ms: the eval thread in the manager)");
  app.add_option("--metrics-csv", a.metrics_csv,
                 "Write one row per decode token in the phone's metrics format for moe-residency calibrate: "
                 "step,steps,wall_ms,compute_ms,read_bytes,cache_hit_pct,stall_ms,majflt,cpu_ms,sys_ms "
                 "(cpu_ms: the eval thread's CPU time; sys_ms: the part of it in the kernel; "
                 "stall_ms = wall_ms - cpu_ms)");
  app.add_option("--trace-out", a.trace_out, "Write the route trace (route_trace v1 CSV)");
  app.add_flag("--score", a.score,
               "With --residency: score the predictors too (the observer alone always does); their GEMVs are the "
               "lab's, not the manager's, and cost the decode token");
  app.add_option("--budget-mib", a.budget_mib,
                 "The route recorder's LRU cache line: its budget in MiB (default: half of all experts)")
      ->check(opt::real(real_domain::open_closed(0, 1e12)));
}

void add_residency_options(CLI::App& app, lab_run_args& a) {
  namespace opt = moe_residency_cli;
  using moe_residency::detail::real_domain;
  app.add_option("--residency", a.residency,
                 "Residency manager parts: all, off, or a comma list of dense, exact, predicted, cache")
      ->capture_default_str();
  app.add_option("--policy", a.policy, "Residency: the expert cache's policy: " + mrl::live_cache_policy_names())
      ->capture_default_str();
  app.add_option("--residency-budget", a.residency_budget,
                 "Pinned expert cache budget in MiB, or auto (from the memory limit)")
      ->capture_default_str();
  app.add_option("--lanes", a.lanes, "Residency: read lanes")->check(opt::whole(0, 64))->capture_default_str();
  app.add_flag("--serial", a.serial,
               "Residency: the eval thread waits for every read of a layer before its matmuls (no overlap)");
  app.add_flag("--owned-reads", a.owned_reads,
               "Residency: the lanes read each miss themselves (sendfile into the page cache, exact ranges), "
               "not the eval thread's willneed of every miss and populate_read on the lanes");
  app.add_flag(
      "--pool", a.pool,
      "Residency: the cache's experts in an expert pool the manager owns (read past the page cache with "
      "O_DIRECT into memory allocated once, mapped over the expert's pages), not locked page cache; needs cache");
  app.add_option("--spec-cap", a.spec_cap, "Residency: predicted reads per layer at most")
      ->check(opt::whole(0, 32))
      ->capture_default_str();
  app.add_option("--degrade", a.degrade,
                 "Residency: share of predicted slots replaced by a wrong expert (seeded by --seed)")
      ->check(opt::real(real_domain::closed(0, 1)))
      ->capture_default_str();
  app.add_option("--predictor", a.predictor,
                 "Residency: what predicted reads are planned from: stale-gate, or oracle:P[,PROFILE] (needs "
                 "--route-from: the trace's next layer, each slot kept with probability P, or per layer from "
                 "PROFILE; the replay's --speculate oracle:P draws, so replay --decode-only plans the same reads)")
      ->capture_default_str();
  app.add_option("--oracle-seed", a.oracle_seed, "Residency: seed of --predictor oracle's draws (the replay's --seed)")
      ->check(opt::whole())
      ->capture_default_str();
  app.add_flag("--no-hit-measure", a.no_hit_measure,
               "Residency: no mincore of the routed experts at each routing (hit_pct stays empty)");
  app.add_option("--residency-when-fits", a.when_fits,
                 "Residency: stand-down (nothing advised when the model fits the memory limit) or act "
                 "(manage it anyway: what the manager costs a token when every routed expert is resident)")
      ->check(opt::one_of({"stand-down", "act"}))
      ->capture_default_str();
}

/// An option that acts only with another is an error naming both, not ignored.
void option_needs(const CLI::App& app, const lab_run_args& a) {
  auto needs = [&app](std::initializer_list<const char*> options, bool with, const char* other) {
    for (const char* o : options)
      if (app.count(o) != 0 && !with)
        throw error(std::string(o) + " has no effect without " + other + "; give " + other + ", or drop " + o);
  };
  needs({"--residency-budget", "--policy", "--lanes", "--serial", "--owned-reads", "--pool", "--spec-cap", "--degrade",
         "--no-hit-measure", "--residency-when-fits", "--predictor", "--oracle-seed"},
        a.residency != "off", "--residency (the manager's parts)");
  needs({"--trace-out", "--budget-mib"}, !a.no_observer, "the observer (drop --no-observer)");
  needs({"--score"}, a.residency != "off", "--residency (the observer alone always scores)");
  needs({"--trace-layers"}, !a.route_from.empty(), "--route-from");
  if (a.predictor != "stale-gate" && a.predictor.rfind("oracle:", 0) != 0)
    throw configuration_error("--predictor: '" + a.predictor + "'; expected stale-gate or oracle:P[,PROFILE]");
  if (a.predictor.rfind("oracle:", 0) == 0 && a.route_from.empty())
    throw configuration_error("--predictor " + a.predictor +
                              " reads the routing to come from the trace; give --route-from TRACE");
  if (app.count("--oracle-seed") != 0 && a.predictor.rfind("oracle:", 0) != 0)
    throw configuration_error(
        "--oracle-seed has no effect without --predictor oracle:P; give both, or drop --oracle-seed");
}

/// --residency (all, off, or a list of parts; residency/options.hpp's one
/// parser) and the rest of the manager's options. Returns false for off.
bool residency_options_from(const lab_run_args& a, mrl::residency_options& o) {
  const bool any = mrl::parse_residency_parts(a.residency, o);
  (void)mrl::live_cache_policy(a.policy);  // refused before the model loads
  if (a.policy_given && !o.cache)
    throw error("--policy " + a.policy + " with --residency " + a.residency +
                ": the policy is the cache's, and the cache is not on; expected --residency all or a list with cache");
  if (a.residency_budget != "auto") {
    o.cache_budget_bytes =
        from_mib(moe_residency::detail::parse_real(a.residency_budget, "--residency-budget (auto, or MiB)",
                                                   moe_residency::detail::real_domain::open_closed(0, 1e9)));
  }
  o.lanes = a.lanes;
  o.overlap = !a.serial;
  o.owned_reads = a.owned_reads;
  o.pool = a.pool;
  o.spec_cap = a.spec_cap;
  o.measure = !a.no_hit_measure;  // the page cache's hit rate at routing: the per-token hit_pct
  o.fits = a.when_fits == "act" ? mrl::when_fits::act : mrl::when_fits::stand_down;  // its validator took only these
  o.validate();
  return any;
}

struct model_deleter {
  void operator()(llama_model* m) const noexcept { llama_model_free(m); }
};
using model_ptr = std::unique_ptr<llama_model, model_deleter>;
struct context_deleter {
  void operator()(llama_context* c) const noexcept { llama_free(c); }
};
using context_ptr = std::unique_ptr<llama_context, context_deleter>;

llama_context_params context_params(const lab_run_args& a, std::size_t n_tokens) {
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<std::uint32_t>(n_tokens + 16);
  cp.n_batch = cp.n_ctx;
  cp.n_ubatch = cp.n_ctx;  // the prompt is one graph
  cp.n_threads = a.threads;
  cp.n_threads_batch = a.threads;
  return cp;
}

std::vector<llama_token> random_prompt(const lab_run_args& a, const llama_model* m) {
  std::mt19937_64 gen(a.seed);
  std::uniform_int_distribution<int> pick(0, llama_vocab_n_tokens(llama_model_get_vocab(m)) - 1);
  std::vector<llama_token> t(a.tokens);
  for (auto& x : t) x = pick(gen);
  return t;
}

/// The records every run writes and prints.
void finish(const lab_run_args& a, const lab::run_result& r) {
  lab::print_run_summary(r);
  if (!a.metrics_csv.empty()) lab::write_metrics_csv(r, a.metrics_csv);
  if (!a.per_token_csv.empty()) lab::write_per_token_csv(r, a.per_token_csv);
}

int lab_run(const lab_run_args& a) {
  mrl::residency_options ro;
  const bool managed = residency_options_from(a, ro);
  if (managed && a.no_observer) throw error("--residency needs the observer; drop --no-observer");
  if (a.load_mode != "mmap" && (managed || !a.no_observer))
    throw error("--load-mode " + a.load_mode + " is a stock baseline: it needs --no-observer and no --residency");
  if (a.degrade > 0 && !ro.predicted)
    throw configuration_error(
        "--degrade " + std::to_string(a.degrade) +
        " degrades the predicted reads' rankings; expected --residency all or a list with predicted");
  if (a.predictor.rfind("oracle:", 0) == 0 && !ro.predicted)
    throw configuration_error("--predictor " + a.predictor +
                              " plans predicted reads; expected --residency all or a list with predicted");
  // Real routing: the trace read (and checked) before the model loads.
  std::unique_ptr<validated_route_trace> trace;
  std::unique_ptr<mrl::forced_routing> routes;
  lab_run_args sized = a;
  if (!a.route_from.empty()) {
    trace = std::make_unique<validated_route_trace>(load_trace(a.route_from, a.trace_layers));
    routes = std::make_unique<mrl::forced_routing>(*trace, a.route_from);
    if (!a.tokens_given && routes->prefill_tokens() > 0) sized.tokens = routes->prefill_tokens();
    if (!a.decode_given) sized.decode = routes->decode_tokens();
  }
  llama_log_set(
      [](ggml_log_level level, const char* text, void*) {
        if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
      },
      nullptr);
  llama_backend_init();

  llama_model_params mp = llama_model_default_params();
  // No "extra" CPU buffer types: with them, llama.cpp's CPU backend repacks
  // quantised weights (Q4_K, Q8_0, … into interleaved layouts for its GEMM
  // kernels) by copying them out of the mapping into anonymous memory at
  // load. The experts would then no longer be the file's pages — nothing to
  // page in, prefetch or pin, and a model larger than memory could not load.
  mp.use_extra_bufts = false;
  mp.load_mode = LLAMA_LOAD_MODE_MMAP;
  if (a.load_mode == "no-mmap") mp.load_mode = LLAMA_LOAD_MODE_NONE;
  if (a.load_mode == "mlock") mp.load_mode = LLAMA_LOAD_MODE_MMAP_MLOCK;
  if (a.load_mode == "direct-io") mp.load_mode = LLAMA_LOAD_MODE_DIRECT_IO;
  model_ptr model(llama_model_load_from_file(a.model_path.c_str(), mp));
  if (!model) throw error("--model: llama.cpp could not load '" + a.model_path + "'");
  char desc[256];
  llama_model_desc(model.get(), desc, sizeof desc);
  const std::vector<llama_token> prompt = random_prompt(sized, model.get());
  const std::size_t n_total = prompt.size() + sized.decode;

  if (a.no_observer) {
    // Plain llama.cpp: no callback at all (with --route-from, only the
    // observer's forcing: one graph split a MoE layer, no sink); the same
    // warm-up token as below.
    llama_context_params cp = context_params(sized, n_total);
    std::unique_ptr<mrl::observer> forcing;
    if (routes) {
      forcing = std::make_unique<mrl::observer>(model.get());
      forcing->install(cp);
      forcing->force_routing(routes.get());
    }
    context_ptr ctx(llama_init_from_model(model.get(), cp));
    if (!ctx) throw error("llama_init_from_model failed");
    llama_token t0 = prompt.front();
    if (llama_decode(ctx.get(), llama_batch_get_one(&t0, 1)) != 0) throw error("warm-up decode failed");
    llama_memory_clear(llama_get_memory(ctx.get()), true);
    if (forcing) {
      forcing->set_position(0);
      routes->reset_stats();
    }
    const lab::run_result r =
        lab::timed_decode(ctx.get(), model.get(), prompt, sized.decode, a.seed, nullptr, lab::current_threads());
    std::printf("model: %s, no observer%s\nrun: %zu prompt tokens, %zu decoded\n", desc,
                routes ? " (routing forced)" : "", prompt.size(), sized.decode);
    if (routes) std::printf("%s\n", routes->note().c_str());
    finish(a, r);
    return 0;
  }

  // The observer; one warm-up token teaches it the graph (the routers, each
  // layer's spec, the expert tensors) before the session is built.
  mrl::observer obs(model.get());
  llama_context_params cp = context_params(sized, n_total);
  obs.install(cp);
  if (routes) obs.force_routing(routes.get());  // from the warm-up on: every graph routes as the trace
  context_ptr ctx(llama_init_from_model(model.get(), cp));
  if (!ctx) throw error("llama_init_from_model failed");
  mrl::warm_up(ctx.get(), obs, "'" + std::string(desc) + "'", prompt.front());
  const model_shape shape = obs.shape();
  if (routes) {
    routes->check_layers(shape);
    routes->reset_stats();
  }

  session_options so;
  so.on_anomaly = anomaly_action::count;
  lab_session s(shape, so);
  const std::size_t n_routers = mrl::configure_routers(s, obs);

  std::uint64_t budget = from_mib(a.budget_mib);
  if (budget == 0) {
    std::uint64_t all = 0;
    for (std::size_t l = 0; l < shape.n_layers(); ++l)
      all += shape.expert_bytes(layer_id(static_cast<std::uint16_t>(l))) * shape.n_experts();
    budget = all / 2;
  }
  mrl::route_recorder<lru_policy> rec(shape, budget);
  std::string label = a.model_path;  // the trace header's model, without spaces
  for (char& c : label)
    if (c == ' ' || c == '\t') c = '_';
  const mrl::gguf_expert_map map(a.model_path, obs);
  rec.describe(label, obs.arch(), mrl::gguf_dense_bytes(a.model_path, map, shape.n_layers()));
  mrl::session_sink<lab_session> sink(s, &rec);
  // The manager's runs feed the recorder alone, unless --score: the session's predictors
  // (a GEMV a layer for the stale gate) are the lab's instrument, not the manager's cost.
  const bool score = !managed || a.score;
  mrl::observer_sink* after = score ? static_cast<mrl::observer_sink*>(&sink) : &rec;

  const std::vector<std::string> engine = lab::current_threads();  // before the manager's lanes
  std::unique_ptr<mrl::residency_manager> res;
  // --predictor oracle:P[,PROFILE]: the trace's next layer at accuracy P, the replay's draws.
  std::unique_ptr<mrl::trace_oracle> oracle;
  if (a.predictor.rfind("oracle:", 0) == 0) {
    std::string p = a.predictor.substr(7), profile_file;
    if (const auto comma = p.find(','); comma != std::string::npos) {
      profile_file = p.substr(comma + 1);
      p = p.substr(0, comma);
    }
    const double acc = moe_residency::detail::parse_real(p, "--predictor oracle:P: P",
                                                         moe_residency::detail::real_domain::closed(0, 1));
    std::vector<double> profile;
    if (!profile_file.empty()) {
      std::ifstream in(profile_file);
      std::stringstream text;
      text << in.rdbuf();
      if (!in) throw error("--predictor " + a.predictor + ": cannot read the profile '" + profile_file + "'");
      profile = parse_oracle_profile(text.str(), "--predictor: " + profile_file, routes->shape().n_layers());
    }
    oracle = std::make_unique<mrl::trace_oracle>(*routes, acc, profile, a.oracle_seed);
  }
  mrl::stale_gate_ranking stale;
  std::unique_ptr<lab::degraded_ranking> degraded;
  if (managed) {
    // Acts at each layer's routing, then hands every event on to the session.
    res = mrl::make_residency_manager(a.policy, obs, a.model_path, ro, nullptr, after);
    // --degrade: the predictor's rankings with a seeded share of wrong slots.
    if (ro.predicted && a.degrade > 0) {
      if (!oracle) stale.init(obs, shape, ro.horizon);
      degraded = std::make_unique<lab::degraded_ranking>(oracle ? static_cast<mrl::routing_predictor&>(*oracle) : stale,
                                                         shape.top_k(), shape.n_experts(), a.degrade, a.seed);
      res->set_predictor(degraded.get());
    } else if (oracle) {
      res->set_predictor(oracle.get());
    }
    res->activate();  // now, so a refusal (locking limit, budget) stops the run with its figures
    obs.set_sink(res.get());
  } else {
    obs.set_sink(&sink);
  }
  const lab::run_result observed =
      lab::timed_decode(ctx.get(), model.get(), prompt, sized.decode, a.seed, res.get(), engine);

  std::size_t first_moe = 0;
  while (!shape.is_moe(layer_id(static_cast<std::uint16_t>(first_moe)))) ++first_moe;
  std::printf("model: %s (%s), %zu layers (%zu MoE), %zu experts, top-%zu, router %s\n", desc, obs.arch().c_str(),
              shape.n_layers(), shape.n_moe_layers(), shape.n_experts(), shape.top_k(),
              to_string(obs.layers()[first_moe].router.type));
  std::printf("run: %zu prompt tokens, %zu decoded; %zu routers configured\n\n", prompt.size(), sized.decode,
              n_routers);
  if (routes)
    std::printf(
        "%s\nnote: the routing is the trace's, not the model's: the fresh-gate control and the predictors are "
        "scored against the trace's routing, which the random model's routers do not compute\n\n",
        routes->note().c_str());
  if (score) std::fputs(format_text(s.report()).c_str(), stdout);
  std::printf("\n%s\n", rec.cache_line().c_str());
  if (!rec.warning().empty()) std::printf("note: %s\n", rec.warning().c_str());
  const auto& st = obs.stats();
  std::printf(
      "observer: %llu graphs, %llu layer batches, %llu partial (output rows only, sent), "
      "%llu not sent, %llu unreadable, %llu unsupported, %llu exceptions%s%s\n",
      static_cast<unsigned long long>(st.graphs), static_cast<unsigned long long>(st.layer_batches),
      static_cast<unsigned long long>(sink.partial_layers()), static_cast<unsigned long long>(sink.bad_layers()),
      static_cast<unsigned long long>(st.unreadable), static_cast<unsigned long long>(st.unsupported),
      static_cast<unsigned long long>(st.exceptions), st.exceptions ? "; last: " : "",
      st.exceptions ? obs.last_error() : "");
  if (st.metadata_mismatches)
    std::printf("note: %llu layers' GGUF keys disagree with the graph (the graph is used); first: %s\n",
                static_cast<unsigned long long>(st.metadata_mismatches), obs.metadata_note().c_str());
  if (res) {
    std::printf("%s\n", res->summary().c_str());
    if (!res->budget_note().empty()) std::printf("residency budget: %s\n", res->budget_note().c_str());
  }
  finish(a, observed);
  if (!a.trace_out.empty()) {
    std::ostringstream out;
    write_route_trace_csv(rec.trace(), out);
    lab::write_whole_file(a.trace_out, out.str(), "--trace-out");
    std::printf("trace: %zu rows written to %s\n", rec.trace().rows.size(), a.trace_out.c_str());
  }
  obs.set_sink(nullptr);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  lab_run_args a;
  CLI::App app{"moe-lab-run: one memory-lab run of llama.cpp on a GGUF file, every token timed and counted"};
  add_run_options(app, a);
  add_record_options(app, a);
  add_residency_options(app, a);
  CLI11_PARSE(app, argc, argv);
  a.policy_given = app.count("--policy") != 0;
  a.tokens_given = app.count("--tokens") != 0;
  a.decode_given = app.count("--decode") != 0;
  try {
    option_needs(app, a);
    return lab_run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-lab-run: %s\n", e.what());
    return 1;
  }
}
