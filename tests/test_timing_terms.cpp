// timing: the contention and top-k terms of the wall-clock model (issue 51) —
// q requests per expert read, the pipelined making-resident (5'), compute per
// major fault and per MiB read, management per lookup, compute scaled by
// e_l / k_c — each by hand, and the whole per-load model against a slow
// obvious twin that simulates every request on its lane and the engine
// thread's timeline event by event, on random loads with fixed seeds.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "moe_residency/timing.hpp"

using namespace moe_residency;

namespace {

constexpr std::uint64_t mib = 1048576;

load_event load(std::uint32_t token, std::uint16_t layer, std::uint16_t routed, std::uint16_t misses,
                std::uint64_t bytes, std::uint32_t evictions = 0) {
  load_event e;
  e.token = token;
  e.layer = layer_id(layer);
  e.routed = routed;
  e.misses = misses;
  e.hits = static_cast<std::uint16_t>(routed - misses);
  e.expert_bytes = bytes;
  e.demanded_bytes = misses * bytes;
  e.evictions = evictions;
  return e;
}

/// The twin's storage: the curve's bandwidth at m concurrent requests, by a
/// search over the points written out again (not storage_curve::mib_per_s).
double twin_bandwidth(const timing_params& p, std::size_t m) {
  const auto& pts = p.curve.points();
  const double x = static_cast<double>(m);
  if (x <= pts.front().first) return pts.front().second;
  for (std::size_t i = 0; i + 1 < pts.size(); ++i)
    if (x <= pts[i + 1].first) {
      const double t = (x - pts[i].first) / (pts[i + 1].first - pts[i].first);
      return pts[i].second + t * (pts[i + 1].second - pts[i].second);
    }
  return pts.back().second;
}

struct twin_token {
  double wall = 0, compute = 0, stall = 0, mgmt = 0, io = 0, faults = 0;
};

/// One load, slowly: every request of every demanded read placed on a lane
/// (requests go out expert by expert; a wave is the next n requests, starting
/// when the previous wave ends), each read's end the end of its last
/// request's wave; the engine thread does its matmuls' share ω first, then —
/// pipelined — makes each read resident in read order once it has ended, or —
/// not — waits for the last wave, and is idle whenever it has nothing to do.
twin_token twin_load(const timing_params& p, std::size_t moe_layers, const load_event& e, double measured_faults) {
  twin_token t;
  const double L = static_cast<double>(moe_layers);
  const double executed = e.routed - e.dropped;
  const double share = p.compute_top_k ? executed / static_cast<double>(p.compute_top_k) : executed / e.routed;
  const double read_mib = static_cast<double>(e.demanded_bytes) / mib;
  const double matmul = p.compute_ms_per_token / L * ((1 - p.expert_compute_share) + p.expert_compute_share * share) +
                        p.compute_ms_per_read_mib * read_mib;
  const double evicted_mib = e.evictions * static_cast<double>(e.expert_bytes) / mib;
  const double faults = std::isnan(measured_faults) ? p.faults_per_token / L + p.faults_per_evicted_mib * evicted_mib
                                                    : measured_faults / L;
  t.faults = faults;
  t.compute = matmul + p.compute_ms_per_fault * faults;
  // Requests on lanes.
  const std::size_t q = p.requests_per_read, n = p.lanes, d = e.misses;
  std::vector<double> request_end(d * q);
  double wave_start = 0;
  for (std::size_t first = 0; first < d * q; first += n) {
    const std::size_t m = std::min(n, d * q - first);
    const double per_request_mib = static_cast<double>(e.expert_bytes) / mib / static_cast<double>(q);
    const double dur = p.read_latency_ms +
                       1000.0 * per_request_mib * static_cast<double>(m) / (p.bandwidth_scale * twin_bandwidth(p, m));
    for (std::size_t r = first; r < first + m; ++r) request_end[r] = wave_start + dur;
    t.io += static_cast<double>(m) * dur;
    wave_start += dur;
  }
  const double reads_end = wave_start;
  const double per_read = p.mgmt_ms_per_read + p.read_cpu_ms_per_mib * static_cast<double>(e.expert_bytes) / mib;
  double clock = p.overlap * matmul;  // the engine thread's own work first
  if (d == 0) {
    t.stall = 0;
  } else if (p.pipelined_mgmt) {
    double idle = 0;
    for (std::size_t j = 0; j < d; ++j) {
      const double ends = request_end[j * q + q - 1];
      if (clock < ends) idle += ends - clock, clock = ends;
      clock += per_read;
    }
    t.stall = idle;
  } else {
    t.stall = std::max(0.0, reads_end - clock);
  }
  t.mgmt = per_read * static_cast<double>(d) + p.mgmt_ms_per_eviction * e.evictions +
           p.mgmt_ms_per_lookup * (e.hits + e.misses);
  t.wall = t.compute + t.mgmt + t.stall;
  return t;
}

}  // namespace

TEST_CASE("an expert read as q requests: waves of n requests of b/q, latency per wave") {
  timing_params p;
  p.lanes = 4;
  p.curve = storage_curve({{1, 1000.0}, {2, 1500.0}, {4, 2000.0}, {8, 2000.0}});
  p.read_latency_ms = 0.5;
  const std::uint64_t b = 6 * mib;
  // q = 1: two reads of 6 MiB on 4 lanes, one wave of two: 0.5 + 12 MiB / 1500 MiB/s = 8.5 ms.
  CHECK(p.read_ms(2, b) == doctest::Approx(8.5));
  // q = 3: six requests of 2 MiB, a wave of four (0.5 + 8/2000 s = 4.5 ms) then two (0.5 + 4/1500 s).
  p.requests_per_read = 3;
  CHECK(p.read_ms(2, b) == doctest::Approx(4.5 + 0.5 + 4000.0 / 1500.0));
  CHECK(p.read_io_ms(2, b) == doctest::Approx(4 * 4.5 + 2 * (0.5 + 4000.0 / 1500.0)));
  // Eight lanes take the six at once: 0.5 + 12 MiB at the curve's 2000 MiB/s between 4 and 8.
  p.lanes = 8;
  CHECK(p.read_ms(2, b) == doctest::Approx(0.5 + 6.0));
  // So with q > 1 more lanes than reads still cut a wave's latency: the lever the phone's A/B measured.
  p.lanes = 4;
  const double four = p.read_ms(2, b);
  p.lanes = 8;
  CHECK(p.read_ms(2, b) < four);
  // The config file carries q, and refuses 0.
  CHECK(parse_timing_config("requests_per_read = 3\n", "q.cfg").requests_per_read == 3);
  CHECK_THROWS_WITH_AS(
      parse_timing_config("requests_per_read = 0\n", "q.cfg"),
      doctest::Contains("q.cfg: line 1: requests_per_read: '0' is out of range; expected a whole number from 1 to 16"),
      error);
}

TEST_CASE("pipelined making-resident: the reads done in earlier waves are made resident behind the later ones") {
  const model_shape shape("one", 16, 4, {4 * mib});
  timing_params p;
  p.lanes = 2;
  p.curve = storage_curve({{1, 1000.0}});  // flat: a wave of m requests of 2 MiB takes 2m ms
  p.requests_per_read = 2;
  p.compute_ms_per_token = 0;
  p.overlap = 0;
  p.mgmt_ms_per_read = 3;
  // 3 reads, 6 requests, 3 waves of 2 requests (4 ms each): read j ends at 4(j+1) ms.
  const load_event e = load(0, 0, 4, 3, 4 * mib);
  CHECK(simulate_timing(shape, p, {e})[0].stall_ms == doctest::Approx(12.0));  // (5): waits for the last wave
  p.pipelined_mgmt = true;
  // The engine thread: idle 0-4, read 0 resident 4-7, idle 7-8, read 1 resident 8-11, idle 11-12, read 2 12-15.
  const auto ts = simulate_timing(shape, p, {e});
  CHECK(ts[0].stall_ms == doctest::Approx(4 + 1 + 1));
  CHECK(ts[0].mgmt_ms == doctest::Approx(9.0));  // still paid in full
  CHECK(ts[0].wall_ms == doctest::Approx(15.0));
  // One wave (six requests at once, 12 MiB at the flat 1000 MiB/s): nothing to hide behind, (5) exactly.
  p.lanes = 8;
  CHECK(simulate_timing(shape, p, {e})[0].stall_ms == doctest::Approx(12.0));
  CHECK(parse_timing_config("pipelined_mgmt = 1\n", "pm.cfg").pipelined_mgmt);
  CHECK_THROWS_WITH_AS(parse_timing_config("pipelined_mgmt = 2\n", "pm.cfg"), doctest::Contains("pipelined_mgmt"),
                       error);
}

TEST_CASE("major faults stretch compute by φ each: measured on recorded tokens, F_0 + χ × evicted MiB otherwise") {
  const model_shape shape("two", 16, 4, {2 * mib, 2 * mib});
  timing_params p;
  p.compute_ms_per_token = 10;
  p.expert_compute_share = 0;
  p.overlap = 1;
  p.compute_ms_per_fault = 0.05;
  p.faults_per_token = 100;
  p.faults_per_evicted_mib = 2;
  // Two layers, 3 evictions of 2 MiB at the first: faults 100 + 2 × 6 = 112, 5.6 ms of compute.
  const std::vector<load_event> loads{load(0, 0, 4, 0, 2 * mib, 3), load(0, 1, 4, 0, 2 * mib)};
  auto ts = simulate_timing(shape, p, loads);
  CHECK(ts[0].faults == doctest::Approx(112));
  CHECK(ts[0].fault_ms == doctest::Approx(5.6));
  CHECK(ts[0].compute_ms == doctest::Approx(15.6));
  // A recorded token's measured faults replace the model's; NaN keeps the model's.
  ts = simulate_timing(shape, p, loads, {400});
  CHECK(ts[0].faults == doctest::Approx(400));
  CHECK(ts[0].compute_ms == doctest::Approx(30.0));
  CHECK(simulate_timing(shape, p, loads, {std::nan("")})[0].faults == doctest::Approx(112));
  // A fault waits in the kernel: it does not hide reads (the stall is the one without faults).
  timing_params r = p;
  r.compute_ms_per_fault = 0;
  std::vector<load_event> missing{load(0, 0, 4, 2, 2 * mib), load(0, 1, 4, 1, 2 * mib)};
  const auto with = simulate_timing(shape, p, missing, {1000});
  const auto without = simulate_timing(shape, r, missing, {1000});
  CHECK(with[0].stall_ms == doctest::Approx(without[0].stall_ms));
  CHECK(with[0].wall_ms == doctest::Approx(without[0].wall_ms + 50.0));
}

TEST_CASE("contention: compute grows by ρ per MiB read; lookups cost ν_l each; compute scales by e_l / k_c") {
  const model_shape shape("one", 16, 4, {4 * mib});
  timing_params p;
  p.compute_ms_per_token = 8;
  p.expert_compute_share = 0.5;
  p.overlap = 0;
  p.curve = storage_curve({{1, 4000.0}});
  p.compute_ms_per_read_mib = 0.25;
  p.mgmt_ms_per_lookup = 0.125;
  load_event e = load(0, 0, 4, 2, 4 * mib);
  auto ts = simulate_timing(shape, p, {e});
  CHECK(ts[0].contention_ms == doctest::Approx(0.25 * 8));
  CHECK(ts[0].compute_ms == doctest::Approx(8 + 2));
  CHECK(ts[0].mgmt_ms == doctest::Approx(0.125 * 4));
  // k_c = 0: e_l / r_l, so a top-4 routing computes what a top-2 one does (the model before the lever).
  load_event wide = load(0, 0, 8, 0, 4 * mib);
  p.compute_ms_per_read_mib = 0;
  CHECK(simulate_timing(shape, p, {wide})[0].compute_ms == doctest::Approx(8));
  // k_c = 4 (C measured at top-4): top-8 executes twice the experts, (1 − σ) + σ × 2 = 1.5.
  p.compute_top_k = 4;
  CHECK(simulate_timing(shape, p, {wide})[0].compute_ms == doctest::Approx(12));
  wide.dropped = 4;  // drops still take their share off
  CHECK(simulate_timing(shape, p, {wide})[0].compute_ms == doctest::Approx(8));
  // The config file carries every term and refuses a negative one naming it.
  p.faults_per_token = 7;
  const timing_params q = parse_timing_config(format_timing_config(p), "terms.cfg");
  CHECK(q.compute_top_k == 4);
  CHECK(q.mgmt_ms_per_lookup == doctest::Approx(0.125));
  CHECK(q.faults_per_token == doctest::Approx(7));
  for (const char* key : {"mgmt_ms_per_lookup", "compute_ms_per_fault", "faults_per_token", "faults_per_evicted_mib",
                          "compute_ms_per_read_mib", "noise_pct"})
    CHECK_THROWS_WITH_AS(parse_timing_config(std::string(key) + " = -1\n", "neg.cfg"),
                         doctest::Contains((std::string(key) + " = -1; expected a finite value >= 0").c_str()), error);
}

TEST_CASE("the per-load model against its slow twin, every term at once, on random loads") {
  std::mt19937_64 rng(51);
  auto uni = [&](double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng); };
  auto pick = [&](std::size_t a, std::size_t b) { return std::uniform_int_distribution<std::size_t>(a, b)(rng); };
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t layers = pick(1, 5);
    std::vector<std::uint64_t> bytes;
    for (std::size_t l = 0; l < layers; ++l) bytes.push_back(static_cast<std::uint64_t>(uni(0.5, 16) * mib));
    const model_shape shape("rand", 64, 8, bytes);
    timing_params p;
    p.lanes = pick(1, 8);
    p.curve = storage_curve({{1, uni(500, 1500)}, {2, uni(1500, 2500)}, {8, uni(2000, 3000)}});
    p.requests_per_read = pick(1, 4);
    p.read_latency_ms = uni(0, 3);
    p.bandwidth_scale = uni(0.5, 2);
    p.compute_ms_per_token = uni(0, 200);
    p.expert_compute_share = uni(0, 1);
    p.compute_top_k = pick(0, 8);
    p.overlap = uni(0, 1);
    p.mgmt_ms_per_read = uni(0, 2);
    p.mgmt_ms_per_eviction = uni(0, 0.5);
    p.read_cpu_ms_per_mib = trial % 3 ? 0.0 : uni(0, 0.2);
    p.mgmt_ms_per_lookup = uni(0, 0.2);
    p.compute_ms_per_fault = uni(0, 0.1);
    p.faults_per_token = uni(0, 300);
    p.faults_per_evicted_mib = uni(0, 1);
    p.compute_ms_per_read_mib = uni(0, 0.1);
    p.pipelined_mgmt = trial % 2 == 0;
    const std::size_t tokens = pick(1, 4);
    std::vector<load_event> loads;
    std::vector<double> measured;
    for (std::uint32_t t = 0; t < tokens; ++t) {
      measured.push_back(trial % 4 == 0 ? std::nan("") : uni(0, 2000));
      for (std::uint16_t l = 0; l < layers; ++l) {
        const auto routed = static_cast<std::uint16_t>(pick(1, 8));
        load_event e = load(t, l, routed, static_cast<std::uint16_t>(pick(0, routed)), bytes[l],
                            static_cast<std::uint32_t>(pick(0, 6)));
        e.dropped = static_cast<std::uint16_t>(pick(0, routed - e.misses));
        loads.push_back(e);
      }
    }
    const auto ts = simulate_timing(shape, p, loads, measured);
    REQUIRE(ts.size() == tokens);
    std::vector<twin_token> twin(tokens);
    for (const load_event& e : loads) {
      const twin_token x = twin_load(p, layers, e, measured[e.token]);
      twin[e.token].wall += x.wall, twin[e.token].compute += x.compute, twin[e.token].stall += x.stall;
      twin[e.token].mgmt += x.mgmt, twin[e.token].io += x.io, twin[e.token].faults += x.faults;
    }
    for (std::size_t t = 0; t < tokens; ++t) {
      CAPTURE(trial);
      CAPTURE(t);
      CHECK(ts[t].wall_ms == doctest::Approx(twin[t].wall).epsilon(1e-9));
      CHECK(ts[t].compute_ms == doctest::Approx(twin[t].compute).epsilon(1e-9));
      CHECK(ts[t].stall_ms == doctest::Approx(twin[t].stall).epsilon(1e-9));
      CHECK(ts[t].mgmt_ms == doctest::Approx(twin[t].mgmt).epsilon(1e-9));
      CHECK(ts[t].io_ms == doctest::Approx(twin[t].io).epsilon(1e-9));
      CHECK(ts[t].faults == doctest::Approx(twin[t].faults).epsilon(1e-9));
    }
  }
}

TEST_CASE("a speculative read of q requests fills the waves request by request, and a started one is never cut") {
  const model_shape shape("two", 16, 4, {2 * mib, 2 * mib});
  timing_params p;
  p.lanes = 2;
  p.requests_per_read = 3;
  p.curve = storage_curve({{1, 1000.0}});  // a wave of m requests of 2/3 MiB takes 2m/3 ms
  p.compute_ms_per_token = 20;             // 10 ms a layer: the window
  p.expert_compute_share = 0;
  p.overlap = 0;
  timing_simulator sim(shape, p);
  sim.on_load(load(0, 0, 4, 0, 2 * mib));
  // First read: requests 1-2 in a wave (4/3 ms), request 3 in the next (4/3 ms with the second read's first).
  CHECK(sim.admit(layer_id(1), 2 * mib));
  CHECK(sim.admit(layer_id(1), 2 * mib));
  const auto& t = sim.tokens().back();
  CHECK(t.speculative_reads == 2);
  // Six requests in three waves of two: io = 3 × 2 × 4/3 ms.
  CHECK(t.io_ms == doctest::Approx(8.0));
  // Reads 3 to 6 start before the layer ends at 10 ms (the sixth's last two requests run past it: a
  // started read is never cut); the seventh's first request would open a wave at 12 ms: cancelled.
  for (int i = 0; i < 4; ++i) CHECK(sim.admit(layer_id(1), 2 * mib));
  CHECK_FALSE(sim.admit(layer_id(1), 2 * mib));
  CHECK(sim.tokens().back().speculative_cancelled == 1);
}
