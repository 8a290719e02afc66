// moe_residency_lab/lab.hpp: the memory lab's configurations as inputs of the timing
// model, on hand-computed cases — the mapping of each configuration, the
// read-around page cache, the fault-driven loads, the metrics file the lab's
// runs write (moe-lab-run --metrics-csv), and calibration on one lab cell.

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "moe_residency/timing.hpp"
#include "moe_residency/timing/calibrate.hpp"
#include "moe_residency_lab/lab.hpp"
#include "moe_residency_lab/calibrate.hpp"
#include "moe_residency_lab/manager.hpp"

using namespace moe_residency;
using namespace moe_residency::lab;

namespace {

constexpr std::uint64_t page = 4096;

lab_setup quick_setup(double limit) {
  lab_setup s;
  s.limit_mib = limit;
  s.dense_mib = 112.25;
  s.overhead_mib = 64;
  s.budget_mib = 140;
  s.stale_gate_pct = 93.9;
  s.lanes = 2;
  s.spec_cap = 2;
  return s;
}

/// One layer (or more) of `n_expert` experts of three one-page slices each,
/// one dense page per layer; decode[token][layer] the routed experts (k of
/// them), after a prompt batch routing `prompt` in every layer.
route_trace toy_trace(std::size_t layers, std::size_t n_expert, std::size_t k, const std::vector<std::uint16_t>& prompt,
                      const std::vector<std::vector<std::vector<std::uint16_t>>>& decode) {
  route_trace t;
  t.header.arch = "toy";
  t.header.n_layer = layers;
  t.header.n_expert = n_expert;
  t.header.n_expert_used = k;
  t.header.expert_bytes.assign(layers, 3 * page);
  t.header.dense_bytes.assign(layers, page);
  auto row = [&](run_phase ph, std::uint32_t step, std::uint16_t l, std::uint8_t slot, std::uint16_t e) {
    trace_row r;
    r.phase = ph;
    r.step = step;
    r.layer = layer_id(l);
    r.slot = slot;
    r.expert = expert_id(e);
    r.weight = 1.0f / static_cast<float>(slot + 1);
    t.rows.push_back(r);
  };
  for (std::size_t i = 0; i < prompt.size(); ++i)
    for (std::uint16_t l = 0; l < layers; ++l)
      for (std::uint8_t j = 0; j < k; ++j)
        row(run_phase::prefill, static_cast<std::uint32_t>(i), l, j,
            static_cast<std::uint16_t>((prompt[i] + j) % n_expert));
  for (std::size_t tok = 0; tok < decode.size(); ++tok)
    for (std::uint16_t l = 0; l < layers; ++l)
      for (std::uint8_t j = 0; j < decode[tok][l].size(); ++j)
        row(run_phase::decode, static_cast<std::uint32_t>(prompt.size() + tok), l, j, decode[tok][l][j]);
  return t;
}

}  // namespace

TEST_CASE("each lab configuration maps to its model, by hand") {
  const lab_setup s = quick_setup(563);
  // exact: the page cache's room for experts = 563 - 112.25 - 64; two lanes; no speculation.
  lab_mapping m = map_lab_config(lab_config::exact, s);
  CHECK(m.kind == lab_model_kind::lanes);
  CHECK(m.cache_mib == doctest::Approx(386.75));
  CHECK(m.lanes == 2);
  CHECK(m.speculation.source == speculation_source::none);
  // cache alone reads inline: one lane, the same memory.
  m = map_lab_config(lab_config::cache, s);
  CHECK(m.kind == lab_model_kind::lanes);
  CHECK(m.cache_mib == doctest::Approx(386.75));
  CHECK(m.lanes == 1);
  // all: the stale-gate's measured accuracy as the oracle's, cap 2, the next layer.
  m = map_lab_config(lab_config::all, s);
  CHECK(m.lanes == 2);
  CHECK(m.speculation.source == speculation_source::oracle);
  CHECK(m.speculation.oracle_p == doctest::Approx(0.939));
  CHECK(m.speculation.cap == 2);
  CHECK(m.speculation.horizon == 1);
  CHECK(map_lab_config(lab_config::degraded, s).speculation.oracle_p == doctest::Approx(0.886));
  // the fault-driven ones: the whole limit but the overhead is page cache; dense pinned leaves the LRU smaller.
  for (lab_config c : {lab_config::mmap, lab_config::observer, lab_config::predicted}) {
    m = map_lab_config(c, s);
    CHECK(m.kind == lab_model_kind::faults);
    CHECK(m.cache_mib == doctest::Approx(499));
    CHECK(m.lanes == 1);
    CHECK_FALSE(m.dense_pinned);
  }
  m = map_lab_config(lab_config::dense, s);
  CHECK(m.dense_pinned);
  CHECK(m.cache_mib == doctest::Approx(386.75));
  CHECK(map_lab_config(lab_config::resident, lab_setup{}).kind == lab_model_kind::resident);
  CHECK_THROWS_WITH_AS(map_lab_config(lab_config::exact, lab_setup{}), doctest::Contains("expected a memory limit > 0"),
                       error);
  CHECK_THROWS_WITH_AS(map_lab_config(lab_config::exact, quick_setup(150)),
                       doctest::Contains("leaves -26.250000 MiB for the page cache"), error);
  CHECK(parse_lab_config("degraded") == lab_config::degraded);
  CHECK_THROWS_WITH_AS(parse_lab_config("resident-all"),
                       doctest::Contains("lab configuration 'resident-all'; expected"), error);
}

TEST_CASE("the real-routing lab's configurations map to their models, by hand") {
  lab_setup s = quick_setup(563);
  s.stale_gate_pct = 88.6;  // the trace oracle's accuracy, as the cells file gives it for the oracle cells
  // exact-cache: all's mapping without speculation: the union LRU, lanes, the cache's misses pinned on them.
  lab_mapping m = map_lab_config(lab_config::exact_cache, s);
  CHECK(m.kind == lab_model_kind::lanes);
  CHECK(m.cache_mib == doctest::Approx(386.75));
  CHECK(m.lanes == 2);
  CHECK(m.pinned_mib == 140);
  CHECK(m.pins_on_lanes);
  CHECK_FALSE(m.requests_routed);
  CHECK_FALSE(m.reads_inline);
  CHECK(m.speculation.source == speculation_source::none);
  const lab_mapping all = map_lab_config(lab_config::all, s);
  CHECK(all.cache_mib == m.cache_mib);
  CHECK(all.pinned_mib == m.pinned_mib);
  CHECK(all.pins_on_lanes == m.pins_on_lanes);
  // its lanes are the cell's (the cells file's lanes field: exact-cache-l1, -l4).
  s.lanes = 4;
  CHECK(map_lab_config(lab_config::exact_cache, s).lanes == 4);
  s.lanes = 2;
  // all-oracle: the same plus the oracle at the cell's accuracy, spec_cap of the next layer.
  m = map_lab_config(lab_config::all_oracle, s);
  CHECK(m.cache_mib == doctest::Approx(386.75));
  CHECK(m.speculation.source == speculation_source::oracle);
  CHECK(m.speculation.oracle_p == doctest::Approx(0.886));
  CHECK(m.speculation.cap == 2);
  CHECK(m.speculation.horizon == 1);
  // all-oracle-pool: an LRU of the pool's budget alone, the oracle's top 8 placed ahead.
  m = map_lab_config(lab_config::all_oracle_pool, s);
  CHECK(m.kind == lab_model_kind::lanes);
  CHECK(m.cache_mib == 140);
  CHECK(m.pinned_mib == 140);
  CHECK(m.speculation.cap == 8);
  CHECK(m.speculation.oracle_p == doctest::Approx(0.886));
  CHECK_FALSE(m.prompt_cached);  // the pool starts empty: the prompt's reads went to the page cache
  CHECK(map_lab_config(lab_config::all_oracle, s).prompt_cached);
  lab_setup no_budget = s;
  no_budget.budget_mib = 0;
  CHECK_THROWS_WITH_AS(map_lab_config(lab_config::all_oracle_pool, no_budget),
                       doctest::Contains("budget 0.000000 MiB; expected the pool's budget > 0"), error);
  lab_setup too_big = s;
  too_big.budget_mib = 400;
  CHECK_THROWS_WITH_AS(map_lab_config(lab_config::all_oracle_pool, too_big),
                       doctest::Contains("budget 400.000000 MiB above the 386.750000 MiB"), error);
  // mmap-128k: mmap's fault model at a 256 KiB window, which the fault walk (at the device's) does not price.
  m = map_lab_config(lab_config::mmap_128k, s);
  CHECK(m.kind == lab_model_kind::faults);
  CHECK(m.cache_mib == doctest::Approx(499));
  CHECK(m.readaround_mib == doctest::Approx(0.25));
  CHECK_FALSE(m.walk_applies);
  CHECK(map_lab_config(lab_config::mmap, s).readaround_mib == doctest::Approx(16));
  // The file's dense bytes outside the trace's layers (lab-predict --dense-mib) leave a fault
  // cell's page cache smaller; a lanes cell's is already net of all dense bytes.
  lab_setup file = s;
  file.dense_mib = 112.25 + 40;
  file.unlaid_dense_mib = 40;
  CHECK(map_lab_config(lab_config::mmap_128k, file).cache_mib == doctest::Approx(499 - 40));
  CHECK(map_lab_config(lab_config::dense, file).cache_mib == doctest::Approx(499 - 152.25));
  CHECK(map_lab_config(lab_config::exact_cache, file).cache_mib == doctest::Approx(386.75 - 40));
  CHECK(map_lab_config(lab_config::mmap, s).walk_applies);
  for (const char* name : {"mmap-128k", "exact-cache", "all-oracle", "all-oracle-pool"})
    CHECK(std::string(to_string(parse_lab_config(name))) == name);
}

TEST_CASE("the pool starts empty at decode: an expert the prompt read is read again, by hand") {
  // One layer of 4 experts (three one-page slices each), k = 1: the prompt routes expert 0,
  // decode tokens 0 and 1 route 0 again. In the page cache (exact-cache) the prompt's read
  // serves both; the pool reads expert 0 at decode token 0, then holds it.
  const route_trace t = toy_trace(1, 4, 1, {0}, {{{0}}, {{0}}});
  lab_setup s;
  s.limit_mib = 1, s.overhead_mib = 0, s.dense_mib = 0, s.budget_mib = 0.5, s.stale_gate_pct = 100;
  timing_params p;
  p.curve = storage_curve::parse_list("1:100");
  p.compute_ms_per_token = 10, p.overlap = 0, p.read_latency_ms = 0;
  const lab_prediction page_cache = predict_lab(t, lab_config::exact_cache, s, p);
  const lab_prediction pool = predict_lab(t, lab_config::all_oracle_pool, s, p);
  REQUIRE(page_cache.loads.size() == 2);
  REQUIRE(pool.loads.size() == 2);
  CHECK(page_cache.loads[0].misses == 0);
  CHECK(pool.loads[0].misses == 1);
  CHECK(pool.loads[0].demanded_bytes == 3 * page);
  CHECK(pool.loads[1].misses == 0);
  // 12 KiB at 100 MiB/s more at decode token 0; the same token after.
  CHECK(pool.tokens[0].wall_ms - page_cache.tokens[0].wall_ms == doctest::Approx(1000.0 * 3 * page / 1048576 / 100));
  CHECK(pool.tokens[1].wall_ms == doctest::Approx(page_cache.tokens[1].wall_ms));
}

TEST_CASE("the read-around page cache: a fault reads the window around it, the LRU evicts") {
  readaround_page_cache pc(100, 6, 4);
  std::uint64_t read = 0;
  // page 50 faults: window [48, 52), four pages read.
  CHECK(pc.touch(50, 51, read) == 1);
  CHECK(read == 4);
  CHECK(pc.is_resident(48));
  CHECK(pc.is_resident(51));
  CHECK_FALSE(pc.is_resident(52));
  // 51 is a hit; 52 faults, window [50, 54): only 52 and 53 are missing.
  CHECK(pc.touch(51, 53, read) == 1);
  CHECK(read == 6);
  CHECK(pc.resident_pages() == 6);
  // page 0 faults, window clipped to [0, 4): four more pages, the four least recent
  // (48, 49, 50, 51 in insertion/use order: 48, 49 were never touched again) evicted.
  CHECK(pc.touch(0, 1, read) == 1);
  CHECK(read == 10);
  CHECK(pc.resident_pages() == 6);
  CHECK_FALSE(pc.is_resident(48));
  CHECK_FALSE(pc.is_resident(49));
  CHECK(pc.is_resident(52));
  CHECK(pc.is_resident(53));
  // a pinned page never faults and never counts against the LRU.
  readaround_page_cache p2(10, 2, 1);
  p2.pin(0, 3);
  std::uint64_t r2 = 0;
  CHECK(p2.touch(0, 3, r2) == 0);
  CHECK(r2 == 0);
  CHECK(p2.touch(3, 6, r2) == 3);
  CHECK(r2 == 3);
  CHECK(p2.resident_pages() == 2);
  CHECK_THROWS_AS(readaround_page_cache(10, 0, 1), error);
}

TEST_CASE("the two-list page cache: read-around pages never touched go first, touched pages get a second chance") {
  // A 2-page window reads the page before the fault too (unreferenced) and the
  // faulting page (referenced). Capacity 4.
  for (page_reclaim r : {page_reclaim::lru, page_reclaim::two_list}) {
    CAPTURE(static_cast<int>(r));
    readaround_page_cache pc(100, 4, 2, r);
    std::uint64_t read = 0;
    CHECK(pc.touch(10, 11, read) == 1);  // reads 9, 10
    CHECK(pc.touch(20, 21, read) == 1);  // reads 19, 20: full
    // 30 reads 29 (evicting 9, never touched: both agree) and 30, which evicts:
    // the LRU its oldest, 10; the two lists rotate 10 (referenced) and evict 19.
    CHECK(pc.touch(30, 31, read) == 1);
    CHECK(read == 6);
    CHECK(pc.resident_pages() == 4);
    CHECK_FALSE(pc.is_resident(9));
    CHECK(pc.is_resident(10) == (r == page_reclaim::two_list));
    CHECK(pc.is_resident(19) == (r == page_reclaim::lru));
    CHECK(pc.touch(10, 11, read) == (r == page_reclaim::two_list ? 0u : 1u));
  }
  // Referenced on two scans: activated; the active list holds at most half.
  readaround_page_cache pc(100, 3, 1, page_reclaim::two_list);
  std::uint64_t read = 0;
  CHECK(pc.touch(1, 4, read) == 3);  // 1, 2, 3, each referenced
  CHECK(pc.touch(4, 5, read) == 1);  // one scan rotates 1, 2, 3 (clearing their bits), then evicts 1
  CHECK_FALSE(pc.is_resident(1));
  CHECK(pc.active_pages() == 0);
  CHECK(pc.touch(2, 3, read) == 0);  // 2 referenced again
  CHECK(pc.touch(5, 6, read) == 1);  // the scan activates 2 and evicts 3
  CHECK(pc.active_pages() == 1);
  CHECK(pc.is_resident(2));
  CHECK_FALSE(pc.is_resident(3));
  CHECK(pc.resident_pages() == 3);
}

TEST_CASE("fault-driven loads of a route trace, by hand") {
  // One layer, 4 experts: pages 0 dense, 1-4 gate, 5-8 up, 9-12 down (one page per slice).
  const route_trace t = toy_trace(1, 4, 1, {0}, {{{1}}, {{1}}, {{2}}});
  const lab_file_layout f = make_lab_file_layout(t.header);
  CHECK(f.pages == 13);
  CHECK(f.slice_pages(0, 1, 2) == std::make_pair<std::uint64_t, std::uint64_t>(7, 8));
  lab_mapping m;
  m.kind = lab_model_kind::faults;
  m.cache_mib = 1.0;  // 256 pages: nothing is evicted
  // No read-around (a one-page window): the prompt faults dense + expert 0's three
  // slices; decode token 0 faults expert 1's three slices, token 1 none, token 2 expert 2's.
  auto loads = readaround_loads(t, m, 4096.0 / 1048576.0);
  REQUIRE(loads.size() == 3);
  CHECK(loads[0].token == 0);
  CHECK(loads[0].misses == 3);
  CHECK(loads[0].demanded_bytes == 3 * page);
  CHECK(loads[0].expert_bytes == page);
  CHECK(loads[0].hits == 0);
  CHECK(loads[1].token == 1);
  CHECK(loads[1].misses == 0);
  CHECK(loads[1].hits == 1);
  CHECK(loads[2].token == 2);
  CHECK(loads[2].misses == 3);
  // A 4-page window (lo = p - 2): the prompt's dense fault at page 0 reads [0, 4) (dense,
  // gates 0-2); expert 0's gate (page 1) is resident; its up (5) faults, window [3, 7) reads
  // 4, 5, 6; its down (9) faults, window [7, 11) reads 7-10. Decode expert 1: gate 2, up 6,
  // down 10 all resident: no fault. Expert 2 (token 2): gate 3, up 7 resident; down 11
  // faults, window [9, 13) reads 11 and 12.
  loads = readaround_loads(t, m, 4.0 * 4096.0 / 1048576.0);
  REQUIRE(loads.size() == 3);
  CHECK(loads[0].misses == 0);
  CHECK(loads[1].misses == 0);
  CHECK(loads[2].misses == 1);
  CHECK(loads[2].demanded_bytes == 2 * page);
  CHECK(loads[2].expert_bytes == 2 * page);
  // A page cache of 2 pages, no read-around: every touch of a slice faults again.
  m.cache_mib = 2.0 * 4096.0 / 1048576.0;
  loads = readaround_loads(t, m, 4096.0 / 1048576.0);
  CHECK(loads[1].misses == 4);  // dense + three slices (expert 1 was evicted by its own pages)
  // predicted: each fault's window read at the curve's top bandwidth, one after another.
  lab_setup s;
  s.limit_mib = 1.0;
  s.overhead_mib = 0;
  s.readaround_mib = 4096.0 / 1048576.0;
  timing_params p;
  p.curve = storage_curve::parse_list("1:100,8:400");
  p.compute_ms_per_token = 0;
  p.read_latency_ms = 0.5;
  p.overlap = 0;
  const lab_prediction lp = predict_lab(t, lab_config::mmap, s, p);
  REQUIRE(lp.tokens.size() == 3);
  CHECK(lp.tokens[0].wall_ms == doctest::Approx(3 * (0.5 + 1000.0 * 4096.0 / 1048576.0 / 400.0)));
  CHECK(lp.tokens[1].wall_ms == 0);
  // The faults' bandwidth is scaled by β_f, not by the manager's β.
  timing_params q = p;
  q.bandwidth_scale = 4;
  q.fault_bandwidth_scale = 0.5;
  const lab_prediction lq = predict_lab(t, lab_config::mmap, s, q);
  CHECK(lq.tokens[0].wall_ms == doctest::Approx(3 * (0.5 + 1000.0 * 4096.0 / 1048576.0 / (0.5 * 400.0))));
  q.fault_bandwidth_scale = 0;  // tied: β
  CHECK(predict_lab(t, lab_config::mmap, s, q).tokens[0].wall_ms ==
        doctest::Approx(3 * (0.5 + 1000.0 * 4096.0 / 1048576.0 / (4 * 400.0))));
  lab_mapping lanes = m;
  lanes.kind = lab_model_kind::lanes;
  CHECK_THROWS_AS(readaround_loads(t, lanes, 1.0), error);
}

TEST_CASE("the fault path measured in the cell's shape: a fault cell's reads at the walk's ms per MiB, by hand") {
  // The toy of the case above: one layer, 4 experts, one-page slices, no read-around;
  // decode token 0 faults expert 1's three slices, token 1 nothing, token 2 expert 2's.
  const route_trace t = toy_trace(1, 4, 1, {0}, {{{1}}, {{1}}, {{2}}});
  lab_setup s;
  s.limit_mib = 1.0;
  s.overhead_mib = 0;
  s.readaround_mib = 4096.0 / 1048576.0;
  s.fault_walk_off_cpu_ms_per_mib = 2.0;  // the walk: 2 ms off the CPU and 0.5 ms of kernel time per MiB
  s.fault_walk_sys_ms_per_mib = 0.5;
  timing_params p;
  p.curve = storage_curve::parse_list("1:100,8:400");
  p.compute_ms_per_token = 0;
  p.read_latency_ms = 0.5;
  p.overlap = 0;
  p.read_cpu_ms_per_mib = 7;  // κ, the manager's: not the fault path's once it is measured
  const double mib = 3 * 4096.0 / 1048576.0;
  const lab_prediction lp = predict_lab(t, lab_config::mmap, s, p);
  REQUIRE(lp.tokens.size() == 3);
  CHECK(lp.tokens[0].wall_ms == doctest::Approx(mib * (2.0 + 0.5)));
  CHECK(lp.tokens[0].stall_ms == doctest::Approx(mib * 2.0));
  CHECK(lp.tokens[1].wall_ms == 0);
  CHECK(lp.tokens[2].wall_ms == doctest::Approx(mib * (2.0 + 0.5)));
  // β, β_f, λ and κ no longer move a fault cell's reads.
  timing_params q = p;
  q.bandwidth_scale = 4;
  q.fault_bandwidth_scale = 0.5;
  q.read_latency_ms = 3;
  q.read_cpu_ms_per_mib = 0.1;
  CHECK(predict_lab(t, lab_config::mmap, s, q).tokens[0].wall_ms == doctest::Approx(mib * 2.5));
  // Compute is still the model's: C = 10 ms adds 10 ms a token.
  q.compute_ms_per_token = 10;
  CHECK(predict_lab(t, lab_config::mmap, s, q).tokens[0].wall_ms == doctest::Approx(10 + mib * 2.5));
  // Without the walk, the same cell's reads are the curve's top x β_f plus λ and κ (the case above).
  lab_setup plain = s;
  plain.fault_walk_off_cpu_ms_per_mib = plain.fault_walk_sys_ms_per_mib = 0;
  CHECK(predict_lab(t, lab_config::mmap, plain, p).tokens[0].wall_ms ==
        doctest::Approx(3 * (0.5 + 1000.0 * 4096.0 / 1048576.0 / 400.0) + 7 * mib));
  // mmap-128k ignores the walk (measured at the device's read-ahead): its reads are the curve's, as
  // mmap's without the walk, at its own window (one page here, as the case's mmap).
  lab_setup small = s;
  small.readaround_128k_mib = s.readaround_mib;
  CHECK(predict_lab(t, lab_config::mmap_128k, small, p).tokens[0].wall_ms ==
        doctest::Approx(3 * (0.5 + 1000.0 * 4096.0 / 1048576.0 / 400.0) + 7 * mib));
  // A lanes cell ignores the walk: its reads are the manager's.
  lab_setup lanes = quick_setup(563);
  const lab_prediction a = predict_lab(t, lab_config::exact, lanes, p);
  lanes.fault_walk_off_cpu_ms_per_mib = 2.0;
  lanes.fault_walk_sys_ms_per_mib = 0.5;
  const lab_prediction b = predict_lab(t, lab_config::exact, lanes, p);
  REQUIRE(a.tokens.size() == b.tokens.size());
  for (std::size_t i = 0; i < a.tokens.size(); ++i) CHECK(a.tokens[i].wall_ms == b.tokens[i].wall_ms);
}

TEST_CASE("predicted in the fault model: the next layer's experts read without read-around, by hand") {
  // Two layers of 4 experts, k = 1: per layer 1 dense page, then gate, up, down of one page
  // per expert (layer 0 pages 0-12, layer 1 pages 13-25). No read-around, nothing evicted.
  const route_trace t = toy_trace(2, 4, 1, {0}, {{{1}, {2}}, {{3}, {3}}});
  lab_setup s;
  s.limit_mib = 1.0;
  s.overhead_mib = 0;
  s.readaround_mib = 4096.0 / 1048576.0;
  s.stale_gate_pct = 100;
  s.spec_cap = 2;
  lab_mapping m = map_lab_config(lab_config::predicted, s);
  CHECK(m.speculation.source == speculation_source::oracle);
  CHECK(m.speculation.oracle_p == doctest::Approx(1.0));
  CHECK(m.speculation.cap == 2);
  // A perfect prediction: after layer 0's load the next layer's expert is read (3 pages),
  // so layer 1 takes no fault; the last layer plans nothing.
  auto loads = readaround_loads(t, m, s.readaround_mib);
  REQUIRE(loads.size() == 4);
  CHECK(loads[0].misses == 3);
  CHECK(loads[0].speculative_issued == 1);
  CHECK(loads[0].speculative_bytes == 3 * page);
  CHECK(loads[1].misses == 0);
  CHECK(loads[1].hits == 1);
  CHECK(loads[1].speculative_hits == 1);
  CHECK(loads[1].speculative_inserted == 1);
  CHECK(loads[1].speculative_inserted_bytes == 3 * page);
  CHECK(loads[1].speculative_issued == 0);
  CHECK(loads[2].misses == 3);
  CHECK(loads[3].misses == 0);
  CHECK(loads[3].speculative_hits == 1);
  // The same cell without speculation faults in layer 1.
  lab_mapping plain = m;
  plain.speculation = replay_speculation{};
  CHECK(readaround_loads(t, plain, s.readaround_mib)[1].misses == 3);
  // A wrong prediction (P = 0) reads another expert: layer 1 still faults, nothing spared.
  m.speculation.oracle_p = 0;
  loads = readaround_loads(t, m, s.readaround_mib);
  CHECK(loads[0].speculative_bytes == 3 * page);
  CHECK(loads[1].misses == 3);
  CHECK(loads[1].speculative_hits == 0);
  CHECK(loads[1].speculative_inserted == 1);
  // Reads the timing model cancels are never made resident.
  m.speculation.oracle_p = 1;
  replay_observer cancel;
  cancel.admit = [](layer_id, std::uint64_t) { return false; };
  loads = readaround_loads(t, m, s.readaround_mib, 3, page_reclaim::two_list, cancel);
  CHECK(loads[0].speculative_cancelled == 1);
  CHECK(loads[0].speculative_bytes == 0);
  CHECK(loads[1].misses == 3);
  CHECK(loads[1].speculative_inserted == 0);
  // Timing: C = 100 ms over 2 MoE layers, a flat 400 MiB/s, λ = 0.5 ms, κ = 1 ms/MiB. Token 0:
  // layer 0 computes 50 ms and stalls on 3 faults of one page, each a wave of its own; the
  // speculative read (3 pages) starts after them, inside the layer, so layer 1 waits for
  // nothing. κ is paid for layer 0's 3 pages and for the 3 the read brought in at layer 1.
  timing_params p;
  p.curve = storage_curve::parse_list("1:100,8:400");
  p.compute_ms_per_token = 100;
  p.read_latency_ms = 0.5;
  p.overlap = 0;
  p.read_cpu_ms_per_mib = 1;
  const lab_prediction lp = predict_lab(t, lab_config::predicted, s, p);
  REQUIRE(lp.tokens.size() == 2);
  const double w = 0.5 + 1000.0 * 4096.0 / 1048576.0 / 400.0;
  CHECK(lp.tokens[0].speculative_bytes == 3 * page);
  CHECK(lp.tokens[0].stall_ms == doctest::Approx(3 * w));
  CHECK(lp.tokens[0].wall_ms == doctest::Approx(100 + 3 * w + 6 * 4096.0 / 1048576.0));
  CHECK(lp.loads[1].misses == 0);
}

TEST_CASE("the probe's metrics file parses: its columns, the lab's tok/s") {
  // moe-lab-run --metrics-csv, the columns it writes (an empty cache_hit_pct without the manager).
  const std::string text =
      "step,steps,wall_ms,compute_ms,read_bytes,cache_hit_pct,stall_ms,majflt,cpu_ms,sys_ms\n"
      "1,2,400.000,100.000,1048576,,300.000,12,100.000,60.000\n"
      "2,2,100.000,90.000,0,50.00,10.000,0,90.000,0.000\n";
  const token_metrics m = parse_token_metrics(text, "probe.metrics.csv");
  REQUIRE(m.size() == 2);
  CHECK(m.wall_ms[0] == 400.0);
  CHECK(m.compute_ms[1] == 90.0);
  CHECK(m.stall_ms[0] == 300.0);
  CHECK(m.read_bytes[0] == 1048576.0);
  CHECK(std::isnan(m.mgmt_ms[0]));  // not measured on this machine
  CHECK(std::isnan(m.io_ms[1]));
  CHECK(m.cpu_ms[0] == 100.0);
  CHECK(m.sys_ms[0] == 60.0);
  CHECK(m.sys_ms[1] == 0.0);
  // A probe older than sys_ms: the column is NaN.
  CHECK(std::isnan(parse_token_metrics("step,wall_ms,cpu_ms\n1,5,4\n", "old.csv").sys_ms[0]));
  // tokens / Σ wall: 2 / 0.5 s.
  CHECK(metrics_tok_per_s(m) == doctest::Approx(4.0));
  CHECK_THROWS_WITH_AS(parse_token_metrics("step,steps,wall_ms\n1,2,-1\n", "x.csv"),
                       doctest::Contains("x.csv: line 2, column wall_ms: '-1'"), error);
}

namespace {

/// A trace of 2 layers x 32 experts (k = 3) whose routings drift (0-3 misses a
/// layer: up to two waves on two lanes, so latency per wave and overlap per
/// layer are separable), 0.75 MiB experts, and a lab setup whose memory holds
/// ~5 experts of 32.
route_trace drift_trace() {
  std::vector<std::vector<std::vector<std::uint16_t>>> dec;
  for (std::uint16_t tok = 0; tok < 40; ++tok) {
    dec.emplace_back();
    for (std::uint16_t l = 0; l < 2; ++l) {
      dec.back().emplace_back();
      for (std::uint16_t j = 0; j < 3; ++j)
        dec.back().back().push_back(static_cast<std::uint16_t>((tok * tok * 3 + tok * 7 + j * 11 + l * 5) % 32));
    }
  }
  route_trace t = toy_trace(2, 32, 3, {0, 1}, dec);
  t.header.expert_bytes.assign(2, 3 * 262144);
  return t;
}

/// κ = 0.4 ms per MiB and β = 1.5 on a flat curve, C = 30 ms, nothing
/// overlapped; and the start of its fits: the same curve and lanes, the rest default.
timing_params kernel_truth() {
  timing_params truth;
  truth.curve = storage_curve::parse_list("1:250");
  truth.lanes = 2;
  truth.compute_ms_per_token = 30;
  truth.bandwidth_scale = 1.5;
  truth.read_cpu_ms_per_mib = 0.4;
  truth.overlap = 0;
  return truth;
}

timing_params kernel_start() {
  timing_params start;
  start.curve = kernel_truth().curve;
  start.lanes = 2;
  start.overlap = 0;
  return start;
}

lab_setup drift_setup() {
  lab_setup s;
  s.limit_mib = 4;  // 4 - dense - 0 overhead: ~5 experts of 32
  s.dense_mib = 2 * 4096.0 / 1048576.0;
  s.overhead_mib = 0;
  return s;
}

/// The per-token metrics the probe would record for the model's own
/// prediction `p` of setup `s`: the eval thread's kernel time is the model's
/// management less the manager's request cost outside the kernel, its user
/// time the model's compute plus the requests' user part (request_user_ms),
/// and every time is `slow` times the model's (a run that went slower).
token_metrics manager_metrics(const lab_prediction& p, const lab_setup& s, double slow = 1.0) {
  std::vector<double> requested(p.tokens.size(), 0);
  for (const load_event& e : p.loads) requested[e.token] += e.requested;
  token_metrics m;
  for (std::size_t i = 0; i < p.tokens.size(); ++i) {
    const token_timing& x = p.tokens[i];
    const double sys = x.mgmt_ms - (s.request_ms - s.request_sys_ms) * requested[i];
    const double user = x.compute_ms + s.request_user_ms * requested[i];
    m.wall_ms.push_back(slow * x.wall_ms);
    m.stall_ms.push_back(slow * (x.wall_ms - user - sys));
    m.mgmt_ms.push_back(std::nan(""));
    m.compute_ms.push_back(slow * (user + sys));
    m.read_bytes.push_back(static_cast<double>(x.demanded_bytes));
    m.io_ms.push_back(std::nan(""));
    m.cpu_ms.push_back(slow * (user + sys));
    m.sys_ms.push_back(slow * sys);
  }
  return m;
}

}  // namespace

TEST_CASE("calibrated on one lab cell's own predicted timings, the fit recovers its parameters") {
  // The exact configuration's loads of the drift trace; metrics made by the
  // model itself; fitted from elsewhere with every token (split all).
  const route_trace t = drift_trace();
  const lab_setup s = drift_setup();
  timing_params truth;
  truth.curve = storage_curve::parse_list("1:200,2:300");
  truth.compute_ms_per_token = 30;
  truth.read_latency_ms = 1.5;
  truth.overlap = 0.2;
  const lab_prediction p = predict_lab(t, lab_config::exact, s, truth);
  CHECK(p.mapping.lanes == 2);
  CHECK(p.summary.tokens == 40);
  CHECK(p.summary.demanded_mib_per_token > 0);
  token_metrics m;
  for (const auto& x : p.tokens) {
    m.wall_ms.push_back(x.wall_ms);
    m.stall_ms.push_back(x.stall_ms);
    m.mgmt_ms.push_back(std::nan(""));
    m.compute_ms.push_back(x.compute_ms);
    m.read_bytes.push_back(static_cast<double>(x.demanded_bytes));
    m.io_ms.push_back(std::nan(""));
  }
  timing_params start;
  start.curve = truth.curve;
  start.lanes = 2;
  calibration_options co;
  co.split = calibration_split::all;
  co.free = static_cast<unsigned>(timing_param::compute_ms_per_token) |
            static_cast<unsigned>(timing_param::read_latency_ms) | static_cast<unsigned>(timing_param::overlap);
  const calibration_result c = calibrate_timing(t.shape(), p.loads, m, start, co);
  CHECK(c.fit.tokens == 40);
  CHECK(c.held_out.tokens == 0);
  CHECK(c.params.compute_ms_per_token == doctest::Approx(30).epsilon(1e-3));
  CHECK(c.params.read_latency_ms == doctest::Approx(1.5).epsilon(1e-3));
  CHECK(c.params.overlap == doctest::Approx(0.2).epsilon(1e-3));
  // resident: the same compute, no reads, so faster than exact.
  const lab_prediction r = predict_lab(t, lab_config::resident, lab_setup{}, truth);
  CHECK(r.summary.demanded_mib_per_token == 0);
  CHECK(r.summary.s_per_token * 1000 == doctest::Approx(30));
  CHECK(r.summary.tok_per_s > p.summary.tok_per_s);
}

TEST_CASE("the lab's calibration fits the wall alone: a probe's stall that holds no kernel time does not mislead it") {
  // The lab's probe records stall = wall - the eval thread's CPU time, and
  // under a memory limit that CPU time holds the kernel's work for the pages
  // read, so its stall is shorter than the model's read time. Made here as a
  // third of the model's stall: calibrate_lab, which fits the wall alone with
  // nothing overlapping the reads, still recovers compute and latency; the
  // phone's calibration, which also fits the stall column, does not.
  const route_trace t = drift_trace();
  const lab_setup s = drift_setup();
  timing_params truth;
  truth.curve = storage_curve::parse_list("1:200,2:300");
  truth.lanes = 2;
  truth.compute_ms_per_token = 30;
  truth.read_latency_ms = 1.5;
  truth.overlap = 0;
  const lab_prediction p = predict_lab(t, lab_config::exact, s, truth);
  token_metrics m;
  double stall = 0;
  for (const auto& x : p.tokens) {
    m.wall_ms.push_back(x.wall_ms);
    m.stall_ms.push_back(x.stall_ms / 3);
    m.mgmt_ms.push_back(std::nan(""));
    m.compute_ms.push_back(x.wall_ms - x.stall_ms / 3);
    m.read_bytes.push_back(static_cast<double>(x.demanded_bytes));
    m.io_ms.push_back(std::nan(""));
    stall += x.stall_ms;
  }
  REQUIRE(stall > 40 * 2.0);  // the reads matter: > 2 ms a token
  timing_params start;
  start.curve = truth.curve;
  start.lanes = 2;
  start.overlap = 0;
  const unsigned free =
      static_cast<unsigned>(timing_param::compute_ms_per_token) | static_cast<unsigned>(timing_param::read_latency_ms);
  const calibration_result c = calibrate_lab(t, lab_config::exact, s, m, start, free);
  CHECK(c.free == std::vector<std::string>{"compute_ms_per_token", "read_latency_ms"});
  CHECK(params_on_bound(c).empty());
  calibration_result degenerate = c;
  degenerate.params.compute_ms_per_token = 0;
  CHECK(params_on_bound(degenerate) == std::vector<std::string>{"compute_ms_per_token"});
  CHECK(c.params.compute_ms_per_token == doctest::Approx(30).epsilon(1e-3));
  CHECK(c.params.read_latency_ms == doctest::Approx(1.5).epsilon(1e-3));
  CHECK(c.params.overlap == 0);
  CHECK(c.params.curve.to_list() == truth.curve.to_list());
  CHECK(c.params.lanes == 2);
  calibration_options co;
  co.split = calibration_split::all;
  co.free = free;
  const calibration_result phone = calibrate_timing(t.shape(), p.loads, m, start, co);
  CHECK(std::abs(phone.params.compute_ms_per_token - 30) > 0.3);

  // A fault-driven cell calibrates on the curve's top bandwidth and hands back the device's curve.
  lab_setup sf = s;
  sf.limit_mib = 2;
  sf.readaround_mib = 0.125;  // 32 pages: a small file
  const lab_prediction pf = predict_lab(t, lab_config::mmap, sf, truth);
  token_metrics mf;
  for (const auto& x : pf.tokens) {
    mf.wall_ms.push_back(x.wall_ms);
    mf.stall_ms.push_back(0);
    mf.mgmt_ms.push_back(std::nan(""));
    mf.compute_ms.push_back(x.wall_ms);
    mf.read_bytes.push_back(static_cast<double>(x.demanded_bytes));
    mf.io_ms.push_back(std::nan(""));
  }
  const calibration_result cf = calibrate_lab(t, lab_config::mmap, sf, mf, start, free);
  CHECK(cf.params.compute_ms_per_token == doctest::Approx(30).epsilon(1e-3));
  CHECK(cf.params.read_latency_ms == doctest::Approx(1.5).epsilon(1e-3));
  CHECK(cf.params.curve.to_list() == truth.curve.to_list());
}

TEST_CASE(
    "with the eval thread's user and kernel time, the lab's calibration pins compute, kernel CPU per MiB and bandwidth "
    "apart") {
  // The probe's cpu_ms = user + sys; sys_ms is the kernel's part. Made here
  // from the model itself with κ = 0.4 ms per MiB and β = 1.5 on a flat
  // curve, where the reads' time and the kernel's are both proportional to
  // the MiB read: the wall alone cannot tell them apart, sys_ms does.
  const route_trace t = drift_trace();
  const lab_setup s = drift_setup();
  const timing_params truth = kernel_truth();
  const lab_prediction p = predict_lab(t, lab_config::exact, s, truth);
  token_metrics m;
  double kernel = 0;
  for (const auto& x : p.tokens) {
    m.wall_ms.push_back(x.wall_ms);
    m.stall_ms.push_back(x.wall_ms - x.compute_ms - x.mgmt_ms);
    m.mgmt_ms.push_back(std::nan(""));
    m.compute_ms.push_back(x.compute_ms + x.mgmt_ms);  // the probe writes cpu_ms here
    m.read_bytes.push_back(static_cast<double>(x.demanded_bytes));
    m.io_ms.push_back(std::nan(""));
    m.cpu_ms.push_back(x.compute_ms + x.mgmt_ms);
    m.sys_ms.push_back(x.mgmt_ms);
    kernel += x.mgmt_ms;
  }
  REQUIRE(kernel > 40 * 0.5);  // the kernel's time matters: > 0.5 ms a token
  const timing_params start = kernel_start();
  const calibration_result c = calibrate_lab(t, lab_config::exact, s, m, start);
  CHECK(c.free == std::vector<std::string>{"compute_ms_per_token", "bandwidth_scale", "read_cpu_ms_per_mib"});
  CHECK(c.params.compute_ms_per_token == doctest::Approx(30).epsilon(1e-3));
  CHECK(c.params.bandwidth_scale == doctest::Approx(1.5).epsilon(1e-3));
  CHECK(c.params.read_cpu_ms_per_mib == doctest::Approx(0.4).epsilon(1e-3));
  CHECK(params_on_bound(c).empty());

  // Without the two columns nothing measures κ: it is not fitted, and stays 0.
  token_metrics old = m;
  old.cpu_ms.clear();
  old.sys_ms.clear();
  const calibration_result w = calibrate_lab(t, lab_config::exact, s, old, start);
  CHECK(w.free == std::vector<std::string>{"compute_ms_per_token", "bandwidth_scale"});
  CHECK(w.params.read_cpu_ms_per_mib == 0);
  // ... and nothing else is left free when only κ was asked for.
  CHECK_THROWS_WITH_AS(
      calibrate_lab(t, lab_config::exact, s, old, start, static_cast<unsigned>(timing_param::read_cpu_ms_per_mib)),
      doctest::Contains("needs the metrics' sys_ms"), error);
}

namespace {

/// One layer of 8 experts, k = 2; the prompt routes {0, 1}; four decode
/// tokens {0, 1}, {1, 2}, {0, 1}, {3, 4}.
route_trace manager_trace() { return toy_trace(1, 8, 2, {0}, {{{0, 1}}, {{1, 2}}, {{0, 1}}, {{3, 4}}}); }

lab_setup manager_setup() {
  lab_setup s;
  s.limit_mib = 1;
  s.dense_mib = page / 1048576.0;
  s.overhead_mib = 0;
  s.budget_mib = 2 * 3 * page / 1048576.0;  // the pinned cache holds two experts
  return s;
}

token_metrics flat_metrics(std::size_t n, double wall, double sys) {
  token_metrics m;
  m.wall_ms.assign(n, wall);
  m.sys_ms.assign(n, sys);
  m.cpu_ms.assign(n, wall);
  return m;
}

}  // namespace

TEST_CASE("the manager's counts: exact requests every routed expert, the pinned cache counts its decode misses") {
  const route_trace t = manager_trace();
  lab_setup s = manager_setup();
  CHECK(map_lab_config(lab_config::exact, s).requests_routed);
  CHECK(map_lab_config(lab_config::exact, s).pinned_mib == 0);
  for (lab_config c : {lab_config::cache, lab_config::all, lab_config::degraded}) {
    CHECK_FALSE(map_lab_config(c, s).requests_routed);
    CHECK(map_lab_config(c, s).pinned_mib == doctest::Approx(s.budget_mib));
  }
  // An LRU of two experts over the decode batches only, by hand: {0,1} two
  // misses; {1,2} one (2; 0 evicted); {0,1} one (0; 2 evicted, 1 being in the
  // batch); {3,4} two. Had the prompt's {0, 1} warmed it, the first would hit.
  s.request_ms = 0.25;
  s.pin_ms = 1.5;
  timing_params p;
  p.curve = storage_curve::parse_list("1:1000");
  p.compute_ms_per_token = 10;
  p.overlap = 0;
  const lab_prediction cache = predict_lab(t, lab_config::cache, s, p);
  REQUIRE(cache.loads.size() == 4);
  const std::vector<std::uint16_t> pins{2, 1, 1, 2};
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(cache.loads[i].pinned == pins[i]);
    CHECK(cache.loads[i].requested == 0);
  }
  const lab_prediction exact = predict_lab(t, lab_config::exact, s, p);
  for (const load_event& e : exact.loads) {
    CHECK(e.requested == 2);
    CHECK(e.pinned == 0);
  }
  // Each costs its measured price in the token's wall, on top of the same
  // prediction without it.
  lab_setup none = s;
  none.request_ms = none.pin_ms = 0;
  const lab_prediction cache0 = predict_lab(t, lab_config::cache, none, p);
  const lab_prediction exact0 = predict_lab(t, lab_config::exact, none, p);
  for (std::size_t i = 0; i < 4; ++i) {
    // The cache alone locks inline (ψ = 1): the pins' work also hides as much
    // of the reads' device time (one layer, so per token as per load).
    CHECK(cache.tokens[i].mgmt_ms - cache0.tokens[i].mgmt_ms == doctest::Approx(1.5 * pins[i]));
    CHECK(cache0.tokens[i].stall_ms - cache.tokens[i].stall_ms ==
          doctest::Approx(std::min(cache0.tokens[i].stall_ms, 1.5 * pins[i])));
    CHECK(exact.tokens[i].wall_ms - exact0.tokens[i].wall_ms == doctest::Approx(0.25 * 2));
  }
  // With exact reads (`all`) the misses are locked on the two lanes, in
  // parallel: each pin costs the eval thread's wall half its inline price,
  // and none of it is the eval thread's kernel time; the cache alone locks inline.
  CHECK(map_lab_config(lab_config::cache, s).reads_inline);  // ψ = 1: its own kernel work hides its reads
  for (lab_config c : {lab_config::exact, lab_config::all, lab_config::degraded, lab_config::mmap})
    CHECK_FALSE(map_lab_config(c, s).reads_inline);
  CHECK_FALSE(map_lab_config(lab_config::cache, s).pins_on_lanes);
  CHECK_FALSE(map_lab_config(lab_config::exact, s).pins_on_lanes);
  s.pin_sys_ms = 1.0;
  for (lab_config c : {lab_config::all, lab_config::degraded}) {
    const lab_mapping m = map_lab_config(c, s);
    CHECK(m.pins_on_lanes);
    CHECK(m.lanes == 2);
    CHECK(m.pin_ms(s) == doctest::Approx(0.75));
    CHECK(m.pin_off_cpu_ms(s) == doctest::Approx(0.75));
  }
  CHECK(map_lab_config(lab_config::cache, s).pin_ms(s) == doctest::Approx(1.5));
  CHECK(map_lab_config(lab_config::cache, s).pin_off_cpu_ms(s) == doctest::Approx(0.5));
  lab_setup nospec = s;
  nospec.stale_gate_pct = 0;  // `all` speculates nothing right: its pins are the cache's
  const lab_prediction all = predict_lab(t, lab_config::all, nospec, p);
  lab_setup nospec0 = nospec;
  nospec0.request_ms = nospec0.pin_ms = 0;
  const lab_prediction all0 = predict_lab(t, lab_config::all, nospec0, p);
  REQUIRE(all.loads.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(all.loads[i].pinned == pins[i]);
    CHECK(all.tokens[i].wall_ms - all0.tokens[i].wall_ms ==
          doctest::Approx(0.75 * pins[i] + 0.25 * all.loads[i].requested));
  }
  // The fault-driven and resident cells request nothing of the manager.
  for (lab_config c : {lab_config::mmap, lab_config::dense, lab_config::resident}) {
    lab_setup f = s;
    if (c == lab_config::resident) f.limit_mib = 0;
    for (const load_event& e : predict_lab(t, c, f, p).loads) {
      CHECK(e.requested == 0);
      CHECK(e.pinned == 0);
    }
  }
}

TEST_CASE("cache's inline path measured in the cell's shape: its reads and pins at the walk's ms per MiB, by hand") {
  // The pinned cache's misses of manager_trace (pins 2, 1, 1, 2 above), read inline. With the walk
  // a token is C + MiB read x (off-CPU + kernel ms per MiB) + the pins' user time: the walk's
  // wall holds the device time and the overlap there is, its kernel time the pins' own.
  const route_trace t = manager_trace();
  lab_setup s = manager_setup();
  s.pin_ms = 1.5, s.pin_sys_ms = 1.0, s.pin_user_ms = 0.25;
  s.inline_walk_off_cpu_ms_per_mib = 0.5;
  s.inline_walk_sys_ms_per_mib = 1.25;
  timing_params p;
  p.curve = storage_curve::parse_list("1:100,2:200");
  p.compute_ms_per_token = 10;
  p.overlap = 0;
  p.read_latency_ms = 0.5;
  p.read_cpu_ms_per_mib = 7;  // κ, the lanes': not the inline path's once it is measured
  const lab_prediction lp = predict_lab(t, lab_config::cache, s, p);
  REQUIRE(lp.tokens.size() == 4);
  REQUIRE(lp.loads.size() == 4);
  double read = 0;
  const std::vector<std::uint16_t> pins{2, 1, 1, 2};
  for (std::size_t i = 0; i < 4; ++i) {
    const double mib = to_mib(lp.loads[i].demanded_bytes);
    read += mib;
    CHECK(lp.loads[i].pinned == pins[i]);
    CHECK(lp.tokens[i].stall_ms == doctest::Approx(0.5 * mib));
    CHECK(lp.tokens[i].wall_ms == doctest::Approx(10 + mib * (0.5 + 1.25) + 0.25 * pins[i]));
  }
  REQUIRE(read > 0);  // the page cache's first misses: the walk's price is paid
  // β, λ, κ and the pins' measured total no longer move the cell.
  timing_params q = p;
  q.bandwidth_scale = 3;
  q.read_latency_ms = 4;
  q.read_cpu_ms_per_mib = 0.1;
  lab_setup dearer = s;
  dearer.pin_ms = 9, dearer.pin_sys_ms = 8;
  const lab_prediction lq = predict_lab(t, lab_config::cache, dearer, q);
  for (std::size_t i = 0; i < 4; ++i) CHECK(lq.tokens[i].wall_ms == doctest::Approx(lp.tokens[i].wall_ms));
  // Without the walk: κ = 7 per MiB and ν_p = 1.5 per pin, which hide the reads (ψ = 1).
  lab_setup plain = s;
  plain.inline_walk_off_cpu_ms_per_mib = plain.inline_walk_sys_ms_per_mib = 0;
  const lab_prediction l0 = predict_lab(t, lab_config::cache, plain, p);
  for (std::size_t i = 0; i < 4; ++i)
    CHECK(l0.tokens[i].wall_ms - l0.tokens[i].stall_ms ==
          doctest::Approx(10 + 7 * to_mib(l0.loads[i].demanded_bytes) + 1.5 * pins[i]));
  // The lanes' cells ignore it: their reads and pins are the manager's lanes'.
  for (lab_config c : {lab_config::exact, lab_config::all, lab_config::degraded}) {
    const lab_prediction a = predict_lab(t, c, s, p), b = predict_lab(t, c, plain, p);
    REQUIRE(a.tokens.size() == b.tokens.size());
    for (std::size_t i = 0; i < a.tokens.size(); ++i) CHECK(a.tokens[i].wall_ms == b.tokens[i].wall_ms);
  }
}

TEST_CASE("the manager's cost measured with every expert resident: per request and per pin, by hand") {
  const route_trace t = manager_trace();
  const double budget = manager_setup().budget_mib;
  // Requests per token 2 (k = 2, one layer); pins 6 over 4 tokens (above).
  const token_metrics base = flat_metrics(4, 20, 0.5);
  lab_manager_cost c = measure_manager_cost(t, base, flat_metrics(4, 21, 0.75), flat_metrics(4, 23, 1.25), budget);
  CHECK(c.requests_per_token == doctest::Approx(2));
  CHECK(c.pins_per_token == doctest::Approx(1.5));
  CHECK(c.exact_extra_ms == doctest::Approx(1));
  CHECK(c.request_ms == doctest::Approx(0.5));
  CHECK(c.request_sys_ms == doctest::Approx(0.125));
  CHECK(c.pin_ms == doctest::Approx(2));
  CHECK(c.pin_sys_ms == doctest::Approx(0.5));
  // flat_metrics' cpu_ms is its wall: user time 19.5 (base), 20.25 and 21.75 ms a token,
  // i.e. 0.75 / 2 requests and 2.25 / 1.5 pins, all of what the kernel leaves of each.
  CHECK(c.request_user_ms == doctest::Approx(0.375));
  CHECK(c.pin_user_ms == doctest::Approx(1.5));
  {
    // A manager run that waits for its lanes: of 1 ms a token more, 0.25 in the kernel
    // and 0.25 in user time; the rest (0.5) off the CPU. Without cpu_ms, no user part.
    token_metrics waits = flat_metrics(4, 21, 0.75);
    waits.cpu_ms.assign(4, 20.5);
    const lab_manager_cost w = measure_manager_cost(t, base, waits, base, budget);
    CHECK(w.request_ms == doctest::Approx(0.5));
    CHECK(w.request_sys_ms == doctest::Approx(0.125));
    CHECK(w.request_user_ms == doctest::Approx(0.125));
    waits.cpu_ms.clear();
    CHECK(measure_manager_cost(t, base, waits, base, budget).request_user_ms == 0);
  }
  // A manager run no slower than the baseline costs nothing; the kernel part never exceeds the whole.
  c = measure_manager_cost(t, base, flat_metrics(4, 19, 0.5), flat_metrics(4, 20.5, 3), budget);
  CHECK(c.request_ms == 0);
  CHECK(c.request_sys_ms == 0);
  CHECK(c.pin_ms == doctest::Approx(1.0 / 3));
  CHECK(c.pin_sys_ms == doctest::Approx(1.0 / 3));
  CHECK(c.request_user_ms == 0);
  CHECK(c.pin_user_ms == 0);
  CHECK_THROWS_WITH_AS(measure_manager_cost(t, token_metrics{}, base, base, budget),
                       doctest::Contains("the resident-all run has no decode token"), error);
}

TEST_CASE(
    "calibrated with the manager's measured cost, the lab's fit still pins compute, kernel CPU per MiB and bandwidth") {
  // Metrics made by the model with ν_q = 0.2 ms per request, of which 0.05 in
  // the kernel: the eval thread's sys_ms is κ × MiB + 0.05 × requests. The
  // fit must add the 0.15 off the CPU to its kernel-time target; without
  // that, κ would absorb it.
  const route_trace t = drift_trace();
  lab_setup s = drift_setup();
  s.request_ms = 0.2;
  s.request_sys_ms = 0.05;
  const timing_params truth = kernel_truth();
  const lab_prediction p = predict_lab(t, lab_config::exact, s, truth);
  std::vector<double> requested(p.tokens.size(), 0);
  for (const load_event& e : p.loads) requested[e.token] += e.requested;
  REQUIRE(requested[0] > 0);
  const token_metrics m = manager_metrics(p, s);
  const timing_params start = kernel_start();
  const calibration_result c = calibrate_lab(t, lab_config::exact, s, m, start);
  CHECK(c.params.compute_ms_per_token == doctest::Approx(30).epsilon(1e-3));
  CHECK(c.params.bandwidth_scale == doctest::Approx(1.5).epsilon(1e-3));
  CHECK(c.params.read_cpu_ms_per_mib == doctest::Approx(0.4).epsilon(1e-3));
  CHECK(c.params.mgmt_ms_per_request == doctest::Approx(0.2));
  // The same metrics read as if the whole request cost were kernel time: κ moves.
  lab_setup all_sys = s;
  all_sys.request_sys_ms = s.request_ms;
  const calibration_result w = calibrate_lab(t, lab_config::exact, all_sys, m, start);
  CHECK(std::abs(w.params.read_cpu_ms_per_mib - 0.4) > 1e-2);
}

TEST_CASE(
    "the manager's user time leaves the compute target: C is the engine's compute, the manager's calls are not counted "
    "twice") {
  // Metrics made by the model with ν_q = 0.2 ms per request: 0.05 in the
  // kernel, 0.1 in the eval thread's user time, 0.05 off the CPU. The eval
  // thread's user time is then C + 0.1 × requests; the fit must take that
  // 0.1 × requests off its compute target, or C absorbs it.
  const route_trace t = drift_trace();
  lab_setup s = drift_setup();
  s.request_ms = 0.2;
  s.request_sys_ms = 0.05;
  s.request_user_ms = 0.1;
  const timing_params truth = kernel_truth();
  const lab_prediction p = predict_lab(t, lab_config::exact, s, truth);
  const token_metrics m = manager_metrics(p, s);
  const calibration_result c = calibrate_lab(t, lab_config::exact, s, m, kernel_start());
  CHECK(c.params.compute_ms_per_token == doctest::Approx(30).epsilon(1e-3));
  CHECK(c.params.bandwidth_scale == doctest::Approx(1.5).epsilon(1e-3));
  CHECK(c.params.read_cpu_ms_per_mib == doctest::Approx(0.4).epsilon(1e-3));
  // Read as if none of the request were user time, C takes the manager's calls.
  lab_setup no_user = s;
  no_user.request_user_ms = 0;
  const calibration_result w = calibrate_lab(t, lab_config::exact, no_user, m, kernel_start());
  CHECK(w.params.compute_ms_per_token > 30.5);
  // A pin's user time is the eval thread's only where it pins inline (cache alone).
  lab_setup pins = s;
  pins.budget_mib = 1;
  pins.pin_ms = 0.3;
  pins.pin_sys_ms = 0.1;
  pins.pin_user_ms = 0.15;
  CHECK(map_lab_config(lab_config::cache, pins).pin_user_ms(pins) == doctest::Approx(0.15));
  CHECK(map_lab_config(lab_config::cache, pins).pin_off_cpu_ms(pins) == doctest::Approx(0.05));
  CHECK(map_lab_config(lab_config::all, pins).pin_user_ms(pins) == 0);
}

TEST_CASE("a cell measured in several runs is fitted whole: its loads repeated once per run") {
  // The manager's requests cost 0.2 ms, 0.05 of it in the kernel: each run's
  // rows get their own tokens' requests added to the kernel-time target.
  const route_trace t = drift_trace();
  lab_setup s = drift_setup();
  s.request_ms = 0.2;
  s.request_sys_ms = 0.05;
  const timing_params truth = kernel_truth();
  const lab_prediction p = predict_lab(t, lab_config::exact, s, truth);
  const auto made = [&](double slow) { return manager_metrics(p, s, slow); };  // every time slow× the truth's
  const token_metrics one = made(1.0);
  token_metrics twice = one;
  append_token_metrics(twice, one);
  REQUIRE(twice.size() == 2 * one.size());
  CHECK(twice.wall_ms[one.size() + 3] == one.wall_ms[3]);
  CHECK(twice.sys_ms[one.size() + 3] == one.sys_ms[3]);
  const calibration_result a = calibrate_lab(t, lab_config::exact, s, one, kernel_start());
  const calibration_result b = calibrate_lab(t, lab_config::exact, s, twice, kernel_start());
  CHECK(b.params.compute_ms_per_token == doctest::Approx(a.params.compute_ms_per_token).epsilon(1e-6));
  CHECK(b.params.bandwidth_scale == doctest::Approx(a.params.bandwidth_scale).epsilon(1e-6));
  CHECK(b.params.read_cpu_ms_per_mib == doctest::Approx(a.params.read_cpu_ms_per_mib).epsilon(1e-6));
  CHECK(b.params.compute_ms_per_token == doctest::Approx(30).epsilon(1e-3));
  // A run 20% slower and one 20% faster, every time scaled: C and κ are linear in
  // them, so the pooled fit recovers the truth's (each run alone would not).
  token_metrics spread = made(1.2);
  append_token_metrics(spread, made(0.8));
  const calibration_result c = calibrate_lab(t, lab_config::exact, s, spread, kernel_start());
  CHECK(c.params.compute_ms_per_token == doctest::Approx(30).epsilon(1e-3));
  CHECK(c.params.read_cpu_ms_per_mib == doctest::Approx(0.4).epsilon(1e-3));
  const calibration_result slow = calibrate_lab(t, lab_config::exact, s, made(1.2), kernel_start());
  CHECK(slow.params.compute_ms_per_token == doctest::Approx(36).epsilon(1e-3));
  // Rows that are not a whole number of runs.
  token_metrics ragged = one;
  ragged.wall_ms.pop_back();
  for (auto* v : {&ragged.stall_ms, &ragged.mgmt_ms, &ragged.compute_ms, &ragged.read_bytes, &ragged.io_ms,
                  &ragged.cpu_ms, &ragged.sys_ms})
    v->pop_back();
  append_token_metrics(ragged, one);
  CHECK_THROWS_WITH_AS(calibrate_lab(t, lab_config::exact, s, ragged, kernel_start()),
                       doctest::Contains("decode rows but the replay has 40 decode tokens"), error);
}

TEST_CASE("append_token_metrics: a column one run lacks is NaN for its rows") {
  token_metrics a = parse_token_metrics("step,wall_ms,cpu_ms,sys_ms\n1,5,4,1\n", "a.csv");
  append_token_metrics(a, parse_token_metrics("step,wall_ms\n1,6\n2,7\n", "b.csv"));
  REQUIRE(a.size() == 3);
  CHECK(a.wall_ms[2] == 7);
  REQUIRE(a.cpu_ms.size() == 3);
  CHECK(a.cpu_ms[0] == 4);
  CHECK(std::isnan(a.cpu_ms[1]));
  CHECK(std::isnan(a.sys_ms[2]));
}

TEST_CASE(
    "the fault path's own bandwidth scale: untied, a fault cell fits β_f and hands β back, a lanes cell the other way "
    "round") {
  // Metrics made by the model on the drift trace with β = 1.5 for the
  // manager's lanes and β_f = 0.6 for the faults, κ = 0.4 ms per MiB, C = 30.
  const route_trace t = drift_trace();
  lab_setup s = drift_setup();
  s.readaround_mib = 0.5;  // 128 pages: a fault reads two thirds of an expert
  timing_params truth = kernel_truth();
  truth.fault_bandwidth_scale = 0.6;
  const auto measured = [&](lab_config c) {
    const lab_prediction p = predict_lab(t, c, s, truth);
    token_metrics m;
    for (const auto& x : p.tokens) {
      m.wall_ms.push_back(x.wall_ms);
      m.stall_ms.push_back(x.wall_ms - x.compute_ms - x.mgmt_ms);
      m.mgmt_ms.push_back(std::nan(""));
      m.compute_ms.push_back(x.compute_ms + x.mgmt_ms);
      m.read_bytes.push_back(static_cast<double>(x.demanded_bytes));
      m.io_ms.push_back(std::nan(""));
      m.cpu_ms.push_back(x.compute_ms + x.mgmt_ms);
      m.sys_ms.push_back(x.mgmt_ms);
    }
    return std::make_pair(p, m);
  };
  const auto [faults, mf] = measured(lab_config::mmap);
  REQUIRE(faults.mapping.kind == lab_model_kind::faults);
  REQUIRE(faults.summary.stall_ms_per_token > 1);  // the faults' reads matter
  timing_params start = kernel_start();
  // Tied (the default): the one β is fitted on the fault cell, and β_f stays tied to it.
  REQUIRE(start.fault_bandwidth_scale == 0);
  const calibration_result ct = calibrate_lab(t, lab_config::mmap, s, mf, start);
  CHECK(ct.free == std::vector<std::string>{"compute_ms_per_token", "bandwidth_scale", "read_cpu_ms_per_mib"});
  CHECK(ct.params.bandwidth_scale == doctest::Approx(0.6).epsilon(1e-3));
  CHECK(ct.params.fault_bandwidth_scale == 0);
  CHECK(ct.params.fault_scale() == ct.params.bandwidth_scale);
  // Untied: β_f fitted, β kept.
  start.bandwidth_scale = 2.0;  // β as a lanes cell would have fitted it
  start.fault_bandwidth_scale = 1.0;
  const calibration_result cf = calibrate_lab(t, lab_config::mmap, s, mf, start);
  CHECK(cf.free == std::vector<std::string>{"compute_ms_per_token", "fault_bandwidth_scale", "read_cpu_ms_per_mib"});
  CHECK(cf.params.fault_bandwidth_scale == doctest::Approx(0.6).epsilon(1e-3));
  CHECK(cf.params.bandwidth_scale == 2.0);
  CHECK(cf.params.compute_ms_per_token == doctest::Approx(30).epsilon(1e-3));
  CHECK(cf.params.read_cpu_ms_per_mib == doctest::Approx(0.4).epsilon(1e-3));
  CHECK(params_on_bound(cf).empty());
  calibration_result pinned = cf;
  pinned.params.fault_bandwidth_scale = 4;
  CHECK(params_on_bound(pinned) == std::vector<std::string>{"fault_bandwidth_scale"});

  // A lanes cell fits β and keeps the β_f it was given.
  const auto [lanes, ml] = measured(lab_config::exact);
  REQUIRE(lanes.mapping.kind == lab_model_kind::lanes);
  start = kernel_start();
  start.fault_bandwidth_scale = 0.6;
  const calibration_result cl = calibrate_lab(t, lab_config::exact, s, ml, start);
  CHECK(cl.params.bandwidth_scale == doctest::Approx(1.5).epsilon(1e-3));
  CHECK(cl.params.fault_bandwidth_scale == 0.6);
  // ... and with it predicts the fault cell as measured; tied to β it would not.
  CHECK(predict_lab(t, lab_config::mmap, s, cl.params).summary.tok_per_s ==
        doctest::Approx(faults.summary.tok_per_s).epsilon(1e-3));
  start.fault_bandwidth_scale = 0;
  const calibration_result tied = calibrate_lab(t, lab_config::exact, s, ml, start);
  CHECK(tied.params.bandwidth_scale == doctest::Approx(1.5).epsilon(1e-3));
  CHECK(tied.params.fault_scale() == tied.params.bandwidth_scale);
  CHECK(predict_lab(t, lab_config::mmap, s, tied.params).summary.tok_per_s > 1.1 * faults.summary.tok_per_s);
}
