#pragma once
/// The policy registry: the one table of cache policies a program can name at
/// run time. Each entry ties a type to its name (the type's own `name`) and a
/// one-line help. The replay, the command line's `--policies` (parse, help
/// text, error messages) and docs/replay.md's policy table all come from it; a
/// test fails when the docs' table and this one differ.
///
///   with_cache_policy("layerlfu", {}, [&](auto policy) { expert_cache<decltype(policy)> c(...); });
///
/// A name is spelt one way (`cache_policy_names()`); the old spellings the
/// command line already accepted are kept as aliases (`cache_policy_aliases()`).

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "moe_residency/cache/adaptive.hpp"
#include "moe_residency/cache/arc.hpp"
#include "moe_residency/cache/belady.hpp"
#include "moe_residency/cache/cycle.hpp"
#include "moe_residency/cache/layer.hpp"
#include "moe_residency/cache/lfu.hpp"
#include "moe_residency/cache/lru.hpp"
#include "moe_residency/cache/random.hpp"
#include "moe_residency/cache/s3fifo.hpp"
#include "moe_residency/cache/sieve.hpp"
#include "moe_residency/error.hpp"

namespace moe_residency {

/// One registered policy: its canonical name (the type's `name`) and one line of help.
struct cache_policy_info {
  const char* name;
  const char* help;
};

/// What the policies that need more than a default constructor are built from.
struct cache_policy_args {
  std::uint64_t seed = 0x5eed;   ///< random_policy's seed
  cycle_policy_options cycle{};  ///< cycle_policy's tuning (and the adaptive policy's cycle rule's)
  /// adaptive_policy's tuning; its `cycle` is replaced by `cycle` above.
  adaptive_policy_options adaptive{};
  /// belady_policy's next-use index (the trace's future); belady is refused without one.
  std::shared_ptr<const next_use_index> next_use;
};

namespace detail {

template <class P>
struct policy_tag {
  using type = P;
};

/// The registry itself: one call of f(policy_tag<Type>{}, help) per policy, in
/// the order people see them. Adding a policy is one line here.
template <class F>
void for_each_registered_policy(F&& f) {
  f(policy_tag<lru_policy>{}, "global least recently used; collapses to 0% below the token cycle");
  f(policy_tag<lfu_policy>{}, "fewest lookups, ties to least recent; counts persist across evictions");
  f(policy_tag<random_policy>{}, "uniform among the evictable experts, seeded (--seed)");
  f(policy_tag<layer_lru_policy>{}, "the budget partitioned per layer, LRU inside each part");
  f(policy_tag<layer_lfu_policy>{}, "the budget partitioned per layer, LFU inside each part");
  f(policy_tag<belady_policy>{}, "offline: the farthest next use in the trace (replay only)");
  f(policy_tag<arc_policy>{}, "ARC as libCacheSim defines it");
  f(policy_tag<s3fifo_policy>{}, "S3-FIFO as libCacheSim defines it");
  f(policy_tag<sieve_policy>{}, "SIEVE as libCacheSim defines it");
  f(policy_tag<cycle_policy>{}, "this library's token-cycle-aware approximation of Belady (--decay)");
  f(policy_tag<adaptive_policy>{},
    "follows whichever of lru ... cycle read the fewest bytes lately, kept in shadow caches");
}

inline bool policy_name_is(const char* a, const std::string& b) noexcept { return b == a; }

template <class P>
P make_registered_policy(const cache_policy_args& a) {
  if constexpr (std::is_same<P, random_policy>::value) {
    return random_policy{a.seed};
  } else if constexpr (std::is_same<P, cycle_policy>::value) {
    return cycle_policy{a.cycle};
  } else if constexpr (std::is_same<P, adaptive_policy>::value) {
    adaptive_policy_options o = a.adaptive;
    o.cycle = a.cycle;
    return adaptive_policy{o};
  } else if constexpr (std::is_same<P, belady_policy>::value) {
    if (!a.next_use)
      throw error(
          "cache policy 'belady': no next-use index; expected cache_policy_args::next_use (the trace's future)");
    return belady_policy{a.next_use};
  } else {
    return P{};
  }
}

}  // namespace detail

/// Every registered policy, canonical names, in the registry's order.
inline const std::vector<cache_policy_info>& cache_policy_registry() {
  static const std::vector<cache_policy_info> table = [] {
    std::vector<cache_policy_info> t;
    detail::for_each_registered_policy([&t](auto tag, const char* help) {
      t.push_back({decltype(tag)::type::name, help});
    });
    return t;
  }();
  return table;
}

/// Old spellings still accepted, as (alias, canonical name): only those a
/// released command line accepted.
inline const std::vector<std::pair<std::string, std::string>>& cache_policy_aliases() {
  static const std::vector<std::pair<std::string, std::string>> aliases = {{"layer_lfu", "layerlfu"}};
  return aliases;
}

/// "lru, lfu, ..., cycle": the canonical names, for help and error messages.
inline std::string cache_policy_names() {
  std::string s;
  for (const auto& p : cache_policy_registry()) s += (s.empty() ? "" : ", ") + std::string(p.name);
  return s;
}

/// The registry as text for a --help: one "  name  help" line per policy.
inline std::string cache_policy_help() {
  std::size_t w = 0;
  for (const auto& p : cache_policy_registry()) w = std::max(w, std::string(p.name).size());
  std::string s;
  for (const auto& p : cache_policy_registry())
    s += "  " + std::string(p.name) + std::string(w + 2 - std::string(p.name).size(), ' ') + p.help + "\n";
  return s;
}

/// The canonical name of `name` (itself, or what its alias stands for), or
/// the empty string when it names no registered policy.
inline std::string find_cache_policy(const std::string& name) {
  for (const auto& p : cache_policy_registry())
    if (name == p.name) return name;
  for (const auto& a : cache_policy_aliases())
    if (name == a.first) return a.second;
  return {};
}

/// The canonical name of `name`. Throws `error` naming it and listing the
/// valid names when it is not registered.
inline std::string canonical_cache_policy(const std::string& name) {
  std::string c = find_cache_policy(name);
  if (c.empty()) throw error("cache policy '" + name + "': unknown; expected one of " + cache_policy_names());
  return c;
}

/// Calls f(policy) with a new policy of the registered type `name` (canonical
/// or alias), built from `args`. Throws `error` on an unknown name (listing the
/// valid ones), and for belady without a next-use index.
template <class F>
void with_cache_policy(const std::string& name, const cache_policy_args& args, F&& f) {
  const std::string c = canonical_cache_policy(name);
  bool done = false;
  detail::for_each_registered_policy([&](auto tag, const char*) {
    using P = typename decltype(tag)::type;
    if (done || !detail::policy_name_is(P::name, c)) return;
    done = true;
    f(detail::make_registered_policy<P>(args));
  });
}

}  // namespace moe_residency
