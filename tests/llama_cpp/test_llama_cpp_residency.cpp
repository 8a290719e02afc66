// The mmap residency manager against a real llama.cpp on a saved, memory-
// mapped random-weight model, with the kernel replaced by a fake memory-advice
// interface that records every call: exactly the routed experts' ranges of
// every expert tensor are requested before the layer's expert matmuls; the
// pinned bytes never exceed the budget after any layer; an evicted expert is
// unlocked; the dense ranges are locked once; failing calls are counted and
// the run goes on; and with the real kernel's advice the logits are
// bit-identical to plain mmap.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <map>
#include <mutex>
#include <set>
#include <chrono>
#include <thread>
#include <tuple>
#include <string>
#include <sys/stat.h>
#include <cstring>
#include <sys/mman.h>
#include <fcntl.h>
#include <unistd.h>
#include <cstdlib>
#include <memory>
#include <vector>

#include "../source_text.hpp"
#include "degraded_ranking.hpp"
#include "fake_advice.hpp"
#include "llama_support.hpp"
#include "moe_residency/adapters/llama_cpp/residency.hpp"
#include "moe_residency/adapters/llama_cpp/residency/policies.hpp"
#include "moe_residency/adapters/llama_cpp/sinks.hpp"
#include "moe_residency/replay/dynamic.hpp"

using namespace moe_residency;
using namespace moe_residency_test;

namespace {

std::uintptr_t floor4k(const void* p) { return reinterpret_cast<std::uintptr_t>(p) & ~std::uintptr_t{4095}; }
std::uintptr_t ceil4k(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) + 4095) & ~std::uintptr_t{4095}; }

/// Expert e's slice of every expert tensor of layer l, page-aligned outward.
std::set<std::pair<std::uintptr_t, std::size_t>> expert_ranges(const mrl::layer_structure& s, std::size_t e) {
  std::set<std::pair<std::uintptr_t, std::size_t>> out;
  for (const auto& t : s.experts) {
    const auto* a = static_cast<const unsigned char*>(t.tensor->data) + e * t.bytes_per_expert;
    out.insert({floor4k(a), ceil4k(a + t.bytes_per_expert) - floor4k(a)});
  }
  return out;
}

/// After the manager: checks, at every managed layer, what the fake saw.
class checking_sink : public mrl::observer_sink {
 public:
  const mrl::observer* obs = nullptr;
  fake_advice* fake = nullptr;
  mrl::mmap_residency<>* res = nullptr;
  std::size_t seen = 0;
  std::size_t layers_checked = 0, exact_mismatch = 0, over_budget = 0, unpinned_resident = 0, pinned_evicted = 0;
  /// When the routing event began, before the manager acted (a front_sink's
  /// seq): an owned read may end before this sink is called, on a loaded
  /// machine. Unset: this sink's own seq.
  std::function<std::uint64_t()> routing_began;

  bool wants(moe_residency::engine_event e) const noexcept override { return e == moe_residency::engine_event::routed; }
  void on_layer_loaded(const mrl::layer_batch&) override {}
  void on_routed(const mrl::layer_batch& b) override {
    std::vector<fake_advice::call_record> calls;
    seen = fake->calls_since(seen, calls);
    if (!res->active() || b.phase != run_phase::decode) return;
    ++layers_checked;
    routings.push_back({static_cast<int>(to_index(b.layer)), next_seq()});
    const auto& s = *b.structure;
    if (res->cache() == nullptr && !res->options().predicted) check_exact(b, s, calls);
    // With overlap this layer's admissions are still being locked on the lanes
    // while its matmuls run: they are checked at the next routing.
    // With the pool and predicted reads, the next layer's experts may already
    // be placed ahead (by the lanes, not yet the cache's): checked there.
    if (res->cache() != nullptr)
      check_cache(res->options().overlap && res->options().exact ? to_index(b.layer) : SIZE_MAX,
                  res->options().pool && res->options().predicted ? to_index(b.layer) + 1 : SIZE_MAX);
  }

  // Without cache or prediction: the willneed calls since the previous layer
  // are exactly the routed experts' slices of every expert tensor.
  void check_exact(const mrl::layer_batch& b, const mrl::layer_structure& s,
                   const std::vector<fake_advice::call_record>& calls) {
    // The routed experts of this layer, and the ranges their reads must cover.
    std::set<std::pair<std::uintptr_t, std::size_t>> want, got;
    for (std::size_t j = 0; j < b.k; ++j)
      for (const auto& r : expert_ranges(s, static_cast<std::size_t>(b.ids[j]))) want.insert(r);
    std::vector<std::pair<std::uintptr_t, std::size_t>> sequence, in_order;
    for (const auto& c : calls)
      if (c.kind == mrl::advice::willneed) {
        got.insert({c.addr, c.len});
        sequence.push_back({c.addr, c.len});
      }
    // The order ggml's matmuls read them in: tensor by tensor as the graph
    // multiplies them, each tensor's experts in id order (ggml's mul_mat_id).
    std::vector<std::size_t> ids;
    for (std::size_t j = 0; j < b.k; ++j) ids.push_back(static_cast<std::size_t>(b.ids[j]));
    std::sort(ids.begin(), ids.end());
    for (const auto& t : s.experts)
      for (std::size_t e : ids) {
        const auto* a = static_cast<const unsigned char*>(t.tensor->data) + e * t.bytes_per_expert;
        in_order.push_back({floor4k(a), ceil4k(a + t.bytes_per_expert) - floor4k(a)});
      }
    if (res->owned_reads()) {
      // The lanes read (advice::read): checked after the run (read_checks),
      // since they finish during the layer's matmuls, after this event.
      owned_wants.push_back({routing_began ? routing_began() : routings.back().second, want, ids.size()});
      return;
    }
    exact_mismatch += got != want;
    order_mismatch += sequence != in_order;
  }

 public:
  std::size_t order_mismatch = 0;
  struct owned_want {
    std::uint64_t routed_at;
    std::set<std::pair<std::uintptr_t, std::size_t>> ranges;
    std::size_t experts;
  };
  std::vector<owned_want> owned_wants;

  void check_cache(std::size_t skip_layer = SIZE_MAX, std::size_t skip_layer2 = SIZE_MAX) {
    {
      const auto st = res->stats();
      over_budget += st.pinned_bytes > res->budget_bytes();
      // Every expert the cache holds is locked; every other has no locked interior page.
      for (std::size_t l = 0; l < obs->n_layer(); ++l) {
        const auto& ls = obs->layers()[l];
        if (!ls.moe || l == skip_layer || l == skip_layer2) continue;
        for (std::size_t e = 0; e < ls.spec.n_experts; ++e) {
          const bool resident = res->cache()->is_resident(layer_id(static_cast<std::uint16_t>(l)),
                                                          expert_id(static_cast<std::uint16_t>(e)));
          for (const auto& t : ls.experts) {
            const auto* a = static_cast<const unsigned char*>(t.tensor->data) + e * t.bytes_per_expert;
            const auto interior = ceil4k(a);
            if (interior + 4096 > floor4k(a + t.bytes_per_expert)) continue;
            const bool locked = fake->locked(interior) || fake->placed(interior);  // pinned, or in the pool
            unpinned_resident += resident && !locked;
            pinned_evicted += !resident && locked;
          }
        }
      }
    }
  }
  std::vector<std::pair<int, std::uint64_t>> routings;  // (layer, seq) of managed decode routings
};

/// In front of the manager: when each routing event began (before the manager acted).
class front_sink : public mrl::observer_sink {
 public:
  explicit front_sink(mrl::observer_sink& next) : next_(next) {}
  std::vector<std::pair<int, std::uint64_t>> routings;  // (layer, seq at the event's start)
  bool wants(moe_residency::engine_event e) const noexcept override {
    return e == moe_residency::engine_event::routed || next_.wants(e);
  }
  void on_begin_batch(const moe_residency::batch_info& b) override { next_.on_begin_batch(b); }
  void on_layer_loaded(const mrl::layer_batch& b) override { next_.on_layer_loaded(b); }
  void on_routed(const mrl::layer_batch& b) override {
    if (before_routing) before_routing();
    routings.push_back({static_cast<int>(to_index(b.layer)), next_seq()});
    next_.on_routed(b);
  }
  /// Called at each routing before anything else (e.g. to let the lanes drain).
  std::function<void()> before_routing;

 private:
  mrl::observer_sink& next_;
};

/// A user callback chained under the observer: the order of expert matmuls.
struct matmul_order {
  std::vector<std::pair<int, std::uint64_t>> asks;  // (layer, seq) of MUL_MAT_ID asks
  std::vector<const ggml_tensor*> weights;          // the weight each ask multiplies (src[0])
  static bool cb(ggml_tensor* t, bool ask, void* ud) {
    if (ask && t->op == GGML_OP_MUL_MAT_ID) {
      auto* self = static_cast<matmul_order*>(ud);
      int il = -1;
      // expert matmuls have no stable name; their ids (src[2]) are ffn_moe_topk-il
      if (t->src[2] == nullptr || std::sscanf(t->src[2]->name, "ffn_moe_topk-%d", &il) != 1) il = -1;
      self->asks.push_back({il, next_seq()});
      self->weights.push_back(t->src[0]);
    }
    return false;
  }
};

/// The layer an address of an expert tensor belongs to (-1: none).
int layer_of(const mrl::observer& obs, std::uintptr_t a) {
  for (std::size_t l = 0; l < obs.n_layer(); ++l)
    for (const auto& t : obs.layers()[l].experts) {
      const auto lo = floor4k(t.tensor->data);
      const auto hi = ceil4k(static_cast<const unsigned char*>(t.tensor->data) + t.bytes_per_expert * t.n_expert);
      if (a >= lo && a < hi) return static_cast<int>(l);
    }
  return -1;
}

/// 6 prompt + 16 decode tokens of `m` (its structure known) with a manager of
/// options `o` on `fake`, `check` behind it; after the run the last layer is
/// settled (its admissions locked and accounted) and the cache checked at
/// every layer, the last one too. The manager is returned alive: what its
/// destructor undoes is the caller's to check.
std::unique_ptr<mrl::mmap_residency<>> run_checked(mapped_model& m, const mrl::residency_options& o, fake_advice& fake,
                                                   checking_sink& check) {
  auto res = std::make_unique<mrl::mmap_residency<>>(m.obs, m.path, o, &fake);
  check.obs = &m.obs;
  check.fake = &fake;
  check.res = res.get();
  res->set_next(&check);
  m.obs.set_sink(res.get());
  m.restart();
  m.run(6, 16);
  m.obs.set_sink(nullptr);
  res->settle();
  check.check_cache();
  return res;
}

}  // namespace

TEST_CASE("mmap residency: exact reads request exactly the routed experts' ranges, in the matmuls' order") {
  // overlap off: the eval thread waits for every read before the layer's
  // matmuls; on (the default): the matmuls start while the reads are on the
  // lanes, and a layer's reads are all done before the next layer's begin.
  // owned: the lanes read each expert themselves (advice::read).
  struct variant {
    const char* name;
    bool overlap, owned;
  };
  for (const variant v :
       {variant{"serial", false, false}, variant{"overlap", true, false}, variant{"owned", true, true}}) {
    const std::string variant_name = v.name;
    CAPTURE(variant_name);
    matmul_order order;
    auto cp = test_context_params();
    cp.cb_eval = &matmul_order::cb;  // chained under the observer
    cp.cb_eval_user_data = &order;
    mapped_model m(std::string("res_exact_") + v.name, small_moe_spec(), cp);
    mrl::observer& obs = m.obs;

    fake_advice fake;
    fake.slow_reads = true;
    fake.owned = v.owned;
    mrl::residency_options o = mrl::residency_options::none();
    o.fits = mrl::when_fits::act;  // the tiny model fits: act anyway
    o.exact = true;
    o.lanes = 2;
    o.overlap = v.overlap;
    o.owned_reads = v.owned;
    mrl::mmap_residency<> res(obs, m.path, o, &fake);
    checking_sink check;
    check.obs = &obs;
    check.fake = &fake;
    check.res = &res;
    res.set_next(&check);
    front_sink front(res);
    check.routing_began = [&front] { return front.routings.back().second; };
    obs.set_sink(&front);

    m.run(6, 12);
    res.settle();  // the last layer's reads, still open with overlap
    REQUIRE(res.active());
    CHECK(res.status() == "");
    CHECK(res.owned_reads() == v.owned);
    if (v.owned) {
      const mrl::gguf_expert_map map(m.path, obs);
      CHECK(fake.attached_path == m.path);
      CHECK(fake.attached_base == static_cast<const unsigned char*>(obs.layers()[0].experts[0].tensor->data) -
                                      map.ranges(layer_id(0))[0].offset);
      CHECK(check.owned_wants.size() == 12 * 4);
    }
    CHECK(check.layers_checked == 12 * 4);
    CHECK(check.exact_mismatch == 0);
    CHECK(check.order_mismatch == 0);
    const auto st = res.stats();
    CHECK(st.exact_failed == 0);
    CHECK(st.exact_reads == 12 * 4 * 4);
    CHECK(st.advice_errors() == 0);
    CHECK(st.calls[static_cast<std::size_t>(mrl::advice::random)] > 0);  // random faults on expert ranges
    CHECK(st.calls[static_cast<std::size_t>(mrl::advice::lock)] == 0);   // no cache: nothing locked
    // Two lanes: never more than two reads at the device from them at once.
    CHECK(fake.max_reading() <= 2);

    // The graph multiplies each layer's expert tensors in the order the
    // observer lists them (the order the reads are issued in).
    for (std::size_t i = 0; i < order.asks.size(); ++i) {
      const int l = order.asks[i].first;
      if (l < 0) continue;
      const auto& ts = obs.layers()[static_cast<std::size_t>(l)].experts;
      std::size_t pos = 0;  // this ask's place among its layer's asks in this graph
      for (std::size_t j = i; j > 0 && order.asks[j - 1].first == l; --j) ++pos;
      REQUIRE(pos < ts.size());
      CHECK(order.weights[i] == ts[pos].tensor);
    }

    // Each device read (recorded when it returns; each takes 2 ms), against
    // the routing it served and the first expert matmul ask of that layer
    // after it (the eval thread released into the layer's matmuls).
    const auto calls = fake.calls();
    const mrl::advice device = v.owned ? mrl::advice::read : mrl::advice::populate_read;
    std::size_t reads = 0, before = 0;
    std::map<std::uint64_t, std::uint64_t> last_read_of;  // routing seq -> its last read's seq
    for (const auto& c : calls) {
      if (c.kind != device) continue;
      CHECK(c.kind != (v.owned ? mrl::advice::populate_read : mrl::advice::read));
      const int layer = layer_of(obs, c.addr);
      REQUIRE(layer >= 0);
      std::uint64_t routed_at = 0;
      for (const auto& r : front.routings)
        if (r.first == layer && r.second < c.seq) routed_at = r.second;
      REQUIRE(routed_at != 0);
      ++reads;
      last_read_of[routed_at] = std::max(last_read_of[routed_at], c.seq);
      const auto first_after_routing = std::find_if(order.asks.begin(), order.asks.end(), [&](const auto& a) {
        return a.first == layer && a.second > routed_at;
      });
      before += first_after_routing != order.asks.end() && c.seq < first_after_routing->second;
    }
    CHECK(reads == 12 * 4 * 4 * 3);  // decode tokens x layers x routed experts x expert tensors
    if (v.owned) {
      // Each routing's owned reads are exactly its experts' slices, and each
      // expert's tensors are read in the matmuls' order by the lane that took it.
      std::size_t wrong = 0, disordered = 0;
      for (const auto& w : check.owned_wants) {
        std::set<std::pair<std::uintptr_t, std::size_t>> got;
        // expert -> the tensor index of each of its reads, in the order they ended
        std::map<std::size_t, std::vector<std::size_t>> per_expert;
        for (const auto& c : calls) {
          if (c.kind != mrl::advice::read || c.seq < w.routed_at) continue;
          if (w.ranges.count({c.addr, c.len}) == 0) continue;
          // the first routing after w of the same layer ends w's window
          bool later = false;
          for (const auto& r : front.routings)
            later = later || (r.second > w.routed_at && r.second < c.seq && r.first == layer_of(obs, c.addr));
          if (later) continue;
          got.insert({c.addr, c.len});
          const auto& ts = obs.layers()[static_cast<std::size_t>(layer_of(obs, c.addr))].experts;
          for (std::size_t ti = 0; ti < ts.size(); ++ti) {
            const auto lo = reinterpret_cast<std::uintptr_t>(ts[ti].tensor->data);
            const auto mid = c.addr + c.len / 2;  // the slice's middle page: inside its own expert
            if (mid >= lo && mid < lo + ts[ti].bytes_per_expert * ts[ti].n_expert)
              per_expert[(mid - lo) / ts[ti].bytes_per_expert].push_back(ti);
          }
        }
        wrong += got != w.ranges;
        for (const auto& [e, tensors] : per_expert)
          disordered += !std::is_sorted(tensors.begin(), tensors.end()) || tensors.size() != 3;
      }
      CHECK(wrong == 0);
      CHECK(disordered == 0);
    }
    if (!v.overlap) {
      CHECK(before == reads);  // every read done before the layer's first matmul
      continue;
    }
    // Overlap: the layer's first matmul starts before its reads are done
    // (2 ms each, two lanes: 12 a layer take 12 ms; the eval thread returns at once).
    std::size_t layers = 0, released = 0, drained = 0;
    for (const auto& [routed_at, last] : last_read_of) {
      ++layers;
      int layer = -1;
      for (const auto& r : front.routings)
        if (r.second == routed_at) layer = r.first;
      const auto first = std::find_if(order.asks.begin(), order.asks.end(),
                                      [&](const auto& a) { return a.first == layer && a.second > routed_at; });
      released += first != order.asks.end() && first->second < last;
      // In flight: at most one layer's reads. Each is done before the manager
      // requests anything for the next routing.
      const auto next = std::find_if(front.routings.begin(), front.routings.end(),
                                     [&](const auto& r) { return r.second > routed_at; });
      bool before_next = true;
      if (next != front.routings.end()) {
        const auto first_next = std::find_if(calls.begin(), calls.end(), [&](const auto& c) {
          return (c.kind == mrl::advice::willneed || c.kind == device) && c.seq > next->second &&
                 layer_of(obs, c.addr) == next->first;
        });
        before_next = first_next == calls.end() || first_next->seq > last;
      }
      drained += before_next;
    }
    CHECK(layers == 12 * 4);
    CHECK(drained == layers);
    CHECK(released * 10 >= layers * 9);  // all but a descheduled eval thread's
    MESSAGE(std::string(v.name) << ": " << released << " of " << layers
                                << " layers' matmuls started before their reads were done");
  }
}

TEST_CASE("mmap residency: the pinned cache holds its budget, unlocks evictions, locks dense once") {
  mapped_model m("res_cache", small_moe_spec());
  mrl::observer& obs = m.obs;

  m.run(2, 1);  // the structure
  const std::uint64_t expert_bytes = obs.layers()[0].expert_bytes;
  for (std::size_t run = 0; run < 4; ++run) {
    const std::size_t fail_every = run % 2 == 0 ? 0 : 5;
    const bool overlap = run < 2;  // the admissions locked on the lanes during the matmuls, or before them
    CAPTURE(fail_every);
    CAPTURE(overlap);
    fake_advice fake;
    fake.fail_every = fail_every;  // with 3 tensors per expert, about every other admission fails
    mrl::residency_options o = mrl::residency_options::none();
    o.fits = mrl::when_fits::act;  // the tiny model fits: act anyway
    o.pin_dense = true;
    o.exact = true;
    o.overlap = overlap;
    o.cache = true;
    o.cache_budget_bytes = 24 * expert_bytes;  // 1.5 token cycles of 4 layers x 4
    checking_sink check;
    auto owner = run_checked(m, o, fake, check);
    mrl::mmap_residency<>& res = *owner;

    REQUIRE(res.active());
    const auto st = res.stats();
    CHECK(check.layers_checked == 16 * 4);
    CHECK(check.over_budget == 0);
    CHECK(check.pinned_evicted == 0);
    if (fail_every == 0) {
      CHECK(check.unpinned_resident == 0);
      CHECK(st.lock_failed == 0);
      CHECK(st.advice_errors() == 0);
    } else {
      // Every fifth lock fails: counted, the expert invalidated, the run goes on.
      CHECK(st.lock_failed > 0);
      CHECK(st.errors[static_cast<std::size_t>(mrl::advice::lock)] > 0);
      CHECK(check.unpinned_resident == 0);  // a failed lock is not left in the cache
    }
    CHECK(st.evictions > 0);
    CHECK(st.cache_hits + st.cache_misses == 16 * 4 * 4);  // k = 4 unique ids per layer
    CHECK(st.pinned_bytes <= res.budget_bytes());
    CHECK(st.pinned_peak_bytes <= res.budget_bytes());

    // Dense: the pages of each non-expert tensor the graph reads locked by
    // exactly one call; a tensor it never reads (the per-expert scales of
    // this model) is never touched, so never locked.
    const auto g = mrl::detail::open_gguf(m.path, "test");
    const mrl::gguf_expert_map map(m.path, obs);
    const auto* base =
        static_cast<const unsigned char*>(obs.layers()[0].experts[0].tensor->data) - map.ranges(layer_id(0))[0].offset;
    std::map<std::pair<std::uintptr_t, std::size_t>, int> dense, unread;
    for (std::int64_t i = 0; i < gguf_get_n_tensors(g.get()); ++i) {
      // the weights the expert matmuls multiply; everything else (per-expert
      // scales included) is dense
      const std::string name = gguf_get_tensor_name(g.get(), i);
      bool expert = false;
      for (const auto& ls : obs.layers())
        for (const auto& t : ls.experts) expert = expert || t.name == name;
      if (expert) continue;
      bool read = false;
      for (const ggml_tensor* w : obs.weights()) read = read || name == w->name;
      const auto* a = base + gguf_get_data_offset(g.get()) + gguf_get_tensor_offset(g.get(), i);
      ++(read ? dense : unread)[{floor4k(a), ceil4k(a + gguf_get_tensor_size(g.get(), i)) - floor4k(a)}];
    }
    REQUIRE(dense.size() > 5);
    REQUIRE(!unread.empty());
    std::map<std::pair<std::uintptr_t, std::size_t>, int> locked_dense;
    std::size_t locked_unread = 0;
    for (const auto& c : fake.calls())
      if (c.kind == mrl::advice::lock) {
        if (dense.count({c.addr, c.len}) != 0) ++locked_dense[{c.addr, c.len}];
        locked_unread += unread.count({c.addr, c.len}) != 0 && dense.count({c.addr, c.len}) == 0;
      }
    CHECK(locked_dense == dense);  // one call per dense tensor, none repeated per token
    CHECK(locked_unread == 0);
    CHECK(fake.locked_pages() > 0);
    owner.reset();
    CHECK(fake.locked_pages() == 0);  // the destructor unlocked every page it locked
    std::size_t normal = 0;
    for (const auto& c : fake.calls()) normal += c.kind == mrl::advice::normal;
    CHECK(normal == 3 * 4);  // and gave the expert ranges their read-around back
    if (fail_every == 0) CHECK(st.dense_bytes > 0);
  }
}

TEST_CASE(
    "mmap residency: the expert pool places the cache's experts in free slots and maps the file back on eviction") {
  mapped_model m("res_pool", small_moe_spec());
  mrl::observer& obs = m.obs;
  m.run(2, 1);  // the structure
  const std::uint64_t expert_bytes = obs.layers()[0].expert_bytes;
  std::uint64_t exact_reads_unpredicted = 0;
  for (int run = 0; run < 4; ++run) {
    const std::size_t fail_every = run % 2 == 0 ? 0 : 5;
    const bool predicted = run >= 2;  // the lanes place the stale-gate's experts ahead, the cache adopts them
    CAPTURE(fail_every);
    CAPTURE(predicted);
    fake_advice fake;
    fake.pool = true;
    fake.fail_every = fail_every;  // every fifth placement fails (EIO)
    fake.fail_kind = mrl::advice::place;
    mrl::residency_options o = mrl::residency_options::none();
    o.fits = mrl::when_fits::act;  // the tiny model fits: act anyway
    o.pin_dense = o.exact = o.cache = o.pool = true;
    o.predicted = predicted;
    o.cache_budget_bytes = 24 * expert_bytes;  // 1.5 token cycles of 4 layers x 4
    checking_sink check;
    auto owner = run_checked(m, o, fake, check);
    mrl::mmap_residency<>& res = *owner;

    REQUIRE(res.active());
    const auto st = res.stats();
    CHECK(check.layers_checked == 16 * 4);
    CHECK(check.over_budget == 0);
    CHECK(check.pinned_evicted == 0);     // an evicted expert's pages are neither locked nor placed
    CHECK(check.unpinned_resident == 0);  // every expert the cache holds is placed (or locked)
    CHECK(fake.bad_places == 0);          // whole pages, inside the pool, never over another placement
    // The pool: the budget's experts plus one layer's routed ones, each its slices' whole pages.
    const auto& ls = obs.layers()[0];
    std::uint64_t slot = 0;
    for (const auto& t : ls.experts) slot += t.bytes_per_expert / 4096 * 4096;
    CHECK(st.pool_bytes == (24 + 4 + (predicted ? o.spec_cap : 0)) * slot);
    CHECK(fake.pool_bytes == st.pool_bytes);
    CHECK(fake.max_pool_used > 0);
    CHECK(st.pool_fallbacks == 0);
    CHECK(st.evictions > 0);
    CHECK(st.calls[static_cast<std::size_t>(mrl::advice::restore)] > 0);
    // Placements are the slices' whole pages; the locks on expert pages are
    // the pages a slice shares with its neighbours, one page each.
    std::set<std::pair<std::uintptr_t, std::size_t>> slices;
    for (const auto& layer : obs.layers())
      for (std::size_t e = 0; e < layer.spec.n_experts; ++e)
        for (const auto& r : expert_ranges(layer, e)) slices.insert(r);
    std::size_t expert_locks = 0, wide_locks = 0, places = 0, unaligned = 0;
    bool placing = false;  // the dense locks come before, at activation
    for (const auto& c : fake.calls()) {
      placing = placing || c.kind == mrl::advice::place;
      if (c.kind == mrl::advice::place && c.rc == 0) {
        ++places;
        // inside one slice's range, not its first or last page where those are shared
        bool inside = false;
        for (const auto& r : slices) inside = inside || (c.addr >= r.first && c.addr + c.len <= r.first + r.second);
        unaligned += !inside;
      }
      if (c.kind != mrl::advice::lock || !placing) continue;
      bool expert = false;
      for (const auto& r : slices) expert = expert || (c.addr >= r.first && c.addr < r.first + r.second);
      if (!expert) continue;
      ++expert_locks;
      wide_locks += c.len != 4096;
    }
    CHECK(places > 0);
    CHECK(unaligned == 0);
    if (!predicted && fail_every == 0) exact_reads_unpredicted = st.exact_reads;
    if (predicted) {
      CHECK(st.predicted_issued > 0);
      CHECK(st.predicted_useful > 0);  // placed ahead and adopted by the cache: misses that need no read
      if (fail_every == 0) CHECK(st.exact_reads < exact_reads_unpredicted);  // of their own (same routing)
      CHECK(st.predicted_rejected == 0);
    }
    CHECK(expert_locks > 0);  // this model's slices are not page-aligned: their shared pages are locked
    if (fail_every == 0) {
      CHECK(wide_locks == 0);
      CHECK(st.lock_failed == 0);
      CHECK(st.advice_errors() == 0);
    } else {
      // A failed placement: counted, its slices mapped back, the expert not held, the run goes on.
      CHECK(st.lock_failed > 0);
      CHECK(st.errors[static_cast<std::size_t>(mrl::advice::place)] > 0);
    }
    owner.reset();
    CHECK(fake.placed_pages() == 0);  // the destructor mapped every placed page back to the file
    CHECK(fake.locked_pages() == 0);  // and unlocked every page it locked
  }
}

TEST_CASE("mmap residency: the kernel's expert pool maps the file's own bytes, and restore maps the file again") {
  // A file of known bytes, mapped shared and read-only as llama.cpp maps a model.
  const std::string path = "res_pool_kernel.bin";
  const std::size_t page = 4096, pages = 64;
  std::vector<unsigned char> bytes(page * pages);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>((i * 2654435761u) >> 13);
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  auto* base = static_cast<unsigned char*>(::mmap(nullptr, bytes.size(), PROT_READ, MAP_SHARED, fd, 0));
  ::close(fd);
  REQUIRE(base != MAP_FAILED);
  // The mapping that holds addr, as /proc/self/maps names it ("" when none).
  auto backing = [](const void* addr) {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    const auto a = reinterpret_cast<std::uintptr_t>(addr);
    while (std::getline(maps, line)) {
      std::uintptr_t lo = 0, hi = 0;
      if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2 && a >= lo && a < hi) return line;
    }
    return std::string();
  };
  {
    mrl::system_memory_advice adv;
    CHECK(adv.place(base + 8 * page, 16 * page, 0) == ENOSYS);  // no file, no pool yet
    REQUIRE(adv.attach_file(path, base, bytes.size()) == 0);
    REQUIRE(adv.attach_pool(32 * page) == 0);
    CHECK(adv.place(base + 8 * page + 1, 16 * page, 0) == EINVAL);      // not a page
    CHECK(adv.place(base + 8 * page, 16 * page, 20 * page) == EINVAL);  // past the pool's end
    REQUIRE(adv.place(base + 8 * page, 16 * page, 4 * page) == 0);
    CHECK(backing(base + 8 * page).find("moe-residency-expert-pool") != std::string::npos);
    CHECK(backing(base + 24 * page).find(path) != std::string::npos);  // the rest: still the file
    CHECK(std::memcmp(base, bytes.data(), bytes.size()) == 0);         // the same bytes, placed or not
    REQUIRE(adv.apply(mrl::advice::restore, base + 8 * page, 16 * page) == 0);
    CHECK(backing(base + 8 * page).find(path) != std::string::npos);
    CHECK(std::memcmp(base, bytes.data(), bytes.size()) == 0);
  }
  ::munmap(base, bytes.size());
  std::remove(path.c_str());
}

/// After the manager: at each managed prompt routing, what it asked since the last one.
class prompt_sink : public mrl::observer_sink {
 public:
  fake_advice* fake = nullptr;
  mrl::mmap_residency<>* res = nullptr;
  mrl::observer_sink* next = nullptr;  // called after this one looked
  std::size_t seen = 0, prompt_layers = 0, prompt_mismatch = 0, prompt_locks = 0;
  bool wants(moe_residency::engine_event e) const noexcept override { return e == moe_residency::engine_event::routed; }
  void on_layer_loaded(const mrl::layer_batch&) override {}
  void on_routed(const mrl::layer_batch& b) override {
    look(b);
    if (next != nullptr) next->on_routed(b);
  }

 private:
  void look(const mrl::layer_batch& b) {
    std::vector<fake_advice::call_record> calls;
    seen = fake->calls_since(seen, calls);
    if (!res->active() || b.phase != run_phase::prefill) return;
    ++prompt_layers;
    std::set<std::pair<std::uintptr_t, std::size_t>> want, got;
    for (std::size_t t = 0; t < b.n_tokens; ++t)
      for (std::size_t j = 0; j < b.k; ++j)
        for (const auto& r : expert_ranges(*b.structure, static_cast<std::size_t>(b.ids[t * b.ids_stride + j])))
          want.insert(r);
    for (const auto& c : calls) {
      if (c.kind == mrl::advice::willneed) got.insert({c.addr, c.len});
      prompt_locks += c.kind == mrl::advice::lock;
    }
    prompt_mismatch += got != want;
  }
};

TEST_CASE("mmap residency: the cache alone reads every routed expert itself, so faults read one page") {
  mapped_model m("res_cache_alone", small_moe_spec());
  mrl::observer& obs = m.obs;
  m.run(2, 1);  // the structure
  fake_advice fake;
  mrl::residency_options o = mrl::residency_options::none();
  o.fits = mrl::when_fits::act;
  o.cache = true;  // no exact, no dense
  o.cache_budget_bytes = 24 * obs.layers()[0].expert_bytes;
  auto owner = std::make_unique<mrl::mmap_residency<>>(obs, m.path, o, &fake);
  mrl::mmap_residency<>& res = *owner;
  checking_sink check;
  check.obs = &obs;
  check.fake = &fake;
  check.res = &res;
  prompt_sink prompt;
  prompt.fake = &fake;
  prompt.res = &res;
  prompt.next = &check;
  res.set_next(&prompt);
  obs.set_sink(&res);
  m.restart();
  m.run(6, 16);
  obs.set_sink(nullptr);

  REQUIRE(res.active());
  const auto st = res.stats();
  CHECK(st.advice_errors() == 0);
  // MADV_RANDOM once per expert tensor at activation (4 layers x 3), as with exact.
  CHECK(st.calls[static_cast<std::size_t>(mrl::advice::random)] == 3 * 4);
  // A prompt batch: every routed expert of the layer requested (WILLNEED), none locked.
  CHECK(prompt.prompt_layers == 4);
  CHECK(prompt.prompt_mismatch == 0);
  CHECK(prompt.prompt_locks == 0);
  // Decode: the cache holds its budget and pins what it holds, nothing else.
  CHECK(check.layers_checked == 16 * 4);
  CHECK(check.over_budget == 0);
  CHECK(check.pinned_evicted == 0);
  CHECK(check.unpinned_resident == 0);
  CHECK(st.cache_hits + st.cache_misses == 16 * 4 * 4);
  owner.reset();
  std::size_t normal = 0;
  for (const auto& c : fake.calls()) normal += c.kind == mrl::advice::normal;
  CHECK(normal == 3 * 4);  // the destructor gave the expert ranges their read-around back
}

TEST_CASE("mmap residency: predicted reads are planned, issued and settled") {
  mapped_model m("res_pred", small_moe_spec());
  m.warm_up();
  mrl::observer& obs = m.obs;
  std::vector<std::uint64_t> hit_share;
  for (double degrade : {0.0, 1.0}) {
    CAPTURE(degrade);
    fake_advice fake;
    mrl::residency_options o = mrl::residency_options::none();
    o.fits = mrl::when_fits::act;  // the tiny model fits: act anyway
    o.predicted = true;
    o.spec_cap = 2;
    mrl::stale_gate_ranking gate;
    gate.init(obs, obs.shape(), o.horizon);
    mre::degraded_ranking degraded(gate, obs.shape().top_k(), obs.shape().n_experts(), degrade, 1);
    mrl::mmap_residency<> res(obs, m.path, o, &fake);
    res.set_predictor(&degraded);
    front_sink front(res);
    // The lanes drain before each routing: a read issued while the previous layer
    // computes has run by then, whatever the machine's load; one issued later has not.
    front.before_routing = [&res] { drain_lanes(res); };
    obs.set_sink(&front);
    m.restart();
    m.run(6, 16);
    obs.set_sink(nullptr);
    res.settle();
    const auto st = res.stats();
    // The next layer's reads are in flight while this layer computes: each
    // speculative read (a lane's willneed) is issued, and so ends, before that
    // layer's own routing.
    std::size_t spec_reads = 0, ahead = 0;
    const auto calls = fake.calls();
    for (const auto& c : calls) {
      if (c.kind != mrl::advice::willneed) continue;
      const int layer = layer_of(obs, c.addr);
      if (layer < 0) continue;
      ++spec_reads;
      // The routing that issued it: the last before it; the one it serves: the next of its layer.
      const auto next = std::find_if(front.routings.begin(), front.routings.end(),
                                     [&](const auto& r) { return r.second > c.seq && r.first == layer; });
      ahead += next != front.routings.end() &&
               std::any_of(front.routings.begin(), front.routings.end(),
                           [&](const auto& r) { return r.second < c.seq && r.first == layer - 1; });
    }
    CHECK(spec_reads > 0);
    CHECK(ahead * 10 >= spec_reads * 9);
    // 3 of 4 layers have a next MoE layer; 16 decode tokens.
    CHECK(st.predictions == 16 * 3);
    CHECK(st.predicted_issued == 16 * 3 * 2);
    CHECK(st.predicted_useful + st.predicted_late + st.predicted_wasted == st.predicted_issued);
    hit_share.push_back(st.predicted_useful + st.predicted_late);
    if (degrade == 0.0) CHECK(st.predicted_useful > 0);
  }
  // Every predicted slot replaced by a wrong expert: far fewer reads hit the routing.
  CHECK(hit_share[0] > 2 * hit_share[1]);
}

TEST_CASE("mmap residency: refusals name the figures") {
  mapped_model m("res_refuse", small_moe_spec());
  mrl::observer& obs = m.obs;

  {
    fake_advice fake;
    mrl::residency_options o = mrl::residency_options::none();
    o.fits = mrl::when_fits::act;  // the tiny model fits: act anyway
    o.cache = true;
    o.cache_budget_bytes = 64ull << 20;
    mrl::mmap_residency<> res(obs, m.path, o, &fake);
    CHECK_THROWS_WITH_AS(res.activate(), doctest::Contains("evaluate one batch first"), error);
  }
  m.run(4, 1);
  {
    fake_advice fake;
    fake.limit = 1 << 20;  // 1 MiB of RLIMIT_MEMLOCK
    mrl::residency_options o = mrl::residency_options::none();
    o.fits = mrl::when_fits::act;  // the tiny model fits: act anyway
    o.cache = true;
    o.cache_budget_bytes = 64ull << 20;
    mrl::mmap_residency<> res(obs, m.path, o, &fake);
    // One check, after the budget is known: the dense weights and the whole budget.
    CHECK_THROWS_WITH_AS(res.activate(),
                         doctest::Contains("+ the cache's budget 64.0 MiB) but RLIMIT_MEMLOCK is 1.0 MiB"), error);
  }
  {
    mrl::residency_options o = mrl::residency_options::none();
    o.fits = mrl::when_fits::act;  // the tiny model fits: act anyway
    o.horizon = 3;
    CHECK_THROWS_WITH_AS(mrl::mmap_residency<>(obs, m.path, o), doctest::Contains("horizon 3; expected 1 or 2"), error);
  }
  {
    // A model that is not memory-mapped: nothing to manage, said in words.
    llama_model_params mp = llama_model_default_params();
    mp.load_mode = LLAMA_LOAD_MODE_NONE;
    mre::model_ptr copy(llama_model_load_from_file(m.path.c_str(), mp));
    REQUIRE(copy != nullptr);
    mrl::observer obs2(copy.get());
    auto cp2 = test_context_params();
    obs2.install(cp2);
    auto ctx2 = make_context(copy.get(), cp2);
    run_tokens(ctx2.get(), copy.get(), 4, 1);
    fake_advice fake;
    mrl::residency_options o = mrl::residency_options::none();
    o.fits = mrl::when_fits::act;  // the tiny model fits: act anyway
    o.exact = true;
    mrl::mmap_residency<> res(obs2, m.path, o, &fake);
    // Every expert tensor is a copy (LLAMA_LOAD_MODE_NONE): none is in the mapping.
    CHECK_THROWS_WITH_AS(
        res.activate(), doctest::Contains("no expert tensor is in the model's file mapping: 12 expert tensors"), error);
    CHECK_THROWS_WITH_AS(res.activate(), doctest::Contains("of layers 0-3 copied out of the file (CPU)"), error);
    CHECK(fake.calls().empty());
  }
  {
    // A refusal found while sizing (here: no readable router is not it; the
    // lock limit is) leaves the mapping as llama.cpp left it: no advice at all.
    fake_advice fake;
    fake.limit = 1 << 20;
    mrl::residency_options o = mrl::residency_options::none();
    o.fits = mrl::when_fits::act;  // the tiny model fits: act anyway
    o.pin_dense = o.exact = o.cache = true;
    o.cache_budget_bytes = 64ull << 20;
    mrl::mmap_residency<> res(obs, m.path, o, &fake);
    CHECK_THROWS_AS(res.activate(), error);
    CHECK(fake.calls().empty());
    CHECK(!res.active());
  }
  // The auto budget reads a limit from the cgroup or /proc/meminfo.
  const mrl::memory_limit lim = mrl::detail::process_memory_limit();
  CHECK(lim.bytes > 0);
  CHECK(!lim.source.empty());
}

namespace {
// The names of the buffer types of layer l's expert tensors that are not
// "CPU_Mapped" (the file's mapping as a CPU buffer): what llama.cpp copied.
std::size_t copied_tensors(const mrl::observer& obs, std::size_t l, std::string& buft) {
  std::size_t n = 0;
  for (const auto& t : obs.layers()[l].experts) {
    const std::string name = ggml_backend_buft_name(ggml_backend_buffer_get_type(t.tensor->buffer));
    if (name != "CPU_Mapped") {
      ++n;
      buft = name;
    }
  }
  return n;
}
}  // namespace

TEST_CASE("mmap residency: experts repacked by the CPU backend are left to llama.cpp, the rest managed") {
  // Layers 0-1 f16 (llama.cpp's CPU backend does not repack f16), layers 2-3
  // q4_K (repacked into an interleaved copy on AVX2 x86 and on ARM with the
  // dot-product extensions), loaded with llama.cpp's default extra buffer
  // types; the attention and output weights q4_K too (repacked: their matmuls),
  // the token embedding q4_K (not: a row lookup).
  llama_init_once();
  mre::random_model_spec spec = small_moe_spec();
  spec.layer_expert_types = {GGML_TYPE_F16, GGML_TYPE_F16, GGML_TYPE_Q4_K, GGML_TYPE_Q4_K};
  spec.dense_type = GGML_TYPE_Q4_K;
  temp_file file("res_repack");
  mre::save_random_gguf(spec, file.path);
  observed_model om(load_mmap(file.path, true));
  std::vector<float> plain;
  {
    auto ctx = make_context(om.model.get(), test_context_params());
    plain = run_tokens(ctx.get(), om.model.get(), 6, 12).logits;
  }
  om.warm_up();
  mrl::observer& obs = om.obs;
  REQUIRE(obs.structure_known());
  std::string buft;
  CHECK(copied_tensors(obs, 0, buft) == 0);
  CHECK(copied_tensors(obs, 1, buft) == 0);
  const std::size_t repacked = copied_tensors(obs, 2, buft) + copied_tensors(obs, 3, buft);
#if defined(__x86_64__)
  // This machine kind (and CI) has AVX2: llama.cpp repacks q4_K there.
  REQUIRE_MESSAGE(repacked == 6, "llama.cpp did not repack the q4_K experts on this CPU");
#endif
  if (repacked == 0) MESSAGE("this CPU has no repacked q4_K: every expert stays in the mapping");
  // The dense weights the graph read, those llama.cpp copied and those in
  // the mapping, and all of the file's dense bytes (every tensor but the
  // expert weights: their scales too, which this graph never reads).
  std::size_t dense_copied = 0;
  std::uint64_t dense_copied_bytes = 0, dense_mapped_bytes = 0, dense_file_bytes = 0;
  for (const ggml_tensor* w : obs.weights()) {
    if (mre::detail::is_expert_weight(w->name)) continue;
    if (std::string(ggml_backend_buft_name(ggml_backend_buffer_get_type(w->buffer))) != "CPU_Mapped") {
      ++dense_copied;
      dense_copied_bytes += ggml_nbytes(w);
    } else {
      dense_mapped_bytes += ggml_nbytes(w);
    }
  }
  {
    gguf_init_params gp{};
    gp.no_alloc = true;
    gguf_context* g = gguf_init_from_file(file.path.c_str(), gp);
    REQUIRE(g != nullptr);
    for (std::int64_t i = 0; i < gguf_get_n_tensors(g); ++i)
      if (!mre::detail::is_expert_weight(gguf_get_tensor_name(g, i))) dense_file_bytes += gguf_get_tensor_size(g, i);
    gguf_free(g);
  }
#if defined(__x86_64__)
  REQUIRE_MESSAGE(dense_copied == 4 * 4 + 1, "llama.cpp did not repack the q4_K attention and output weights");
#endif

  mrl::residency_options o = mrl::residency_options::none();
  o.fits = mrl::when_fits::act;  // the tiny model fits: act anyway
  o.pin_dense = o.exact = o.predicted = o.cache = true;
  o.cache_budget_bytes = 8ull << 20;
  {
    // The fake: every call the manager makes is on layers 0-1's experts or
    // the dense weights, never on the repacked copies.
    fake_advice fake;
    mrl::mmap_residency<> res(obs, file.path, o, &fake);
    res.activate();
    CHECK(res.active());
    const model_shape& ms = res.managed_shape();
    for (std::size_t l = 0; l < 4; ++l) {
      CAPTURE(l);
      const auto id = layer_id(static_cast<std::uint16_t>(l));
      const bool managed = l < 2 || repacked == 0;
      CHECK(ms.is_moe(id) == managed);
      CHECK(ms.expert_bytes(id) == (managed ? obs.layers()[l].expert_bytes : 0));
    }
    if (repacked == 6) {
      char mib[32];
      std::snprintf(mib, sizeof mib, "%.1f MiB",
                    static_cast<double>(obs.layers()[2].expert_bytes + obs.layers()[3].expert_bytes) *
                        static_cast<double>(spec.n_expert) / (1024.0 * 1024.0));
      char dense_mib[32];
      std::snprintf(dense_mib, sizeof dense_mib, "%.1f MiB",
                    static_cast<double>(dense_copied_bytes) / (1024.0 * 1024.0));
      CHECK(res.unmanaged_note() == "6 expert tensors (" + std::string(mib) +
                                        ") of layers 2-3 repacked by the CPU backend (" + buft + "); " +
                                        std::to_string(dense_copied) + " dense tensors (" + dense_mib +
                                        ") repacked by the CPU backend (" + buft + ")");
    }
    // The dense weights locked are those the graph reads in the mapping: not
    // the copies, not the tensors it never reads.
    CHECK(res.stats().dense_bytes == dense_mapped_bytes);
    CHECK(dense_mapped_bytes + dense_copied_bytes < dense_file_bytes);
    obs.set_sink(&res);
    om.run(6, 12);
    obs.set_sink(nullptr);
    res.settle();
    std::size_t calls_on_layer[5] = {0, 0, 0, 0, 0};  // layers 0-3, then anything else (dense)
    std::size_t on_copies = 0;                        // calls on a dense weight's copy
    for (const auto& c : fake.calls()) {
      const int l = layer_of(obs, c.addr);
      ++calls_on_layer[l < 0 ? 4 : l];
      for (const ggml_tensor* w : obs.weights()) {
        const auto a = reinterpret_cast<std::uintptr_t>(w->data);
        if (std::string(ggml_backend_buft_name(ggml_backend_buffer_get_type(w->buffer))) != "CPU_Mapped" &&
            c.addr < a + ggml_nbytes(w) && a < c.addr + c.len)
          ++on_copies;
      }
    }
    CHECK(on_copies == 0);
    CHECK(calls_on_layer[4] > 0);  // the dense weights in the mapping were locked
    CHECK(calls_on_layer[0] > 0);
    CHECK(calls_on_layer[1] > 0);
    if (repacked == 6) {
      CHECK(calls_on_layer[2] == 0);
      CHECK(calls_on_layer[3] == 0);
      CHECK(res.summary().find("left to llama.cpp: 6 expert tensors") != std::string::npos);
    }
    CHECK(res.stats().exact_reads > 0);
    CHECK(res.stats().cache_misses + res.stats().cache_hits > 0);
  }
  {
    // The kernel's advice: the same logits as stock with the same load.
    mrl::mmap_residency<> res(obs, file.path, o);
    om.restart();
    obs.set_sink(&res);
    const auto got = om.run(6, 12).logits;
    obs.set_sink(nullptr);
    res.settle();
    CHECK(res.active());
    CHECK(res.stats().advice_errors() == 0);
    REQUIRE(got.size() == plain.size());
    CHECK(std::memcmp(got.data(), plain.data(), got.size() * sizeof(float)) == 0);
    MESSAGE(res.summary());
  }
}

TEST_CASE("mmap residency: every expert repacked: nothing to manage, said with where they are") {
  llama_init_once();
  mre::random_model_spec spec = small_moe_spec();
  spec.expert_type = GGML_TYPE_Q4_K;
  temp_file file("res_repack_all");
  mre::save_random_gguf(spec, file.path);
  observed_model om(load_mmap(file.path, true));
  om.warm_up();
  const mrl::observer& obs = om.obs;
  REQUIRE(obs.structure_known());
  std::string buft;
  std::size_t repacked = 0;
  for (std::size_t l = 0; l < 4; ++l) repacked += copied_tensors(obs, l, buft);
  if (repacked == 0) {
    MESSAGE("this CPU has no repacked q4_K: nothing to check");
    return;
  }
  REQUIRE(repacked == 12);
  fake_advice fake;
  mrl::residency_options o = mrl::residency_options::none();
  o.fits = mrl::when_fits::act;
  o.pin_dense = o.exact = o.cache = true;
  o.cache_budget_bytes = 8ull << 20;
  mrl::mmap_residency<> res(obs, file.path, o, &fake);
  CHECK_THROWS_WITH_AS(res.activate(),
                       doctest::Contains("no expert tensor is in the model's file mapping: 12 expert tensors"), error);
  CHECK_THROWS_WITH_AS(res.activate(),
                       doctest::Contains(("of layers 0-3 repacked by the CPU backend (" + buft + ")").c_str()), error);
  CHECK(fake.calls().empty());
  CHECK(!res.active());
}

TEST_CASE(
    "mmap residency: a file's mappings are read from the process's map list by device and inode, or by name, split "
    "ones joined") {
  temp_file file("res_regions");
  { std::ofstream(file.path) << std::string(8192, 'x'); }
  const int fd = ::open(file.path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  void* p = ::mmap(nullptr, 8192, PROT_READ, MAP_PRIVATE, fd, 0);
  REQUIRE(p != MAP_FAILED);
  void* q = ::mmap(nullptr, 4096, PROT_READ, MAP_PRIVATE, fd, 4096);  // its second page, again
  REQUIRE(q != MAP_FAILED);
  std::vector<mrl::detail::file_region> r;
  REQUIRE(mrl::detail::file_regions(file.path, r));
  std::set<std::tuple<std::uintptr_t, std::uintptr_t, std::uint64_t>> got;
  for (const auto& x : r) got.insert({x.begin, x.end, x.offset});
  const auto a = reinterpret_cast<std::uintptr_t>(p), b = reinterpret_cast<std::uintptr_t>(q);
  CHECK(got ==
        std::set<std::tuple<std::uintptr_t, std::uintptr_t, std::uint64_t>>{{a, a + 8192, 0}, {b, b + 4096, 4096}});
  ::munmap(p, 8192);
  ::munmap(q, 4096);
  ::close(fd);
  // A list that names the file (an overlay filesystem reports another device
  // there) but gives another inode: matched by its real path.
  char* real = ::realpath(file.path.c_str(), nullptr);
  REQUIRE(real != nullptr);
  temp_file maps("res_regions_maps");
  {
    std::ofstream f(maps.path);
    // One mapping split in two (joined), a neighbour that does not continue
    // it (its offset jumps), another file, an anonymous mapping.
    f << "7f0000000000-7f0000003000 r--p 00002000 00:2a 99999999 " << real << "\n"
      << "7f0000003000-7f0000004000 r--s 00005000 00:2a 99999999 " << real << "\n"
      << "7f0000004000-7f0000005000 r--p 00009000 00:2a 99999999 " << real << "\n"
      << "7f0000005000-7f0000006000 r--p 00000000 00:2a 99999998 /somewhere/else.gguf\n"
      << "7f0000006000-7f0000007000 rw-p 00000000 00:00 0 \n";
  }
  std::free(real);
  REQUIRE(mrl::detail::file_regions(file.path, r, maps.path));
  REQUIRE(r.size() == 2);
  CHECK(r[0].begin == 0x7f0000000000u);
  CHECK(r[0].end == 0x7f0000004000u);
  CHECK(r[0].offset == 0x2000u);
  CHECK(r[1].begin == 0x7f0000004000u);
  CHECK(r[1].end == 0x7f0000005000u);
  CHECK(r[1].offset == 0x9000u);
  CHECK(!mrl::detail::file_regions(file.path, r, maps.path + ".missing"));  // no list: the caller decides
  CHECK(r.empty());
}

TEST_CASE("mmap residency: the memory limit is the tightest over the cgroup and its ancestors") {
  const std::string root = "moe_residency_fakeroot_" + std::to_string(::getpid());
  auto write = [&](const std::string& rel, const std::string& text) {
    const std::string path = root + rel;
    for (std::size_t i = 1; i < path.size(); ++i)
      if (path[i] == '/') ::mkdir(path.substr(0, i).c_str(), 0755);
    std::ofstream(path) << text;
  };
  write("/proc/meminfo", "MemTotal: 24000000 kB\nMemAvailable: 20000000 kB\n");
  SUBCASE("v2: a scope under a limited slice") {
    write("/proc/self/cgroup", "0::/lab.slice/run.scope\n");
    write("/sys/fs/cgroup/lab.slice/run.scope/memory.max", "max\n");
    write("/sys/fs/cgroup/lab.slice/memory.max", "4294967296\n");
    write("/sys/fs/cgroup/memory.max", "max\n");
    const auto lim = mrl::detail::process_memory_limit(root);
    CHECK(lim.bytes == 4294967296ull);
    CHECK(lim.source.find("lab.slice/memory.max") != std::string::npos);
  }
  SUBCASE("v1: the hierarchical limit wins over the group's own") {
    write("/proc/self/cgroup", "5:memory:/moe-residency-x\n4:cpu,cpuacct:/\n");
    write("/sys/fs/cgroup/memory/moe-residency-x/memory.limit_in_bytes", "9223372036854771712\n");
    write("/sys/fs/cgroup/memory/moe-residency-x/memory.stat", "cache 0\nhierarchical_memory_limit 2147483648\n");
    const auto lim = mrl::detail::process_memory_limit(root);
    CHECK(lim.bytes == 2147483648ull);
  }
  SUBCASE("no limit anywhere: MemAvailable") {
    write("/proc/self/cgroup", "0::/\n");
    write("/sys/fs/cgroup/memory.max", "max\n");
    const auto lim = mrl::detail::process_memory_limit(root);
    CHECK(lim.bytes == 20000000ull * 1024);
    CHECK(lim.source == "MemAvailable in /proc/meminfo");
  }
  std::system(("rm -rf " + root).c_str());
}

TEST_CASE("mmap residency: with the kernel's advice every part leaves the logits bit-identical") {
  llama_init_once();
  temp_model file("res_logits", small_moe_spec());
  auto model = load_mmap(file.path);
  auto cp = test_context_params();
  std::vector<float> plain;
  {
    auto ctx = make_context(model.get(), cp);
    plain = run_tokens(ctx.get(), model.get(), 6, 12).logits;
  }
  struct config {
    const char* name;
    bool dense, exact, predicted, cache;
    bool overlap = true, owned = false, pool = false;
  };
  // overlap (the default): the layers' matmuls run while their reads are in flight
  for (const config& c : {config{"dense", true, false, false, false}, config{"exact", false, true, false, false},
                          config{"predicted", false, false, true, false}, config{"cache", false, false, false, true},
                          config{"all", true, true, true, true}, config{"all serial", true, true, true, true, false},
                          config{"all owned reads", true, true, true, true, true, true},
                          config{"exact owned reads", false, true, false, false, true, true},
                          config{"all pool", true, true, true, true, true, false, true},
                          config{"cache pool", false, false, false, true, true, false, true}}) {
    CAPTURE(c.name);
    mrl::observer obs(model.get());
    auto cp2 = test_context_params();
    obs.install(cp2);
    auto ctx = make_context(model.get(), cp2);
    mrl::residency_options o = mrl::residency_options::none();
    o.fits = mrl::when_fits::act;  // the tiny model fits: act anyway
    o.pin_dense = c.dense;
    o.exact = c.exact;
    o.predicted = c.predicted;
    o.cache = c.cache;
    o.overlap = c.overlap;
    o.owned_reads = c.owned;
    o.pool = c.pool;
    o.cache_budget_bytes = 8ull << 20;
    o.measure = true;
    mrl::mmap_residency<> res(obs, file.path, o);
    obs.set_sink(&res);
    const auto got = run_tokens(ctx.get(), model.get(), 6, 12).logits;
    res.settle();
    CHECK(res.active());
    CHECK(res.owned_reads() == (c.owned && (c.exact || c.predicted)));  // the kernel's advice has owned reads on Linux
    CHECK(res.status() == "");
    CHECK(res.stats().advice_errors() == 0);  // the kernel took every call (root here; CI too)
    CHECK(res.stats().lock_failed == 0);
    if (c.pool) {  // the cache's experts were placed in the pool for real
      CHECK(res.stats().pool_bytes > 0);
      CHECK(res.stats().calls[static_cast<std::size_t>(mrl::advice::place)] > 0);
      CHECK(res.stats().pool_fallbacks == 0);
    }
    REQUIRE(got.size() == plain.size());
    CHECK(std::memcmp(got.data(), plain.data(), got.size() * sizeof(float)) == 0);
    MESSAGE(res.summary());
  }
}

TEST_CASE("mmap residency: every live cache policy, named at run time, keeps the budget and the logits") {
  // make_residency_manager: the policy by name, the kernel's advice, all
  // parts on, a budget of 1.5 token cycles (evictions every token): logits
  // bit-identical to plain mmap, the pinned bytes within the budget, every
  // decode routing counted once, the policy named in the summary.
  llama_init_once();
  temp_model file("res_policies", small_moe_spec());
  auto model = load_mmap(file.path);
  std::vector<float> plain;
  {
    auto ctx = make_context(model.get(), test_context_params());
    plain = run_tokens(ctx.get(), model.get(), 6, 12).logits;
  }
  std::set<std::uint64_t> hits_seen;
  for (const std::string& policy : mrl::live_cache_policies()) {
    CAPTURE(policy);
    mrl::observer obs(model.get());
    auto cp = test_context_params();
    obs.install(cp);
    auto ctx = make_context(model.get(), cp);
    {  // one token: the structure, for the expert bytes
      llama_token t0 = 1;
      REQUIRE(llama_decode(ctx.get(), llama_batch_get_one(&t0, 1)) == 0);
      llama_memory_clear(llama_get_memory(ctx.get()), true);
      obs.set_position(0);
    }
    mrl::residency_options o = mrl::residency_options::none();
    o.fits = mrl::when_fits::act;  // the tiny model fits: act anyway
    o.pin_dense = o.exact = o.predicted = o.cache = true;
    o.cache_budget_bytes = 24 * obs.layers()[0].expert_bytes;
    o.measure = true;
    const std::unique_ptr<mrl::residency_manager> res = mrl::make_residency_manager(policy, obs, file.path, o);
    obs.set_sink(res.get());
    const auto got = run_tokens(ctx.get(), model.get(), 6, 12).logits;
    res->settle();
    obs.set_sink(nullptr);
    CHECK(std::string(res->policy_name()) == policy);
    CHECK(res->active());
    CHECK(res->status() == "");
    const mrl::residency_stats st = res->stats();
    CHECK(st.advice_errors() == 0);
    CHECK(st.lock_failed == 0);
    CHECK(st.evictions > 0);
    CHECK(st.pinned_peak_bytes <= res->budget_bytes());
    CHECK(st.cache_hits + st.cache_misses == 12 * 4 * 4);  // decode: 12 tokens x 4 layers x k = 4
    CHECK(res->summary().find("cache " + policy + " ") != std::string::npos);
    hits_seen.insert(st.cache_hits);
    REQUIRE(got.size() == plain.size());
    CHECK(std::memcmp(got.data(), plain.data(), got.size() * sizeof(float)) == 0);
  }
  CHECK(hits_seen.size() > 1);  // the policies did decide differently
}

namespace {

/// Behind a manager: records the routing (a route_recorder over the managed
/// shape, made at the first layer after activation), the manager's counters
/// and its prediction after each decode routing, and its settled totals at
/// each graph's start.
class ledger_sink : public mrl::observer_sink {
 public:
  ledger_sink(const mrl::residency_manager& res, std::size_t n_layers) : res_(res), n_layers_(n_layers) {}
  struct routed {
    layer_id layer{};
    mrl::residency_stats after;  // the manager's counters once it managed this routing
  };
  std::vector<routed> decode_routings;
  std::vector<mrl::residency_stats> graphs;                                // settled, at the start of each graph
  std::map<std::pair<std::uint32_t, std::uint16_t>, ranking> predictions;  // (decode token, target layer)
  std::unique_ptr<mrl::route_recorder<lru_policy>> recorder;

  bool wants(moe_residency::engine_event) const noexcept override { return true; }
  void on_begin_batch(const moe_residency::batch_info&) override { graphs.push_back(res_.stats()); }
  void on_layer_loaded(const mrl::layer_batch& b) override {
    if (!recorder && res_.active())
      recorder = std::make_unique<mrl::route_recorder<lru_policy>>(res_.managed_shape(), 0);
    if (recorder) recorder->on_layer_loaded(b);
  }
  void on_routed(const mrl::layer_batch& b) override {
    if (b.phase != run_phase::decode) return;
    const auto token = static_cast<std::uint32_t>(decode_routings.size() / n_layers_);
    layer_id target{};
    ranking r;
    if (res_.last_prediction(target, r)) predictions[{token, static_cast<std::uint16_t>(to_index(target))}] = r;
    decode_routings.push_back({b.layer, res_.stats()});
  }

 private:
  const mrl::residency_manager& res_;
  std::size_t n_layers_;
};

}  // namespace

TEST_CASE("mmap residency: the replay of its recorded routing makes the live cache's decisions, token by token") {
  // One runtime path: the live manager (on the fake advice) runs the same
  // speculation<> as replay_dynamic. The routing it saw is recorded behind it
  // (prompt included) and replayed with prefill_cached = false (the manager
  // looks up decode only), at the same budget and policy and, with predicted
  // reads, from the rankings the manager predicted (its lanes drained before
  // each routing, so every read it issued has completed, as the replay's
  // synchronous ones have). The same hits and misses at every decode layer;
  // per token the same evictions, admissions (a lock of each expert tensor's
  // slice, or a placement, per miss and per speculative read made resident),
  // pinned bytes and reads (a lane read per miss with exact, the same
  // speculative reads issued).
  mapped_model m("res_replay_equiv", small_moe_spec());
  m.warm_up();
  const std::uint64_t expert = m.obs.layers()[0].expert_bytes;
  const std::size_t tensors = m.obs.layers()[0].experts.size();
  const std::size_t n_decode = 16, n_layers = 4;
  struct mode {
    const char* name;
    bool exact, pool, predicted;
  };
  const mode modes[] = {{"cache", false, false, false},
                        {"exact+cache", true, false, false},
                        {"exact+cache pool", true, true, false},
                        {"cache predicted", false, false, true},
                        {"exact+cache predicted", true, false, true},
                        {"exact+cache pool predicted", true, true, true}};
  std::set<std::uint64_t> hits_seen;
  std::size_t inserted_seen = 0;
  for (const std::string& policy : mrl::live_cache_policies())
    for (const std::size_t budget_experts : {18u, 28u})  // the token cycle is 16 experts
      for (const mode& md : modes) {
        CAPTURE(policy);
        CAPTURE(budget_experts);
        const std::string mode_name = md.name;
        CAPTURE(mode_name);
        fake_advice fake;
        fake.pool = md.pool;
        mrl::residency_options o = mrl::residency_options::none();
        o.fits = mrl::when_fits::act;
        o.cache = true;
        o.exact = md.exact;
        o.pool = md.pool;
        o.predicted = md.predicted;
        o.cache_budget_bytes = budget_experts * expert;
        const std::unique_ptr<mrl::residency_manager> res =
            mrl::make_residency_manager(policy, m.obs, m.path, o, &fake);
        ledger_sink ledger(*res, n_layers);
        res->set_next(&ledger);
        draining_sink front(*res);
        m.obs.set_sink(&front);
        m.restart();
        m.run(6, n_decode);
        m.obs.set_sink(nullptr);
        res->settle();
        ledger.graphs.push_back(res->stats());
        REQUIRE(res->active());
        REQUIRE(ledger.recorder != nullptr);
        REQUIRE(res->managed_shape().expert_bytes(layer_id(0)) == expert);
        REQUIRE(ledger.graphs.size() == 1 + n_decode + 1);  // the prompt's graph, each token's, the end
        REQUIRE(ledger.decode_routings.size() == n_decode * n_layers);
        CHECK(res->stats().lock_failed == 0);
        if (md.predicted) CHECK(ledger.predictions.size() == n_decode * (n_layers - 1));

        CHECK_NOTHROW((void)validate_route_trace(ledger.recorder->trace()));
        const auto in = routed_replay_input::from_trace(ledger.recorder->trace());
        dynamic_replay_options ro;
        ro.policy = policy;
        ro.budget_mib = to_mib(budget_experts * expert);
        ro.prefill_cached = false;
        if (md.predicted) {
          ro.speculation.source = speculation_source::given;
          ro.speculation.cap = o.spec_cap;
          ro.speculation.horizon = o.horizon;
          ro.speculation.given = [&ledger](std::uint32_t token, layer_id target, ranking& out) {
            const auto it = ledger.predictions.find({token, static_cast<std::uint16_t>(to_index(target))});
            if (it == ledger.predictions.end()) return false;
            out = it->second;
            return true;
          };
        }
        const dynamic_replay_result rp = replay_dynamic(in, ro);
        REQUIRE(rp.decode_loads.size() == n_decode * n_layers);

        // Every decode layer: the same hits and misses.
        std::size_t layers_same = 0;
        std::uint64_t hits = ledger.graphs[1].cache_hits, misses = ledger.graphs[1].cache_misses;
        for (std::size_t i = 0; i < rp.decode_loads.size(); ++i) {
          const load_event& e = rp.decode_loads[i];
          const auto& live = ledger.decode_routings[i];
          layers_same += e.layer == live.layer && e.token == i / n_layers && live.after.cache_hits - hits == e.hits &&
                         live.after.cache_misses - misses == e.misses;
          hits = live.after.cache_hits;
          misses = live.after.cache_misses;
        }
        CHECK(layers_same == rp.decode_loads.size());

        // Every token: evictions, admissions, pinned bytes, reads.
        std::size_t tokens_same = 0;
        std::uint64_t resident = 0;
        for (std::size_t t = 0; t < n_decode; ++t) {
          std::uint64_t r_misses = 0, r_evictions = 0, r_inserted = 0, r_issued = 0;
          for (std::size_t l = 0; l < n_layers; ++l) {
            const load_event& e = rp.decode_loads[t * n_layers + l];
            r_misses += e.misses;
            r_evictions += e.evictions;
            r_inserted += e.speculative_inserted;
            r_issued += e.speculative_issued;
          }
          inserted_seen += r_inserted;
          resident += r_misses + r_inserted - r_evictions;
          const mrl::residency_stats &a = ledger.graphs[t + 1], &b = ledger.graphs[t + 2];
          const auto kind = [&](mrl::advice k) {
            return b.calls[static_cast<std::size_t>(k)] - a.calls[static_cast<std::size_t>(k)];
          };
          bool same = b.evictions - a.evictions == r_evictions && b.cache_misses - a.cache_misses == r_misses &&
                      b.pinned_bytes == resident * expert && b.predicted_issued - a.predicted_issued == r_issued;
          // The pool places each admission (and locks only shared pages); the page cache locks every slice.
          if (!md.pool) same = same && kind(mrl::advice::lock) == (r_misses + r_inserted) * tensors;
          if (md.exact) same = same && b.exact_reads - a.exact_reads == r_misses;
          tokens_same += same;
        }
        CHECK(tokens_same == n_decode);
        CHECK(res->stats().cache_hits == rp.cache.decode.hits);
        CHECK(res->stats().evictions == rp.cache.all.evictions);
        CHECK(res->stats().evictions > 0);
        hits_seen.insert(rp.cache.decode.hits);
      }
  CHECK(hits_seen.size() > 2);  // the policies and budgets did decide differently
  CHECK(inserted_seen > 0);     // and predicted reads were made resident
}

TEST_CASE("mmap residency: a cache policy the live manager does not take is refused, saying why") {
  llama_init_once();
  temp_model file("res_policy_refused", small_moe_spec());
  auto model = load_mmap(file.path);
  mrl::observer obs(model.get());
  const struct {
    const char* name;
    const char* why;
  } cases[] = {{"layerlfu", "a layer partition keeps top-k experts"},
               {"layer_lfu", "a layer partition keeps top-k experts"},
               {"belady", "offline"},
               {"random", "a replay baseline"},
               {"mru", "unknown"}};
  for (const auto& c : cases) {
    CAPTURE(c.name);
    try {
      (void)mrl::make_residency_manager(c.name, obs, file.path, mrl::residency_options::none());
      FAIL("expected a refusal");
    } catch (const error& e) {
      const std::string m = e.what();
      CHECK(m.find("cache policy '" + std::string(c.name) + "': " + c.why) != std::string::npos);
      CHECK(m.find("expected one of " + mrl::live_cache_policy_names()) != std::string::npos);
    }
  }
  CHECK(mrl::live_cache_policy("adaptive") == "adaptive");
}

TEST_CASE("docs/llama-cpp-residency.md: the block is this test's code, and it runs") {
  // The page's block is the code between the markers below (read from this
  // file, so it is written once), after the include and namespace lines the
  // suite has already.
  const std::string root = MOE_RESIDENCY_SOURCE_DIR;
  const std::string page = read_file(root + "/docs/llama-cpp-residency.md");
  const std::string self = read_file(root + "/tests/llama_cpp/test_llama_cpp_residency.cpp");
  REQUIRE(!page.empty());
  REQUIRE(!self.empty());
  const std::vector<std::string> in_docs = block_lines(page, "```cpp", "```");
  const std::vector<std::string> in_test =
      block_lines(self, "// docs/llama-cpp-residency.md, block 1, verbatim but for", "// end of the block");
  REQUIRE(in_docs.size() > 5);
  CHECK(in_docs[0] == "#include \"moe_residency/adapters/llama_cpp/residency.hpp\"");
  CHECK(in_docs[1] == "namespace mrl = moe_residency::llama_cpp;");
  CHECK(in_docs[2] == "");
  const std::vector<std::string> code(in_docs.begin() + 3, in_docs.end());
  CHECK(code.size() == in_test.size());
  for (std::size_t i = 0; i < std::max(code.size(), in_test.size()); ++i) {
    CAPTURE(i);
    CHECK((i < code.size() ? code[i] : "<missing>") == (i < in_test.size() ? in_test[i] : "<missing>"));
  }

  llama_init_once();
  temp_model file("res_doc", small_moe_spec());
  const char* path = file.path.c_str();
  llama_model* keep_model = nullptr;
  llama_context* keep_ctx = nullptr;
  {
    // docs/llama-cpp-residency.md, block 1, verbatim but for the include
    llama_model_params mp = llama_model_default_params();
    mp.load_mode = LLAMA_LOAD_MODE_MMAP;  // the experts stay in the file mapping
    mp.use_extra_bufts = false;           // no repacked (copied) quantised experts
    llama_model* model = llama_model_load_from_file(path, mp);
    mrl::observer obs(model);
    llama_context_params cp = llama_context_default_params();
    obs.install(cp);
    llama_context* ctx = llama_init_from_model(model, cp);
    mrl::mmap_residency<> res(obs, path);  // dense, exact, cache; the budget sized from the memory limit
    mrl::start(ctx, obs, res, path);       // a warm-up token teaches the structure; then it acts
    // end of the block
    run_tokens(ctx, model, 4, 8);
    // This small model fits this machine's memory: the manager stands down,
    // advises nothing and stops asking the graph for routing.
    CHECK(res.active());
    CHECK(res.status() == "");
    CHECK(res.standing_down());
    CHECK(res.fit_note().find(" fit the limit ") != std::string::npos);
    CHECK(res.stats().routed_layers == 0);
    CHECK(res.stats().dense_bytes == 0);
    CHECK(obs.stats().routing_events == 0);  // activated by start(): not one routing asked of the graph
    MESSAGE(res.summary());
    obs.set_sink(nullptr);
    keep_model = model;
    keep_ctx = ctx;
  }  // res, then obs, end here: before the context and the model
  llama_free(keep_ctx);
  llama_model_free(keep_model);
}
