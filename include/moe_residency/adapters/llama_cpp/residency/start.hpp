#pragma once
/// The one entry point every caller of the residency manager runs — moe-run,
/// the probe, the lab's tools and the C ABI — so the order that works is
/// written once:
///
///   mrl::observer obs(model);
///   llama_context_params cp = llama_context_default_params();
///   obs.install(cp);
///   llama_context* ctx = llama_init_from_model(model, cp);
///   auto res = mrl::make_residency_manager("lru", obs, path);   // residency_options{}: dense, exact, cache
///   mrl::start(ctx, obs, *res);   // warm-up, structure, activation; then the manager is the sink
///
/// `warm_up` alone is the first half, for a caller that only observes.

#include <string>

#include "llama.h"
#include "moe_residency/adapters/llama_cpp/observer.hpp"
#include "moe_residency/adapters/llama_cpp/residency/manager.hpp"
#include "moe_residency/error.hpp"

namespace moe_residency::llama_cpp {

/// One token decoded so the observer learns the graph (routers, each layer's
/// selection rule, the expert tensors), then llama.cpp's memory cleared and
/// the observer's position reset: the next decode starts a sequence afresh.
/// `first`: the token to decode (negative: the vocabulary's BOS, else 0). A
/// routing the observer forces (observer::force_routing) is forced in it too.
/// Throws `error` when the decode fails, `refusal` when the graph showed no
/// MoE routing (a dense model: nothing to manage), naming `what` (the model).
inline void warm_up(llama_context* ctx, observer& obs, const std::string& what, llama_token first = -1) {
  if (ctx == nullptr) throw error("warm-up: the context is null");
  if (first < 0) {
    first = llama_vocab_bos(llama_model_get_vocab(obs.model()));
    if (first < 0) first = 0;
  }
  if (llama_decode(ctx, llama_batch_get_one(&first, 1)) != 0)
    throw error("warm-up: llama_decode failed on one token of " + what);
  llama_memory_clear(llama_get_memory(ctx), true);
  obs.set_position(0);
  if (!obs.structure_known()) throw refusal(what + ": no MoE routing in the graph (a dense model): nothing to manage");
}

/// warm_up, then the manager's activation (every refusal before any advice:
/// `refusal` with the figures; nothing is left advised), then the manager is
/// the observer's sink (chain yours with `res.set_next`). A host predictor
/// (`res.set_predictor`) is set before this.
inline void start(llama_context* ctx, observer& obs, residency_manager& res, const std::string& what,
                  llama_token first = -1) {
  warm_up(ctx, obs, what, first);
  res.activate();
  obs.set_sink(&res);
}

}  // namespace moe_residency::llama_cpp
