#pragma once
// Shared test support: where the real traces are, and how a suite that needs
// them skips (loudly) on a user's machine but fails under CI=true; and the slow
// obvious twins and workloads more than one suite compares the library against
// (test_cache, test_plan, test_speculation and test_properties).

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "moe_residency/cache.hpp"
#include "moe_residency/plan.hpp"
#include "moe_residency/session.hpp"
#include "moe_residency/simulated_flash.hpp"
#include "moe_residency/speculation.hpp"
#include "moe_residency/synthetic.hpp"
#include "moe_residency/trace.hpp"
#include "source_text.hpp"

namespace moe_residency_test {

/// MOE_RESIDENCY_TRACES, else ../shared/traces next to the source tree.
inline std::string traces_dir() {
  if (const char* env = std::getenv("MOE_RESIDENCY_TRACES"); env && *env) return env;
  return MOE_RESIDENCY_DEFAULT_TRACES;
}

inline bool file_exists(const std::string& path) {
  std::ifstream f(path);
  return f.good();
}

inline bool running_in_ci() {
  const char* ci = std::getenv("CI");
  return ci && std::string(ci) == "true";
}

/// Path of a real trace file, or "" when the folder is absent. Absent under
/// CI=true is a failure; elsewhere the caller skips with a loud message.
inline std::string real_trace(const std::string& name) {
  const std::string path = traces_dir() + "/" + name;
  if (file_exists(path)) return path;
  if (running_in_ci()) {
    FAIL("real trace " << path << " is missing and CI=true; set MOE_RESIDENCY_TRACES");
  }
  MESSAGE("SKIPPED: real trace " << path << " not found (set MOE_RESIDENCY_TRACES to the shared/traces folder)");
  return {};
}

// ---- twins and workloads ------------------------------------------------------
// In their own namespace: suites that say `using namespace moe_residency_test`
// (the llama_cpp ones) keep their own names.
namespace fixtures {
using namespace moe_residency;

inline layer_id L(int l) { return layer_id(static_cast<std::uint16_t>(l)); }
inline expert_id E(int e) { return expert_id(static_cast<std::uint16_t>(e)); }

// ---- the cache (from test_cache.cpp) -------------------------------------------

inline model_shape equal_shape(std::size_t layers, std::size_t experts, std::size_t k, std::uint64_t bytes = 100) {
  return model_shape("t", experts, k, std::vector<std::uint64_t>(layers, bytes));
}

struct batch {
  run_phase phase;
  int layer;
  std::vector<expert_id> ids;
};

/// A shared real trace's load batches (prefill and decode, in order) and its
/// shape; empty when the trace is absent (real_trace() says so, or fails in CI).
inline std::vector<batch> real_trace_batches(const std::string& name, model_shape& shape) {
  const std::string path = real_trace(name);
  if (path.empty()) return {};
  const validated_route_trace t = read_route_trace(path);
  shape = t.shape();
  const load_batches lb = group_load_batches(t);
  std::vector<batch> tr;
  for (const load_batch& b : lb.batches) {
    const auto ids = lb.experts_of(b);
    tr.push_back({b.phase, static_cast<int>(to_index(b.layer)), std::vector<expert_id>(ids.begin(), ids.end())});
  }
  return tr;
}

/// A random trace in the engine's shape: a prefill batch per layer (many
/// tokens, duplicates), then decode batches of k distinct ids per layer, with
/// skewed (hot-expert) routing so policies differ.
inline std::vector<batch> random_trace(const model_shape& s, std::uint32_t seed, int prefill_tokens,
                                       int decode_tokens) {
  std::mt19937 rng(seed);
  const int n_e = static_cast<int>(s.n_experts()), k = static_cast<int>(s.top_k());
  std::vector<std::discrete_distribution<int>> dist;
  for (std::size_t l = 0; l < s.n_layers(); ++l) {
    std::vector<double> w(n_e);
    for (int e = 0; e < n_e; ++e) w[e] = 1.0 / (1 + ((e * 7 + static_cast<int>(l) * 3) % n_e));
    dist.emplace_back(w.begin(), w.end());
  }
  auto routing = [&](int l) {
    std::vector<expert_id> ids;
    while (static_cast<int>(ids.size()) < k) {
      const expert_id e = E(dist[l](rng));
      if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
    }
    return ids;
  };
  std::vector<batch> out;
  for (int l = 0; l < static_cast<int>(s.n_layers()); ++l) {
    batch b{run_phase::prefill, l, {}};
    for (int t = 0; t < prefill_tokens; ++t)
      for (expert_id e : routing(l)) b.ids.push_back(e);
    if (prefill_tokens) out.push_back(b);
  }
  for (int t = 0; t < decode_tokens; ++t)
    for (int l = 0; l < static_cast<int>(s.n_layers()); ++l) out.push_back({run_phase::decode, l, routing(l)});
  return out;
}

inline std::shared_ptr<const next_use_index> index_of(const model_shape& s, const std::vector<batch>& tr) {
  auto idx = std::make_shared<next_use_index>(s);
  for (const auto& b : tr) idx->add_batch(L(b.layer), b.ids);
  idx->finish();
  return idx;
}

inline cache_options opts(std::uint64_t budget) {
  cache_options o;
  o.budget_bytes = budget;
  o.guard = cycle_guard::off;
  return o;
}

/// Slow obvious twin: std::list LRU with the same batch accounting.
struct list_lru {
  std::uint64_t budget, used = 0, hits = 0, lookups = 0, bytes = 0;
  std::list<std::pair<int, int>> order;  // front = most recent
  std::map<std::pair<int, int>, std::list<std::pair<int, int>>::iterator> where;
  std::uint64_t size_of(int l, const model_shape& s) const { return s.expert_bytes(L(l)); }
  void run(const batch& b, const model_shape& s) {
    std::set<std::pair<int, int>> touched;
    for (expert_id e : b.ids) {
      const std::pair<int, int> key{b.layer, static_cast<int>(to_index(e))};
      const bool repeat = touched.count(key) > 0;
      touched.insert(key);
      auto it = where.find(key);
      if (!repeat) ++lookups;
      if (it != where.end()) {
        if (!repeat) ++hits;
        order.erase(it->second);
      } else {
        bytes += size_of(b.layer, s);
        used += size_of(b.layer, s);
      }
      order.push_front(key);
      where[key] = order.begin();
    }
    auto it = order.end();
    while (used > budget && it != order.begin()) {
      --it;
      if (touched.count(*it)) continue;
      used -= size_of(it->first, s);
      where.erase(*it);
      it = order.erase(it);
    }
  }
};

/// Slow obvious twin: Belady that rescans the future at every eviction.
struct rescan_belady {
  std::uint64_t budget, used = 0, hits = 0, lookups = 0;
  std::map<std::pair<int, int>, std::uint64_t> last;  // resident → last access tick
  std::uint64_t tick = 0;
  void run(const std::vector<batch>& tr, std::size_t i, const model_shape& s) {
    const batch& b = tr[i];
    std::set<std::pair<int, int>> touched;
    for (expert_id e : b.ids) {
      const std::pair<int, int> key{b.layer, static_cast<int>(to_index(e))};
      ++tick;
      if (touched.count(key)) {
        last[key] = tick;
        continue;
      }
      touched.insert(key);
      ++lookups;
      if (last.count(key)) ++hits;
      else used += s.expert_bytes(L(b.layer));
      last[key] = tick;
    }
    evict(tr, i + 1, touched, s);
  }
  /// insert() after batch i: admitted, then evict to the budget sparing it.
  void insert(const std::vector<batch>& tr, std::size_t i, const model_shape& s, std::pair<int, int> key) {
    used += s.expert_bytes(L(key.first));
    last[key] = ++tick;
    evict(tr, i + 1, {key}, s);
  }
  void evict(const std::vector<batch>& tr, std::size_t from, const std::set<std::pair<int, int>>& touched,
             const model_shape& s) {
    while (used > budget) {
      std::vector<std::tuple<std::size_t, std::uint64_t, std::pair<int, int>>> c;  // next use, -last
      for (const auto& [key, t] : last) {
        if (touched.count(key)) continue;
        std::size_t next = SIZE_MAX;
        for (std::size_t j = from; j < tr.size(); ++j)
          if (tr[j].layer == key.first &&
              std::find(tr[j].ids.begin(), tr[j].ids.end(), E(key.second)) != tr[j].ids.end()) {
            next = j;
            break;
          }
        c.emplace_back(next, t, key);
      }
      if (c.empty()) break;
      std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) {
        if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) > std::get<0>(b);
        return std::get<1>(a) < std::get<1>(b);
      });
      const auto key = std::get<2>(c.front());
      used -= s.expert_bytes(L(key.first));
      last.erase(key);
    }
  }
};

/// Runs a trace through a cache, checking the invariants after every batch:
/// the budget holds unless every resident unpinned entry was touched by the
/// batch; touched and pinned entries survive.
template <class Policy>
cache_stats run_checked(const model_shape& s, const std::vector<batch>& tr, std::uint64_t budget, Policy p,
                        const std::vector<std::pair<int, int>>& pins = {}) {
  expert_cache<Policy> c(s, opts(budget), std::move(p));
  for (auto [l, e] : pins) c.pin(L(l), E(e));
  for (const auto& b : tr) {
    c.access_batch(b.phase, L(b.layer), b.ids);
    for (expert_id e : b.ids) REQUIRE(c.is_resident(L(b.layer), e));  // touched survive
    for (const auto& pin : pins) {
      const int l = pin.first, e = pin.second;
      const bool seen = std::any_of(tr.begin(), tr.end(), [&](const batch& x) {
        return x.layer == l && std::find(x.ids.begin(), x.ids.end(), E(e)) != x.ids.end() && &x <= &b;
      });
      if (seen) REQUIRE(c.is_resident(L(l), E(e)));  // pinned survive once loaded
    }
    if constexpr (std::is_base_of_v<detail::cache_partition_base, Policy>) {
      // A partition bounds each layer, not the total (floor of k per layer).
      if (c.resident_count(L(b.layer)) > c.policy().layer_capacity(L(b.layer))) {
        for (std::size_t e = 0; e < s.n_experts(); ++e) {
          const bool touched = std::find(b.ids.begin(), b.ids.end(), E(static_cast<int>(e))) != b.ids.end();
          if (!touched && !c.is_pinned(L(b.layer), E(static_cast<int>(e))))
            REQUIRE_FALSE(c.is_resident(L(b.layer), E(static_cast<int>(e))));
        }
      }
    } else if (c.resident_bytes() > budget) {
      // Only allowed when nothing else could go: count evictable residents.
      std::set<int> here;
      for (expert_id e : b.ids) here.insert(static_cast<int>(to_index(e)));
      for (std::size_t l = 0; l < s.n_layers(); ++l)
        for (std::size_t e = 0; e < s.n_experts(); ++e) {
          const bool touched = static_cast<int>(l) == b.layer && here.count(static_cast<int>(e));
          const bool pinned = c.is_pinned(L(static_cast<int>(l)), E(static_cast<int>(e)));
          if (!touched && !pinned) REQUIRE_FALSE(c.is_resident(L(static_cast<int>(l)), E(static_cast<int>(e))));
        }
    }
  }
  return c.stats();
}

/// P that also records every slot it is told was evicted, in order.
template <class P>
struct recording : P {
  using P::P;
  recording() = default;
  explicit recording(P p) : P(std::move(p)) {}
  std::vector<std::uint32_t> evicted;
  void on_evict(std::uint32_t s) noexcept {
    evicted.push_back(s);  // test only: may allocate
    P::on_evict(s);
  }
};

/// Runs `fast` and `twin` (expert_caches of recording<> policies) side by side
/// on `trace`, calling `between(i)` after batch i on both (a preload, a pin,
/// an invalidation), and returns the number of batches after which their
/// evictions so far (every slot, in order), bytes or hits differ, or, every
/// `full_every` batches, their residency of any (layer, expert).
template <class Fast, class Twin, class Between>
std::size_t count_divergences(const model_shape& s, Fast& fast, Twin& twin, const std::vector<batch>& trace,
                              Between&& between, std::size_t full_every = 1) {
  std::size_t bad = 0, checked = 0;  // evictions compared so far
  for (std::size_t i = 0; i < trace.size(); ++i) {
    fast.access_batch(trace[i].phase, L(trace[i].layer), trace[i].ids);
    twin.access_batch(trace[i].phase, L(trace[i].layer), trace[i].ids);
    between(i);
    const auto& a = fast.policy().evicted;
    const auto& b = twin.policy().evicted;
    bool same = a.size() == b.size() && std::equal(a.begin() + static_cast<std::ptrdiff_t>(checked), a.end(),
                                                   b.begin() + static_cast<std::ptrdiff_t>(checked));
    checked = std::min(a.size(), b.size());
    same = same && fast.resident_bytes() == twin.resident_bytes() && fast.stats().all.hits == twin.stats().all.hits;
    if (i % full_every == 0 || i + 1 == trace.size())
      for (std::size_t l = 0; l < s.n_layers() && same; ++l)
        for (std::size_t e = 0; e < s.n_experts() && same; ++e)
          same = fast.is_resident(L(static_cast<int>(l)), E(static_cast<int>(e))) ==
                 twin.is_resident(L(static_cast<int>(l)), E(static_cast<int>(e)));
    bad += !same;
  }
  return bad;
}

/// Between batches of a fast-against-twin comparison, the same disturbance to
/// both, drawn from `rng` for batch i: an insert() of a random (layer,
/// expert) every 5th batch, an invalidate() every 11th, a pin at 40 mod 97
/// and its unpin at 80 mod 97.
template <class Fast, class Twin>
void disturb_both(Fast& fast, Twin& twin, const model_shape& s, std::mt19937& rng, std::size_t i) {
  const int l = static_cast<int>(rng() % s.n_layers()), e = static_cast<int>(rng() % s.n_experts());
  if (i % 5 == 2) CHECK(fast.insert(L(l), E(e)) == twin.insert(L(l), E(e)));
  if (i % 11 == 6) CHECK(fast.invalidate(L(l), E(e)) == twin.invalidate(L(l), E(e)));
  if (i % 97 == 40) {
    fast.pin(L(l), E(e));
    twin.pin(L(l), E(e));
  }
  if (i % 97 == 80) {
    fast.unpin(L(l), E(e));
    twin.unpin(L(l), E(e));
  }
}

// ---- the drop policy and the planner (from test_plan.cpp) -----------------------

// Residency as a set of expert ids of any layer (tests use one layer at a time).
struct resident_set {
  std::set<unsigned> ids;
  bool operator()(layer_id, expert_id e) const { return ids.count(static_cast<unsigned>(e)) != 0; }
};

// The slow obvious twin of drop_policy::evaluate.
inline std::uint32_t twin_drop(const routing& r, double thr, const std::set<unsigned>& resident) {
  // The top-weighted slot: sort slots by weight, NaN last, stable on ties.
  std::vector<std::size_t> order(r.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const float wa = r.weight(a), wb = r.weight(b);
    if (std::isnan(wa)) return false;
    if (std::isnan(wb)) return true;
    return wa > wb;
  });
  const std::size_t top = order.empty() ? 0 : order[0];
  std::uint32_t m = 0;
  for (std::size_t s = 0; s < r.size(); ++s) {
    if (s == top) continue;
    const bool miss = resident.count(static_cast<unsigned>(r.id(s))) == 0;
    const bool light = !std::isnan(r.weight(s)) && static_cast<double>(r.weight(s)) < thr;
    if (miss && light) m |= 1u << s;
  }
  return m;
}

// The slow obvious twin of the planner: filter the list, then take `cap`.
inline std::vector<unsigned> twin_plan(const ranking& pred, std::size_t top_k, std::size_t cap,
                                       const std::set<unsigned>& resident, std::optional<double> thr) {
  std::vector<unsigned> seen, out;
  for (std::size_t r = 0; r < std::min(top_k, pred.size()); ++r) {
    const unsigned id = static_cast<unsigned>(pred.id(r));
    const bool dup = std::find(seen.begin(), seen.end(), id) != seen.end();
    seen.push_back(id);
    if (dup || resident.count(id)) continue;
    const float w = pred.weight(r);
    if (thr && r != 0 && !std::isnan(w) && static_cast<double>(w) < *thr) continue;
    out.push_back(id);
  }
  if (out.size() > cap) out.resize(cap);
  return out;
}

// ---- speculation through a session (from test_speculation.cpp) ------------------

using lru_cache = expert_cache<lru_policy>;

// A read callback recording calls; expert ids listed in `fail` fail.
struct recorder {
  std::mutex mu;
  std::vector<std::tuple<unsigned, unsigned, read_reason>> calls;
  std::set<unsigned> fail;
  read_callback callback() {
    return [this](layer_id l, expert_id e, read_reason why) {
      std::lock_guard<std::mutex> lock(mu);
      calls.emplace_back(static_cast<unsigned>(to_index(l)), static_cast<unsigned>(to_index(e)), why);
      return fail.count(static_cast<unsigned>(to_index(e))) ? read_status::failed : read_status::ok;
    };
  }
  std::size_t count(read_reason why) {
    std::lock_guard<std::mutex> lock(mu);
    std::size_t n = 0;
    for (auto& c : calls) n += std::get<2>(c) == why;
    return n;
  }
};

struct demand_entry {  // one lookup: the batch's first token, layer, expert
  std::uint32_t batch_token;
  unsigned layer, expert;
  bool operator<(const demand_entry& o) const {
    return std::tie(batch_token, layer, expert) < std::tie(o.batch_token, o.layer, o.expert);
  }
  bool operator==(const demand_entry& o) const {
    return batch_token == o.batch_token && layer == o.layer && expert == o.expert;
  }
};

struct executed_slot {  // one routed expert the engine computes with
  std::uint32_t batch_token, token;
  unsigned layer, expert;
  std::uint32_t weight_bits;  // exact, NaN-safe
  auto key() const { return std::tie(batch_token, token, layer, expert, weight_bits); }
  bool operator<(const executed_slot& o) const { return key() < o.key(); }
  bool operator==(const executed_slot& o) const { return key() == o.key(); }
};

inline std::uint32_t bits_of(float w) {
  std::uint32_t b;
  std::memcpy(&b, &w, sizeof b);
  return b;
}

// Shared by the recording cache and the routing recorder (host thread only).
struct library_log {
  std::uint32_t batch_token = 0;  // set at each begin_batch
  bool batch_open = false;        // a cache load batch is open
  unsigned batch_layer = 0;
  std::vector<demand_entry> lookups;
  std::uint64_t lookups_outside_batch = 0;
  std::vector<executed_slot> executed;  // unmasked slots of the routings handed to extensions
  std::uint64_t masked_slots = 0;       // slots the extensions asked the engine to skip
};

// An expert_cache<lru_policy> that logs what it is asked.
class recording_cache {
 public:
  recording_cache(lru_cache c, std::shared_ptr<library_log> log) : c_(std::move(c)), log_(std::move(log)) {}
  const model_shape& shape() const noexcept { return c_.shape(); }
  bool is_resident(layer_id l, expert_id e) const noexcept { return c_.is_resident(l, e); }
  bool insert(layer_id l, expert_id e, run_phase p) noexcept { return c_.insert(l, e, p); }
  bool invalidate(layer_id l, expert_id e) noexcept { return c_.invalidate(l, e); }
  bool begin_batch(run_phase phase, layer_id l) noexcept {
    log_->batch_open = true;
    log_->batch_layer = static_cast<unsigned>(to_index(l));
    return c_.begin_batch(phase, l);
  }
  lookup_result lookup(expert_id e) noexcept {
    if (!log_->batch_open) ++log_->lookups_outside_batch;
    log_->lookups.push_back({log_->batch_token, log_->batch_layer, static_cast<unsigned>(to_index(e))});
    return c_.lookup(e);
  }
  std::size_t end_batch() noexcept {
    log_->batch_open = false;
    return c_.end_batch();
  }
  const cache_stats& stats() const noexcept { return c_.stats(); }
  std::uint64_t budget_bytes() const noexcept { return c_.budget_bytes(); }

 private:
  lru_cache c_;
  std::shared_ptr<library_log> log_;
};

// A session extension placed after the speculation: sees the routings and the
// drop masks as the session hands them on.
struct routing_recorder {
  static constexpr session_hook hooks = session_hook::begin_batch | session_hook::routed;
  std::shared_ptr<library_log> log;
  template <class S>
  void on_begin_batch(S&, run_phase, std::uint32_t first_token, std::size_t) noexcept {
    log->batch_token = first_token;
  }
  template <class S>
  void on_routed(S&, layer_id l, span<const routing> rs, span<std::uint32_t> masks) {
    for (std::size_t t = 0; t < rs.size(); ++t) {
      const routing& r = rs[t];
      const std::uint32_t mask = t < masks.size() ? masks[t] : 0u;
      for (std::size_t i = 0; i < r.size(); ++i) {
        if ((mask >> i) & 1u) {
          ++log->masked_slots;
          continue;
        }
        log->executed.push_back({log->batch_token, r.token, static_cast<unsigned>(to_index(l)),
                                 static_cast<unsigned>(to_index(r.id(i))), bits_of(r.weight(i))});
      }
    }
  }
};

using rec_spec_t = speculation<recording_cache>;
using spec_session = session<predictor_set<stale_gate_predictor>, rec_spec_t, routing_recorder>;

struct run_result {
  std::vector<demand_entry> demanded;        // what each layer asked the cache for, sorted
  std::vector<executed_slot> executed;       // what the session handed on, unmasked, sorted
  std::vector<executed_slot> host_executed;  // the host's routings minus s.drop_mask(t), sorted
  std::uint64_t masked_slots = 0;
  std::uint64_t lookups_outside_batch = 0;
  speculation_stats spec;
  scheduler_stats reads;
  cache_stats cache;
  std::size_t demanded_callbacks = 0;
  std::size_t not_resident_when_executed = 0;
  std::string notes;
};

// The experts demanded, as (batch, layer, expert): what the executed slots
// should have asked the cache for.
inline std::vector<demand_entry> demand_of(const std::vector<executed_slot>& executed) {
  std::vector<demand_entry> d;
  for (const executed_slot& x : executed) d.push_back({x.batch_token, x.layer, x.expert});
  std::sort(d.begin(), d.end());
  return d;
}

/// One batch of `n` tokens of `stream` through session `s`, as an engine feeds
/// it: begin_batch, then for each MoE layer its gate inputs and routings,
/// `host(layer)` (what the host does before the layer's experts are in), and
/// layer_loaded; end_batch. Every call must succeed.
template <class Session, class Host>
void feed_batch(Session& s, const synthetic_model& model, synthetic_stream& stream, run_phase phase, std::size_t n,
                Host&& host) {
  const model_shape& shape = model.shape();
  stream.next(n);
  REQUIRE(s.begin_batch(phase, stream.first_token(), n));
  for (std::size_t l = 0; l < shape.n_layers(); ++l) {
    const layer_id lid = L(static_cast<int>(l));
    if (!shape.is_moe(lid)) continue;
    REQUIRE(s.gate_input(lid, stream.gate_inputs(lid), model.n_embd(), n, model.n_embd() * sizeof(float)));
    REQUIRE(s.routed(lid, span<const routing>(&stream.routed(lid, 0), n)));
    host(lid);
    REQUIRE(s.layer_loaded(lid));
  }
  REQUIRE(s.end_batch());
}

/// A prompt batch of 8 tokens, then `decode_tokens` tokens one by one (feed_batch).
template <class Session, class Host>
void feed_prompt_and_decode(Session& s, const synthetic_model& model, synthetic_stream& stream,
                            std::size_t decode_tokens, Host&& host) {
  feed_batch(s, model, stream, run_phase::prefill, 8, host);
  for (std::size_t t = 0; t < decode_tokens; ++t) feed_batch(s, model, stream, run_phase::decode, 1, host);
}

/// The synthetic workload (8 layers x 64 experts, top-6) through a session with
/// a recording cache. `seed` picks the model's routers and the token stream.
inline run_result run_synthetic(bool speculate, bool drop, std::size_t lanes, std::size_t tokens,
                                double flash_scale = 0.0, std::uint64_t seed = 1) {
  const synthetic_config c =
      synthetic_presets::small(synthetic_router::qwen3moe, element_type::f32, 8, 64, 128, 6, false, seed);
  const synthetic_model model(c);
  const model_shape& shape = model.shape();
  // A budget of 1.5 token cycles: LRU hits, and speculation both helps and evicts.
  const std::uint64_t budget = token_cycle_bytes(shape) * 3 / 2;
  std::unique_ptr<simulated_flash> flash;
  recorder rec;
  read_callback cb = rec.callback();
  if (flash_scale > 0) {
    simulated_flash_options fo;
    fo.time_scale = flash_scale;
    flash = std::make_unique<simulated_flash>(shape, fo);
    cb = flash->callback();
  }
  speculation_options o;
  o.enabled = speculate;
  o.scheduler.lanes = lanes;
  if (drop) o.drop = drop_options{};
  auto log = std::make_shared<library_log>();
  log->lookups.reserve(1u << 16);
  spec_session s(
      shape, session_options{}, std::tuple<stale_gate_predictor>{},
      std::tuple<rec_spec_t, routing_recorder>{
          rec_spec_t(shape, recording_cache(lru_cache(shape, {budget, cycle_guard::refuse, {}}), log), cb, o),
          routing_recorder{log}});
  install_routers(s, model);
  synthetic_stream stream(model, seed - 1);  // seed 1: the stream the suites always used
  run_result out;
  // The host: computes its own routings without the slots the session says to skip.
  feed_prompt_and_decode(s, model, stream, tokens, [&](layer_id lid) {
    const rec_spec_t& x = s.extension<0>();
    for (std::size_t t = 0; t < stream.batch_size(); ++t) {
      const routing& r = stream.routed(lid, t);
      for (std::size_t i = 0; i < r.size(); ++i) {
        if ((s.drop_mask(t) >> i) & 1u) continue;
        out.host_executed.push_back({stream.first_token(), stream.first_token() + static_cast<std::uint32_t>(t),
                                     static_cast<unsigned>(to_index(lid)), static_cast<unsigned>(to_index(r.id(i))),
                                     bits_of(r.weight(i))});
        if (!x.cache().is_resident(lid, r.id(i))) ++out.not_resident_when_executed;
      }
    }
  });
  rec_spec_t& x = s.extension<0>();
  x.finish();
  out.spec = x.stats();
  out.reads = x.read_stats();
  out.cache = x.cache().stats();
  out.demanded_callbacks = rec.count(read_reason::demanded);
  for (const std::string& n : x.lines()) out.notes += n + "\n";
  out.demanded = log->lookups;
  std::sort(out.demanded.begin(), out.demanded.end());
  out.executed = log->executed;
  std::sort(out.executed.begin(), out.executed.end());
  std::sort(out.host_executed.begin(), out.host_executed.end());
  out.masked_slots = log->masked_slots;
  out.lookups_outside_batch = log->lookups_outside_batch;
  return out;
}

// What must hold for any run with dropping off, speculation on or off.
inline void check_run_consistent(const run_result& r) {
  CHECK(r.lookups_outside_batch == 0);
  CHECK(r.masked_slots == 0);
  CHECK(!r.executed.empty());
  // The session handed on exactly what the host routed, and the host's view of
  // the drop masks matches what the extensions wrote.
  CHECK(r.executed == r.host_executed);
  // Each layer asked the cache for exactly the experts it computes with.
  CHECK(r.demanded == demand_of(r.executed));
  CHECK(r.not_resident_when_executed == 0);
}

}  // namespace fixtures
}  // namespace moe_residency_test
