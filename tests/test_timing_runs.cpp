// timing: several recorded runs of one device (issue 51) — a run's
// configuration from its metrics header, rows paired with a trace's tokens by
// read volume (against a brute-force twin), top-k as a lever, the verdict and
// its noise band (against a two-pass twin), a calibration of every term on
// several runs that recovers the parameters of metrics the model itself
// produced, and the phone's A/B campaign (shared/traces/lanes4_k2.csv,
// lanes8_k2.csv, cliff_k4_c1500.csv: gpt-oss-120b, BigMoeOnEdge) predicted
// from one calibrated run.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "moe_residency/timing.hpp"
#include "moe_residency/timing/calibrate.hpp"
#include "moe_residency/timing/recorded_runs.hpp"
#include "support.hpp"

using namespace moe_residency;
using moe_residency_test::read_file;
using moe_residency_test::real_trace;

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

/// The pairing by read volume, slowly: for each row every token's distance,
/// the set at the least one, and the rows that met that same set so far.
std::vector<std::size_t> twin_pairing(const std::vector<std::uint64_t>& tokens, const std::vector<double>& rows) {
  std::map<std::vector<std::size_t>, std::size_t> seen;
  std::vector<std::size_t> out;
  for (double b : rows) {
    double best = HUGE_VAL;
    for (std::uint64_t t : tokens) best = std::min(best, std::abs(static_cast<double>(t) - b));
    std::vector<std::size_t> near;
    for (std::size_t i = 0; i < tokens.size(); ++i)
      if (std::abs(static_cast<double>(tokens[i]) - b) == best) near.push_back(i);
    out.push_back(near[seen[near]++ % near.size()]);
  }
  return out;
}

}  // namespace

TEST_CASE(
    "a run's configuration: from the metrics header, completed from the command line, refused when it conflicts") {
  const std::string text =
      "# bmoe_metrics v1\n"
      "# model=my model.gguf arch=gpt-oss n_layer=36 n_expert=128 n_expert_used=2 threads=4\n"
      "# moe_stream=1 cache_mb=2000 cache_auto=0 io_threads=4 overlap=1 prefetch=0\n"
      "step,steps,wall_ms\n1,1,5\n";
  const run_config c = parse_run_config(text, "r.csv");
  REQUIRE(c.cache_mib);
  CHECK(*c.cache_mib == 2000);
  CHECK(*c.lanes == 4);
  CHECK(*c.top_k == 2);
  CHECK_FALSE(*c.prefetch);
  CHECK(*c.overlap);
  CHECK(c.describe() == "cache 2000 MiB, 4 lanes, top-2, prefetch off, overlap on");
  // Lines after the column header are data, not configuration.
  CHECK_FALSE(parse_run_config("step,wall_ms\n# cache_mb=5\n1,2\n", "late.csv").cache_mib);
  // On the real files the A/B campaign's levers are read back.
  const std::string l4 = real_trace("lanes4_k2.csv"), cl = real_trace("cliff_k4_c1500.csv");
  if (!l4.empty() && !cl.empty()) {
    const run_config a = parse_run_config(read_file(l4), l4), b = parse_run_config(read_file(cl), cl);
    CHECK(*a.lanes == 4);
    CHECK(*a.cache_mib == 2000);
    CHECK(*b.top_k == 4);
    CHECK(*b.cache_mib == 1500);
    CHECK(*b.lanes == 8);
  }
  const run_config given = parse_run_config_list("cache_mb=2000,n_expert_used=2", "--run-config");
  CHECK(merge_run_config(c, given, "r.csv").cache_mib == 2000.0);
  CHECK_THROWS_WITH_AS(merge_run_config(c, parse_run_config_list("io_threads=8", "--run-config"), "r.csv"),
                       "r.csv: io_threads is 4 in the file's header but 8 on the command line; expected the same "
                       "value, or the key in one place",
                       error);
  CHECK_THROWS_WITH_AS(parse_run_config_list("cache_mb=2000,lanes=4", "--run-config"),
                       "--run-config: item 2 of 'cache_mb=2000,lanes=4': unknown key 'lanes'; expected cache_mb, "
                       "io_threads, n_expert_used, prefetch, overlap or cache_auto",
                       error);
  CHECK_THROWS_WITH_AS(parse_run_config_list("cache_mb=2000,", "--run-config"),
                       doctest::Contains("item 2 of 'cache_mb=2000,': ''; expected key=value"), error);
  CHECK_THROWS_WITH_AS(parse_run_config("# io_threads=4 io_threads=8\nwall_ms\n1\n", "dup.csv"),
                       "dup.csv: line 1: io_threads=8, but io_threads=4 before it; expected each key once, or the "
                       "same value",
                       error);
  CHECK_THROWS_WITH_AS(parse_run_config("# cache_mb=-5\nwall_ms\n1\n", "neg.csv"),
                       doctest::Contains("neg.csv: line 1: cache_mb (MiB)"), error);
  CHECK_THROWS_WITH_AS(parse_run_config("# prefetch=2\nwall_ms\n1\n", "p.csv"),
                       doctest::Contains("p.csv: line 1: prefetch (0 or 1)"), error);
  // A run the replay cannot stand for is refused, naming why.
  run_config bad = c;
  bad.prefetch = true;
  CHECK_THROWS_WITH_AS(resolve_run_setup(bad, 2, "r.csv"), doctest::Contains("r.csv: prefetch=1"), error);
  bad = c;
  bad.cache_auto = true;
  CHECK_THROWS_WITH_AS(resolve_run_setup(bad, 2, "r.csv"), doctest::Contains("r.csv: cache_auto=1"), error);
  CHECK_THROWS_WITH_AS(resolve_run_setup(run_config{}, 2, "r.csv"), doctest::Contains("r.csv: no cache budget"), error);
  const run_setup s = resolve_run_setup(c, 2, "r.csv");
  CHECK(s.budget_mib == 2000);
  CHECK(s.lanes == 4);
  CHECK(s.top_k == 2);
}

TEST_CASE("rows paired by read volume: nearest replayed token, equally near ones in turn (a brute-force twin)") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t m = 1 + rng() % 12, n = rng() % 40;
    std::vector<std::uint64_t> tokens(m);
    for (auto& t : tokens) t = (rng() % 6) * 1000;  // few values: many ties
    std::vector<double> rows(n);
    for (auto& r : rows) r = static_cast<double>(rng() % 6000);
    const paired_tokens p = pair_tokens_by_volume(tokens, rows, "trial");
    CAPTURE(trial);
    CHECK(p.replay_token == twin_pairing(tokens, rows));
  }
  // Every token alike (a cache below the token cycle): the rows spread evenly over them.
  const paired_tokens even = pair_tokens_by_volume({5, 5, 5, 5}, std::vector<double>(12, 5.0), "even");
  CHECK(token_weights({even}, 4) == std::vector<double>{3, 3, 3, 3});
  CHECK_THROWS_WITH_AS(pair_tokens_by_volume({5}, {1.0, std::nan("")}, "m.csv"),
                       doctest::Contains("m.csv: row 2: read_bytes nan; expected every row's read_bytes"), error);
  CHECK_THROWS_WITH_AS(pair_tokens_by_step({1, 2}, {}, 3, "m.csv"),
                       doctest::Contains("m.csv: 3 metrics rows, but the replay has 2 decode tokens"), error);
  // The paired loads carry the row's index as their token.
  const std::vector<load_event> loads{load(0, 0, 2, 1, mib), load(1, 0, 2, 2, mib)};
  paired_tokens q;
  q.replay_token = {1, 1, 0};
  const auto pl = paired_loads(loads, q);
  REQUIRE(pl.size() == 3);
  CHECK(pl[0].token == 0);
  CHECK(pl[0].misses == 2);
  CHECK(pl[2].token == 2);
  CHECK(pl[2].misses == 1);
}

TEST_CASE("top-k as a lever: narrower keeps each routing's first slots, wider adds modelled experts by frequency") {
  const std::string gp = real_trace("gptoss.route.csv");
  if (gp.empty()) return;
  const route_trace t = read_route_trace(gp);
  top_k_change c;
  const auto one = with_top_k(t, 1, 1, &c);
  CHECK_FALSE(c.modelled);
  CHECK(one.header().n_expert_used == 1);
  CHECK(one.rows().size() * 2 == t.rows.size());
  for (std::size_t i = 0; i < one.rows().size(); ++i) {
    CHECK(one.rows()[i].slot == 0);
    CHECK(one.rows()[i].expert == t.rows[2 * i].expert);
  }
  const auto four = with_top_k(t, 4, 9, &c);
  CHECK(c.modelled);
  CHECK(four.rows().size() == 2 * t.rows.size());
  CHECK(c.added_slots == t.rows.size());
  // Each routing keeps its two recorded experts first and gains two others, distinct.
  std::map<std::pair<std::size_t, std::size_t>, double> drawn;  // (layer, expert) -> draws
  std::vector<std::map<std::size_t, double>> freq(t.header.n_layer);
  for (const trace_row& r : t.rows) freq[to_index(r.layer)][to_index(r.expert)] += 1;
  for (std::size_t i = 0; i < four.rows().size(); i += 4) {
    const auto* r = &four.rows()[i];
    CHECK(r[0].expert == t.rows[i / 2].expert);
    CHECK(r[1].expert == t.rows[i / 2 + 1].expert);
    std::set<std::size_t> ids{to_index(r[0].expert), to_index(r[1].expert), to_index(r[2].expert),
                              to_index(r[3].expert)};
    CHECK(ids.size() == 4);
    for (int s = 2; s < 4; ++s) {
      CHECK(r[s].slot == s);
      CHECK(r[s].residency == 0);
      // Drawn from the experts the layer routed (it routed far more than four).
      CHECK(freq[to_index(r[s].layer)].count(to_index(r[s].expert)) == 1);
      drawn[{to_index(r[s].layer), to_index(r[s].expert)}] += 1;
    }
  }
  // Proportional to frequency: the layers' most routed experts are drawn more than their least routed.
  double hot = 0, cold = 0;
  for (std::size_t l = 0; l < freq.size(); ++l) {
    std::size_t top = 0, bottom = 0;
    double fmax = -1, fmin = 1e18;
    for (const auto& [e, f] : freq[l]) {
      if (f > fmax) fmax = f, top = e;
      if (f < fmin) fmin = f, bottom = e;
    }
    hot += drawn[{l, top}];
    cold += drawn[{l, bottom}];
  }
  MESSAGE("draws of each layer's most / least routed expert: " << hot << " / " << cold);
  CHECK(hot > 4 * cold);
  // Seeded: the same seed draws the same experts, another seed others.
  const auto again = with_top_k(t, 4, 9);
  const auto other = with_top_k(t, 4, 10);
  std::size_t same = 0, differ = 0;
  for (std::size_t i = 0; i < four.rows().size(); ++i) {
    same += four.rows()[i].expert == again.rows()[i].expert;
    differ += four.rows()[i].expert != other.rows()[i].expert;
  }
  CHECK(same == four.rows().size());
  CHECK(differ > four.rows().size() / 4);
  CHECK_THROWS_WITH_AS(with_top_k(t, 33, 1), doctest::Contains("top-k 33; expected 1 to 32"), error);
  CHECK_THROWS_WITH_AS(with_top_k(t, 0, 1), doctest::Contains("top-k 0; expected 1 to 32"), error);
  // σ from the trace's bytes: 2 × Σ expert bytes over that and Σ dense bytes.
  double ex = 0, de = 0;
  for (std::size_t l = 0; l < t.header.n_layer; ++l)
    ex += 2.0 * static_cast<double>(t.header.expert_bytes[l]), de += static_cast<double>(t.header.dense_bytes[l]);
  CHECK(expert_share_from_bytes(t.header) == doctest::Approx(ex / (ex + de)));
}

TEST_CASE(
    "the verdict: slower above 1 + band, faster below 1 - band; the band twice the standard error of block means") {
  CHECK(judge_ratio(110, 100, 5).verdict == timing_verdict::slower);
  CHECK(judge_ratio(104, 100, 5).verdict == timing_verdict::within_noise);
  CHECK(judge_ratio(94, 100, 5).verdict == timing_verdict::faster);
  CHECK(judge_ratio(94, 100, 5).ratio == doctest::Approx(0.94));
  CHECK(std::string(to_string(timing_verdict::within_noise)) == "within noise");
  CHECK_THROWS_WITH_AS(judge_ratio(0, 100, 5), doctest::Contains("expected finite times > 0"), error);
  CHECK_THROWS_WITH_AS(judge_ratio(1, 100, -1), doctest::Contains("noise band -1"), error);
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<double> w(32 + rng() % 100);
    for (auto& x : w) x = 100 + static_cast<double>(rng() % 1000) / 10;
    // Twin: the blocks' means, their sample variance, two standard errors over the grand mean.
    const std::size_t blocks = w.size() / 16;
    std::vector<double> means;
    for (std::size_t b = 0; b < blocks; ++b) {
      double s = 0;
      for (std::size_t i = 0; i < 16; ++i) s += w[b * 16 + i];
      means.push_back(s / 16);
    }
    double mean = 0;
    for (double m : means) mean += m / static_cast<double>(blocks);
    double ss = 0;
    for (double m : means) ss += (m - mean) * (m - mean);
    const double twin = 200 * std::sqrt(ss / static_cast<double>(blocks - 1) / static_cast<double>(blocks)) / mean;
    CHECK(run_noise_pct(w) == doctest::Approx(twin));
  }
  CHECK(std::isnan(run_noise_pct(std::vector<double>(31, 1.0))));
}

TEST_CASE("calibration on several runs recovers every term from metrics the model itself produced") {
  // Two layers; run A at top-2 on 2 lanes, run B at top-4 on 8 lanes: σ and ν_l are
  // identifiable only because the runs' top-k differ; φ from the faults each token measures;
  // ρ from compute that grows with the MiB read; λ, β from the io_ms of waves of q = 3 requests.
  const model_shape a_shape("toy", 16, 2, {mib, 2 * mib}), b_shape("toy", 16, 4, {mib, 2 * mib});
  timing_params truth;
  truth.requests_per_read = 3;
  truth.pipelined_mgmt = true;
  truth.compute_top_k = 2;
  truth.read_latency_ms = 0.8;
  truth.bandwidth_scale = 0.7;
  truth.compute_ms_per_token = 12;
  truth.expert_compute_share = 0.6;
  truth.overlap = 0.35;
  truth.mgmt_ms_per_read = 0.25;
  truth.mgmt_ms_per_eviction = 0.1;
  truth.mgmt_ms_per_lookup = 0.05;
  truth.compute_ms_per_fault = 0.02;
  truth.compute_ms_per_read_mib = 0.3;
  std::mt19937_64 rng(11);
  auto make_run = [&](const std::string& name, const model_shape& shape, std::size_t lanes, std::uint16_t k) {
    calibration_run r;
    r.name = name;
    r.shape = shape;
    r.lanes = lanes;
    std::vector<double> faults;
    for (std::uint32_t t = 0; t < 60; ++t) {
      faults.push_back(static_cast<double>(rng() % 400));
      for (std::uint16_t l = 0; l < 2; ++l)
        r.loads.push_back(load(t, l, k, static_cast<std::uint16_t>(rng() % (k + 1)), shape.expert_bytes(layer_id(l)),
                               static_cast<std::uint32_t>(rng() % 3)));
    }
    timing_params p = truth;
    p.lanes = lanes;
    for (const auto& x : simulate_timing(shape, p, r.loads, faults)) {
      r.metrics.wall_ms.push_back(x.wall_ms);
      r.metrics.stall_ms.push_back(x.stall_ms);
      r.metrics.mgmt_ms.push_back(x.mgmt_ms);
      r.metrics.compute_ms.push_back(x.compute_ms);
      r.metrics.io_ms.push_back(x.io_ms);
      r.metrics.read_bytes.push_back(static_cast<double>(x.demanded_bytes));
    }
    r.metrics.majflt = faults;
    return r;
  };
  const std::vector<calibration_run> runs{make_run("a", a_shape, 2, 2), make_run("b", b_shape, 8, 4)};
  timing_params start;
  start.requests_per_read = 3;
  start.pipelined_mgmt = true;
  start.compute_top_k = 2;
  calibration_options o;
  o.split = calibration_split::all;
  o.fit_io = true;
  o.free = 0x7ff;  // every parameter
  o.free &= ~static_cast<unsigned>(timing_param::read_cpu_ms_per_mib);
  const calibration_result c = calibrate_timing_runs(runs, start, o);
  CHECK(c.params.compute_ms_per_token == doctest::Approx(12).epsilon(1e-3));
  CHECK(c.params.expert_compute_share == doctest::Approx(0.6).epsilon(1e-3));
  CHECK(c.params.read_latency_ms == doctest::Approx(0.8).epsilon(1e-3));
  CHECK(c.params.bandwidth_scale == doctest::Approx(0.7).epsilon(1e-3));
  CHECK(c.params.overlap == doctest::Approx(0.35).epsilon(1e-3));
  CHECK(c.params.mgmt_ms_per_read == doctest::Approx(0.25).epsilon(1e-3));
  CHECK(c.params.mgmt_ms_per_eviction == doctest::Approx(0.1).epsilon(1e-3));
  CHECK(c.params.mgmt_ms_per_lookup == doctest::Approx(0.05).epsilon(1e-3));
  CHECK(c.params.compute_ms_per_fault == doctest::Approx(0.02).epsilon(1e-3));
  CHECK(c.params.compute_ms_per_read_mib == doctest::Approx(0.3).epsilon(1e-3));
  REQUIRE(c.runs.size() == 2);
  CHECK(c.runs[1].name == "b");
  CHECK(c.runs[0].fit.median_abs_err_pct < 0.01);
  CHECK(c.runs[1].fit.median_abs_err_pct < 0.01);
  // A run whose rows do not match its replay is named.
  std::vector<calibration_run> cut = runs;
  cut[1].metrics.wall_ms.pop_back();
  CHECK_THROWS_WITH_AS(calibrate_timing_runs(cut, start, o),
                       doctest::Contains("calibrate_timing (run b): the replay has 60 decode tokens but the metrics "
                                         "have 59 rows"),
                       error);
  // F_0 and χ: the least-squares line of the fitted tokens' faults on their evicted MiB, both >= 0.
  const auto line = detail::fit_faults_line({0, 1, 2, 3}, {10, 12, 14, 16});
  CHECK(line.first == doctest::Approx(10));
  CHECK(line.second == doctest::Approx(2));
  const auto down = detail::fit_faults_line({0, 1, 2, 3}, {16, 14, 12, 10});  // faults falling with churn: χ held at 0
  CHECK(down.second == 0);
  CHECK(down.first == doctest::Approx(13));
}

TEST_CASE("the phone's A/B campaign: calibrated on 8 lanes, the model predicts 4 lanes and top-4 at 1500 MiB") {
  // docs/wall-clock.md, "The phone's A/B campaign": the engine's structure (q = 3 requests an
  // expert, pipelined making-resident) and every term fitted from lanes8_k2.csv's columns
  // (wall, stall, mgmt, io_ms, majflt); the other two runs only by their headers.
  const std::string tr = real_trace("gptoss.route.csv"), l8 = real_trace("lanes8_k2.csv"),
                    l4 = real_trace("lanes4_k2.csv"), cl = real_trace("cliff_k4_c1500.csv");
  if (tr.empty() || l8.empty() || l4.empty() || cl.empty()) return;
  const route_trace trace = read_route_trace(tr);
  timing_params start;
  start.requests_per_read = 3;
  start.pipelined_mgmt = true;
  calibration_options o;
  o.split = calibration_split::all;
  o.fit_io = true;
  o.free = 0x1f | static_cast<unsigned>(timing_param::bandwidth_scale) |
           static_cast<unsigned>(timing_param::compute_ms_per_fault) |
           static_cast<unsigned>(timing_param::compute_ms_per_read_mib);
  const recorded_run r8 = parse_recorded_run(read_file(l8), l8), r4 = parse_recorded_run(read_file(l4), l4),
                     rc = parse_recorded_run(read_file(cl), cl);
  const runs_calibration cal = calibrate_recorded_runs(trace, {r8}, start, o);
  REQUIRE(cal.pairings.size() == 1);
  CHECK(cal.pairings[0].how == token_pairing::volume);  // 256 rows, a 64-token trace
  CHECK(cal.pairings[0].mean_abs_diff_mib < 10);
  CHECK(cal.result.params.lanes == 8);
  const run_prediction b = predict_recorded_run(trace, r8, cal.result.params, cal.weights);
  for (const recorded_run* r : {&r4, &rc}) {
    const run_prediction p = predict_recorded_run(trace, *r, cal.result.params, cal.weights);
    const ab_comparison ab = compare_runs(p, b, cal.result.params.noise_pct);
    CAPTURE(r->source);
    CAPTURE(ab.err_pct);
    CAPTURE(ab.ratio_err_pct);
    CHECK(std::abs(ab.err_pct) <= 10);
    CHECK(std::abs(ab.ratio_err_pct) <= 10);
    CHECK(ab.sign_right);
    CHECK(ab.measured.ratio > 1);  // both slower than 8 lanes at top-2, as the phone measured
  }
  // The figures the issue quotes: 414 vs 454 ms, and 2.31x.
  CHECK(b.measured_ms == doctest::Approx(414.1).epsilon(0.001));
  CHECK(predict_recorded_run(trace, rc, cal.result.params, cal.weights).measured_ms / b.measured_ms ==
        doctest::Approx(2.31).epsilon(0.002));
}
