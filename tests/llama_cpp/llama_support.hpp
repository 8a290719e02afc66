#pragma once
// Shared support for the tests that run llama.cpp: a backend initialised
// once, random-weight models (in memory, or saved to a temporary GGUF and
// loaded back memory-mapped), a context with or without the observer, a run
// of one prompt batch followed by token-by-token decoding, and the loop over
// the three architectures with a warmed-up observer.

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include <unistd.h>

#include "moe_residency/adapters/llama_cpp.hpp"
#include "random_model.hpp"

namespace moe_residency_test {

namespace mrl = moe_residency::llama_cpp;
namespace mre = moe_residency::llama_cpp::lab;

inline void llama_init_once() {
  static const bool done = [] {
    llama_log_set(
        [](ggml_log_level level, const char* text, void*) {
          if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
        },
        nullptr);
    llama_backend_init();
    return true;
  }();
  (void)done;
}

struct context_deleter {
  void operator()(llama_context* c) const noexcept { llama_free(c); }
};
using context_ptr = std::unique_ptr<llama_context, context_deleter>;

inline llama_context_params test_context_params() {
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 512;
  cp.n_batch = 512;
  cp.n_ubatch = 512;  // the whole prompt is one graph
  cp.n_threads = 1;   // the CI machine is shared
  cp.n_threads_batch = 1;
  cp.no_perf = true;
  return cp;
}

inline context_ptr make_context(llama_model* m, llama_context_params cp) {
  context_ptr c(llama_init_from_model(m, cp));
  REQUIRE_MESSAGE(c != nullptr, "llama_init_from_model failed");
  return c;
}

/// The logits of every evaluated position that has them (the prompt's last
/// token, then each decoded token), concatenated.
struct run_result {
  std::vector<float> logits;
  std::vector<llama_token> tokens;
};

/// One prompt batch of `n_prompt` seeded random tokens, then `n_decode`
/// tokens decoded one by one, each sampled from softmax(logits) with a
/// seeded generator (deterministic, and not stuck on one token as greedy
/// decoding of a random model can be).
inline run_result run_tokens(llama_context* ctx, const llama_model* model, std::size_t n_prompt, std::size_t n_decode,
                             std::uint64_t seed = 7) {
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int> pick(0, n_vocab - 1);
  run_result r;
  for (std::size_t i = 0; i < n_prompt; ++i) r.tokens.push_back(pick(gen));
  llama_batch b = llama_batch_get_one(r.tokens.data(), static_cast<int32_t>(r.tokens.size()));
  REQUIRE(llama_decode(ctx, b) == 0);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (std::size_t step = 0; step <= n_decode; ++step) {
    const float* lg = llama_get_logits_ith(ctx, -1);
    REQUIRE(lg != nullptr);
    r.logits.insert(r.logits.end(), lg, lg + n_vocab);
    if (step == n_decode) break;
    float mx = lg[0];
    for (int i = 1; i < n_vocab; ++i) mx = std::max(mx, lg[i]);
    std::vector<double> p(static_cast<std::size_t>(n_vocab));
    double sum = 0;
    for (int i = 0; i < n_vocab; ++i) sum += p[static_cast<std::size_t>(i)] = std::exp(double(lg[i]) - mx);
    double target = u(gen) * sum;
    llama_token next = n_vocab - 1;
    for (int i = 0; i < n_vocab; ++i) {
      target -= p[static_cast<std::size_t>(i)];
      if (target <= 0) {
        next = i;
        break;
      }
    }
    r.tokens.push_back(next);
    llama_batch one = llama_batch_get_one(&r.tokens.back(), 1);
    REQUIRE(llama_decode(ctx, one) == 0);
  }
  return r;
}

/// A file in the working directory, "moe_residency_<stem>_<pid>.gguf",
/// removed when this goes out of scope.
struct temp_file {
  std::string path;
  explicit temp_file(const std::string& stem)
      : path("moe_residency_" + stem + "_" + std::to_string(::getpid()) + ".gguf") {}
  ~temp_file() { std::remove(path.c_str()); }
  temp_file(const temp_file&) = delete;
  temp_file& operator=(const temp_file&) = delete;
};

/// A random model built by llama.cpp and saved by llama_model_save_to_file to
/// a temp_file.
struct temp_model : temp_file {
  temp_model(const std::string& stem, const mre::random_model_spec& spec) : temp_file(stem) {
    llama_init_once();
    auto built = mre::make_random_model(spec);
    llama_model_save_to_file(built.get(), path.c_str());
  }
};

/// A GGUF file read whole by ggml's own reader: its key/values (g) and its
/// tensors with their data (data).
struct gguf_file {
  gguf_context* g = nullptr;
  ggml_context* data = nullptr;
  explicit gguf_file(const std::string& path) {
    gguf_init_params p{};
    p.no_alloc = false;
    p.ctx = &data;
    g = gguf_init_from_file(path.c_str(), p);
    REQUIRE_MESSAGE(g != nullptr, "gguf_init_from_file failed on " << path);
  }
  ~gguf_file() {
    if (data) ggml_free(data);
    if (g) gguf_free(g);
  }
  gguf_file(const gguf_file&) = delete;
  gguf_file& operator=(const gguf_file&) = delete;
};

/// A GGUF file loaded memory-mapped, without repacked (copied) expert
/// buffers: the expert tensors' data are the file's bytes. `repack`: with
/// llama.cpp's default extra buffer types (the CPU backend repacks what it can).
inline mre::model_ptr load_mmap(const std::string& path, bool repack = false) {
  llama_model_params mp = llama_model_default_params();
  mp.load_mode = LLAMA_LOAD_MODE_MMAP;
  mp.use_extra_bufts = repack;
  mre::model_ptr m(llama_model_load_from_file(path.c_str(), mp));
  REQUIRE_MESSAGE(m != nullptr, "llama_model_load_from_file failed on " << path);
  return m;
}

/// The set-up most observer tests share: a model (a random one, or one
/// loaded), an observer (with `sink`, if given) installed on `cp`, and a
/// context made from it. Members are destroyed context first, as the tests'
/// locals were.
struct observed_model {
  mre::model_ptr model;
  mrl::observer obs;
  context_ptr ctx;

  explicit observed_model(const mre::random_model_spec& spec, mrl::observer_sink* sink = nullptr,
                          llama_context_params cp = test_context_params())
      : observed_model((llama_init_once(), mre::make_random_model(spec)), sink, cp) {}
  explicit observed_model(mre::model_ptr loaded, mrl::observer_sink* sink = nullptr,
                          llama_context_params cp = test_context_params())
      : model(std::move(loaded)), obs(model.get()) {
    if (sink) obs.set_sink(sink);
    obs.install(cp);
    ctx = make_context(model.get(), cp);
  }

  /// run_tokens on this context.
  run_result run(std::size_t n_prompt, std::size_t n_decode, std::uint64_t seed = 7) {
    return run_tokens(ctx.get(), model.get(), n_prompt, n_decode, seed);
  }
  /// Start afresh: memory cleared, the observer's position 0.
  void restart() {
    llama_memory_clear(llama_get_memory(ctx.get()), true);
    obs.set_position(0);
  }
  /// One token, so the observer learns the graph's structure; then restart.
  void warm_up() {
    run(1, 0);
    restart();
  }
};

/// A random model saved to a temporary GGUF, loaded back memory-mapped
/// (load_mmap) and observed: what the residency and file tests run on.
struct mapped_model : temp_model, observed_model {
  mapped_model(const std::string& stem, const mre::random_model_spec& spec,
               llama_context_params cp = test_context_params())
      : temp_model(stem, spec), observed_model(load_mmap(path), nullptr, cp) {}
};

inline mre::random_model_spec spec_for(const std::string& arch, ggml_type router) {
  mre::random_model_spec s;
  s.arch = arch;
  s.router_type = router;
  s.n_layer = 4;
  s.n_embd = 128;
  if (arch == "deepseek2") {
    s.n_expert = 64;
    s.n_expert_used = 6;
  } else if (arch == "gpt-oss") {
    s.n_expert = 32;
    s.n_expert_used = 4;
  } else {
    s.n_expert = 64;
    s.n_expert_used = 8;
  }
  return s;
}

/// The residency tests' model: qwen3moe, 4 layers of 16 experts (top-4),
/// f16 routers, 256-wide (128 KiB per f32 expert slice: page-sized
/// boundaries matter).
inline mre::random_model_spec small_moe_spec() {
  mre::random_model_spec s = spec_for("qwen3moe", GGML_TYPE_F16);
  s.n_layer = 4;
  s.n_expert = 16;
  s.n_expert_used = 4;
  s.n_embd = 256;
  s.n_ff_exp = 256;
  return s;
}

inline const char* type_name(ggml_type t) { return ggml_type_name(t); }

/// For qwen3moe, deepseek2 and gpt-oss (each CAPTUREd as `config`): a random
/// model with `router` routers, its observer warmed up (it knows the graph's
/// structure, and the run starts afresh), handed to `body(om, config)`.
template <class Body>
void for_each_warm_arch(ggml_type router, Body&& body) {
  for (const char* arch : {"qwen3moe", "deepseek2", "gpt-oss"}) {
    const std::string config = arch;
    CAPTURE(config);
    observed_model om(spec_for(arch, router));
    om.warm_up();  // learn the structure, then start afresh
    REQUIRE(om.obs.structure_known());
    body(om, config);
  }
}

/// Waits, for at most 10 s, until the manager's lanes have nothing queued or running:
/// on a loaded machine a lane may not get a core before the next routing. A test that
/// checks the order the manager issues reads in, or what its cache decides (a
/// speculative read enters the cache only once complete), calls it before each routing.
inline void drain_lanes(const mrl::residency_manager& res) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    const auto st = res.stats();
    if (st.reads_queued + st.reads_in_flight == 0 || std::chrono::steady_clock::now() > until) return;
    std::this_thread::yield();
  }
}

/// In front of a manager: drains its lanes before each routing, then passes every event on.
class draining_sink : public mrl::observer_sink {
 public:
  explicit draining_sink(mrl::residency_manager& res) : res_(res) {}
  bool wants(moe_residency::engine_event e) const noexcept override { return res_.wants(e); }
  void on_begin_batch(const moe_residency::batch_info& b) override { res_.on_begin_batch(b); }
  void on_layer_loaded(const mrl::layer_batch& b) override { res_.on_layer_loaded(b); }
  void on_routed(const mrl::layer_batch& b) override {
    drain_lanes(res_);
    res_.on_routed(b);
  }

 private:
  mrl::residency_manager& res_;
};

}  // namespace moe_residency_test
