// timing: the wall-clock model on hand-computed cases, its config and metrics
// readers, and its calibration against the per-token timings the engine
// recorded on the phone (shared/traces/*.metrics.csv, BigMoeOnEdge commit
// 2d4f2b11db128cbe32da738ce114c0479542f458, docs/bench-data/2026-07-15-route-trace/).

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "moe_residency/timing.hpp"
#include "moe_residency/timing/calibrate.hpp"
#include "support.hpp"

using namespace moe_residency;
using moe_residency_test::read_file;
using moe_residency_test::real_trace;

namespace {

constexpr std::uint64_t mib = 1048576;

load_event load(std::uint32_t token, std::uint16_t layer, std::uint16_t misses, std::uint64_t bytes,
                std::uint32_t evictions = 0) {
  load_event e;
  e.token = token;
  e.layer = layer_id(layer);
  e.routed = std::max<std::uint16_t>(4, misses);
  e.misses = misses;
  e.hits = static_cast<std::uint16_t>(e.routed - misses);
  e.expert_bytes = bytes;
  e.demanded_bytes = misses * bytes;
  e.evictions = evictions;
  return e;
}

/// One lane at 1000 MiB/s, 1 ms of compute a token that drops do not change,
/// every demanded read hidden behind it as far as it goes.
timing_params one_lane() {
  timing_params p;
  p.lanes = 1;
  p.curve = storage_curve({{1, 1000.0}});
  p.compute_ms_per_token = 1.0;
  p.expert_compute_share = 0.0;
  p.overlap = 1.0;
  return p;
}

}  // namespace

TEST_CASE("one layer, one lane, known bytes and bandwidth: the stall by hand") {
  const model_shape shape("one", 16, 4, {2 * mib});
  timing_params p = one_lane();
  p.read_latency_ms = 0.5;
  p.mgmt_ms_per_read = 0.1;
  p.mgmt_ms_per_eviction = 0.2;
  // 3 misses of 2 MiB at 1000 MiB/s on one lane: 3 waves of 0.5 + 2 ms = 7.5 ms;
  // the layer's 1 ms of compute hides 1 ms of it: stall 6.5 ms; management
  // 3 × 0.1 + 2 × 0.2 = 0.7 ms; wall 1 + 0.7 + 6.5 = 8.2 ms.
  CHECK(p.read_ms(3, 2 * mib) == doctest::Approx(7.5));
  const auto ts = simulate_timing(shape, p, {load(0, 0, 3, 2 * mib, 2)});
  REQUIRE(ts.size() == 1);
  CHECK(ts[0].stall_ms == doctest::Approx(6.5));
  CHECK(ts[0].mgmt_ms == doctest::Approx(0.7));
  CHECK(ts[0].compute_ms == doctest::Approx(1.0));
  CHECK(ts[0].wall_ms == doctest::Approx(8.2));
  CHECK(ts[0].demanded_bytes == 6 * mib);
  // Half the overlap: 0.5 ms hidden, stall 7.0 ms.
  p.overlap = 0.5;
  CHECK(simulate_timing(shape, p, {load(0, 0, 3, 2 * mib, 2)})[0].stall_ms == doctest::Approx(7.0));
  // No miss: no stall, only compute.
  CHECK(simulate_timing(shape, p, {load(0, 0, 0, 2 * mib)})[0].wall_ms == doctest::Approx(1.0));
  // A layer whose routing dropped half its experts computes (1 − σ) + σ/2 of its share.
  p.expert_compute_share = 0.6;
  load_event half = load(0, 0, 0, 2 * mib);
  half.dropped = 2;
  CHECK(simulate_timing(shape, p, {half})[0].compute_ms == doctest::Approx(0.4 + 0.3));
}

TEST_CASE("the read CPU per MiB: paid for demanded and speculative MiB, never hidden by overlap") {
  const model_shape shape("one", 16, 4, {2 * mib});
  timing_params p = one_lane();
  p.read_cpu_ms_per_mib = 0.25;
  // 3 misses of 2 MiB: reads 6 ms, 1 ms hidden: stall 5 ms; κ × 6 MiB = 1.5 ms
  // of management, not hidden; wall 1 + 1.5 + 5 = 7.5 ms.
  load_event e = load(0, 0, 3, 2 * mib);
  auto ts = simulate_timing(shape, p, {e});
  REQUIRE(ts.size() == 1);
  CHECK(ts[0].stall_ms == doctest::Approx(5.0));
  CHECK(ts[0].mgmt_ms == doctest::Approx(1.5));
  CHECK(ts[0].wall_ms == doctest::Approx(7.5));
  // Two speculative reads made resident at this load: 2 × 2 MiB more, 1 ms more.
  e.speculative_inserted = 2;
  e.speculative_inserted_bytes = 2 * 2 * mib;
  ts = simulate_timing(shape, p, {e});
  CHECK(ts[0].mgmt_ms == doctest::Approx(2.5));
  CHECK(ts[0].wall_ms == doctest::Approx(8.5));
  // The config file carries it, and refuses a negative one naming it.
  const timing_params q = parse_timing_config(format_timing_config(p), "kappa.cfg");
  CHECK(q.read_cpu_ms_per_mib == doctest::Approx(0.25));
  CHECK_THROWS_WITH_AS(parse_timing_config("read_cpu_ms_per_mib = -1\n", "neg.cfg"),
                       doctest::Contains("read_cpu_ms_per_mib = -1; expected a finite value >= 0"), error);
}

TEST_CASE("the engine thread's own read work hides the reads' device time by ψ (kernel_overlap), and is still paid") {
  const model_shape shape("one", 16, 4, {2 * mib});
  timing_params p = one_lane();
  p.overlap = 0;
  p.read_cpu_ms_per_mib = 0.5;
  p.mgmt_ms_per_pin = 0.25;
  // 3 misses of 2 MiB at 1000 MiB/s: 6 ms of device time. κ × 6 MiB = 3 ms and
  // 2 pins × 0.25 = 0.5 ms of the engine thread's own work: 3.5 ms of management.
  load_event e = load(0, 0, 3, 2 * mib);
  e.pinned = 2;
  CHECK(simulate_timing(shape, p, {e})[0].stall_ms == doctest::Approx(6.0));  // ψ = 0: waits for all of it
  p.kernel_overlap = 1;
  auto ts = simulate_timing(shape, p, {e});
  CHECK(ts[0].stall_ms == doctest::Approx(2.5));  // 6 − 3.5
  CHECK(ts[0].mgmt_ms == doctest::Approx(3.5));   // still paid in full
  CHECK(ts[0].wall_ms == doctest::Approx(1 + 3.5 + 2.5));
  p.kernel_overlap = 0.5;
  CHECK(simulate_timing(shape, p, {e})[0].stall_ms == doctest::Approx(6.0 - 1.75));
  // More own work than device time: no stall, never a negative one.
  p.kernel_overlap = 1;
  p.read_cpu_ms_per_mib = 2;
  ts = simulate_timing(shape, p, {e});
  CHECK(ts[0].stall_ms == 0);
  CHECK(ts[0].wall_ms == doctest::Approx(1 + 12.5));
  // The config file carries it, and refuses a share outside [0, 1] naming it.
  p.kernel_overlap = 0.75;
  CHECK(parse_timing_config(format_timing_config(p), "psi.cfg").kernel_overlap == doctest::Approx(0.75));
  CHECK(timing_params{}.kernel_overlap == 0);
  CHECK_THROWS_WITH_AS(parse_timing_config("kernel_overlap = 1.5\n", "psi.cfg"),
                       doctest::Contains("psi.cfg: timing_params: kernel_overlap = 1.5; expected a share in [0, 1]"),
                       error);
}

TEST_CASE("the manager's own cost: per requested expert and per pinned-cache miss, resident or not") {
  const model_shape shape("one", 16, 4, {2 * mib});
  timing_params p = one_lane();
  p.mgmt_ms_per_request = 0.125;
  p.mgmt_ms_per_pin = 0.5;
  // No read at all (every expert resident): 8 requests × 0.125 + 3 pins × 0.5
  // = 2.5 ms of management on top of the 1 ms of compute, never hidden.
  load_event e = load(0, 0, 0, 2 * mib);
  e.requested = 8;
  e.pinned = 3;
  auto ts = simulate_timing(shape, p, {e});
  REQUIRE(ts.size() == 1);
  CHECK(ts[0].stall_ms == 0);
  CHECK(ts[0].mgmt_ms == doctest::Approx(2.5));
  CHECK(ts[0].wall_ms == doctest::Approx(3.5));
  // A replay's loads leave both counts 0: the parameters then cost nothing.
  ts = simulate_timing(shape, p, {load(0, 0, 0, 2 * mib)});
  CHECK(ts[0].wall_ms == doctest::Approx(1.0));
  // The config file carries them, and refuses a negative one naming it.
  const timing_params q = parse_timing_config(format_timing_config(p), "nu.cfg");
  CHECK(q.mgmt_ms_per_request == doctest::Approx(0.125));
  CHECK(q.mgmt_ms_per_pin == doctest::Approx(0.5));
  CHECK_THROWS_WITH_AS(parse_timing_config("mgmt_ms_per_pin = -0.5\n", "neg.cfg"),
                       doctest::Contains("mgmt_ms_per_pin = -0.5; expected a finite value >= 0"), error);
  CHECK_THROWS_WITH_AS(parse_timing_config("mgmt_ms_per_request = nan\n", "nan.cfg"),
                       "nan.cfg: line 1: mgmt_ms_per_request: 'nan' is not finite; expected a finite number", error);
}

TEST_CASE("two lanes on a curve: waves at the curve's bandwidth, interpolated between points") {
  timing_params p;
  p.lanes = 2;
  p.curve = storage_curve({{1, 1000.0}, {2, 1500.0}, {4, 1500.0}});
  p.read_latency_ms = 0.0;
  const std::uint64_t b = 3 * mib / 2;  // 1.5 MiB
  CHECK(p.curve.mib_per_s(1.5) == doctest::Approx(1250.0));
  CHECK(p.curve.mib_per_s(3) == doctest::Approx(1500.0));
  CHECK(p.curve.mib_per_s(16) == doctest::Approx(1500.0));
  CHECK(p.curve.mib_per_s(0.5) == doctest::Approx(1000.0));
  // One read alone: 1.5 MiB at 1000 MiB/s = 1.5 ms. Two together: 3 MiB at 1500 = 2 ms.
  CHECK(p.read_ms(1, b) == doctest::Approx(1.5));
  CHECK(p.read_ms(2, b) == doctest::Approx(2.0));
  // Three reads on two lanes: a wave of two (2 ms), then one alone (1.5 ms).
  CHECK(p.read_ms(3, b) == doctest::Approx(3.5));
  // Their I/O time, summed over lanes as the engine's io_ms: 2 × 2 + 1 × 1.5 ms.
  CHECK(p.read_io_ms(3, b) == doctest::Approx(5.5));
  // A device delivering half the curve: transfers take twice as long.
  p.bandwidth_scale = 0.5;
  CHECK(p.read_ms(3, b) == doctest::Approx(7.0));
  p.bandwidth_scale = 1.0;
  // Latency is paid per wave: 2 waves × 0.25 ms.
  p.read_latency_ms = 0.25;
  CHECK(p.read_ms(3, b) == doctest::Approx(4.0));
  // Four lanes: one wave of three at the curve's 1500 MiB/s: 4.5 MiB / 1500 = 3 ms (+ 0.25).
  p.lanes = 4;
  CHECK(p.read_ms(3, b) == doctest::Approx(3.25));
}

TEST_CASE("a speculative read that cannot start before the layer ends is cancelled; a started one is waited for") {
  const model_shape shape("two", 16, 4, {mib, 3 * mib / 2});
  timing_params p;
  p.lanes = 1;
  p.curve = storage_curve({{1, 1000.0}});
  p.read_latency_ms = 0.0;
  p.compute_ms_per_token = 2.0;  // 1 ms per layer
  p.expert_compute_share = 0.0;
  p.overlap = 0.0;
  timing_simulator sim(shape, p);
  // Layer 0: no miss, 1 ms of compute: the speculation window is [0, 1) ms.
  sim.on_load(load(0, 0, 0, mib));
  // First read for layer 1 (1.5 MiB, 1.5 ms) starts at 0: admitted, ends at 1.5 ms.
  CHECK(sim.admit(layer_id(1), 3 * mib / 2));
  // The second would start at 1.5 ms, after the layer ended at 1 ms: cancelled.
  CHECK_FALSE(sim.admit(layer_id(1), 3 * mib / 2));
  // Layer 1 (no miss) waits 0.5 ms for the read in flight; overlap 0 hides none of it.
  sim.on_load(load(0, 1, 0, 3 * mib / 2));
  const auto& t = sim.tokens();
  REQUIRE(t.size() == 1);
  CHECK(t[0].speculative_reads == 1);
  CHECK(t[0].speculative_cancelled == 1);
  CHECK(t[0].speculative_bytes == 3 * mib / 2);
  CHECK(t[0].stall_ms == doctest::Approx(0.5));
  CHECK(t[0].wait_ms == doctest::Approx(0.5));
  CHECK(t[0].wall_ms == doctest::Approx(2.5));
  CHECK(t[0].io_ms == doctest::Approx(1.5));  // the cancelled read spent no I/O time
  // Two lanes: both reads share one wave (3 MiB at 1000 MiB/s = 3 ms), so both start.
  p.lanes = 2;
  timing_simulator two(shape, p);
  two.on_load(load(0, 0, 0, mib));
  CHECK(two.admit(layer_id(1), 3 * mib / 2));
  CHECK(two.admit(layer_id(1), 3 * mib / 2));
  two.on_load(load(0, 1, 0, 3 * mib / 2));
  CHECK(two.tokens()[0].stall_ms == doctest::Approx(2.0));
}

TEST_CASE("the timing model decides, read by read, which speculative reads land in the replay") {
  // A long-compute layer admits everything; zero compute and a slow device admit
  // only the first wave after each load, and the cancelled reads never enter the cache.
  route_trace t;
  t.header.arch = "toy";
  t.header.n_layer = 3;
  t.header.n_expert = 8;
  t.header.n_expert_used = 2;
  t.header.expert_bytes = {mib, mib, mib};
  t.header.dense_bytes = {0, 0, 0};
  for (std::uint32_t tok = 0; tok < 40; ++tok)
    for (std::uint16_t l = 0; l < 3; ++l)
      for (std::uint8_t s = 0; s < 2; ++s) {
        trace_row r;
        r.step = tok;
        r.layer = layer_id(l);
        r.slot = s;
        r.expert = expert_id(static_cast<std::uint16_t>((tok * 3 + l * 5 + s * 2) % 8));
        r.weight = s ? 0.3f : 0.7f;
        t.rows.push_back(r);
      }
  const auto in = routed_replay_input::from_trace(t);
  dynamic_replay_options o;
  o.budget_mib = 8;
  o.speculation = parse_replay_speculation("oracle:1");
  o.speculation.cap = 2;
  timing_params fast;
  fast.lanes = 1;
  fast.compute_ms_per_token = 1e4;
  timing_params slow = fast;
  slow.compute_ms_per_token = 0;
  const auto a = predict_timing(in, o, fast), b = predict_timing(in, o, slow);
  CHECK(a.replay.speculation.inserted > 0);
  CHECK(a.summary.speculative_cancelled_per_token == 0);
  CHECK(b.summary.speculative_cancelled_per_token > 0);
  std::uint64_t cancelled = 0;
  for (const auto& e : b.replay.decode_loads) cancelled += e.speculative_cancelled;
  CHECK(b.replay.reads.failed == cancelled);
  CHECK(b.replay.speculation.inserted + cancelled <= a.replay.speculation.inserted + cancelled);
  CHECK(b.replay.cache.decode.hits < a.replay.cache.decode.hits);
  CHECK(a.summary.tokens == 40);
}

TEST_CASE("config, curve and metrics files: round trip and errors that name the input") {
  timing_params p;
  p.lanes = 4;
  p.read_latency_ms = 1.25;
  p.overlap = 0.3;
  p.fault_bandwidth_scale = 0.75;
  const timing_params q = parse_timing_config(format_timing_config(p), "cfg");
  CHECK(q.lanes == 4);
  CHECK(q.read_latency_ms == 1.25);
  CHECK(q.overlap == doctest::Approx(0.3));
  CHECK(q.fault_bandwidth_scale == 0.75);
  CHECK_THROWS_WITH_AS(
      parse_timing_config("fault_bandwidth_scale = -1", "dev.cfg"),
      doctest::Contains("dev.cfg: timing_params: fault_bandwidth_scale = -1; expected a factor in (0, 4], or 0"),
      error);
  CHECK(timing_params{}.fault_bandwidth_scale == 0);  // tied to β by default
  CHECK(parse_timing_config("bandwidth_scale = 2\n", "dev.cfg").fault_scale() == 2);
  CHECK(q.curve.to_list() == "1:1809.9,2:2459.8,4:2457.9,8:2420,12:2360.1,16:2243.9,24:2308.6,32:2254.8");
  // A config without any setting is refused (an empty file would otherwise
  // mean every default, silently), as is a curve_file that is a directory.
  CHECK_THROWS_WITH_AS(parse_timing_config("", "e.cfg"),
                       "e.cfg: no settings (an empty file); expected key = value lines, e.g. compute_ms_per_token = 20",
                       error);
  CHECK_THROWS_WITH_AS(parse_timing_config("# only a comment\n\n  \n", "c.cfg"),
                       doctest::Contains("c.cfg: no settings (only blank and comment lines)"), error);
  CHECK_THROWS_WITH_AS(parse_timing_config("curve_file = .\n", "d.cfg"),
                       "d.cfg: line 1: .: is a directory; expected a lanes CSV file", error);
  CHECK_THROWS_WITH_AS(parse_timing_config("lanes = 2\nspeed = 3\n", "dev.cfg"),
                       doctest::Contains("dev.cfg: line 2: unknown key 'speed'"), error);
  CHECK_THROWS_WITH_AS(parse_timing_config("overlap = 1.5", "dev.cfg"),
                       doctest::Contains("overlap = 1.5; expected a share in [0, 1]"), error);
  CHECK_THROWS_WITH_AS(
      parse_timing_config("lanes = two", "dev.cfg"),
      "dev.cfg: line 1: lanes: 'two' is not a whole number in decimal digits; expected a whole number from 1 to 64",
      error);
  CHECK_THROWS_WITH_AS(storage_curve::parse_list("1:100,1:200"), doctest::Contains("strictly increasing"), error);
  CHECK_THROWS_WITH_AS(storage_curve::parse_list("2"), doctest::Contains("expected lanes:MiB/s pairs"), error);
  const storage_curve c =
      storage_curve::parse_csv("lanes,read_kib,mib_per_s,mean_latency_ms\n1,4096,100,1\n2,4096,150,2\n", "x.csv");
  CHECK(c.mib_per_s(2) == 150.0);
  const token_metrics m = parse_token_metrics("step,wall_ms,stall_ms\n1,10.5,2\n# summary\n2,11,3\n", "m.csv");
  CHECK(m.size() == 2);
  CHECK(m.wall_ms[1] == 11.0);
  CHECK(std::isnan(m.mgmt_ms[0]));
  CHECK_THROWS_WITH_AS(parse_token_metrics("step,wall_ms\n1,x\n", "m.csv"),
                       doctest::Contains("m.csv: line 2, column wall_ms: 'x'"), error);
  CHECK_THROWS_WITH_AS(parse_token_metrics("step,ms\n1,2\n", "m.csv"), doctest::Contains("no wall_ms column"), error);

  SUBCASE("metrics are paired with decode tokens by step, not by their place in the file") {
    // reordered rows: put back in step order
    const token_metrics r = parse_token_metrics("step,wall_ms,stall_ms\n2,20,2\n3,30,3\n1,10,1\n", "r.csv");
    CHECK(r.wall_ms == std::vector<double>{10, 20, 30});
    CHECK(r.stall_ms == std::vector<double>{1, 2, 3});
    // without a step column: by position
    CHECK(parse_token_metrics("wall_ms\n20\n10\n", "p.csv").wall_ms == std::vector<double>{20, 10});
    CHECK_THROWS_WITH_AS(parse_token_metrics("step,wall_ms\n1,10\n3,30\n4,40\n", "gap.csv"),
                         "gap.csv: line 3: step 3, but step 2 is missing; expected steps 1 to 3, one row per "
                         "decode token",
                         error);
    CHECK_THROWS_WITH_AS(parse_token_metrics("step,wall_ms\n1,10\n2,20\n2,21\n", "dup.csv"),
                         "dup.csv: line 4: step 2 again (line 3 has it); expected each decode token's step once",
                         error);
    CHECK_THROWS_WITH_AS(parse_token_metrics("step,wall_ms\n2,10\n3,20\n", "late.csv"),
                         "late.csv: line 2: step 2, but step 1 is missing; expected steps 1 to 2, one row per "
                         "decode token",
                         error);
    CHECK_THROWS_WITH_AS(parse_token_metrics("step,wall_ms\n0,10\n", "zero.csv"),
                         "zero.csv: line 2, column step: '0' is out of range; expected a whole number >= 1", error);
    CHECK_THROWS_WITH_AS(parse_token_metrics("step,wall_ms\n-1,10\n", "neg.csv"),
                         doctest::Contains("neg.csv: line 2, column step: '-1'"), error);
    // a steps column that disagrees with the rows: a file cut short (or two runs merged)
    CHECK_THROWS_WITH_AS(parse_token_metrics("step,steps,wall_ms\n1,3,10\n2,3,20\n", "cut.csv"),
                         "cut.csv: line 2: steps 3 (the run's decode tokens), but the file has 2 rows; expected "
                         "one row per decode token (a cut or merged file?)",
                         error);
    CHECK(parse_token_metrics("step,steps,wall_ms\n1,2,10\n2,2,20\n", "ok.csv").size() == 2);
  }

  const std::string lanes = real_trace("flash-lanes.csv");
  if (lanes.empty()) return;
  // The default curve is the phone's measured one.
  const storage_curve phone = storage_curve::parse_csv(read_file(lanes), lanes);
  CHECK(phone.to_list() == storage_curve().to_list());
}

TEST_CASE("config, curve and metrics files: one rule per encoding, column name, key and empty value") {
  SUBCASE("a UTF-8 byte-order mark is skipped: it no longer hides the first column or key") {
    // Before, the mark made the first column '\xef\xbb\xbfstep': no step column, the rows paired by
    // position and the step check skipped, silently.
    const token_metrics m = parse_token_metrics("\xef\xbb\xbfstep,wall_ms\n2,20\n1,10\n", "m.csv");
    CHECK(m.wall_ms == std::vector<double>{10, 20});
    CHECK(parse_timing_config("\xef\xbb\xbflanes = 3\n", "c.cfg").lanes == 3);
    CHECK(storage_curve::parse_csv("\xef\xbb\xbflanes,mib_per_s\n1,100\n", "l.csv").mib_per_s(1) == 100.0);
  }
  SUBCASE("compressed data and UTF-16 are named, with what to do") {
    const std::string gz("\x1f\x8b\x08\x00\x00", 5);
    CHECK_THROWS_WITH_AS(parse_token_metrics(gz, "m.csv.gz"),
                         "m.csv.gz: is gzip-compressed data (magic bytes 1f 8b); expected a metrics CSV (a header like "
                         "step,steps,wall_ms,...): decompress it first (gunzip -k FILE)",
                         error);
    CHECK_THROWS_WITH_AS(
        parse_timing_config("\x28\xb5\x2f\xfd", "c.cfg.zst"),
        "c.cfg.zst: is zstd-compressed data (magic bytes 28 b5 2f fd); expected a timing config (key = "
        "value lines): decompress it first (zstd -d FILE)",
        error);
    CHECK_THROWS_WITH_AS(storage_curve::parse_csv("\xfe\xff\0l", "l.csv"),
                         "l.csv: is UTF-16 text (byte-order mark fe ff); expected a lanes CSV (a header with lanes and "
                         "mib_per_s): convert it to UTF-8 first (iconv -f UTF-16 -t UTF-8 FILE)",
                         error);
  }
  SUBCASE("a column named twice, or not named, is refused naming both places") {
    CHECK_THROWS_WITH_AS(parse_token_metrics("step,wall_ms,stall_ms,wall_ms\n1,10,1,11\n", "m.csv"),
                         "m.csv: line 1: column 'wall_ms' named twice (columns 2 and 4); expected each column once",
                         error);
    CHECK_THROWS_WITH_AS(parse_token_metrics("# run 1\nstep,,wall_ms\n1,0,10\n", "m.csv"),
                         "m.csv: line 2, column 2: the header names no column here; expected a name in every field of "
                         "'step,,wall_ms'",
                         error);
    CHECK_THROWS_WITH_AS(parse_token_metrics("step,wall_ms,\n1,10,\n", "m.csv"),
                         "m.csv: line 1, column 3: the header names no column here; expected a name in every field of "
                         "'step,wall_ms,'",
                         error);
    CHECK_THROWS_WITH_AS(storage_curve::parse_csv("lanes,mib_per_s,lanes\n1,100,2\n", "l.csv"),
                         "l.csv: line 1: column 'lanes' named twice (columns 1 and 3); expected each column once",
                         error);
  }
  SUBCASE("a configuration key given twice is refused naming both lines") {
    CHECK_THROWS_WITH_AS(parse_timing_config("lanes = 2\noverlap = 0.5\nlanes = 4\n", "c.cfg"),
                         "c.cfg: line 3: lanes: given again (first on line 1); expected each setting once", error);
    // curve and curve_file set the same parameter.
    CHECK_THROWS_WITH_AS(
        parse_timing_config("curve = 1:100\n# the phone\ncurve_file = lanes.csv\n", "c.cfg"),
        "c.cfg: line 3: curve_file: given again (first on line 1, as curve); expected each setting once", error);
  }
  SUBCASE("empty values are errors, in every file") {
    CHECK_THROWS_WITH_AS(parse_timing_config("lanes = 2\ncurve_file =\n", "c.cfg"),
                         "c.cfg: line 2: curve_file: empty value; expected key = value", error);
    CHECK_THROWS_WITH_AS(parse_timing_config("= 3\n", "c.cfg"), "c.cfg: line 1: '= 3' has no key; expected key = value",
                         error);
    CHECK_THROWS_WITH_AS(parse_token_metrics("step,wall_ms,stall_ms\n1,10,\n", "m.csv"),
                         "m.csv: line 2, column stall_ms: empty; expected a finite number >= 0", error);
    CHECK_THROWS_WITH_AS(storage_curve::parse_list("1:100,,4:200"),
                         "storage_curve: point 2 of '1:100,,4:200' is empty; expected lanes:MiB/s pairs like "
                         "1:1809.9,2:2459.8",
                         error);
    CHECK_THROWS_WITH_AS(storage_curve::parse_csv("lanes,mib_per_s\n1,\n", "l.csv"),
                         "l.csv: line 2, column mib_per_s: empty; expected a finite number", error);
  }
  SUBCASE("reals are decimal, in every file") {
    CHECK_THROWS_WITH_AS(
        parse_timing_config("compute_ms_per_token = 0x10\n", "c.cfg"),
        "c.cfg: line 1: compute_ms_per_token: '0x10' is not a decimal number; expected a finite number", error);
    CHECK_THROWS_WITH_AS(
        parse_token_metrics("wall_ms\n0x1p4\n", "m.csv"),
        "m.csv: line 2, column wall_ms: '0x1p4' is not a decimal number; expected a finite number >= 0", error);
  }
  SUBCASE("curve points are numbered from 1 in every message") {
    CHECK_THROWS_WITH_AS(storage_curve::parse_list("1:100,1:200"),
                         "storage_curve: point 2: lanes 1; expected lanes >= 1, strictly increasing", error);
    CHECK_THROWS_WITH_AS(storage_curve::parse_list("0.5:100"),
                         "storage_curve: point 1: lanes 0.5; expected lanes >= 1, strictly increasing", error);
    CHECK_THROWS_WITH_AS(storage_curve::parse_list("1:100,2:x"),
                         "storage_curve: point 2 of '1:100,2:x', MiB/s: 'x' is not a number; expected a finite number",
                         error);
  }
}

TEST_CASE("calibration recovers known parameters from metrics the model itself produced") {
  const model_shape shape("toy", 16, 4, {mib, 2 * mib, mib});
  timing_params truth;
  truth.lanes = 2;
  truth.read_latency_ms = 0.8;
  truth.compute_ms_per_token = 12;
  truth.overlap = 0.35;
  truth.mgmt_ms_per_read = 0.25;
  truth.mgmt_ms_per_eviction = 0.1;
  truth.bandwidth_scale = 0.7;
  std::vector<load_event> loads;
  for (std::uint32_t t = 0; t < 60; ++t)
    for (std::uint16_t l = 0; l < 3; ++l)
      // Misses vary with token and layer (0-6 per layer: one to four waves), so
      // latency (per wave) and overlap (per stalled layer) are separable.
      loads.push_back(load(t, l, static_cast<std::uint16_t>((t * t * 3 + t * 5 + l * 11u) % 7),
                           shape.expert_bytes(layer_id(l)), (t * 5 + l) % 4));
  const auto ts = simulate_timing(shape, truth, loads);
  token_metrics m;
  for (const auto& x : ts) {
    m.wall_ms.push_back(x.wall_ms);
    m.stall_ms.push_back(x.stall_ms);
    m.mgmt_ms.push_back(x.mgmt_ms);
    m.compute_ms.push_back(x.compute_ms);
    m.read_bytes.push_back(static_cast<double>(x.demanded_bytes));
    m.io_ms.push_back(x.io_ms);
  }
  timing_params start;
  start.lanes = 2;
  calibration_options all;
  all.free = 0x3f;  // every parameter, the bandwidth scale too
  all.fit_io = true;
  const calibration_result c = calibrate_timing(shape, loads, m, start, all);
  CHECK(c.params.compute_ms_per_token == doctest::Approx(12).epsilon(1e-3));
  CHECK(c.params.read_latency_ms == doctest::Approx(0.8).epsilon(1e-3));
  CHECK(c.params.overlap == doctest::Approx(0.35).epsilon(1e-3));
  CHECK(c.params.mgmt_ms_per_read == doctest::Approx(0.25).epsilon(1e-3));
  CHECK(c.params.mgmt_ms_per_eviction == doctest::Approx(0.1).epsilon(1e-3));
  CHECK(c.params.bandwidth_scale == doctest::Approx(0.7).epsilon(1e-3));
  CHECK(c.held_out.median_abs_err_pct < 0.01);
  CHECK(c.fit.tokens == 30);
  CHECK(c.held_out.tokens == 30);
  CHECK(calibration_csv(c).rfind("set,tokens,mean_recorded_ms,mean_predicted_ms,median_abs_err_pct\nfit,30,", 0) == 0);
  token_metrics short_m = m;
  short_m.wall_ms.pop_back();
  short_m.stall_ms.pop_back();
  short_m.mgmt_ms.pop_back();
  short_m.io_ms.pop_back();
  CHECK_THROWS_WITH_AS(calibrate_timing(shape, loads, short_m, start),
                       doctest::Contains("the replay has 60 decode tokens but the metrics have 59 rows"), error);
}

namespace {

struct phone_run {
  const char* name;
  double budget;
};

/// For each phone run (Qwen3-30B at 4000 MiB, gpt-oss-120b at 3000 MiB): its
/// recorded trace replayed through LRU at its budget, and the per-token metrics
/// the engine recorded with it, handed to `body(run, in, replay, metrics)`.
/// Stops at a run whose files are missing (real_trace has said so, loudly, or
/// failed under CI=true).
template <class Body>
void for_each_phone_run(Body&& body) {
  for (const phone_run run : {phone_run{"qwen", 4000}, phone_run{"gptoss", 3000}}) {
    const std::string tr = real_trace(std::string(run.name) + ".route.csv");
    const std::string me = real_trace(std::string(run.name) + ".metrics.csv");
    if (tr.empty() || me.empty()) return;
    const auto in = routed_replay_input::from_file(tr);
    dynamic_replay_options o;
    o.budget_mib = run.budget;
    const auto r = replay_dynamic(in, o);
    const token_metrics m = parse_token_metrics(read_file(me), me);
    body(run, in, r, m);
  }
}

}  // namespace

TEST_CASE("the LRU replay's per-token reads are the reads the engine made (*.metrics.csv)") {
  // The engine's read_bytes per token exceed the replay's (reads x expert bytes) by a
  // few KiB per read: it reads an expert's three tensors at page-aligned extents. On
  // Qwen that is exactly 3 x 4096 bytes per read on 127 of the 128 tokens; on gpt-oss
  // it varies per expert. Either way the replay's reads are within 0.5% of the bytes.
  for_each_phone_run(
      [](const phone_run& run, const routed_replay_input& in, const dynamic_replay_result& r, const token_metrics& m) {
        const auto ts = simulate_timing(in.shape(), timing_params{}, r.decode_loads);
        REQUIRE(ts.size() == m.size());
        std::size_t aligned = 0, close = 0;
        for (std::size_t t = 0; t < ts.size(); ++t) {
          const double replayed = static_cast<double>(ts[t].demanded_bytes);
          aligned += m.read_bytes[t] == replayed + 12288.0 * ts[t].demanded_reads;
          close += m.read_bytes[t] >= replayed && m.read_bytes[t] <= replayed * 1.005;
        }
        CAPTURE(run.name);
        CHECK(close == ts.size());
        if (std::string(run.name) == "qwen") CHECK(aligned == 127);
      });
}

TEST_CASE("calibrated on the first half of the phone's tokens, the model predicts the second half") {
  // Targets: held-out median |error| <= 15% of the recorded per-token wall
  // time, mean s/token within 10%. Qwen3-30B at 4000 MiB meets both (asserted). gpt-oss-120b
  // at 3000 MiB does not: its recorded compute alone varies 0.2-12.9 s per token with no
  // relation to routing (docs/wall-clock.md), so only the fit's sanity is asserted there.
  for_each_phone_run(
      [](const phone_run& run, const routed_replay_input& in, const dynamic_replay_result& r, const token_metrics& m) {
        const calibration_result c = calibrate_timing(in.shape(), r.decode_loads, m, timing_params{});
        CAPTURE(run.name);
        CAPTURE(calibration_csv(c));
        CHECK(c.fit.tokens + c.held_out.tokens == m.size());
        CHECK(std::abs(c.fit.mean_predicted_ms / c.fit.mean_recorded_ms - 1) < 0.05);
        // The floor a constant-compute model cannot beat, from the recorded compute alone.
        if (std::string(run.name) == "gptoss") CHECK(c.compute_floor_pct > 50.0);
        if (std::string(run.name) == "qwen") {
          CHECK(c.held_out.median_abs_err_pct <= 15.0);
          CHECK(std::abs(c.held_out.mean_predicted_ms / c.held_out.mean_recorded_ms - 1) <= 0.10);
          CHECK(std::abs(c.held_out.mean_predicted_ms / 177.0 - 1) <= 0.10);  // the summary's 0.177 s/token
        }
      });
}
