#pragma once
// Shared support for the tests that run llama.cpp: a backend initialised
// once, random-weight models, a context with or without the observer, and a
// run of one prompt batch followed by token-by-token decoding.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "moe_residency/adapters/llama_cpp.hpp"
#include "random_model.hpp"

namespace moe_residency_test {

namespace mrl = moe_residency::llama_cpp;
namespace mre = moe_residency::llama_cpp::examples;

inline void llama_init_once() {
  static const bool done = [] {
    llama_log_set([](ggml_log_level level, const char* text, void*) {
      if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
    }, nullptr);
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
inline run_result run_tokens(llama_context* ctx, const llama_model* model, std::size_t n_prompt,
                             std::size_t n_decode, std::uint64_t seed = 7) {
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

/// The set-up most observer tests share: a random model, an observer (with
/// `sink`, if given) installed on `cp`, and a context made from it. Members
/// are destroyed context first, as the tests' locals were.
struct observed_model {
  mre::model_ptr model;
  mrl::observer obs;
  context_ptr ctx;

  explicit observed_model(const mre::random_model_spec& spec, mrl::observer_sink* sink = nullptr,
                          llama_context_params cp = test_context_params())
      : model(mre::make_random_model(spec)), obs(model.get()) {
    if (sink) obs.set_sink(sink);
    obs.install(cp);
    ctx = make_context(model.get(), cp);
  }

  /// run_tokens on this context.
  run_result run(std::size_t n_prompt, std::size_t n_decode, std::uint64_t seed = 7) {
    return run_tokens(ctx.get(), model.get(), n_prompt, n_decode, seed);
  }
  /// One token, so the observer learns the graph's structure; then start
  /// afresh (memory cleared, position 0).
  void warm_up() {
    run(1, 0);
    llama_memory_clear(llama_get_memory(ctx.get()), true);
    obs.set_position(0);
  }
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

inline const char* type_name(ggml_type t) { return ggml_type_name(t); }

}  // namespace moe_residency_test
