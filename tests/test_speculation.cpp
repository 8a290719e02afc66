// Speculation glue: completed speculative reads applied to a real expert_cache
// on the host thread, useful / wasted accounting, the un-drop, failed reads
// never touching residency, and — on the synthetic workload through a session
// — the byte-identity contract (dropping off: the experts demanded and the
// routings executed are identical with and without speculation).
#include "moe_residency/speculation.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "moe_residency/cache/lru.hpp"
#include "moe_residency/session.hpp"
#include "moe_residency/synthetic.hpp"

using namespace moe_residency;

namespace {

using lru_cache = expert_cache<lru_policy>;
using spec_t = speculation<lru_cache>;

layer_id L(unsigned l) { return layer_id(static_cast<std::uint16_t>(l)); }
expert_id E(unsigned e) { return expert_id(static_cast<std::uint16_t>(e)); }

routing make_routing(unsigned layer, std::vector<std::pair<unsigned, float>> slots,
                     std::uint32_t token = 0) {
  routing r;
  r.layer = L(layer);
  r.phase = run_phase::decode;
  r.token = token;
  for (auto& s : slots) r.push_back(E(s.first), s.second);
  return r;
}

ranking make_ranking(std::vector<std::pair<unsigned, float>> entries) {
  ranking r;
  float score = 10.0f;
  for (auto& e : entries) r.push_back(E(e.first), score--, e.second);
  return r;
}

// A read callback recording calls; expert ids listed in `fail` fail.
struct recorder {
  std::mutex mu;
  std::vector<std::tuple<unsigned, unsigned, read_reason>> calls;
  std::set<unsigned> fail;
  read_callback callback() {
    return [this](layer_id l, expert_id e, read_reason why) {
      std::lock_guard<std::mutex> lock(mu);
      calls.emplace_back(static_cast<unsigned>(to_index(l)), static_cast<unsigned>(to_index(e)),
                         why);
      return fail.count(static_cast<unsigned>(to_index(e))) ? read_status::failed
                                                            : read_status::ok;
    };
  }
  std::size_t count(read_reason why) {
    std::lock_guard<std::mutex> lock(mu);
    std::size_t n = 0;
    for (auto& c : calls) n += std::get<2>(c) == why;
    return n;
  }
};

// 4 layers × 16 experts × 100 bytes, top-4; the budget holds 12 entries.
model_shape tiny() { return model_shape("tiny", 16, 4, {100, 100, 100, 100}); }
lru_cache tiny_cache(std::uint64_t entries = 12) {
  return lru_cache(tiny(), cache_options{entries * 100, cycle_guard::off, {}});
}
speculation_options sync_options() {
  speculation_options o;
  o.scheduler.lanes = 0;
  return o;
}

}  // namespace

TEST_CASE("speculation: a completed read lands in the cache and is counted useful when demanded") {
  recorder rec;
  spec_t s(tiny(), tiny_cache(), rec.callback(), sync_options());
  std::uint32_t masks[1] = {};
  const routing r0 = make_routing(0, {{1, 0.4f}, {2, 0.3f}, {3, 0.2f}, {4, 0.1f}});
  CHECK(s.begin_load({&r0, 1}, masks) == 4);  // cold: four demanded misses
  CHECK(rec.count(read_reason::demanded) == 4);

  // Layer 1 predicted 5, 6, 7, 8: the planner takes the top-2 misses.
  const ranking pred = make_ranking({{5, 0.4f}, {6, 0.3f}, {7, 0.2f}, {8, 0.1f}});
  CHECK(s.end_load(L(0), &pred) == 2);
  CHECK(rec.count(read_reason::speculative) == 2);  // synchronous: ran at end_load
  CHECK_FALSE(s.cache().is_resident(L(1), E(5)));  // not applied until the next load

  // Layer 1 actually routes 5, 9, 10, 11: 5 is a hit thanks to speculation.
  const routing r1 = make_routing(1, {{5, 0.4f}, {9, 0.3f}, {10, 0.2f}, {11, 0.1f}});
  CHECK(s.begin_load({&r1, 1}, masks) == 3);
  speculation_stats st = s.stats();
  CHECK(st.inserted == 2);
  CHECK(st.useful == 1);
  CHECK(st.useful_bytes == 100);
  CHECK(st.pending == 1);  // expert 6 of layer 1: resident, not demanded yet
  CHECK(s.cache().is_resident(L(1), E(6)));
  CHECK(s.cache().stats().all.hits == 1);
  // Loading layer 1 again: four hits, none of them thanks to speculation any more.
  CHECK(s.begin_load({&r1, 1}, masks) == 0);
  CHECK(s.cache().stats().all.hits == 5);
  CHECK(s.stats().useful == 1);

  // Fill the cache until expert 6 is evicted unused: wasted bytes.
  for (unsigned l = 2; l < 4; ++l) {
    const routing r = make_routing(l, {{1, 0.4f}, {2, 0.3f}, {3, 0.2f}, {4, 0.1f}});
    s.begin_load({&r, 1}, masks);
  }
  const routing r0b = make_routing(0, {{12, 0.4f}, {13, 0.3f}, {14, 0.2f}, {15, 0.1f}});
  s.begin_load({&r0b, 1}, masks);
  st = s.stats();
  CHECK(st.evicted_unused == 1);
  CHECK(st.evicted_unused_bytes == 100);
  CHECK(st.pending == 0);
  const scheduler_stats rs = s.read_stats();
  CHECK(rs.issued == 2);
  CHECK(rs.completed == 2);
  CHECK(rs.balanced());
  CHECK(s.prefetch_line().rfind("moe-prefetch: issued 2 / useful 1 (50.0% of completed) / "
                                "cancelled 0, ",
                                0) == 0);
}

TEST_CASE("speculation: a failed or throwing read never becomes residency") {
  recorder rec;
  rec.fail = {5};
  spec_t s(tiny(), tiny_cache(), rec.callback(), sync_options());
  std::uint32_t masks[1] = {};
  const routing r0 = make_routing(0, {{1, 0.4f}, {2, 0.3f}, {3, 0.2f}, {4, 0.1f}});
  s.begin_load({&r0, 1}, masks);
  const ranking pred = make_ranking({{5, 0.4f}, {6, 0.3f}});
  CHECK(s.end_load(L(0), &pred) == 2);
  const routing r1 = make_routing(1, {{5, 0.4f}, {6, 0.3f}, {7, 0.2f}, {8, 0.1f}});
  // 5 failed: still a miss, read again as demanded; 6 landed: a hit.
  CHECK(s.begin_load({&r1, 1}, masks) == 3);
  CHECK(s.stats().inserted == 1);
  CHECK(s.stats().useful == 1);
  CHECK(s.read_stats().failed == 1);
  CHECK(s.stats().demanded_failed == 1);  // the demanded re-read of 5 failed too (host's problem)
}

TEST_CASE("speculation: horizon 2 targets the MoE layer two ahead; a missing prediction is counted") {
  recorder rec;
  speculation_options o = sync_options();
  o.horizon = 2;
  spec_t s(tiny(), tiny_cache(), rec.callback(), o);
  std::uint32_t masks[1] = {};
  const ranking pred = make_ranking({{5, 0.4f}, {6, 0.3f}});
  const routing r0 = make_routing(0, {{1, 0.4f}, {2, 0.3f}, {3, 0.2f}, {4, 0.1f}});
  s.begin_load({&r0, 1}, masks);
  // Horizon 2 from layer 0 targets layer 2.
  CHECK(s.end_load(L(0), &pred) == 2);
  CHECK(s.cache().is_resident(L(0), E(1)));
  s.begin_load({&r0, 1}, masks);  // applies them
  CHECK(s.cache().is_resident(L(2), E(5)));
  CHECK(s.cache().is_resident(L(2), E(6)));
  // Horizon 2 from layer 2 has no target (4 layers): nothing issued.
  CHECK(s.end_load(L(2), &pred) == 0);
  // No prediction: counted.
  CHECK(s.end_load(L(0), nullptr) == 0);
  CHECK(s.stats().no_prediction == 1);
}

TEST_CASE("speculation: with dropping armed, a correct speculative read un-drops an expert") {
  // k = 4, F = 1: threshold 0.25. Layer 1 routes 9 at slot 3 with weight 0.05:
  // a miss below the threshold, so the drop policy skips it — unless the
  // planner read it: the top prediction is always kept, even at 0.05.
  const routing r0 = make_routing(0, {{1, 0.4f}, {2, 0.3f}, {3, 0.2f}, {4, 0.1f}});
  const routing r1 = make_routing(1, {{5, 0.5f}, {6, 0.3f}, {7, 0.15f}, {9, 0.05f}});
  const ranking pred = make_ranking({{9, 0.05f}, {5, 0.5f}});
  std::vector<std::string> warnings;
  auto run = [&](bool speculate) {
    recorder rec;
    speculation_options o = sync_options();
    o.enabled = speculate;
    o.drop = drop_options{};
    o.drop->on_warning = [&](const std::string& w) { warnings.push_back(w); };
    spec_t s(tiny(), tiny_cache(), rec.callback(), o);
    std::uint32_t masks[1] = {};
    s.begin_load({&r0, 1}, masks);
    s.end_load(L(0), &pred);
    s.begin_load({&r1, 1}, masks);
    return std::make_pair(masks[0], s.stats().undropped);
  };
  const auto off = run(false);
  const auto on = run(true);
  CHECK(off.first == 0b1100u);  // 7 (0.15) and 9 (0.05) dropped: misses below 0.25
  CHECK(on.first == 0b0100u);   // 9 is resident now: a hit, so nothing is saved by skipping it
  CHECK(off.second == 0);
  CHECK(on.second == 1);
  CHECK(warnings.size() == 2);  // k = 4: one warning per policy, through the sink
}

TEST_CASE("speculation: with dropping armed, the planner skips predictions the drop would discard") {
  recorder rec;
  speculation_options o = sync_options();
  o.drop = drop_options{};  // k = 4, F = 1: threshold 0.25
  spec_t s(tiny(), tiny_cache(), rec.callback(), o);
  std::uint32_t masks[1] = {};
  const routing r0 = make_routing(0, {{1, 0.4f}, {2, 0.3f}, {3, 0.2f}, {4, 0.1f}});
  s.begin_load({&r0, 1}, masks);
  const ranking pred = make_ranking({{5, 0.5f}, {9, 0.05f}, {6, 0.3f}});
  CHECK(s.end_load(L(0), &pred) == 2);
  CHECK(s.stats().skipped_below_threshold == 1);
  std::lock_guard<std::mutex> lock(rec.mu);
  std::set<unsigned> speculated;
  for (auto& c : rec.calls)
    if (std::get<2>(c) == read_reason::speculative) speculated.insert(std::get<1>(c));
  CHECK(speculated == std::set<unsigned>{5, 6});
}

TEST_CASE("speculation: rejects a bad configuration") {
  recorder rec;
  speculation_options o = sync_options();
  o.horizon = 3;
  CHECK_THROWS_WITH_AS(spec_t(tiny(), tiny_cache(), rec.callback(), o),
                       "speculation: horizon 3 out of range; expected 1 (next MoE layer) or 2",
                       error);
  o = sync_options();
  o.cap = 40;
  CHECK_THROWS_AS(spec_t(tiny(), tiny_cache(), rec.callback(), o), error);
  o = sync_options();
  o.drop = drop_options{};
  o.drop->fraction = 2.0;
  CHECK_THROWS_WITH_AS(spec_t(tiny(), tiny_cache(), rec.callback(), o),
                       doctest::Contains("drop_policy: fraction F = 2 out of range"), error);
}

// ---- the synthetic workload through a session ---------------------------------

namespace {

using spec_session = session<predictor_set<stale_gate_predictor>, spec_t>;

struct executed_slot {
  std::uint32_t token;
  unsigned layer, expert;
  float weight;
  bool operator==(const executed_slot& o) const {
    return token == o.token && layer == o.layer && expert == o.expert &&
           (weight == o.weight || (weight != weight && o.weight != o.weight));
  }
};

struct run_result {
  std::vector<executed_slot> executed;  // every expert every layer computed with, in order
  speculation_stats spec;
  scheduler_stats reads;
  cache_stats cache;
  std::size_t demanded_callbacks = 0;
  std::size_t not_resident_when_executed = 0;
  std::string notes;
};

run_result run_synthetic(bool speculate, bool drop, std::size_t lanes, std::size_t tokens,
                         double flash_scale = 0.0) {
  const synthetic_config c =
      synthetic_presets::small(synthetic_router::qwen3moe, element_type::f32, 8, 64, 128, 6);
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
  spec_session s(shape, session_options{}, std::tuple<stale_gate_predictor>{},
                 std::tuple<spec_t>{spec_t(shape, lru_cache(shape, {budget, cycle_guard::refuse, {}}),
                                           cb, o)});
  install_routers(s, model);
  synthetic_stream stream(model);
  run_result out;
  auto feed = [&](run_phase phase, std::size_t n) {
    stream.next(n);
    REQUIRE(s.begin_batch(phase, stream.first_token(), n));
    for (std::size_t l = 0; l < shape.n_layers(); ++l) {
      const layer_id lid = L(static_cast<unsigned>(l));
      if (!shape.is_moe(lid)) continue;
      REQUIRE(s.gate_input(lid, stream.gate_inputs(lid), model.n_embd(), n,
                           model.n_embd() * sizeof(float)));
      REQUIRE(s.routed(lid, span<const routing>(&stream.routed(lid, 0), n)));
      const spec_t& x = s.extension<0>();
      for (std::size_t t = 0; t < n; ++t) {
        const routing& r = stream.routed(lid, t);
        for (std::size_t i = 0; i < r.size(); ++i) {
          if ((s.drop_mask(t) >> i) & 1u) continue;
          out.executed.push_back({stream.first_token() + static_cast<std::uint32_t>(t),
                                  static_cast<unsigned>(l), static_cast<unsigned>(to_index(r.id(i))),
                                  r.weight(i)});
          if (!x.cache().is_resident(lid, r.id(i))) ++out.not_resident_when_executed;
        }
      }
      REQUIRE(s.layer_loaded(lid));
    }
    REQUIRE(s.end_batch());
  };
  feed(run_phase::prefill, 8);
  for (std::size_t t = 0; t < tokens; ++t) feed(run_phase::decode, 1);
  spec_t& x = s.extension<0>();
  x.finish();
  out.spec = x.stats();
  out.reads = x.read_stats();
  out.cache = x.cache().stats();
  out.demanded_callbacks = rec.count(read_reason::demanded);
  for (const std::string& n : x.lines()) out.notes += n + "\n";
  return out;
}

}  // namespace

TEST_CASE("byte-identity: dropping off, speculation changes residency and timing only") {
  const run_result off = run_synthetic(false, false, 0, 48);
  const run_result on = run_synthetic(true, false, 0, 48);
  // The same experts demanded, with the same weights, in the same order.
  REQUIRE(off.executed.size() == on.executed.size());
  CHECK(off.executed == on.executed);
  CHECK(off.cache.all.lookups == on.cache.all.lookups);
  CHECK(off.not_resident_when_executed == 0);
  CHECK(on.not_resident_when_executed == 0);
  // And speculation did act: reads landed, were used, demanded reads fell.
  CHECK(off.reads.issued == 0);
  CHECK(on.reads.issued > 0);
  CHECK(on.spec.useful > 0);
  CHECK(on.spec.demanded_reads < off.spec.demanded_reads);
  CHECK(on.demanded_callbacks == on.spec.demanded_reads);
  CHECK(on.reads.balanced());
  MESSAGE("synthetic, sync, speculation off:\n" << off.notes);
  MESSAGE("synthetic, sync, speculation on:\n" << on.notes);
}

TEST_CASE("byte-identity holds with real lanes and a simulated flash") {
  const run_result off = run_synthetic(false, false, 2, 24, 0.01);
  const run_result on = run_synthetic(true, false, 2, 24, 0.01);
  CHECK(off.executed == on.executed);
  CHECK(on.not_resident_when_executed == 0);
  CHECK(on.reads.balanced());
  CHECK(on.reads.in_flight == 0);
  CHECK(on.spec.inserted + on.spec.redundant ==
        on.reads.completed - on.reads.discarded);  // every landed read applied once
  MESSAGE("synthetic, 2 lanes, simulated flash x0.01:\n" << on.notes);
}

TEST_CASE("with dropping on, speculation un-drops experts (the executed routings change)") {
  const run_result off = run_synthetic(false, true, 0, 48);
  const run_result on = run_synthetic(true, true, 0, 48);
  CHECK(off.spec.undropped == 0);
  CHECK(on.spec.undropped > 0);
  CHECK(off.executed != on.executed);
  CHECK(on.notes.find("un-dropped by speculation") != std::string::npos);
  MESSAGE("synthetic, sync, drop F=1, speculation on:\n" << on.notes);
}

// docs/speculation.md, "Example": an engine driving speculation without a session.
TEST_CASE("docs example: the engine API") {
  const model_shape shape = presets::qwen3_30b_a3b(8);
  speculation_options o;                // 2 lanes, cap 2, horizon 1, quiesce waits
  o.drop = drop_options{};              // F = 1: skip light misses (decode only)
  std::atomic<int> reads{0};
  speculation<expert_cache<lru_policy>> spec(
      shape, expert_cache<lru_policy>(shape, {from_mib(2000), cycle_guard::refuse, {}}),
      [&](layer_id, expert_id, read_reason) {  // called from the lanes only
        ++reads;                               // pread() the expert's bytes here
        return read_status::ok;
      },
      o);

  routing r;                            // what layer 0 routed for this token
  r.layer = layer_id{0};
  for (unsigned e = 0; e < 8; ++e) r.push_back(expert_id(static_cast<std::uint16_t>(e)), 0.125f);
  ranking next;                         // the predictor's ranking of layer 1
  for (unsigned e = 0; e < 8; ++e)
    next.push_back(expert_id(static_cast<std::uint16_t>(e + 8)), 1.0f, 0.125f);

  std::uint32_t drop_mask[1];
  spec.begin_load({&r, 1}, drop_mask);  // quiesce, apply, drop, cache batch, demanded reads
  // ... compute layer 0 without the slots set in drop_mask[0] ...
  spec.end_load(layer_id{0}, &next);    // hand layer 1's speculative reads to the lanes
  spec.finish();                        // end of run: apply what completed

  CHECK(drop_mask[0] == 0);             // 0.125 is not below F/k = 0.125
  // Eight demanded misses, then the top-2 predicted. With lanes, finish()
  // cancels what no lane had started yet, so how many of the two ran depends
  // on scheduling; the accounting must say exactly which.
  const scheduler_stats rs = spec.read_stats();
  CHECK(rs.demanded == 8);
  CHECK(rs.issued == 2);
  CHECK(rs.completed + rs.cancelled == 2);
  CHECK(reads.load() == 8 + static_cast<int>(rs.completed));
  const int resident_predicted = int(spec.cache().is_resident(layer_id{1}, expert_id{8})) +
                                 int(spec.cache().is_resident(layer_id{1}, expert_id{9}));
  CHECK(resident_predicted == static_cast<int>(rs.completed));
  CHECK(spec.lines().size() == 3);      // cache, drop and prefetch lines
}

TEST_CASE("docs example, synchronous: the top-2 predicted misses are read exactly") {
  const model_shape shape = presets::qwen3_30b_a3b(8);
  speculation_options o;
  o.scheduler.lanes = 0;                // reads run inline at end_load: deterministic
  std::atomic<int> reads{0};
  speculation<expert_cache<lru_policy>> spec(
      shape, expert_cache<lru_policy>(shape, {from_mib(2000), cycle_guard::refuse, {}}),
      [&](layer_id, expert_id, read_reason) {
        ++reads;
        return read_status::ok;
      },
      o);
  routing r;
  r.layer = layer_id{0};
  for (unsigned e = 0; e < 8; ++e) r.push_back(expert_id(static_cast<std::uint16_t>(e)), 0.125f);
  ranking next;
  for (unsigned e = 0; e < 8; ++e)
    next.push_back(expert_id(static_cast<std::uint16_t>(e + 8)), 1.0f, 0.125f);
  std::uint32_t drop_mask[1];
  spec.begin_load({&r, 1}, drop_mask);
  spec.end_load(layer_id{0}, &next);
  spec.finish();
  CHECK(reads.load() == 8 + 2);
  CHECK(spec.cache().is_resident(layer_id{1}, expert_id{8}));
  CHECK(spec.cache().is_resident(layer_id{1}, expert_id{9}));
  CHECK_FALSE(spec.cache().is_resident(layer_id{1}, expert_id{10}));
}
