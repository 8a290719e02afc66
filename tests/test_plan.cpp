// The cache-aware drop policy and the drop-aware speculation planner:
// table-driven rule tests (DESIGN.md "Planner", "Drop policy"), rejections
// with their messages, and both compared against slow obvious twins on
// random inputs with fixed seeds.
#include "moe_residency/plan.hpp"

#include <doctest/doctest.h>

#include "alloc_counter.hpp"
#include "support.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <new>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

using namespace moe_residency;

// ---- allocation counter: the hot paths must not allocate ---------------------
using moe_residency_test::g_allocations;

namespace {
// A warning sink that discards: the k <= 4 warning is tested on its own, and
// would otherwise print once per randomly built policy.
const warning_sink quiet = [](const std::string&) {};
}  // namespace

namespace {

// Runs f with the process's stderr (fd 2) redirected to a temporary file and
// returns what was written. Where that cannot be done, runs f and returns "".
#if defined(__unix__) || defined(__APPLE__)
#define MR_TEST_CAN_CAPTURE_STDERR 1
template <class F>
std::string capture_stderr(F&& f) {
  std::fflush(stderr);
  std::FILE* tmp = std::tmpfile();
  REQUIRE(tmp != nullptr);
  const int saved = ::dup(2);
  REQUIRE(saved >= 0);
  REQUIRE(::dup2(::fileno(tmp), 2) >= 0);
  f();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::string out;
  std::rewind(tmp);
  char buf[512];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, tmp)) > 0;) out.append(buf, n);
  std::fclose(tmp);
  return out;
}
#else
#define MR_TEST_CAN_CAPTURE_STDERR 0
template <class F>
std::string capture_stderr(F&& f) {
  f();
  return {};
}
#endif

constexpr float nan_w = std::numeric_limits<float>::quiet_NaN();

layer_id L(unsigned l) { return layer_id(static_cast<std::uint16_t>(l)); }
expert_id E(unsigned e) { return expert_id(static_cast<std::uint16_t>(e)); }

model_shape shape_k(std::size_t k, std::size_t layers = 4) {
  std::vector<std::uint64_t> bytes;
  for (std::size_t l = 0; l < layers; ++l) bytes.push_back(1000 + 100 * l);
  return model_shape("test", 64, k, bytes);
}

routing make_routing(unsigned layer, const std::vector<float>& w, run_phase phase = run_phase::decode) {
  routing r;
  r.layer = L(layer);
  r.phase = phase;
  for (std::size_t s = 0; s < w.size(); ++s) r.push_back(E(static_cast<unsigned>(10 + s)), w[s]);
  return r;
}

using moe_residency_test::fixtures::resident_set;

std::uint32_t mask_of(std::initializer_list<unsigned> slots) {
  std::uint32_t m = 0;
  for (unsigned s : slots) m |= 1u << s;
  return m;
}

}  // namespace

TEST_CASE("drop_policy: the rules, slot by slot") {
  struct row {
    const char* name;
    std::size_t k;
    double f;
    std::vector<float> weights;
    std::set<unsigned> resident;  // expert ids (slot s has id 10 + s)
    run_phase phase;
    bool include_prefill;
    std::uint32_t expected;
  };
  const std::vector<float> w8 = {0.30f, 0.20f, 0.15f, 0.10f, 0.10f, 0.08f, 0.04f, 0.03f};
  const std::vector<row> rows = {
      {"all misses, F=1, k=8: every miss below 1/8 but the top",
       8,
       1.0,
       w8,
       {},
       run_phase::decode,
       false,
       mask_of({3, 4, 5, 6, 7})},
      {"resident experts are hits, never dropped", 8, 1.0, w8, {13, 15}, run_phase::decode, false, mask_of({4, 6, 7})},
      {"every expert resident: nothing dropped",
       8,
       1.0,
       w8,
       {10, 11, 12, 13, 14, 15, 16, 17},
       run_phase::decode,
       false,
       0},
      {"F=0.5 halves the threshold to 1/16", 8, 0.5, w8, {}, run_phase::decode, false, mask_of({6, 7})},
      {"a weight exactly at F/k is kept (strictly below drops)",
       8,
       1.0,
       {0.5f, 0.125f, 0.125f, 0.124f, 0.05f, 0.03f, 0.03f, 0.02f},
       {},
       run_phase::decode,
       false,
       mask_of({3, 4, 5, 6, 7})},
      {"top-weighted below the threshold is still kept (first slot on ties)",
       8,
       1.0,
       {0.05f, 0.05f, 0.05f, 0.05f, 0.05f, 0.05f, 0.05f, 0.05f},
       {},
       run_phase::decode,
       false,
       mask_of({1, 2, 3, 4, 5, 6, 7})},
      {"the top-weighted expert is protected wherever it sits",
       8,
       1.0,
       {0.05f, 0.60f, 0.05f, 0.05f, 0.05f, 0.05f, 0.05f, 0.10f},
       {},
       run_phase::decode,
       false,
       mask_of({0, 2, 3, 4, 5, 6, 7})},
      {"NaN weights are never below the threshold",
       8,
       1.0,
       {0.5f, nan_w, 0.01f, nan_w, 0.2f, 0.01f, nan_w, 0.01f},
       {},
       run_phase::decode,
       false,
       mask_of({2, 5, 7})},
      {"all weights NaN: nothing dropped",
       8,
       1.0,
       {nan_w, nan_w, nan_w, nan_w, nan_w, nan_w, nan_w, nan_w},
       {},
       run_phase::decode,
       false,
       0},
      {"k=1: the only expert is the top one", 1, 1.0, {0.0f}, {}, run_phase::decode, false, 0},
      {"k=2, F=1: 0.3 < 1/2 is dropped", 2, 1.0, {0.7f, 0.3f}, {}, run_phase::decode, false, mask_of({1})},
      {"k=2, F=1: an even split is kept", 2, 1.0, {0.5f, 0.5f}, {}, run_phase::decode, false, 0},
      {"prefill is not eligible by default", 8, 1.0, w8, {}, run_phase::prefill, false, 0},
      {"prefill when asked", 8, 1.0, w8, {}, run_phase::prefill, true, mask_of({3, 4, 5, 6, 7})},
  };
  for (const row& t : rows) {
    CAPTURE(t.name);
    drop_options o;
    o.fraction = t.f;
    o.include_prefill = t.include_prefill;
    o.on_warning = quiet;  // the k <= 4 warning has its own test
    drop_policy p(shape_k(t.k), o);
    const routing r = make_routing(2, t.weights, t.phase);
    const drop_decision d = p.decide(r, resident_set{t.resident});
    CHECK(d.dropped_mask == t.expected);
    CHECK(d.n_dropped == static_cast<unsigned>(__builtin_popcount(t.expected)));
    CHECK(d.bytes_avoided == d.n_dropped * std::uint64_t{1200});  // layer 2 costs 1200 bytes
    double w = 0;
    for (std::size_t s = 0; s < r.size(); ++s)
      if (d.dropped(s)) w += static_cast<double>(r.weight(s));
    CHECK(d.weight_discarded == doctest::Approx(w));
  }
}

TEST_CASE("drop_policy: F = 1.0 exactly is accepted and gives 1/k") {
  drop_policy p(shape_k(8), {1.0, false, {}});
  CHECK(p.threshold() == 0.125);
  CHECK(p.fraction() == 1.0);
  drop_policy q(shape_k(6), {1.0, false, {}});
  CHECK(q.threshold() == doctest::Approx(1.0 / 6.0));
}

TEST_CASE("drop_policy: F outside (0, 1] is rejected with the reason") {
  auto make = [](double f) { return drop_policy(shape_k(8), {f, false, {}}); };
  CHECK_THROWS_WITH_AS(make(0.0),
                       "drop_policy: fraction F = 0 out of range; expected 0 < F <= 1 (F <= 0 never drops; "
                       "disable the policy instead)",
                       error);
  CHECK_THROWS_WITH_AS(make(-0.5),
                       "drop_policy: fraction F = -0.5 out of range; expected 0 < F <= 1 (F <= 0 never drops; "
                       "disable the policy instead)",
                       error);
  CHECK_THROWS_WITH_AS(make(1.5),
                       "drop_policy: fraction F = 1.5 out of range; expected 0 < F <= 1 (F > 1 "
                       "could drop every expert but the top one)",
                       error);
  CHECK_THROWS_WITH_AS(make(1.0000001), doctest::Contains("out of range; expected 0 < F <= 1"), error);
  CHECK_THROWS_WITH_AS(make(std::numeric_limits<double>::infinity()), doctest::Contains("F = inf out of range"), error);
  CHECK_THROWS_WITH_AS(make(std::numeric_limits<double>::quiet_NaN()),
                       "drop_policy: fraction F = nan is not a number; expected 0 < F <= 1", error);
  CHECK_NOTHROW(make(1e-9));
}

TEST_CASE("drop_policy: warns once, through the sink, when k <= 4") {
  std::vector<std::string> got;
  drop_options o;
  o.on_warning = [&](const std::string& s) { got.push_back(s); };
  SUBCASE("k = 4 warns") {
    drop_policy p(shape_k(4), o);
    REQUIRE(got.size() == 1);
    CHECK(got[0] ==
          "drop_policy: top-k 4 <= 4: the drop threshold F/k = 0.25 (F = 1) can remove a large "
          "share of the routing and its weight; watch the router weight discarded in the drop "
          "line");
    CHECK(p.warning() == got[0]);
    // Deciding never warns again.
    p.decide(make_routing(0, {0.7f, 0.1f, 0.1f, 0.1f}), resident_set{});
    p.decide(make_routing(1, {0.7f, 0.1f, 0.1f, 0.1f}), resident_set{});
    CHECK(got.size() == 1);
  }
  SUBCASE("k = 1 warns") {
    drop_policy p(shape_k(1), o);
    CHECK(got.size() == 1);
  }
  SUBCASE("k = 5 does not") {
    drop_policy p(shape_k(5), o);
    CHECK(got.empty());
    CHECK(p.warning().empty());
  }
  SUBCASE("a sink replaces stderr: nothing is printed") {
    const std::string printed = capture_stderr([&] { drop_policy p(shape_k(3), o); });
    CHECK(got.size() == 1);
    CHECK(printed.empty());
  }
  SUBCASE("no sink: printed to stderr, once, like the cache's warning") {
    std::string printed;
    std::string kept;
    printed = capture_stderr([&] {
      drop_policy p(shape_k(2), drop_options{});
      kept = p.warning();
      p.decide(make_routing(0, {0.9f, 0.1f}), resident_set{});  // deciding never warns again
      const drop_policy copy = p;                               // nor does a copy
      static_cast<void>(copy);
    });
    CHECK(got.empty());
    CHECK(kept.find("top-k 2 <= 4") != std::string::npos);
#if MR_TEST_CAN_CAPTURE_STDERR
    CHECK(printed == "moe_residency: warning: " + kept + "\n");
#endif
  }
  SUBCASE("no sink, k = 5: nothing printed") {
    const std::string printed = capture_stderr([] { drop_policy p(shape_k(5), drop_options{}); });
    CHECK(printed.empty());
  }
}

TEST_CASE("drop_policy: the drop line's counters") {
  drop_policy p(shape_k(8), drop_options{});
  // Layer 1 (1100 bytes): slots 3..7 below 1/8; slot 4 resident; slot 1 is a miss above.
  const routing a = make_routing(1, {0.30f, 0.20f, 0.15f, 0.10f, 0.10f, 0.08f, 0.04f, 0.03f});
  const resident_set res{{10, 12, 14}};
  const drop_decision da = p.decide(a, res);
  CHECK(da.dropped_mask == mask_of({3, 5, 6, 7}));
  // A routing with nothing to drop (all resident), and a prefill routing (ineligible).
  p.decide(make_routing(3, {0.5f, 0.5f}), resident_set{{10, 11}});
  p.decide(make_routing(0, {0.9f, 0.01f}, run_phase::prefill), resident_set{});
  const drop_stats& s = p.stats();
  CHECK(s.routings == 2);
  CHECK(s.ineligible == 1);
  CHECK(s.routings_with_drop == 1);
  CHECK(s.experts == 10);
  CHECK(s.experts_dropped == 4);
  CHECK(s.misses == 5);  // slots 1, 3, 5, 6, 7 of the first routing
  CHECK(s.miss_bytes == 5 * 1100);
  CHECK(s.miss_bytes_avoided == 4 * 1100);
  CHECK(s.miss_bytes_avoided_fraction() == doctest::Approx(0.8));
  CHECK(s.weight_total == doctest::Approx(1.0 + 1.0));
  CHECK(s.weight_discarded == doctest::Approx(0.10 + 0.08 + 0.04 + 0.03));
  CHECK(s.weight_discarded_fraction() == doctest::Approx(0.25 / 2.0));
  p.reset_stats();
  CHECK(p.stats().routings == 0);
}

TEST_CASE("drop_policy: decide asks the cache about each routed expert once") {
  drop_policy p(shape_k(8), drop_options{});
  const routing a = make_routing(1, {0.30f, 0.20f, 0.15f, 0.10f, 0.10f, 0.08f, 0.04f, 0.03f});
  const resident_set res{{10, 12, 14}};
  std::size_t asked = 0;
  auto counting = [&](layer_id l, expert_id e) noexcept {
    ++asked;
    return res(l, e);
  };
  const drop_decision d = p.decide(a, counting);
  CHECK(d.dropped_mask == mask_of({3, 5, 6, 7}));
  CHECK(asked == a.size());  // once per slot (it used to ask the candidates twice)
  CHECK(p.stats().misses == 5);
  asked = 0;
  CHECK(p.evaluate(a, counting).dropped_mask == d.dropped_mask);
  CHECK(asked == 5);  // evaluate asks only the slots below the threshold (not the top)
}

TEST_CASE("drop_policy: NaN weights are counted, not summed, never dropped") {
  drop_policy p(shape_k(4), {1.0, false, quiet});
  const drop_decision d = p.decide(make_routing(0, {nan_w, nan_w, 0.01f, nan_w}), resident_set{});
  // slot 2 (0.01) is the only finite weight, hence the top-weighted one: protected.
  CHECK(d.dropped_mask == 0);
  CHECK(p.stats().nan_weights == 3);
  CHECK(p.stats().weight_total == doctest::Approx(0.01));
}

namespace {

using moe_residency_test::fixtures::twin_drop;

}  // namespace

TEST_CASE("drop_policy agrees with a slow twin on random routings (fixed seeds)") {
  for (unsigned seed : {1u, 2u, 3u, 42u}) {
    std::mt19937 rng(seed);
    for (int it = 0; it < 2000; ++it) {
      const std::size_t k = 1 + rng() % 12;
      const double f = std::uniform_real_distribution<double>(0.01, 1.0)(rng);
      drop_policy p(shape_k(k), {it % 7 == 0 ? 1.0 : f, false, quiet});
      routing r;
      r.layer = L(static_cast<unsigned>(rng() % 4));
      std::set<unsigned> resident;
      for (std::size_t s = 0; s < k; ++s) {
        const unsigned id = static_cast<unsigned>(s * 3 + rng() % 3);
        float w = std::uniform_real_distribution<float>(0.0f, 2.0f / static_cast<float>(k))(rng);
        if (rng() % 10 == 0) w = nan_w;
        if (rng() % 13 == 0) w = static_cast<float>(p.threshold());  // exact boundary
        r.push_back(E(id), w);
        if (rng() % 3 == 0) resident.insert(id);
      }
      CAPTURE(seed);
      CAPTURE(it);
      CHECK(p.evaluate(r, resident_set{resident}).dropped_mask == twin_drop(r, p.threshold(), resident));
    }
  }
}

// ---- planner ---------------------------------------------------------------

namespace {

ranking make_ranking(const std::vector<std::pair<unsigned, float>>& entries) {
  ranking r;
  float score = 100.0f;
  for (const auto& e : entries) r.push_back(E(e.first), score--, e.second);
  return r;
}

std::vector<unsigned> ids_of(const speculation_plan& p) {
  std::vector<unsigned> v;
  for (std::size_t i = 0; i < p.size(); ++i) v.push_back(static_cast<unsigned>(p.id(i)));
  return v;
}

}  // namespace

TEST_CASE("speculation_planner: the rules, case by case") {
  // Predicted top-8 of layer 5: ids 20..27, weights descending.
  const ranking pred = make_ranking(
      {{20, 0.30f}, {21, 0.20f}, {22, 0.15f}, {23, 0.10f}, {24, 0.10f}, {25, 0.08f}, {26, 0.04f}, {27, 0.03f}});
  struct row {
    const char* name;
    std::size_t cap;
    std::size_t top_k;
    std::set<unsigned> resident;
    std::optional<double> threshold;
    std::vector<unsigned> expected;
  };
  const std::vector<row> rows = {
      {"cap 2 (default), nothing resident: ranks 0 and 1", 2, 8, {}, {}, {20, 21}},
      {"resident predictions skipped and do not use the cap", 2, 8, {20, 22}, {}, {21, 23}},
      {"every prediction resident: nothing to read", 2, 8, {20, 21, 22, 23, 24, 25, 26, 27}, {}, {}},
      {"cap 0 plans nothing", 0, 8, {}, {}, {}},
      {"cap larger than the misses", 5, 8, {21, 23, 24, 25, 26}, {}, {20, 22, 27}},
      {"armed: misses below the threshold skipped", 8, 8, {}, 0.125, {20, 21, 22}},
      {"armed: weight exactly at the threshold kept", 8, 8, {}, static_cast<double>(0.10f), {20, 21, 22, 23, 24}},
      {"armed: top prediction resident; rank 1 gets no exemption", 2, 8, {20}, 0.25, {}},
      {"top_k bounds the ranks considered", 8, 3, {}, {}, {20, 21, 22}},
      {"top_k = 1: only the top prediction", 2, 1, {}, {}, {20}},
      {"top_k = 1, resident: nothing", 2, 1, {20}, {}, {}},
      {"top_k larger than the ranking", 32, 32, {}, {}, {20, 21, 22, 23, 24, 25, 26, 27}},
  };
  for (const row& t : rows) {
    CAPTURE(t.name);
    const speculation_planner planner(t.cap);
    const speculation_plan p = planner.plan(L(5), pred, t.top_k, resident_set{t.resident}, t.threshold);
    CHECK(ids_of(p) == t.expected);
    CHECK(p.layer == L(5));
    for (std::size_t i = 0; i < p.size(); ++i) {
      CHECK(pred.id(p.rank(i)) == p.id(i));
      CHECK(pred.weight(p.rank(i)) == p.weight(i));
    }
  }
}

TEST_CASE("speculation_planner: the top prediction is kept even below the threshold") {
  // A predictor whose weights say rank 0 is light (e.g. predicted weights from a
  // stale gate disagree with the ranking): rank 0 is read anyway, rank 1 is not.
  const ranking pred = make_ranking({{7, 0.01f}, {8, 0.02f}, {9, 0.60f}});
  const speculation_plan p = speculation_planner(2).plan(L(1), pred, 3, resident_set{}, 0.25);
  CHECK(ids_of(p) == std::vector<unsigned>{7, 9});
  CHECK(p.rank(0) == 0);
  CHECK(p.rank(1) == 2);
  CHECK(p.skipped_below_threshold == 1);
}

TEST_CASE("speculation_planner: NaN predicted weights are never below the threshold") {
  const ranking pred = make_ranking({{1, nan_w}, {2, nan_w}, {3, 0.01f}, {4, nan_w}});
  const speculation_plan p = speculation_planner(3).plan(L(0), pred, 4, resident_set{}, 0.125);
  CHECK(ids_of(p) == std::vector<unsigned>{1, 2, 4});
  CHECK(p.skipped_below_threshold == 1);
}

TEST_CASE("speculation_planner: the skip counters say why") {
  const ranking pred = make_ranking({{1, 0.5f}, {2, 0.01f}, {3, 0.3f}, {1, 0.1f}, {4, 0.1f}});
  const speculation_plan p = speculation_planner(2).plan(L(0), pred, 5, resident_set{{3}}, 0.05);
  CHECK(ids_of(p) == std::vector<unsigned>{1, 4});
  CHECK(p.skipped_below_threshold == 1);  // id 2
  CHECK(p.skipped_resident == 1);         // id 3
  CHECK(p.skipped_duplicate == 1);        // id 1 again at rank 3
  CHECK(p.considered == 5);
}

TEST_CASE("speculation_planner: cap above 32 is rejected") {
  CHECK_THROWS_WITH_AS(speculation_planner(33),
                       "speculation_planner: cap 33 out of range; expected [0, 32] (2 is the "
                       "measured default)",
                       error);
  CHECK(speculation_planner().cap() == 2);
  CHECK_NOTHROW(speculation_planner(32));
}

namespace {

using moe_residency_test::fixtures::twin_plan;

}  // namespace

TEST_CASE("speculation_planner agrees with a slow twin on random inputs (fixed seeds)") {
  for (unsigned seed : {7u, 8u, 9u, 2024u}) {
    std::mt19937 rng(seed);
    for (int it = 0; it < 3000; ++it) {
      const std::size_t n = rng() % 33;
      ranking pred;
      std::set<unsigned> resident;
      for (std::size_t i = 0; i < n; ++i) {
        const unsigned id = static_cast<unsigned>(rng() % 48);  // duplicates happen
        float w = std::uniform_real_distribution<float>(0.0f, 0.4f)(rng);
        if (rng() % 9 == 0) w = nan_w;
        pred.push_back(E(id), 0.0f, w);
        if (rng() % 3 == 0) resident.insert(id);
      }
      const std::size_t cap = rng() % 6;
      const std::size_t top_k = rng() % 34;
      std::optional<double> thr;
      if (rng() % 2) thr = std::uniform_real_distribution<double>(0.0, 0.3)(rng);
      CAPTURE(seed);
      CAPTURE(it);
      const speculation_plan p = speculation_planner(cap).plan(L(3), pred, top_k, resident_set{resident}, thr);
      CHECK(ids_of(p) == twin_plan(pred, top_k, cap, resident, thr));
    }
  }
}

TEST_CASE("planner and drop policy allocate nothing per decision") {
  const ranking pred = make_ranking({{1, 0.5f}, {2, 0.01f}, {3, 0.3f}, {4, 0.1f}});
  const speculation_planner planner(2);
  drop_policy dp(shape_k(8), drop_options{});
  const routing r = make_routing(1, {0.30f, 0.20f, 0.15f, 0.10f, 0.10f, 0.08f, 0.04f, 0.03f});
  auto none = [](layer_id, expert_id) noexcept { return false; };
  const layer_id l0{};
  static_assert(noexcept(planner.plan(l0, pred, 4, none, 0.1)), "planner is noexcept");
  static_assert(noexcept(dp.decide(r, none)), "drop decision is noexcept");
  const long before = g_allocations.load();
  std::size_t planned = 0, dropped = 0;
  for (int i = 0; i < 1000; ++i) {
    planned += planner.plan(L(0), pred, 4, none, 0.1).size();
    dropped += dp.decide(r, none).n_dropped;
  }
  const long after = g_allocations.load();
  CHECK(after - before == 0);
  CHECK(planned == 2000);
  CHECK(dropped == 5000);
}
