#pragma once
/// The residency manager with its cache policy named at run time:
///
///   auto res = make_residency_manager("adaptive", obs, gguf_path, options);
///   obs.set_sink(res.get());
///
/// The live manager pins what its cache holds, so it takes only the
/// registered policies that keep the byte budget at every batch (lru, lfu,
/// arc, s3fifo, sieve, cycle, adaptive). The layer partitions (layer,
/// layerlfu) keep a floor of top-k entries per layer, more than the budget
/// below the token cycle or after a wide batch; belady needs the future;
/// random is for replay baselines. Each is refused by name, with why.

#include <memory>
#include <string>
#include <vector>

#include "moe_residency/adapters/llama_cpp/residency/manager.hpp"
#include "moe_residency/cache/registry.hpp"
#include "moe_residency/error.hpp"

namespace moe_residency::llama_cpp {

/// The cache policies the live manager takes, canonical names, in the registry's order.
inline const std::vector<std::string>& live_cache_policies() {
  static const std::vector<std::string> names = {"lru", "lfu", "arc", "s3fifo", "sieve", "cycle", "adaptive"};
  return names;
}

/// "lru, lfu, ...": live_cache_policies() for help and messages.
inline std::string live_cache_policy_names() {
  std::string s;
  for (const auto& n : live_cache_policies()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

/// The canonical name of `policy` (a name or an alias) when the live manager
/// takes it. Throws `error` naming it, saying why not, and listing the
/// accepted ones otherwise.
inline std::string live_cache_policy(const std::string& policy) {
  const std::string name = find_cache_policy(policy);
  std::string why;
  if (name.empty()) why = "unknown";
  else if (name == "layer" || name == "layerlfu")
    why =
        "a layer partition keeps top-k experts of every layer even above its budget, and the manager pins "
        "what its cache holds";
  else if (name == "belady") why = "offline: it needs the trace's future (replay only)";
  else if (name == "random") why = "a replay baseline, not for a live cache";
  else {
    for (const auto& n : live_cache_policies())
      if (n == name) return name;
    why = "not built into the live manager";
  }
  throw configuration_error("residency manager: cache policy '" + policy + "': " + why + "; expected one of " +
                            live_cache_policy_names());
}

/// A manager whose cache follows the registered policy `policy` (a canonical
/// name or an alias). Arguments as mmap_residency's constructor. Throws
/// `error` as live_cache_policy does, and as that constructor does for bad
/// options.
inline std::unique_ptr<residency_manager> make_residency_manager(const std::string& policy, const observer& obs,
                                                                 std::string gguf_path, residency_options options = {},
                                                                 memory_advice* advice = nullptr,
                                                                 observer_sink* next = nullptr) {
  const std::string name = live_cache_policy(policy);
  auto make = [&](auto tag) -> std::unique_ptr<residency_manager> {
    using P = decltype(tag);
    return std::make_unique<mmap_residency<P>>(obs, std::move(gguf_path), options, advice, next);
  };
  if (name == "lru") return make(lru_policy{});
  if (name == "lfu") return make(lfu_policy{});
  if (name == "arc") return make(arc_policy{});
  if (name == "s3fifo") return make(s3fifo_policy{});
  if (name == "sieve") return make(sieve_policy{});
  if (name == "cycle") return make(cycle_policy{});
  return make(adaptive_policy{});  // live_cache_policy() returned one of live_cache_policies()
}

}  // namespace moe_residency::llama_cpp
