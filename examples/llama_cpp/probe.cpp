// moe-llama-probe: observes a Mixture-of-Experts model running in an
// unmodified llama.cpp — a GGUF file, or a random-weight model of a real
// architecture built in memory to try it out — with the moe_residency
// observer attached. Prints the prediction report (stale-gate, prev-token,
// frequency, and the fresh-gate control, which must read 100.0%) and the cache
// line of an LRU cache replaying the engine's load batches; optionally writes
// the route trace (for moe-residency replay), reads every missed expert's
// bytes from the GGUF file, and measures what observing costs.
//
//   moe-llama-probe --random qwen3moe --tokens 32 --decode 64 --budget-mib 8
//   moe-llama-probe --model model.gguf --prompt "Hello" --trace-out run.route.csv --warm pread
//   moe-llama-probe --model shaped.gguf --route-from run.route.csv --trace-out again.route.csv
//     (llama.cpp routes as the recorded trace did; recorded back, the trace's experts)
//
// The memory lab's instruments (a run timed and counted token by token, the
// residency manager's parts, the model writer) are lab/llama_cpp's moe-lab-run
// and moe-lab-model (docs/memlab.md).

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "moe_residency/adapters/llama_cpp.hpp"
#include "moe_residency/adapters/llama_cpp/forced_routing.hpp"
#include "moe_residency/adapters/llama_cpp/residency/start.hpp"
#include "moe_residency/cache/lru.hpp"
#include "moe_residency/score.hpp"
#include "moe_residency/session.hpp"
#include "checked_options.hpp"
#include "random_model.hpp"  // lab/llama_cpp: --random's model, built in memory

namespace {

using namespace moe_residency;
namespace mrl = moe_residency::llama_cpp;
namespace rm = moe_residency::llama_cpp::lab;

using probe_session =
    session<predictor_set<stale_gate_predictor, prev_token_predictor, frequency_predictor, fresh_gate_control>>;

struct probe_args {
  std::string model_path, random_arch;
  rm::random_model_spec spec;
  std::string router = "f32";
  std::string prompt;
  std::size_t tokens = 32;  // prompt tokens when no --prompt
  std::size_t decode = 64;
  double budget_mib = 0;  // 0: half of all experts' bytes
  std::string trace_out, warm;
  int threads = 2;
  bool cost = false;
  int cost_rounds = 5;
  std::uint64_t seed = 7;
  std::string route_from;  // llama.cpp's routing replaced by this trace's (forced_routing.hpp)
  bool tokens_given = false, decode_given = false;
};

struct context_deleter {
  void operator()(llama_context* c) const noexcept { llama_free(c); }
};
using context_ptr = std::unique_ptr<llama_context, context_deleter>;

llama_context_params context_params(const probe_args& a, std::size_t n_tokens) {
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<std::uint32_t>(n_tokens + 16);
  cp.n_batch = cp.n_ctx;
  cp.n_ubatch = cp.n_ctx;  // the prompt is one graph
  cp.n_threads = a.threads;
  cp.n_threads_batch = a.threads;
  return cp;
}

std::vector<llama_token> prompt_tokens(const probe_args& a, const llama_model* m) {
  const llama_vocab* vocab = llama_model_get_vocab(m);
  if (!a.prompt.empty()) {
    std::vector<llama_token> t(a.prompt.size() + 16);
    int n = llama_tokenize(vocab, a.prompt.c_str(), static_cast<int32_t>(a.prompt.size()), t.data(),
                           static_cast<int32_t>(t.size()), true, true);
    if (n < 0) {
      t.resize(static_cast<std::size_t>(-n));
      n = llama_tokenize(vocab, a.prompt.c_str(), static_cast<int32_t>(a.prompt.size()), t.data(),
                         static_cast<int32_t>(t.size()), true, true);
    }
    if (n <= 0) throw error("--prompt: the model's vocabulary produced no tokens");
    t.resize(static_cast<std::size_t>(n));
    return t;
  }
  std::mt19937_64 gen(a.seed);
  std::uniform_int_distribution<int> pick(0, llama_vocab_n_tokens(vocab) - 1);
  std::vector<llama_token> t(a.tokens);
  for (auto& x : t) x = pick(gen);
  return t;
}

/// The prompt as one batch, then `n_decode` tokens sampled from
/// softmax(logits) with a seeded generator. Returns the decode's seconds.
double decode(llama_context* ctx, const llama_model* m, const std::vector<llama_token>& prompt, std::size_t n_decode,
              std::uint64_t seed) {
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(m));
  std::vector<llama_token> toks = prompt;
  if (llama_decode(ctx, llama_batch_get_one(toks.data(), static_cast<int32_t>(toks.size()))) != 0)
    throw error("llama_decode failed on the prompt batch");
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<double> p(static_cast<std::size_t>(n_vocab));
  double seconds = 0;
  for (std::size_t step = 0; step < n_decode; ++step) {
    const float* lg = llama_get_logits_ith(ctx, -1);
    const float mx = *std::max_element(lg, lg + n_vocab);
    double sum = 0;
    for (int i = 0; i < n_vocab; ++i) sum += p[static_cast<std::size_t>(i)] = std::exp(double(lg[i]) - mx);
    double target = u(gen) * sum;
    llama_token next = n_vocab - 1;
    for (int i = 0; i < n_vocab; ++i)
      if ((target -= p[static_cast<std::size_t>(i)]) <= 0) {
        next = i;
        break;
      }
    const auto t0 = std::chrono::steady_clock::now();
    if (llama_decode(ctx, llama_batch_get_one(&next, 1)) != 0) throw error("llama_decode failed");
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return seconds;
}

int probe(const probe_args& a) {
  if (a.model_path.empty() == a.random_arch.empty())
    throw error("give exactly one of --model FILE.gguf and --random ARCH");
  if (!a.warm.empty() && a.model_path.empty())
    throw error(
        "--warm reads the missed experts from the model's file; give --model FILE.gguf (moe-lab-model "
        "writes a random one)");
  llama_log_set(
      [](ggml_log_level level, const char* text, void*) {
        if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
      },
      nullptr);
  llama_backend_init();

  // The model: from a file (mmap), or random weights built in memory.
  // No "extra" CPU buffer types: with them, llama.cpp's CPU backend repacks
  // weights into its own layouts at load, and the experts would no longer be
  // the file's pages (--warm reads those); a model in memory is built the same
  // way, so that it routes as its file would.
  llama_model_params mp = llama_model_default_params();
  mp.use_extra_bufts = false;
  rm::model_ptr model;
  rm::random_model_spec spec = a.spec;
  if (!a.model_path.empty()) {
    model.reset(llama_model_load_from_file(a.model_path.c_str(), mp));
    if (!model) throw error("--model: llama.cpp could not load '" + a.model_path + "'");
  } else {
    spec.arch = a.random_arch;
    spec.router_type = rm::parse_router_type(a.router);
    model = rm::make_random_model(spec, mp);
  }
  char desc[256];
  llama_model_desc(model.get(), desc, sizeof desc);
  // --route-from: every graph routes as the trace did; prompt and decode as long as its, unless given.
  std::unique_ptr<validated_route_trace> trace;
  std::unique_ptr<mrl::forced_routing> routes;
  probe_args sized = a;
  if (!a.route_from.empty()) {
    trace = std::make_unique<validated_route_trace>(read_route_trace(a.route_from));
    routes = std::make_unique<mrl::forced_routing>(*trace, a.route_from);
    if (!a.tokens_given && a.prompt.empty() && routes->prefill_tokens() > 0) sized.tokens = routes->prefill_tokens();
    if (!a.decode_given) sized.decode = routes->decode_tokens();
  }
  const std::vector<llama_token> prompt = prompt_tokens(sized, model.get());
  const std::size_t n_total = prompt.size() + sized.decode;

  // The observer; one warm-up token teaches it the graph (the routers, each
  // layer's spec, the expert tensors) before the session is built.
  mrl::observer obs(model.get());
  llama_context_params cp = context_params(a, n_total);
  obs.install(cp);
  if (routes) obs.force_routing(routes.get());  // refuses a model of another MoE shape, naming both
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
  probe_session s(shape, so);
  const std::size_t n_routers = mrl::configure_routers(s, obs);

  std::uint64_t budget = from_mib(a.budget_mib);
  if (budget == 0) {
    std::uint64_t all = 0;
    for (std::size_t l = 0; l < shape.n_layers(); ++l)
      all += shape.expert_bytes(layer_id(static_cast<std::uint16_t>(l))) * shape.n_experts();
    budget = all / 2;
  }
  mrl::route_recorder<lru_policy> rec(shape, budget);

  // The trace header's model: the file, or the random model's general.name (no spaces);
  // its dense bytes: the file's, or those save_random_gguf would write.
  std::string label = !a.model_path.empty() ? a.model_path : !obs.model_name().empty() ? obs.model_name() : obs.arch();
  for (char& c : label)
    if (c == ' ' || c == '\t') c = '_';
  std::unique_ptr<mrl::gguf_expert_map> map;
  std::unique_ptr<mrl::gguf_expert_reader> reader;
  std::uint64_t failed_reads = 0;
  double read_s = 0;
  if (!a.model_path.empty()) {
    map = std::make_unique<mrl::gguf_expert_map>(a.model_path, obs);
    rec.describe(label, obs.arch(), mrl::gguf_dense_bytes(a.model_path, *map, shape.n_layers()));
    if (!a.warm.empty()) {
      reader = std::make_unique<mrl::gguf_expert_reader>(
          *map, a.warm == "pread" ? mrl::gguf_expert_reader::mode::pread : mrl::gguf_expert_reader::mode::fadvise);
      rec.on_miss([&](layer_id l, expert_id e) {
        const auto t0 = std::chrono::steady_clock::now();
        if (!reader->read(l, e)) ++failed_reads;
        read_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      });
    }
  } else {
    rec.describe(label, obs.arch(), rm::random_model_dense_bytes(spec));
  }
  mrl::session_sink<probe_session> sink(s, &rec);
  obs.set_sink(&sink);
  const double observed_s = decode(ctx.get(), model.get(), prompt, sized.decode, a.seed);

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
        "scored against the trace's routing, which this model's routers do not compute\n\n",
        routes->note().c_str());
  std::fputs(format_text(s.report()).c_str(), stdout);
  std::printf("\n%s\n", rec.cache_line().c_str());
  if (!rec.warning().empty()) std::printf("note: %s\n", rec.warning().c_str());
  if (reader)
    std::printf("warm (%s): %llu expert reads, %.1f MiB from %s in %.3f s, %llu failed\n", a.warm.c_str(),
                static_cast<unsigned long long>(reader->reads()), to_mib(reader->bytes_read()), a.model_path.c_str(),
                read_s, static_cast<unsigned long long>(failed_reads));
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
  std::printf("decode: %zu tokens, %.3f tok/s observed\n", sized.decode,
              observed_s > 0 ? static_cast<double>(sized.decode) / observed_s : 0.0);

  if (!a.trace_out.empty()) {
    std::ofstream out(a.trace_out);
    if (!out) throw error("--trace-out: cannot write '" + a.trace_out + "'");
    write_route_trace_csv(rec.trace(), out);
    if (!out) throw error("--trace-out: writing '" + a.trace_out + "' failed");
    std::printf("trace: %zu rows written to %s\n", rec.trace().rows.size(), a.trace_out.c_str());
  }

  if (a.cost) {
    // Decode time without any callback, with the callback installed but no
    // sink (structure only), and observed with a fresh session; rounds
    // alternate and the fastest of each is kept (the machine is shared).
    context_ptr plain(llama_init_from_model(model.get(), context_params(a, n_total)));
    if (!plain) throw error("llama_init_from_model failed");
    struct null_sink : mrl::observer_sink {
      void on_layer_loaded(const mrl::layer_batch&) override {}
    } nothing;
    double plain_s = 1e300, idle_s = 1e300, split_s = 1e300, observed_best = 1e300;
    for (int round = 0; round < a.cost_rounds; ++round) {
      llama_memory_clear(llama_get_memory(plain.get()), true);
      plain_s = std::min(plain_s, decode(plain.get(), model.get(), prompt, a.decode, a.seed));
      llama_memory_clear(llama_get_memory(ctx.get()), true);
      obs.set_position(0);
      obs.set_sink(nullptr);
      idle_s = std::min(idle_s, decode(ctx.get(), model.get(), prompt, a.decode, a.seed));
      llama_memory_clear(llama_get_memory(ctx.get()), true);
      obs.set_position(0);
      obs.set_sink(&nothing);
      split_s = std::min(split_s, decode(ctx.get(), model.get(), prompt, a.decode, a.seed));
      llama_memory_clear(llama_get_memory(ctx.get()), true);
      obs.set_position(0);
      probe_session s2(shape, so);
      mrl::configure_routers(s2, obs);
      mrl::session_sink<probe_session> sink2(s2);
      obs.set_sink(&sink2);
      observed_best = std::min(observed_best, decode(ctx.get(), model.get(), prompt, a.decode, a.seed));
      obs.set_sink(nullptr);
    }
    const double n = static_cast<double>(a.decode);
    std::printf(
        "cost (fastest of %d rounds, decode only, ms/token): plain %.3f; callback asking "
        "nothing %.3f (x%.3f); one split per MoE layer, empty sink %.3f (x%.3f); "
        "observed with the session %.3f (x%.3f)\n",
        a.cost_rounds, 1e3 * plain_s / n, 1e3 * idle_s / n, idle_s / plain_s, 1e3 * split_s / n, split_s / plain_s,
        1e3 * observed_best / n, observed_best / plain_s);
    std::printf("      the first observed run, with trace, cache%s: %.3f ms/token\n", reader ? " and reads" : "",
                1e3 * observed_s / n);
  }
  obs.set_sink(nullptr);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  namespace opt = moe_residency_cli;  // checked_options.hpp: the numbers every option takes
  using moe_residency::detail::real_domain;
  probe_args a;
  CLI::App app{"moe-llama-probe: observe llama.cpp's MoE routing, score predictors, replay a cache"};
  app.add_option("--model", a.model_path, "A GGUF model file (loaded with mmap)");
  app.add_option("--random", a.random_arch,
                 "A random-weight model of this architecture, built in memory: qwen3moe, deepseek2, gpt-oss");
  app.add_option("--layers", a.spec.n_layer, "Random model: layers")->check(opt::whole(2, 4096))->capture_default_str();
  app.add_option("--experts", a.spec.n_expert, "Random model: experts per layer")
      ->check(opt::whole(1, 65536))
      ->capture_default_str();
  app.add_option("--k", a.spec.n_expert_used, "Random model: experts used per token")
      ->check(opt::whole(1, 32))
      ->capture_default_str();
  app.add_option("--embd", a.spec.n_embd, "Random model: embedding length (multiple of 64)")
      ->check(opt::whole(64, 1 << 20))
      ->capture_default_str();
  app.add_option("--expert-ff", a.spec.n_ff_exp, "Random model: width of one expert")
      ->check(opt::whole(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--router", a.router, "Random model: router type f32, f16 or bf16")->capture_default_str();
  app.add_option("--vocab", a.spec.n_vocab, "Random model: vocabulary size")
      ->check(opt::whole(1, 1 << 24))
      ->capture_default_str();
  app.add_flag("--text-vocab", a.spec.text_vocab,
               "Random model: a text vocabulary (SentencePiece, byte tokens), so --prompt text tokenizes (needs "
               "--vocab >= 512)");
  app.add_option("--prompt", a.prompt, "Prompt text (needs a model with a vocabulary)");
  app.add_option("--tokens", a.tokens, "Prompt length in random tokens when no --prompt")
      ->check(opt::whole(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--decode", a.decode, "Tokens to decode after the prompt")
      ->check(opt::whole(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--budget-mib", a.budget_mib, "LRU cache budget in MiB (default: half of all experts)")
      ->check(opt::real(real_domain::open_closed(0, 1e12)));
  app.add_option("--trace-out", a.trace_out, "Write the route trace (route_trace v1 CSV)");
  app.add_option("--warm", a.warm, "Read every missed expert from the GGUF file: pread or fadvise")
      ->check(opt::one_of({"pread", "fadvise"}));
  app.add_option("--threads", a.threads, "llama.cpp threads")->check(opt::whole(1, 1024))->capture_default_str();
  app.add_option("--seed", a.seed, "Seed of the prompt and of the sampler")->check(opt::whole())->capture_default_str();
  app.add_option("--route-from", a.route_from,
                 "Route every MoE layer as this recorded trace did (forced_routing.hpp): prompt tokens take its "
                 "prompt routings, decode tokens its decode routings in order (cycling past its end); the model must "
                 "have its MoE shape. --tokens and --decode default to the trace's");
  app.add_flag("--cost", a.cost, "Also measure decode time without and with the observer (ratio)");
  app.add_option("--cost-rounds", a.cost_rounds, "Rounds of the --cost measurement")
      ->check(opt::whole(1, 1000))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  a.tokens_given = app.count("--tokens") != 0;
  a.decode_given = app.count("--decode") != 0;
  try {
    // An option that acts only with another is an error naming both, not ignored.
    for (const char* o :
         {"--layers", "--experts", "--k", "--embd", "--expert-ff", "--router", "--vocab", "--text-vocab"})
      if (app.count(o) != 0 && a.random_arch.empty())
        throw error(std::string(o) +
                    " has no effect without --random (they shape a random-weight model); give "
                    "--random, or drop " +
                    o);
    if (app.count("--tokens") != 0 && !a.prompt.empty())
      throw error("--tokens and --prompt: --tokens sizes a random prompt, --prompt gives the text; give one of them");
    if (app.count("--cost-rounds") != 0 && !a.cost)
      throw error("--cost-rounds has no effect without --cost; give --cost, or drop --cost-rounds");
    return probe(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-llama-probe: %s\n", e.what());
    return 1;
  }
}
