// Property tests: random workloads with fixed seeds, each checked against a slow,
// obviously correct twin (tests/support.hpp holds the twins the unit suites share):
//  - the cache: the budget holds after every operation unless nothing else could
//    go, touched and pinned entries survive, hits + misses = lookups, the resident
//    bytes equal a recount, and lru / lfu / belady / cycle decide exactly what a
//    rescanning twin decides, on random shapes, budgets, pins, inserts and
//    invalidations;
//  - the planner and the drop policy: never more than the cap, never a resident,
//    never a sub-threshold miss except the top;
//  - the read scheduler: issued = completed + failed + cancelled + pending at every
//    quiesce, and in synchronous mode every counter equals a queue model's;
//  - speculation: what each layer demanded and what the session handed out are
//    identical with speculation on and off, over many seeds and lane counts.
// A failing case prints its seed (CAPTURE) so it can be replayed alone.

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "moe_residency/cache.hpp"
#include "moe_residency/io.hpp"
#include "moe_residency/plan.hpp"
#include "support.hpp"

using namespace moe_residency;
namespace fx = moe_residency_test::fixtures;  // the shared twins and workloads
using fx::batch;
using fx::E;
using fx::L;

namespace {

// ---- the cache --------------------------------------------------------------

/// A random shape: 2..6 layers of 8..32 experts, top-1..4, each layer's expert
/// size one of three (so byte budgets and counts disagree).
model_shape random_shape(std::mt19937& rng) {
  const std::size_t layers = 2 + rng() % 5, experts = 8 + rng() % 25, k = 1 + rng() % 4;
  std::vector<std::uint64_t> bytes;
  for (std::size_t l = 0; l < layers; ++l) bytes.push_back(100 + 50 * (rng() % 3));
  return model_shape("random", experts, k, bytes);
}

std::uint64_t random_budget(const model_shape& s, std::mt19937& rng) {
  // From below one expert to above the whole model: 0.01 .. 1.2 of every expert.
  std::uint64_t all = 0;
  for (std::size_t l = 0; l < s.n_layers(); ++l) all += s.expert_bytes(L(static_cast<int>(l))) * s.n_experts();
  const double f = std::uniform_real_distribution<double>(0.01, 1.2)(rng);
  return std::max<std::uint64_t>(1, static_cast<std::uint64_t>(f * static_cast<double>(all)));
}

/// The slow recount: bytes of every resident entry, from is_resident alone.
template <class Cache>
std::uint64_t recount_bytes(const Cache& c, const model_shape& s) {
  std::uint64_t b = 0;
  for (std::size_t l = 0; l < s.n_layers(); ++l)
    for (std::size_t e = 0; e < s.n_experts(); ++e)
      if (c.is_resident(L(static_cast<int>(l)), E(static_cast<int>(e)))) b += s.expert_bytes(L(static_cast<int>(l)));
  return b;
}

/// Over budget only when every resident entry is pinned or `spared` (the open
/// batch's, or the one insert() just admitted).
template <class Cache>
bool budget_holds(const Cache& c, const model_shape& s, const std::set<std::pair<int, int>>& spared) {
  if (c.resident_bytes() <= c.budget_bytes()) return true;
  for (std::size_t l = 0; l < s.n_layers(); ++l)
    for (std::size_t e = 0; e < s.n_experts(); ++e) {
      const int li = static_cast<int>(l), ei = static_cast<int>(e);
      if (c.is_resident(L(li), E(ei)) && !c.is_pinned(L(li), E(ei)) && !spared.count({li, ei})) return false;
    }
  return true;
}

void check_counters(const cache_stats& st) {
  CHECK(st.all.lookups == st.all.hits + st.all.misses);
  CHECK(st.decode.lookups == st.decode.hits + st.decode.misses);
  CHECK(st.decode.lookups <= st.all.lookups);
  CHECK(st.decode.evictions <= st.all.evictions);
}

/// Random batches mixed with insert(), invalidate(), pin() and unpin(), on a random
/// shape and budget; after every operation: the budget, the survivors, the
/// resident bytes against a recount, the counters against a tally kept here.
template <class Policy>
void random_operations(std::uint32_t seed, Policy policy) {
  std::mt19937 rng(seed);
  const model_shape s = random_shape(rng);
  const std::uint64_t budget = random_budget(s, rng);
  CAPTURE(seed);
  CAPTURE(budget);
  CAPTURE(s.n_layers());
  CAPTURE(s.n_experts());
  expert_cache<Policy> c(s, fx::opts(budget), std::move(policy));
  const auto tr = fx::random_trace(s, seed, 1 + static_cast<int>(rng() % 4), 40);
  std::set<std::pair<int, int>> pinned;
  std::uint64_t lookups = 0, inserted = 0, invalidated = 0;
  std::size_t failures = 0;  // REQUIRE-free: count, report the first
  std::string first_failure;
  auto fail_if = [&](bool bad, const char* what) {
    if (!bad) return;
    if (!failures++) first_failure = what;
  };
  for (const batch& b : tr) {
    // A batch: one lookup per distinct expert, every touched entry survives it.
    std::set<std::pair<int, int>> touched;
    for (expert_id e : b.ids) touched.insert({b.layer, static_cast<int>(to_index(e))});
    lookups += touched.size();
    c.access_batch(b.phase, L(b.layer), b.ids);
    for (const auto& t : touched)
      fail_if(!c.is_resident(L(t.first), E(t.second)), "a touched entry did not survive its batch");
    fail_if(!budget_holds(c, s, touched), "over budget after a batch with evictable entries left");
    // Between batches: the engine's other calls, at random.
    const unsigned op = rng() % 6;
    const int l = static_cast<int>(rng() % s.n_layers()), e = static_cast<int>(rng() % s.n_experts());
    if (op == 0) {
      const bool was = c.is_resident(L(l), E(e));
      const bool ok = c.insert(L(l), E(e), rng() % 2 ? run_phase::decode : run_phase::prefill);
      fail_if(ok == was, "insert() did not return 'was not resident'");
      inserted += ok;
      fail_if(!c.is_resident(L(l), E(e)), "insert() evicted what it admitted");
      // A refused insert() evicts nothing: the batch's entries are still spared.
      if (ok) fail_if(!budget_holds(c, s, {{l, e}}), "over budget after insert() with evictable entries left");
    } else if (op == 1) {
      const bool was = c.is_resident(L(l), E(e));
      fail_if(c.invalidate(L(l), E(e)) != was, "invalidate() did not return 'was resident'");
      invalidated += was;
      fail_if(c.is_resident(L(l), E(e)), "resident after invalidate()");
    } else if (op == 2 && pinned.size() < 4) {
      c.pin(L(l), E(e));
      pinned.insert({l, e});
    } else if (op == 3 && !pinned.empty()) {
      const auto p = *pinned.begin();
      c.unpin(L(p.first), E(p.second));
      pinned.erase(pinned.begin());
    }
    for (const auto& p : pinned) fail_if(!c.is_pinned(L(p.first), E(p.second)), "a pin was lost");
    fail_if(c.resident_bytes() != recount_bytes(c, s), "resident_bytes() differs from a recount");
  }
  CAPTURE(first_failure);
  CHECK(failures == 0);
  check_counters(c.stats());
  CHECK(c.stats().all.lookups == lookups);
  CHECK(c.stats().inserted == inserted);
  CHECK(c.stats().invalidated == invalidated);
}

/// Slow obvious twin of lfu_policy: rescans every resident entry at each
/// eviction for the fewest lookups, ties to the least recently routed.
/// Frequencies persist across evictions; a batch counts a lookup once.
struct rescan_lfu {
  explicit rescan_lfu(std::uint64_t b) : budget(b) {}
  std::uint64_t budget, used = 0, hits = 0, lookups = 0, tick = 0;
  std::map<std::pair<int, int>, std::uint64_t> freq, last;
  std::set<std::pair<int, int>> resident;
  void run(const batch& b, const model_shape& s) {
    std::set<std::pair<int, int>> touched;
    for (expert_id e : b.ids) {
      const std::pair<int, int> key{b.layer, static_cast<int>(to_index(e))};
      last[key] = ++tick;
      if (!touched.insert(key).second) continue;
      ++lookups;
      ++freq[key];
      if (resident.count(key)) {
        ++hits;
      } else {
        resident.insert(key);
        used += s.expert_bytes(L(b.layer));
      }
    }
    while (used > budget) {
      const std::pair<int, int>* victim = nullptr;
      for (const auto& key : resident) {
        if (touched.count(key)) continue;
        if (!victim || std::make_pair(freq[key], last[key]) < std::make_pair(freq[*victim], last[*victim]))
          victim = &key;
      }
      if (!victim) break;
      used -= s.expert_bytes(L(victim->first));
      resident.erase(*victim);
    }
  }
};

/// Slow obvious twin of layer_lfu_policy: each MoE layer holds at most
/// max(k, floor(budget / n_moe_layers / bytes(l))) entries (capped at
/// n_experts); after a batch of layer l, while l holds more, the entry of l
/// with the fewest lookups, ties to the least recently routed (duplicates
/// refresh recency), untouched by the batch, is rescanned for and evicted.
/// Frequencies persist across evictions; a batch counts a lookup once.
struct rescan_layer_lfu {
  rescan_layer_lfu(std::uint64_t budget, const model_shape& s) {
    for (std::size_t l = 0; l < s.n_layers(); ++l) {
      const std::uint64_t share = budget / (s.n_moe_layers() * s.expert_bytes(L(static_cast<int>(l))));
      cap.push_back(std::min<std::uint64_t>(s.n_experts(), std::max<std::uint64_t>(s.top_k(), share)));
    }
  }
  std::vector<std::uint64_t> cap;
  std::uint64_t hits = 0, lookups = 0, tick = 0;
  std::map<std::pair<int, int>, std::uint64_t> freq, last;
  std::set<std::pair<int, int>> resident;
  void run(const batch& b) {
    std::set<std::pair<int, int>> touched;
    for (expert_id e : b.ids) {
      const std::pair<int, int> key{b.layer, static_cast<int>(to_index(e))};
      last[key] = ++tick;
      if (!touched.insert(key).second) continue;
      ++lookups;
      ++freq[key];
      if (resident.count(key)) ++hits;
      else resident.insert(key);
    }
    for (;;) {
      std::uint64_t held = 0;
      const std::pair<int, int>* victim = nullptr;
      for (const auto& key : resident) {
        if (key.first != b.layer) continue;
        ++held;
        if (touched.count(key)) continue;
        if (!victim || std::make_pair(freq[key], last[key]) < std::make_pair(freq[*victim], last[*victim]))
          victim = &key;
      }
      if (held <= cap[static_cast<std::size_t>(b.layer)] || !victim) break;
      resident.erase(*victim);
    }
  }
};

template <class Cache>
bool same_residency(const Cache& c, const std::set<std::pair<int, int>>& twin, const model_shape& s) {
  for (std::size_t l = 0; l < s.n_layers(); ++l)
    for (std::size_t e = 0; e < s.n_experts(); ++e) {
      const int li = static_cast<int>(l), ei = static_cast<int>(e);
      if (c.is_resident(L(li), E(ei)) != (twin.count({li, ei}) > 0)) return false;
    }
  return true;
}

}  // namespace

TEST_CASE_TEMPLATE("property: every policy keeps the budget, the survivors and the counters under random operations", P,
                   lru_policy, lfu_policy, random_policy, arc_policy, s3fifo_policy, sieve_policy, cycle_policy,
                   retention_policy<lru_policy>, retention_policy<cycle_policy>) {
  for (std::uint32_t seed = 100; seed < 124; ++seed) random_operations(seed, P{});
}

TEST_CASE("property: belady keeps the budget, the survivors and the counters under random operations") {
  for (std::uint32_t seed = 200; seed < 212; ++seed) {
    // The oracle needs the future: built from the same trace random_operations replays.
    std::mt19937 rng(seed);
    const model_shape s = random_shape(rng);
    random_budget(s, rng);
    const auto tr = fx::random_trace(s, seed, 1 + static_cast<int>(rng() % 4), 40);
    random_operations(seed, belady_policy{fx::index_of(s, tr)});
  }
}

TEST_CASE("property: the per-layer policies keep each layer within its partition") {
  for (std::uint32_t seed = 300; seed < 316; ++seed) {
    std::mt19937 rng(seed);
    const model_shape s = random_shape(rng);
    const auto tr = fx::random_trace(s, seed, 2, 30);
    const std::uint64_t budget = random_budget(s, rng);
    CAPTURE(seed);
    CAPTURE(budget);
    check_counters(fx::run_checked(s, tr, budget, layer_lru_policy{}, {{0, 1}}));
    check_counters(fx::run_checked(s, tr, budget, layer_lfu_policy{}, {{0, 1}}));
  }
}

TEST_CASE("property: lru, lfu and belady decide what a rescanning twin decides, batch by batch") {
  for (std::uint32_t seed = 400; seed < 430; ++seed) {
    std::mt19937 rng(seed);
    const model_shape s = random_shape(rng);
    const std::uint64_t budget = random_budget(s, rng);
    const auto tr = fx::random_trace(s, seed, static_cast<int>(rng() % 4), 50);
    CAPTURE(seed);
    CAPTURE(budget);
    expert_cache<lru_policy> lru(s, fx::opts(budget));
    expert_cache<lfu_policy> lfu(s, fx::opts(budget));
    expert_cache<belady_policy> bel(s, fx::opts(budget), belady_policy{fx::index_of(s, tr)});
    fx::list_lru lru_twin{budget, 0, 0, 0, 0, {}, {}};
    rescan_lfu lfu_twin(budget);
    fx::rescan_belady bel_twin{budget, 0, 0, 0, {}, 0};
    std::size_t lru_diff = 0, lfu_diff = 0, bel_diff = 0;
    for (std::size_t i = 0; i < tr.size(); ++i) {
      lru.access_batch(tr[i].phase, L(tr[i].layer), tr[i].ids);
      lfu.access_batch(tr[i].phase, L(tr[i].layer), tr[i].ids);
      bel.access_batch(tr[i].phase, L(tr[i].layer), tr[i].ids);
      lru_twin.run(tr[i], s);
      lfu_twin.run(tr[i], s);
      bel_twin.run(tr, i, s);
      std::set<std::pair<int, int>> lru_res, bel_res;
      for (const auto& kv : lru_twin.where) lru_res.insert(kv.first);
      for (const auto& kv : bel_twin.last) bel_res.insert(kv.first);
      lru_diff += !same_residency(lru, lru_res, s);
      lfu_diff += !same_residency(lfu, lfu_twin.resident, s);
      bel_diff += !same_residency(bel, bel_res, s);
    }
    CHECK(lru_diff == 0);
    CHECK(lfu_diff == 0);
    CHECK(bel_diff == 0);
    CHECK(lru.stats().all.hits == lru_twin.hits);
    CHECK(lfu.stats().all.hits == lfu_twin.hits);
    CHECK(bel.stats().all.hits == bel_twin.hits);
    CHECK(lfu.stats().all.lookups == lfu_twin.lookups);
  }
}

TEST_CASE("property: layerlfu decides what a rescanning twin decides, batch by batch") {
  auto compare = [](const model_shape& s, std::uint64_t budget, const std::vector<batch>& tr) {
    CAPTURE(budget);
    expert_cache<layer_lfu_policy> c(s, fx::opts(budget));
    rescan_layer_lfu twin(budget, s);
    std::size_t diff = 0;
    for (const batch& b : tr) {
      c.access_batch(b.phase, L(b.layer), b.ids);
      twin.run(b);
      diff += !same_residency(c, twin.resident, s);
    }
    CHECK(diff == 0);
    CHECK(c.stats().all.hits == twin.hits);
    CHECK(c.stats().all.lookups == twin.lookups);
    return c.stats().all.evictions;
  };
  for (std::uint32_t seed = 600; seed < 630; ++seed) {
    std::mt19937 rng(seed);
    const model_shape s = random_shape(rng);
    const std::uint64_t budget = random_budget(s, rng);
    CAPTURE(seed);
    compare(s, budget, fx::random_trace(s, seed, static_cast<int>(rng() % 4), 50));
  }
  // Long enough that entries pass layer_lfu_policy::bucket_frequencies
  // lookups and move from the buckets to the layer's heap, and are evicted
  // from there (a layer of 6 experts holding 2, top-2, 1600 tokens).
  const model_shape small = fx::equal_shape(2, 6, 2);
  const auto long_trace = fx::random_trace(small, 631, 3, 1600);
  std::map<std::pair<int, int>, int> count;
  for (const batch& b : long_trace)
    for (expert_id e : b.ids) ++count[{b.layer, static_cast<int>(to_index(e))}];
  int past_buckets = 0;
  for (const auto& kv : count) past_buckets += kv.second > static_cast<int>(layer_lfu_policy::bucket_frequencies) + 10;
  CHECK(past_buckets >= 2);
  CHECK(compare(small, 2 * 2 * 100, long_trace) > 1000);
}

TEST_CASE("property: cycle decides what its full-rescan reference decides, with inserts and pins") {
  for (std::uint32_t seed = 500; seed < 516; ++seed) {
    std::mt19937 rng(seed);
    const model_shape s = random_shape(rng);
    const std::uint64_t budget = random_budget(s, rng);
    const auto tr = fx::random_trace(s, seed, 2, 60);
    CAPTURE(seed);
    CAPTURE(budget);
    cycle_policy_options fo, so;
    fo.decay = so.decay = std::uniform_real_distribution<double>(0.2, 0.95)(rng);
    so.reference_scan = true;
    expert_cache<cycle_policy> fast(s, fx::opts(budget), cycle_policy{fo});
    expert_cache<cycle_policy> scan(s, fx::opts(budget), cycle_policy{so});
    const int pl = static_cast<int>(rng() % s.n_layers()), pe = static_cast<int>(rng() % s.n_experts());
    fast.pin(L(pl), E(pe));
    scan.pin(L(pl), E(pe));
    std::size_t diff = 0;
    for (const batch& b : tr) {
      fast.access_batch(b.phase, L(b.layer), b.ids);
      scan.access_batch(b.phase, L(b.layer), b.ids);
      if (rng() % 4 == 0) {
        const int l = static_cast<int>(rng() % s.n_layers()), e = static_cast<int>(rng() % s.n_experts());
        diff += fast.insert(L(l), E(e)) != scan.insert(L(l), E(e));
      }
      for (std::size_t l = 0; l < s.n_layers(); ++l)
        for (std::size_t e = 0; e < s.n_experts(); ++e)
          diff += fast.is_resident(L(static_cast<int>(l)), E(static_cast<int>(e))) !=
                  scan.is_resident(L(static_cast<int>(l)), E(static_cast<int>(e)));
    }
    CHECK(diff == 0);
    CHECK(fast.stats().all.evictions == scan.stats().all.evictions);
  }
}

// ---- the planner and the drop policy -------------------------------------------

namespace {
const warning_sink quiet = [](const std::string&) {};
constexpr float nan_w = std::numeric_limits<float>::quiet_NaN();
}  // namespace

TEST_CASE("property: the planner never exceeds its cap, never reads a resident, never a light miss but the top") {
  std::size_t plans = 0, nonempty = 0;
  for (unsigned seed = 600; seed < 608; ++seed) {
    std::mt19937 rng(seed);
    for (int it = 0; it < 2500; ++it) {
      const std::size_t n = rng() % 40;
      ranking pred;
      std::set<unsigned> resident;
      for (std::size_t i = 0; i < n; ++i) {
        const unsigned id = static_cast<unsigned>(rng() % 64);
        float w = std::uniform_real_distribution<float>(0.0f, 0.5f)(rng);
        if (rng() % 11 == 0) w = nan_w;
        if (rng() % 13 == 0) w = 0.0f;
        pred.push_back(E(static_cast<int>(id)), 0.0f, w);
        if (rng() % 3 == 0) resident.insert(id);
      }
      const std::size_t cap = rng() % 33, top_k = rng() % 40;
      std::optional<double> thr;
      if (rng() % 2) thr = std::uniform_real_distribution<double>(0.0, 0.4)(rng);
      CAPTURE(seed);
      CAPTURE(it);
      const speculation_plan p = speculation_planner(cap).plan(L(1), pred, top_k, fx::resident_set{resident}, thr);
      std::vector<unsigned> ids;
      for (std::size_t i = 0; i < p.size(); ++i) ids.push_back(static_cast<unsigned>(p.id(i)));
      ++plans;
      nonempty += !ids.empty();
      CHECK(ids.size() <= cap);
      std::set<unsigned> distinct(ids.begin(), ids.end());
      CHECK(distinct.size() == ids.size());
      for (unsigned id : ids) {
        CHECK(resident.count(id) == 0);
        // Where the id first appears within top_k; below the threshold only at rank 0.
        std::size_t r = 0;
        while (r < pred.size() && static_cast<unsigned>(to_index(pred.id(r))) != id) ++r;
        REQUIRE(r < std::min(top_k, pred.size()));
        const float w = pred.weight(r);
        if (thr && r != 0) CHECK((std::isnan(w) || static_cast<double>(w) >= *thr));
      }
      CHECK(ids == fx::twin_plan(pred, top_k, cap, resident, thr));
    }
  }
  CHECK(nonempty > plans / 4);  // the workload exercises real plans, not only empty ones
}

TEST_CASE("property: the drop policy never drops the top slot, a resident, or a weight at or above F/k") {
  std::size_t masks = 0, dropped = 0;
  for (unsigned seed = 700; seed < 706; ++seed) {
    std::mt19937 rng(seed);
    for (int it = 0; it < 3000; ++it) {
      const std::size_t k = 1 + rng() % 16;
      const double f = std::uniform_real_distribution<double>(0.05, 1.0)(rng);
      drop_policy dp(fx::equal_shape(3, 64, k), {f, false, quiet});
      routing r;
      r.layer = L(static_cast<int>(rng() % 3));
      std::set<unsigned> resident;
      std::vector<unsigned> ids(64);
      for (unsigned i = 0; i < 64; ++i) ids[i] = i;
      std::shuffle(ids.begin(), ids.end(), rng);
      for (std::size_t sl = 0; sl < k; ++sl) {
        float w = std::uniform_real_distribution<float>(0.0f, 2.0f / static_cast<float>(k))(rng);
        if (rng() % 12 == 0) w = nan_w;
        r.push_back(E(static_cast<int>(ids[sl])), w);
        if (rng() % 3 == 0) resident.insert(ids[sl]);
      }
      CAPTURE(seed);
      CAPTURE(it);
      const std::uint32_t m = dp.evaluate(r, fx::resident_set{resident}).dropped_mask;
      ++masks;
      // The top slot: the highest non-NaN weight, first on ties.
      std::size_t top = 0;
      for (std::size_t sl = 0; sl < k; ++sl)
        if (!std::isnan(r.weight(sl)) && (std::isnan(r.weight(top)) || r.weight(sl) > r.weight(top))) top = sl;
      CHECK(((m >> top) & 1u) == 0u);
      for (std::size_t sl = 0; sl < k; ++sl) {
        if (!((m >> sl) & 1u)) continue;
        ++dropped;
        CHECK(resident.count(static_cast<unsigned>(to_index(r.id(sl)))) == 0);
        CHECK(static_cast<double>(r.weight(sl)) < dp.threshold());
      }
      CHECK((k >= 32 || (m >> k) == 0u));
      CHECK(m == fx::twin_drop(r, dp.threshold(), resident));
    }
  }
  CHECK(dropped > masks / 4);
}

// ---- the read scheduler -----------------------------------------------------------

namespace {

/// Slow obvious twin of the synchronous scheduler: a FIFO of tickets, a list of
/// completions not yet handed back, and every counter tallied by hand.
struct queue_model {
  explicit queue_model(std::size_t c) : capacity(c) {}
  std::size_t capacity;
  std::deque<unsigned> queue;
  std::vector<unsigned> done;  // completed or failed, awaiting quiesce
  std::uint64_t issued = 0, rejected = 0, cancelled = 0, completed = 0, failed = 0, delivered = 0;
  bool speculate(unsigned key) {
    if (queue.size() + done.size() >= capacity) {
      ++rejected;
      return false;
    }
    queue.push_back(key);
    ++issued;
    return true;
  }
  std::vector<unsigned> pump(std::size_t max) {
    std::vector<unsigned> ran;
    while (ran.size() < max && !queue.empty()) {
      ran.push_back(queue.front());
      done.push_back(queue.front());
      queue.pop_front();
    }
    return ran;
  }
  std::vector<unsigned> quiesce() {
    cancelled += queue.size();
    queue.clear();
    std::vector<unsigned> out;
    out.swap(done);
    delivered += out.size();
    return out;
  }
};

/// Whether the callback fails the read with this key (a fixed rule both sides use).
bool fails(unsigned key) { return key % 5 == 3; }

read_callback keyed_callback(std::atomic<unsigned>& calls) {
  return [&calls](layer_id l, expert_id e, read_reason) {
    calls.fetch_add(1);
    const unsigned key = static_cast<unsigned>(to_index(l)) * 1000u + static_cast<unsigned>(to_index(e));
    if (key % 7 == 6) throw std::runtime_error("injected");
    return fails(key) ? read_status::failed : read_status::ok;
  };
}

}  // namespace

TEST_CASE("property: the synchronous scheduler's counters equal a queue model's after every call") {
  for (unsigned seed = 800; seed < 820; ++seed) {
    std::mt19937 rng(seed);
    scheduler_options o;
    o.lanes = 0;
    o.queue_capacity = 1 + rng() % 12;
    CAPTURE(seed);
    CAPTURE(o.queue_capacity);
    std::atomic<unsigned> calls{0};
    read_scheduler s(keyed_callback(calls), o);
    queue_model m(o.queue_capacity);
    unsigned next = 0;
    std::size_t mismatches = 0;
    auto same = [&] {
      const scheduler_stats st = s.stats();
      const bool ok = st.issued == m.issued && st.rejected == m.rejected && st.cancelled == m.cancelled &&
                      st.completed + st.failed == m.completed + m.failed && st.queued == m.queue.size() &&
                      st.in_flight == 0 && st.delivered == m.delivered && st.balanced();
      mismatches += !ok;
    };
    for (int step = 0; step < 400; ++step) {
      const unsigned op = rng() % 4;
      if (op <= 1) {
        const unsigned key = next++;
        CHECK(s.speculate({L(static_cast<int>(key / 1000)), E(static_cast<int>(key % 1000)), 10}) == m.speculate(key));
      } else if (op == 2) {
        const std::size_t max = rng() % 5;
        const std::vector<unsigned> ran = m.pump(max);
        for (unsigned k : ran) (fails(k) || k % 7 == 6 ? m.failed : m.completed) += 1;
        CHECK(s.pump(max) == ran.size());
      } else {
        const std::vector<unsigned> want = m.quiesce();
        const span<const completed_read> got = s.quiesce();
        REQUIRE(got.size() == want.size());
        for (std::size_t i = 0; i < want.size(); ++i) {
          const unsigned key = static_cast<unsigned>(to_index(got[i].request.layer)) * 1000u +
                               static_cast<unsigned>(to_index(got[i].request.expert));
          CHECK(key == want[i]);  // handed back in completion order
          const read_outcome expect = key % 7 == 6 ? read_outcome::threw
                                      : fails(key) ? read_outcome::failed
                                                   : read_outcome::ok;
          CHECK(got[i].outcome == expect);
        }
        // At every quiesce: issued = completed + failed + cancelled + pending.
        const scheduler_stats st = s.stats();
        CHECK(st.issued == st.completed + st.failed + st.cancelled + st.in_flight + st.queued);
        CHECK(st.queued == 0);
      }
      same();
    }
    CHECK(mismatches == 0);
    CHECK(calls.load() == m.completed + m.failed);
  }
}

TEST_CASE("property: with lanes, issued = completed + failed + cancelled + pending at every quiesce") {
  for (unsigned seed = 900; seed < 906; ++seed) {
    std::mt19937 rng(seed);
    scheduler_options o;
    o.lanes = 1 + rng() % 4;
    o.queue_capacity = 1 + rng() % 10;
    o.mode = rng() % 2 ? quiesce_mode::wait : quiesce_mode::disown;
    CAPTURE(seed);
    CAPTURE(o.lanes);
    std::atomic<unsigned> calls{0};
    std::uint64_t delivered = 0, attempts = 0, unbalanced = 0;
    {
      read_scheduler s(keyed_callback(calls), o);
      unsigned next = 0;
      for (int step = 0; step < 600; ++step) {
        const unsigned n = rng() % 5;
        for (unsigned i = 0; i < n; ++i, ++attempts) {
          const unsigned key = next++;
          s.speculate({L(static_cast<int>(key / 1000)), E(static_cast<int>(key % 1000)), 10});
        }
        if (rng() % 3 == 0) std::this_thread::yield();
        const span<const completed_read> got = s.quiesce();
        delivered += got.size();
        const scheduler_stats st = s.stats();
        unbalanced += st.issued != st.completed + st.failed + st.cancelled + st.in_flight + st.queued;
        unbalanced += st.queued != 0;  // a quiesce leaves nothing queued (lanes may take new reads only later)
        unbalanced += st.delivered != delivered;
      }
      const scheduler_stats st = s.shutdown();
      CHECK(st.issued + st.rejected == attempts);
      CHECK(st.issued == st.completed + st.failed + st.cancelled);
      CHECK(st.completed + st.failed == calls.load());
      CHECK(st.in_flight == 0);
    }
    CHECK(unbalanced == 0);
  }
}

// ---- speculation: byte-identity over many seeds and lane counts ---------------------

TEST_CASE("property: speculation changes residency and timing only, for every seed and lane count") {
  std::uint64_t issued = 0;
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    for (std::size_t lanes : {0u, 1u, 2u, 4u}) {
      CAPTURE(seed);
      CAPTURE(lanes);
      const double flash = lanes ? 0.002 : 0.0;
      const fx::run_result off = fx::run_synthetic(false, false, lanes, 12, flash, seed);
      const fx::run_result on = fx::run_synthetic(true, false, lanes, 12, flash, seed);
      fx::check_run_consistent(off);
      fx::check_run_consistent(on);
      REQUIRE(off.demanded.size() == on.demanded.size());
      CHECK(off.demanded == on.demanded);
      REQUIRE(off.executed.size() == on.executed.size());
      CHECK(off.executed == on.executed);
      CHECK(off.cache.all.lookups == on.cache.all.lookups);
      CHECK(on.reads.balanced());
      CHECK(off.reads.issued == 0);
      issued += on.reads.issued;
    }
  }
  CHECK(issued > 0);
}
