// Speculation glue: completed speculative reads applied to a real expert_cache
// on the host thread, useful / wasted accounting, the un-drop, failed reads
// never touching residency, and — on the synthetic workload through a session
// — the byte-identity contract (dropping off: the experts demanded and the
// routings executed are identical with and without speculation).
#include "moe_residency/simulated_flash.hpp"
#include "moe_residency/speculation.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "moe_residency/cache/lru.hpp"
#include "moe_residency/session.hpp"
#include "moe_residency/synthetic.hpp"
#include "support.hpp"

using namespace moe_residency;

namespace {

using lru_cache = expert_cache<lru_policy>;
using spec_t = speculation<lru_cache>;

layer_id L(unsigned l) { return layer_id(static_cast<std::uint16_t>(l)); }
expert_id E(unsigned e) { return expert_id(static_cast<std::uint16_t>(e)); }

routing make_routing(unsigned layer, std::vector<std::pair<unsigned, float>> slots, std::uint32_t token = 0) {
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

using moe_residency_test::fixtures::feed_batch;
using moe_residency_test::fixtures::feed_prompt_and_decode;
using moe_residency_test::fixtures::recorder;

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
  CHECK(s.routed({&r0, 1}, masks) == 4);  // cold: four demanded misses
  CHECK(rec.count(read_reason::demanded) == 4);

  // Layer 1 predicted 5, 6, 7, 8: the planner takes the top-2 misses.
  const ranking pred = make_ranking({{5, 0.4f}, {6, 0.3f}, {7, 0.2f}, {8, 0.1f}});
  CHECK(s.layer_loaded(L(0), &pred) == 2);
  CHECK(rec.count(read_reason::speculative) == 2);  // synchronous: ran at layer_loaded
  CHECK_FALSE(s.cache().is_resident(L(1), E(5)));   // not applied until the next load

  // Layer 1 actually routes 5, 9, 10, 11: 5 is a hit thanks to speculation.
  const routing r1 = make_routing(1, {{5, 0.4f}, {9, 0.3f}, {10, 0.2f}, {11, 0.1f}});
  CHECK(s.routed({&r1, 1}, masks) == 3);
  speculation_stats st = s.stats();
  CHECK(st.inserted == 2);
  CHECK(st.useful == 1);
  CHECK(st.useful_bytes == 100);
  CHECK(st.pending == 1);  // expert 6 of layer 1: resident, not demanded yet
  CHECK(s.cache().is_resident(L(1), E(6)));
  CHECK(s.cache().stats().all.hits == 1);
  // Loading layer 1 again: four hits, none of them thanks to speculation any more.
  CHECK(s.routed({&r1, 1}, masks) == 0);
  CHECK(s.cache().stats().all.hits == 5);
  CHECK(s.stats().useful == 1);

  // Fill the cache until expert 6 is evicted unused: wasted bytes.
  for (unsigned l = 2; l < 4; ++l) {
    const routing r = make_routing(l, {{1, 0.4f}, {2, 0.3f}, {3, 0.2f}, {4, 0.1f}});
    s.routed({&r, 1}, masks);
  }
  const routing r0b = make_routing(0, {{12, 0.4f}, {13, 0.3f}, {14, 0.2f}, {15, 0.1f}});
  s.routed({&r0b, 1}, masks);
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
  s.routed({&r0, 1}, masks);
  const ranking pred = make_ranking({{5, 0.4f}, {6, 0.3f}});
  CHECK(s.layer_loaded(L(0), &pred) == 2);
  const routing r1 = make_routing(1, {{5, 0.4f}, {6, 0.3f}, {7, 0.2f}, {8, 0.1f}});
  // 5 failed: still a miss, read again as demanded; 6 landed: a hit.
  CHECK(s.routed({&r1, 1}, masks) == 3);
  CHECK(s.stats().inserted == 1);
  CHECK(s.stats().useful == 1);
  CHECK(s.read_stats().failed == 1);
  CHECK(s.stats().demanded_failed == 1);           // the demanded re-read of 5 failed too
  CHECK_FALSE(s.cache().is_resident(L(1), E(5)));  // ... so it is not resident either
}

TEST_CASE("speculation: a failed demanded read is invalidated, a miss again, the budget exact") {
  recorder rec;
  rec.fail = {7};
  spec_t s(tiny(), tiny_cache(6), rec.callback(), sync_options());
  std::uint32_t masks[1] = {};
  auto check_bytes = [&] {
    std::uint64_t n = 0;
    for (unsigned l = 0; l < 4; ++l)
      for (unsigned e = 0; e < 16; ++e) n += s.cache().is_resident(L(l), E(e));
    CHECK(s.cache().resident_bytes() == 100 * n);
    CHECK(s.cache().resident_bytes() <= s.cache().budget_bytes());
  };
  const routing r1 = make_routing(1, {{5, 0.4f}, {6, 0.3f}, {7, 0.2f}, {8, 0.1f}});
  CHECK(s.routed({&r1, 1}, masks) == 4);
  CHECK(s.stats().demanded_failed == 1);
  CHECK_FALSE(s.cache().is_resident(L(1), E(7)));
  CHECK(s.cache().is_resident(L(1), E(8)));
  CHECK(s.cache().resident_count(L(1)) == 3);
  CHECK(s.cache().resident_bytes() == 300);
  CHECK(s.cache().stats().invalidated == 1);
  CHECK(s.cache().stats().all.evictions == 0);  // not an eviction
  check_bytes();
  // Next token: 7 is a miss again (read again, fails again); the others hit.
  CHECK(s.routed({&r1, 1}, masks) == 1);
  CHECK(s.cache().stats().all.hits == 3);
  CHECK(s.cache().stats().all.misses == 5);
  CHECK_FALSE(s.cache().is_resident(L(1), E(7)));
  check_bytes();
  // Under eviction pressure the accounting stays exact; once the device
  // recovers, 7 is read and stays.
  for (unsigned l = 0; l < 4; ++l) {
    const routing r = make_routing(l, {{7, 0.4f}, {l + 1, 0.3f}, {9, 0.2f}, {10, 0.1f}});
    s.routed({&r, 1}, masks);
    CHECK_FALSE(s.cache().is_resident(L(l), E(7)));
    check_bytes();
  }
  rec.fail.clear();
  CHECK(s.routed({&r1, 1}, masks) >= 1);
  CHECK(s.cache().is_resident(L(1), E(7)));
  check_bytes();
  CHECK(s.cache().stats().invalidated == 6);
  CHECK(s.stats().demanded_failed == 6);
}

TEST_CASE("speculation: evictions caused by a speculative read count in the load's phase") {
  recorder rec;
  spec_t s(tiny(), tiny_cache(4), rec.callback(), sync_options());
  std::uint32_t masks[1] = {};
  const routing r0 = make_routing(0, {{1, 0.4f}, {2, 0.3f}, {3, 0.2f}, {4, 0.1f}});
  s.routed({&r0, 1}, masks);  // decode, fills the budget
  const ranking pred = make_ranking({{5, 0.4f}, {6, 0.3f}});
  CHECK(s.layer_loaded(L(0), &pred) == 2);
  const routing r1 = make_routing(1, {{5, 0.4f}, {6, 0.3f}, {7, 0.2f}, {8, 0.1f}});
  // Integrating 5 and 6 (before the batch opens) evicts two; the batch two more.
  CHECK(s.routed({&r1, 1}, masks) == 2);
  CHECK(s.stats().inserted == 2);
  CHECK(s.cache().stats().all.evictions == 4);
  CHECK(s.cache().stats().decode.evictions == 4);  // every load here was decode
}

TEST_CASE("speculation: completed reads enter the cache in issue order, whatever order the lanes finish them") {
  // Two lanes; the first speculative read (expert 5) waits until the second
  // (expert 6) has finished, so the scheduler hands them back as 6, 5. The
  // next batch's four misses leave room for one more entry of a budget of
  // five: the most recently inserted of the two. In issue order that is 6,
  // as with a synchronous scheduler, however the lanes finish.
  for (const bool reversed : {false, true}) {
    CAPTURE(reversed);
    std::mutex mu;
    std::condition_variable cv;
    bool second_done = false;
    int finished = 0;
    read_callback read = [&](layer_id, expert_id e, read_reason why) noexcept {
      if (why != read_reason::speculative || !reversed) return read_status::ok;
      std::unique_lock<std::mutex> lock(mu);
      if (e == E(5)) {
        cv.wait(lock, [&] { return second_done; });
      } else {
        second_done = true;
      }
      ++finished;
      cv.notify_all();
      return read_status::ok;
    };
    speculation_options o;
    o.scheduler.lanes = reversed ? 2 : 0;
    o.scheduler.mode = quiesce_mode::wait;
    spec_t s(tiny(), tiny_cache(5), std::move(read), o);
    std::uint32_t masks[1] = {};
    const routing r0 = make_routing(0, {{1, 0.4f}, {2, 0.3f}, {3, 0.2f}, {4, 0.1f}});
    s.routed({&r0, 1}, masks);
    const ranking pred = make_ranking({{5, 0.4f}, {6, 0.3f}});
    REQUIRE(s.layer_loaded(L(0), &pred) == 2);
    if (reversed) {  // both on their lanes and done before the quiesce (which cancels what is still queued)
      std::unique_lock<std::mutex> lock(mu);
      const bool both = cv.wait_for(lock, std::chrono::seconds(30), [&] { return finished == 2; });
      second_done = true;  // never leave a lane blocked, whatever happened
      cv.notify_all();
      REQUIRE(both);
    }
    const routing r1 = make_routing(1, {{9, 0.4f}, {10, 0.3f}, {11, 0.2f}, {12, 0.1f}});
    s.routed({&r1, 1}, masks);
    REQUIRE(s.completed().size() == 2);
    CHECK(s.completed()[0].request.expert == E(5));  // in issue order
    CHECK(s.completed()[1].request.expert == E(6));
    CHECK(s.stats().inserted == 2);
    CHECK_FALSE(s.cache().is_resident(L(1), E(5)));  // inserted first: the older of the two
    CHECK(s.cache().is_resident(L(1), E(6)));
  }
}

TEST_CASE("speculation: the drop threshold reaches the planner only when the drop applies") {
  recorder rec;
  speculation_options o = sync_options();
  o.drop = drop_options{};  // decode only; k = 4, F = 1: threshold 0.25
  o.drop->on_warning = [](const std::string&) {};
  spec_t s(tiny(), tiny_cache(), rec.callback(), o);
  std::uint32_t masks[1] = {};
  routing r0 = make_routing(0, {{1, 0.4f}, {2, 0.3f}, {3, 0.2f}, {4, 0.1f}});
  r0.phase = run_phase::prefill;  // the target's load is prefill too: nothing will be dropped
  s.routed({&r0, 1}, masks);
  const ranking pred = make_ranking({{5, 0.5f}, {9, 0.05f}, {6, 0.3f}});
  CHECK(s.layer_loaded(L(0), &pred) == 2);
  CHECK(s.stats().skipped_below_threshold == 0);
  std::lock_guard<std::mutex> lock(rec.mu);
  std::set<unsigned> speculated;
  for (auto& c : rec.calls)
    if (std::get<2>(c) == read_reason::speculative) speculated.insert(std::get<1>(c));
  CHECK(speculated == std::set<unsigned>{5, 9});  // rank order, no threshold
}

TEST_CASE("speculation: horizon 2 targets the MoE layer two ahead; a missing prediction is counted") {
  recorder rec;
  speculation_options o = sync_options();
  o.horizon = 2;
  spec_t s(tiny(), tiny_cache(), rec.callback(), o);
  std::uint32_t masks[1] = {};
  const ranking pred = make_ranking({{5, 0.4f}, {6, 0.3f}});
  const routing r0 = make_routing(0, {{1, 0.4f}, {2, 0.3f}, {3, 0.2f}, {4, 0.1f}});
  s.routed({&r0, 1}, masks);
  // Horizon 2 from layer 0 targets layer 2.
  CHECK(s.layer_loaded(L(0), &pred) == 2);
  CHECK(s.cache().is_resident(L(0), E(1)));
  s.routed({&r0, 1}, masks);  // applies them
  CHECK(s.cache().is_resident(L(2), E(5)));
  CHECK(s.cache().is_resident(L(2), E(6)));
  // Horizon 2 from layer 2 has no target (4 layers): nothing issued.
  CHECK(s.layer_loaded(L(2), &pred) == 0);
  // No prediction: counted.
  CHECK(s.layer_loaded(L(0), nullptr) == 0);
  CHECK(s.stats().no_prediction == 1);
  // The prefetch line says so (it did not: a run without a single prediction
  // printed "issued 0" and nothing else).
  CHECK(s.prefetch_line().find(", no prediction 1, decode stall") != std::string::npos);
}

TEST_CASE("speculation: the prefetch line names no_prediction only when there was one") {
  recorder rec;
  spec_t s(tiny(), tiny_cache(), rec.callback(), sync_options());
  std::uint32_t masks[1] = {};
  const routing r0 = make_routing(0, {{1, 0.4f}, {2, 0.3f}, {3, 0.2f}, {4, 0.1f}});
  s.routed({&r0, 1}, masks);
  const ranking pred = make_ranking({{5, 0.4f}});
  s.layer_loaded(L(0), &pred);
  CHECK(s.prefetch_line().find("no prediction") == std::string::npos);
}

namespace {
// A session whose speculation reads with predictor 0's ranking, over a small
// synthetic model; the speculative reads issued over a few decode tokens, and
// the loads that found no prediction.
struct session_run {
  std::uint64_t issued = 0, no_prediction = 0;
};
template <class Predictor>
session_run issued_through_session(std::size_t horizon) {
  const synthetic_model model(synthetic_presets::small(synthetic_router::qwen3moe, element_type::f32, 8, 64, 128, 6));
  const model_shape& shape = model.shape();
  using session_t = session<predictor_set<Predictor>, spec_t>;
  recorder rec;
  speculation_options o = sync_options();
  o.horizon = horizon;
  session_t s(
      shape, session_options{}, std::tuple<Predictor>{},
      std::tuple<spec_t>{spec_t(shape, lru_cache(shape, {token_cycle_bytes(shape) * 3 / 2, cycle_guard::refuse, {}}),
                                rec.callback(), o)});
  install_routers(s, model);
  synthetic_stream stream(model);
  for (std::size_t t = 0; t < 4; ++t) feed_batch(s, model, stream, run_phase::decode, 1, [](layer_id) {});
  s.template extension<0>().finish();
  return {s.template extension<0>().read_stats().issued, s.template extension<0>().stats().no_prediction};
}
}  // namespace

TEST_CASE("speculation in a session: a horizon the predictor cannot rank is refused, naming both") {
  // Reproduced before the fix: `moe-residency demo --streamed --budget 2000 --horizon 2`
  // printed "issued 0" — the stale-gate ranks only the next MoE layer, so every
  // layer_loaded found no prediction for the layer two ahead.
  CHECK_THROWS_WITH_AS(issued_through_session<stale_gate_predictor>(2),
                       "speculation: horizon 2 needs predictor 0 to rank the MoE layer 2 ahead when a layer is "
                       "loaded, but predictor 0 ('stale-gate') is a gate predictor of horizon 1; expected "
                       "horizon <= 1, or a predictor that ranks further ahead (stale_gate_l2_predictor for "
                       "horizon 2, or a history predictor)",
                       error);
  // The control ranks a layer only from its own input: no horizon works.
  CHECK_THROWS_AS(issued_through_session<fresh_gate_control>(1), error);
  // The combinations that can work are accepted and issue reads through the session.
  const session_run h1 = issued_through_session<stale_gate_predictor>(1);
  CHECK(h1.issued > 0);
  CHECK(h1.no_prediction == 0);
  const session_run l2 = issued_through_session<stale_gate_l2_predictor>(2);
  CHECK(l2.issued > 0);
  // Layers 0 and 1 have no layer two before them, whose input would rank them:
  // one of the two layer_loaded calls per token that target them finds nothing.
  CHECK(l2.no_prediction <= 4 * 2);
  CHECK(issued_through_session<stale_gate_l2_predictor>(1).issued > 0);
  // A history predictor ranks any layer at any time: accepted (its ranking is
  // last token's routing, already resident here, so it may issue nothing).
  CHECK_NOTHROW(issued_through_session<prev_token_predictor>(2));
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
    s.routed({&r0, 1}, masks);
    s.layer_loaded(L(0), &pred);
    s.routed({&r1, 1}, masks);
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
  o.drop = drop_options{};                         // k = 4, F = 1: threshold 0.25
  o.drop->on_warning = [](const std::string&) {};  // the k <= 4 warning, expected here
  spec_t s(tiny(), tiny_cache(), rec.callback(), o);
  std::uint32_t masks[1] = {};
  const routing r0 = make_routing(0, {{1, 0.4f}, {2, 0.3f}, {3, 0.2f}, {4, 0.1f}});
  s.routed({&r0, 1}, masks);
  const ranking pred = make_ranking({{5, 0.5f}, {9, 0.05f}, {6, 0.3f}});
  CHECK(s.layer_loaded(L(0), &pred) == 2);
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
                       "speculation: horizon 3 out of range; expected 1 (next MoE layer) or 2", error);
  o = sync_options();
  o.cap = 40;
  CHECK_THROWS_WITH_AS(spec_t(tiny(), tiny_cache(), rec.callback(), o),
                       "speculation_planner: cap 40 out of range; expected [0, 32] (2 is the "
                       "measured default)",
                       error);
  o = sync_options();
  const model_shape other("tiny", 16, 4, {100, 100, 100});
  CHECK_THROWS_WITH_AS(spec_t(tiny(), lru_cache(other, cache_options{1200, cycle_guard::off, {}}), rec.callback(), o),
                       "speculation: the cache's model shape 'tiny' (3 layers, 16 experts, top-4, 300 expert "
                       "bytes in all) differs from 'tiny' (4 layers, 16 experts, top-4, 400 expert bytes in "
                       "all); expected the same shape",
                       error);
  o.scheduler.wait_limit = std::chrono::nanoseconds(-5);
  CHECK_THROWS_WITH_AS(spec_t(tiny(), tiny_cache(), rec.callback(), o),
                       "read_scheduler: wait_limit -5 ns is negative; expected >= 0 ns (0 = no "
                       "limit)",
                       error);
  o = sync_options();
  o.drop = drop_options{};
  o.drop->fraction = 2.0;
  CHECK_THROWS_WITH_AS(spec_t(tiny(), tiny_cache(), rec.callback(), o),
                       doctest::Contains("drop_policy: fraction F = 2 out of range"), error);
}

TEST_CASE("simulated_flash: rejects each bad value, naming it") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  auto make = [](double device, double lane, double scale) {
    simulated_flash_options o;
    o.device_mib_per_s = device;
    o.lane_mib_per_s = lane;
    o.time_scale = scale;
    simulated_flash f(tiny(), o);
  };
  CHECK_THROWS_WITH_AS(make(0, 1809.9, 1), "simulated_flash: device_mib_per_s = 0 MiB/s; expected a finite value > 0",
                       error);
  CHECK_THROWS_WITH_AS(make(2459.8, -3, 1), "simulated_flash: lane_mib_per_s = -3 MiB/s; expected a finite value > 0",
                       error);
  CHECK_THROWS_WITH_AS(make(2459.8, 1809.9, 0), "simulated_flash: time_scale = 0; expected a finite value > 0", error);
  CHECK_THROWS_WITH_AS(make(nan, 1809.9, 1),
                       "simulated_flash: device_mib_per_s = nan MiB/s; expected a finite value > 0", error);
  CHECK_THROWS_WITH_AS(make(2459.8, inf, 1), "simulated_flash: lane_mib_per_s = inf MiB/s; expected a finite value > 0",
                       error);
  CHECK_THROWS_WITH_AS(make(2459.8, 1809.9, -0.5), "simulated_flash: time_scale = -0.5; expected a finite value > 0",
                       error);
  CHECK_NOTHROW(make(2459.8, 1809.9, 0.01));
}

// ---- the synthetic workload through a session ---------------------------------
//
// The byte-identity contract is checked on what the LIBRARY was asked and did,
// never on the workload's own precomputed routings:
//  - `recording_cache` is the speculation's Cache: it forwards to an LRU
//    expert_cache and logs every lookup of every load batch — the experts each
//    layer demanded (what it computes with), hits and misses alike;
//  - `routing_recorder` is a second session extension, after the speculation:
//    it logs the routings the session hands to extensions and the drop masks
//    the speculation wrote into them — what the engine then executes.

namespace {

using moe_residency_test::fixtures::bits_of;
using moe_residency_test::fixtures::check_run_consistent;
using moe_residency_test::fixtures::demand_of;
using moe_residency_test::fixtures::run_result;
using moe_residency_test::fixtures::run_synthetic;

}  // namespace

TEST_CASE("byte-identity: dropping off, speculation changes residency and timing only") {
  const run_result off = run_synthetic(false, false, 0, 48);
  const run_result on = run_synthetic(true, false, 0, 48);
  check_run_consistent(off);
  check_run_consistent(on);
  // The same experts demanded of the cache and the same routings executed
  // (ids and weights, bit for bit), as multisets.
  REQUIRE(off.demanded.size() == on.demanded.size());
  CHECK(off.demanded == on.demanded);
  REQUIRE(off.executed.size() == on.executed.size());
  CHECK(off.executed == on.executed);
  CHECK(off.cache.all.lookups == on.cache.all.lookups);
  // And speculation did act: reads landed and were used, so fewer of the
  // demanded experts were storage reads.
  CHECK(off.reads.issued == 0);
  CHECK(on.reads.issued > 0);
  CHECK(on.spec.useful > 0);
  CHECK(on.spec.demanded_reads < off.spec.demanded_reads);
  CHECK(on.cache.all.misses < off.cache.all.misses);
  CHECK(on.demanded_callbacks == on.spec.demanded_reads);
  CHECK(off.demanded_callbacks == off.spec.demanded_reads);
  CHECK(on.reads.balanced());
  MESSAGE("synthetic, sync, speculation off:\n" << off.notes);
  MESSAGE("synthetic, sync, speculation on:\n" << on.notes);
}

TEST_CASE("byte-identity holds with real lanes and a simulated flash") {
  const run_result off = run_synthetic(false, false, 2, 24, 0.01);
  const run_result on = run_synthetic(true, false, 2, 24, 0.01);
  check_run_consistent(off);
  check_run_consistent(on);
  CHECK(off.demanded == on.demanded);
  CHECK(off.executed == on.executed);
  // Which reads landed before their layer's load is up to the lanes; what
  // is asserted holds for any interleaving.
  CHECK(on.reads.issued > 0);
  CHECK(on.reads.balanced());
  CHECK(on.reads.in_flight == 0);
  CHECK(on.reads.queued == 0);
  CHECK(on.spec.inserted + on.spec.redundant ==
        on.reads.completed - on.reads.discarded);  // every landed read applied once
  // Not asserted: that demanded storage reads fell. Which speculative reads
  // landed in time (and which entries they evicted) depends on the lanes; the
  // synchronous test above asserts it deterministically.
  MESSAGE("synthetic, 2 lanes, simulated flash x0.01: demanded reads " << off.spec.demanded_reads << " off, "
                                                                       << on.spec.demanded_reads << " on\n"
                                                                       << on.notes);
}

TEST_CASE("with dropping on, speculation un-drops experts (the executed routings change)") {
  const run_result off = run_synthetic(false, true, 0, 48);
  const run_result on = run_synthetic(true, true, 0, 48);
  CHECK(off.spec.undropped == 0);
  CHECK(on.spec.undropped > 0);
  CHECK(off.masked_slots > 0);
  CHECK(on.masked_slots > 0);
  CHECK(off.executed != on.executed);
  // Still: the host sees the masks the extensions wrote, and a dropped expert
  // is never demanded of the cache.
  CHECK(on.executed == on.host_executed);
  CHECK(on.demanded == demand_of(on.executed));
  CHECK(off.demanded == demand_of(off.executed));
  CHECK(on.notes.find("un-dropped by speculation") != std::string::npos);
  MESSAGE("synthetic, sync, drop F=1, speculation on:\n" << on.notes);
}

namespace {

// What a session handed its extensions, to drive a second speculation
// directly (no session) through exactly the same calls.
struct recorded_load {
  layer_id layer{};
  std::vector<routing> routings;
  bool has_prediction = false;
  ranking prediction;  // the ranking the session's speculation planned from
};
struct recorded_batch {
  run_phase phase = run_phase::prefill;
  std::size_t n_tokens = 0;
  std::vector<recorded_load> loads;
};
// A session extension placed after the speculation.
struct load_recorder {
  static constexpr session_hook hooks = session_hook::begin_batch | session_hook::routed | session_hook::layer_loaded;
  model_shape shape;
  std::shared_ptr<std::vector<recorded_batch>> batches;
  template <class S>
  void on_begin_batch(S&, run_phase phase, std::uint32_t, std::size_t n) {
    batches->push_back(recorded_batch{phase, n, {}});
  }
  template <class S>
  void on_routed(S&, layer_id l, span<const routing> rs, span<std::uint32_t>) {
    batches->back().loads.push_back(recorded_load{l, std::vector<routing>(rs.begin(), rs.end()), false, {}});
  }
  template <class S>
  void on_layer_loaded(S& s, layer_id l) {
    layer_id target{};
    if (!moe_layer_ahead(shape, l, 1, target)) return;
    if (const ranking* r = s.template prediction<0>(target)) {
      batches->back().loads.back().has_prediction = true;
      batches->back().loads.back().prediction = *r;
    }
  }
};

// A line without its timing-dependent tail ("decode stall ... ms per token").
std::string without_stall(const std::string& line) { return line.substr(0, line.find("decode stall")); }

}  // namespace

TEST_CASE("speculation driven directly: begin_batch gives the session's per-token figures") {
  const synthetic_config c = synthetic_presets::small(synthetic_router::qwen3moe, element_type::f32, 8, 64, 128, 6);
  const synthetic_model model(c);
  const model_shape& shape = model.shape();
  const std::uint64_t budget = token_cycle_bytes(shape) * 3 / 2;
  const std::size_t decode_tokens = 24;
  speculation_options o = sync_options();
  o.drop = drop_options{};
  o.drop->on_warning = [](const std::string&) {};
  recorder rec_a, rec_b;
  auto batches = std::make_shared<std::vector<recorded_batch>>();

  // The session path: the session calls the speculation's hooks.
  using rec_session = session<predictor_set<stale_gate_predictor>, spec_t, load_recorder>;
  rec_session s(shape, session_options{}, std::tuple<stale_gate_predictor>{},
                std::tuple<spec_t, load_recorder>{
                    spec_t(shape, lru_cache(shape, {budget, cycle_guard::refuse, {}}), rec_a.callback(), o),
                    load_recorder{shape, batches}});
  install_routers(s, model);
  synthetic_stream stream(model);
  feed_prompt_and_decode(s, model, stream, decode_tokens, [](layer_id) {});
  spec_t& via_session = s.extension<0>();
  via_session.finish();

  // The engine path: the same calls, made directly, with begin_batch per batch.
  spec_t direct(shape, lru_cache(shape, {budget, cycle_guard::refuse, {}}), rec_b.callback(), o);
  std::vector<std::uint32_t> masks;
  for (const recorded_batch& b : *batches) {
    direct.begin_batch(b.phase, b.n_tokens);
    for (const recorded_load& ld : b.loads) {
      masks.assign(ld.routings.size(), 0u);
      direct.routed(span<const routing>(ld.routings.data(), ld.routings.size()),
                    span<std::uint32_t>(masks.data(), masks.size()));
      direct.layer_loaded(ld.layer, ld.has_prediction ? &ld.prediction : nullptr);
    }
  }
  direct.finish();

  REQUIRE(batches->size() == 1 + decode_tokens);
  CHECK(via_session.stats().decode_tokens == decode_tokens);
  CHECK(direct.stats().decode_tokens == decode_tokens);  // prefill counted nothing
  CHECK(direct.read_stats().issued == via_session.read_stats().issued);
  CHECK(via_session.read_stats().completed > 0);  // speculation acted: the per-token figure is not 0
  CHECK(direct.stats().useful == via_session.stats().useful);
  CHECK(direct.cache_line() == via_session.cache_line());
  CHECK(without_stall(direct.prefetch_line()) == without_stall(via_session.prefetch_line()));
  CHECK(direct.drop_line() == via_session.drop_line());
  MESSAGE("session:\n"
          << via_session.cache_line() << "\n"
          << via_session.prefetch_line() << "\ndirect:\n"
          << direct.cache_line() << "\n"
          << direct.prefetch_line());
}

// docs/speculation.md, "Example": the lines between the two markers are the
// docs block, verbatim (the next test compares them); the names the block
// takes from its surroundings are declared just before it.
TEST_CASE("docs example: the engine API") {
  const model_shape shape = presets::qwen3_30b_a3b(8);
  std::atomic<int> reads{0};
  auto pread_expert = [&](layer_id, expert_id) {  // the host's read: here, a count
    ++reads;
    return true;
  };
  routing routing_of_layer;  // what layer 0 routed for this token
  routing_of_layer.layer = layer_id{0};
  for (unsigned e = 0; e < 8; ++e) routing_of_layer.push_back(expert_id(static_cast<std::uint16_t>(e)), 0.125f);
  const layer_id layer = routing_of_layer.layer;
  ranking ranking_of_next_layer;  // the predictor's ranking of layer 1
  for (unsigned e = 0; e < 8; ++e)
    ranking_of_next_layer.push_back(expert_id(static_cast<std::uint16_t>(e + 8)), 1.0f, 0.125f);

  // clang-format off
  // ---- begin docs/speculation.md "Example"
  speculation_options o;                 // 2 lanes, cap 2, horizon 1, quiesce waits
  o.drop = drop_options{};               // F = 1: skip light misses (decode only)
  speculation<expert_cache<lru_policy>> spec(
      shape, expert_cache<lru_policy>(shape, {from_mib(2000), cycle_guard::refuse, {}}),
      [&](layer_id l, expert_id e, read_reason) {   // called from the lanes only
        return pread_expert(l, e) ? read_status::ok : read_status::failed;
      },
      o);

  std::uint32_t drop_mask[1];
  spec.routed({&routing_of_layer, 1}, drop_mask);    // quiesce, apply, drop, cache, demanded reads
  // compute the layer here, without the slots set in drop_mask[0]
  spec.layer_loaded(layer, &ranking_of_next_layer);  // hand the speculative reads over
  // ... the next layers, the next tokens ...
  spec.finish();                                     // end of run: apply what completed
  for (const std::string& line : spec.lines()) std::puts(line.c_str());
  // ---- end docs/speculation.md "Example"
  // clang-format on

  CHECK(drop_mask[0] == 0);  // 0.125 is not below F/k = 0.125
  // Eight demanded misses, then the top-2 predicted. With lanes, finish()
  // cancels what no lane had started yet, so how many of the two ran depends
  // on scheduling; the accounting must say exactly which.
  const scheduler_stats rs = spec.read_stats();
  CHECK(rs.demanded == 8);
  CHECK(rs.issued == 2);
  CHECK(rs.completed + rs.cancelled == 2);
  CHECK(rs.balanced());
  CHECK(reads.load() == 8 + static_cast<int>(rs.completed));
  const int resident_predicted = int(spec.cache().is_resident(layer_id{1}, expert_id{8})) +
                                 int(spec.cache().is_resident(layer_id{1}, expert_id{9}));
  CHECK(resident_predicted == static_cast<int>(rs.completed));
  CHECK(spec.lines().size() == 3);  // cache, drop and prefetch lines
}

namespace {
using moe_residency_test::block_lines;
using moe_residency_test::read_file;
}  // namespace

TEST_CASE("docs example: the docs block is the code the previous test runs") {
  const std::string root = MOE_RESIDENCY_SOURCE_DIR;
  const std::string doc = read_file(root + "/docs/speculation.md");
  const std::string test = read_file(root + "/tests/test_speculation.cpp");
  REQUIRE(!doc.empty());
  REQUIRE(!test.empty());
  // The first ```cpp block after the "## Example" heading.
  const auto at = doc.find("\n## Example\n");
  REQUIRE(at != std::string::npos);
  const std::vector<std::string> in_docs = block_lines(doc.substr(at), "```cpp", "```");
  const std::vector<std::string> in_test =
      block_lines(test, "// ---- begin docs/speculation.md \"Example\"", "// ---- end docs/speculation.md \"Example\"");
  REQUIRE(in_docs.size() > 5);
  CHECK(in_docs.size() == in_test.size());
  for (std::size_t i = 0; i < std::max(in_docs.size(), in_test.size()); ++i) {
    CAPTURE(i);
    CHECK((i < in_docs.size() ? in_docs[i] : "<missing>") == (i < in_test.size() ? in_test[i] : "<missing>"));
  }
}

TEST_CASE("docs example, synchronous: the top-2 predicted misses are read exactly") {
  const model_shape shape = presets::qwen3_30b_a3b(8);
  speculation_options o;
  o.scheduler.lanes = 0;  // reads run inline at layer_loaded: deterministic
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
  for (unsigned e = 0; e < 8; ++e) next.push_back(expert_id(static_cast<std::uint16_t>(e + 8)), 1.0f, 0.125f);
  std::uint32_t drop_mask[1];
  spec.routed({&r, 1}, drop_mask);
  spec.layer_loaded(layer_id{0}, &next);
  spec.finish();
  CHECK(reads.load() == 8 + 2);
  CHECK(spec.cache().is_resident(layer_id{1}, expert_id{8}));
  CHECK(spec.cache().is_resident(layer_id{1}, expert_id{9}));
  CHECK_FALSE(spec.cache().is_resident(layer_id{1}, expert_id{10}));
}
