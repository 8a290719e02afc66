// Every C++ block of README.md and the docs pages, compiled and run, with
// checks of the numbers and claims the block and its surrounding text state.
// Each block is pasted verbatim (marked "keep in sync"); the last test case
// reads the pages and fails when a ```cpp block is not found here verbatim.
// clang-format leaves each pasted block as the page has it.
// docs/speculation.md and docs/llama-cpp.md are compiled by their own suites.

#include "moe_residency/moe_residency.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "support.hpp"

using namespace moe_residency;

namespace {

// Deterministic uniform values in [-0.5, 0.5) (std::mt19937 is specified bit
// for bit; the std distributions are not).
struct fixed_rng {
  std::mt19937 gen;
  explicit fixed_rng(std::uint32_t seed) : gen(seed) {}
  float next() { return static_cast<float>(gen()) * 0x1.0p-32f - 0.5f; }
};

// What an engine knows about one MoE layer at decode time: the names the
// README and docs/session.md blocks use (router matrix as `router` and `w`).
struct layer {
  layer_id id;
  const std::uint16_t* router;
  const std::uint16_t* w;
  const float* x;
  const expert_id* ids;
  const float* weights;
};

// A synthetic Qwen3-30B-A3B-shaped workload (48 × 128 × 2048, top-8, f16
// routers, seed 1), one decode token generated; built once for the suite.
struct qwen_token {
  synthetic_model model{synthetic_presets::qwen3_30b(element_type::f16)};
  synthetic_stream stream{model};
  std::vector<layer> layers;
  qwen_token() {
    stream.next(1);
    for (std::size_t l = 0; l < model.shape().n_layers(); ++l) {
      const layer_id id = layer_id(static_cast<std::uint16_t>(l));
      const auto* w = static_cast<const std::uint16_t*>(model.router(id).data);
      const routing& r = stream.routed(id, 0);
      layers.push_back({id, w, w, stream.gate_inputs(id), r.ids().data(), r.weights().data()});
    }
  }
};
const qwen_token& qwen() {
  static const qwen_token t;
  return t;
}

// The report of one decode token of 48 MoE layers, top-8: stale-gate cannot
// rank the first layer, prev-token has no previous token, the control
// reproduces every selection.
void check_one_token_report(const std::string& text) {
  CHECK(text.rfind("moe-predict: stale-gate ", 0) == 0);
  CHECK(text.find("fresh-gate control 100.0% (100.0%)") != std::string::npos);
  CHECK(text.find("stale-gate 47 routings/376 slots") != std::string::npos);
  CHECK(text.find("control 48 routings/384 slots; 1 routings the stale-gate could not rank, 48 "
                  "the prev-token could not rank\n") != std::string::npos);
  CHECK(text.find("  layer   stale    prev   ctrl   routings\n") != std::string::npos);
}

// Makes a fresh temporary folder the working directory for one test, with a
// copy of a real trace under the name the docs use; restores it after.
class trace_folder {
 public:
  trace_folder(const std::string& real, const std::string& as) {
    namespace fs = std::filesystem;
    old_ = fs::current_path();
    dir_ = fs::temp_directory_path() / ("moe_residency_test_docs_" + std::to_string(std::random_device{}()));
    fs::create_directories(dir_);
    fs::copy_file(real, dir_ / as, fs::copy_options::overwrite_existing);
    fs::current_path(dir_);
  }
  ~trace_folder() {
    std::error_code ec;
    std::filesystem::current_path(old_, ec);
    std::filesystem::remove_all(dir_, ec);
  }
  trace_folder(const trace_folder&) = delete;
  trace_folder& operator=(const trace_folder&) = delete;

 private:
  std::filesystem::path old_, dir_;
};

std::string fmt1(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

}  // namespace

// ---------------------------------------------------------------------------
TEST_CASE("README.md") {
  const std::string real = moe_residency_test::real_trace("qwen.route.csv");
  if (real.empty()) return;
  const trace_folder folder(real, "qwen.route.csv");
  const std::vector<layer>& moe_layers = qwen().layers;
  const std::uint32_t position = 0;

  // clang-format off
  // README.md, block 1 — keep in sync
#include <moe_residency/moe_residency.hpp>
using namespace moe_residency;

// An engine feeds a session per decode token; it predicts, scores and reports.
standard_session s(presets::qwen3_30b_a3b(8));             // stale-gate, prev-token, control
for (auto& l : moe_layers)
  s.set_router(l.id, matrix_view::f16(l.router, 128, 2048), router_spec::qwen3moe(128, 8));

s.begin_batch(run_phase::decode, position);
for (auto& l : moe_layers) {
  s.gate_input(l.id, l.x, 2048);          // the normalised vector the router multiplies
  s.routed(l.id, l.ids, l.weights, 8);    // what the layer chose, rank order
  s.layer_loaded(l.id);                   // its demanded experts are resident
}
std::fputs(format_text(s.report()).c_str(), stderr);

// Offline: a recorded trace through a byte-budgeted cache, as the engine accounts it.
route_trace trace = read_route_trace("qwen.route.csv");     // CSV or binary
cache_options opt;
opt.budget_bytes = from_mib(4000);                          // MiB = 1048576 bytes
expert_cache<lru_policy> cache(trace.shape(), opt);
  // ---
  // clang-format on

  check_one_token_report(format_text(s.report()));
  // The cache of the block replays the trace as the engine accounted it: LRU's
  // cumulative hit is the phone's 74.9% at 4000 MiB (shared/traces/qwen.summary.txt).
  const load_batches lb = group_load_batches(trace);
  for (const load_batch& b : lb.batches) cache.access_batch(b.phase, b.layer, lb.experts_of(b));
  CHECK(fmt1(cache.stats().all.hit_pct()) == "74.9");
  CHECK(trace.shape().top_k() == 6);
}

// ---------------------------------------------------------------------------
TEST_CASE("docs/overview.md") {
  // clang-format off
  // docs/overview.md, block 1 — keep in sync
#include <moe_residency/core.hpp>
using namespace moe_residency;

model_shape shape = presets::qwen3_30b_a3b(/*k=*/6);   // 48 layers, 128 experts, Q4_K_M bytes
std::uint64_t cycle = token_cycle_bytes(shape);         // Σ expert_bytes(l) × k = 785 MiB
routing r;                                              // ≤ 32 ids + weights, rank order
r.layer = layer_id{3};
r.push_back(expert_id{17}, 0.41f);
  // ---
  // clang-format on

  CHECK(shape.n_layers() == 48);
  CHECK(shape.n_experts() == 128);
  CHECK(shape.top_k() == 6);
  CHECK(fmt1(to_mib(cycle)) == "784.7");  // "= 785 MiB", and docs/cache.md's 784.7 MiB
  CHECK(std::lround(to_mib(cycle)) == 785);
  std::uint64_t sum = 0;
  for (std::size_t l = 0; l < shape.n_layers(); ++l)
    if (shape.is_moe(layer_id(static_cast<std::uint16_t>(l))))
      sum += shape.expert_bytes(layer_id(static_cast<std::uint16_t>(l))) * shape.top_k();
  CHECK(cycle == sum);
  CHECK(max_top_k == 32);
  REQUIRE(r.size() == 1);
  CHECK(r.layer == layer_id{3});
  CHECK(r.id(0) == expert_id{17});
  CHECK(r.weight(0) == 0.41f);
  CHECK(from_mib(1) == 1048576u);
  CHECK_THROWS_WITH_AS(model_shape("m", 128, 33, std::vector<std::uint64_t>(4, 1u << 20)),
                       "model_shape 'm': top-k 33 out of range; expected [1, 32]", error);
}

// ---------------------------------------------------------------------------
TEST_CASE("docs/router.md") {
  // A 128×2048 f16 router and a gate input from a fixed seed.
  fixed_rng rng(7);
  std::vector<std::uint16_t> gate_inp(128 * 2048);
  for (auto& v : gate_inp) v = detail::f32_to_f16_bits(0.05f * rng.next());
  std::vector<float> gate_x(2048);
  for (auto& v : gate_x) v = 2.0f * rng.next();
  const std::uint16_t* gate_inp_bits = gate_inp.data();
  const float* x = gate_x.data();

  // clang-format off
  // docs/router.md, block 1 — keep in sync
#include "moe_residency/router.hpp"
using namespace moe_residency;

const auto w = matrix_view::f16(gate_inp_bits, /*rows=experts*/ 128, /*cols=n_embd*/ 2048);
w.validate("blk.7.ffn_gate_inp");                  // throws error on a bad view
const router_spec spec = router_spec::qwen3moe(128, 8);
router_workspace ws(spec);                          // one per layer; allocates once
routing r;
if (route_token(w, x, spec, r, ws)) {               // gemv + select, noexcept, no allocation
  // r.id(0..7) in rank order, r.weight(0..7) the engine's applied weights
}
  // ---
  // clang-format on

  // Slow obvious twin: logits in double from the f16 weights and the
  // f16-rounded activation; qwen3moe selects the top-8 by softmax, i.e. by logit.
  std::vector<double> logit(128);
  for (std::size_t e = 0; e < 128; ++e) {
    double acc = 0.0;
    for (std::size_t i = 0; i < 2048; ++i)
      acc += static_cast<double>(detail::f16_to_f32(gate_inp[e * 2048 + i])) *
             static_cast<double>(detail::round_to_f16(gate_x[i]));
    logit[e] = acc;
  }
  std::vector<std::size_t> order(128);
  for (std::size_t e = 0; e < 128; ++e) order[e] = e;
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return logit[a] != logit[b] ? logit[a] > logit[b] : a < b; });
  REQUIRE(r.size() == 8);
  double sum = 0.0;
  for (std::size_t i = 0; i < 8; ++i) {
    CHECK(to_index(r.id(i)) == order[i]);  // rank order
    if (i > 0) CHECK(r.weight(i) <= r.weight(i - 1));
    sum += r.weight(i);
  }
  CHECK(sum == doctest::Approx(1.0).epsilon(1e-6));  // qwen3moe normalises the top-k
  CHECK(ws.logits()[order[0]] == doctest::Approx(logit[order[0]]).epsilon(1e-4));
  // validate() throws error naming the view.
  CHECK_THROWS_WITH_AS(matrix_view::f16(nullptr, 128, 2048).validate("blk.7.ffn_gate_inp"),
                       doctest::Contains("blk.7.ffn_gate_inp"), error);
  CHECK_THROWS_AS(matrix_view::f16(gate_inp_bits, 0, 2048).validate("blk.7.ffn_gate_inp"), error);
}

// ---------------------------------------------------------------------------
// clang-format off
// docs/traces.md, block 1 — keep in sync
#include <moe_residency/trace.hpp>

#include <cstdio>
#include <string>
#include <vector>

// Prints how many cache lookups one replay of the trace makes.
std::size_t count_lookups(const std::string& path) {
  using namespace moe_residency;
  const validated_route_trace trace = read_route_trace(path);  // CSV or binary; throws error
  const model_shape shape = trace.shape();  // arch, experts, top-k, bytes per layer
  const load_batches lb = group_load_batches(trace);
  std::size_t lookups = 0;
  for (const load_batch& b : lb.batches) {
    // One lookup per unique (layer, expert) per batch; duplicates only promote.
    std::vector<bool> seen(shape.n_experts(), false);
    for (expert_id e : lb.experts_of(b)) {
      if (!seen[to_index(e)]) ++lookups;
      seen[to_index(e)] = true;
    }
  }
  std::printf("%s: %zu rows, %zu batches, %zu lookups, token cycle %.0f MiB\n", path.c_str(),
              trace.rows().size(), lb.batches.size(), lookups, to_mib(token_cycle_bytes(shape)));
  return lookups;
}
// ---
// clang-format on

TEST_CASE("docs/traces.md") {
  const std::string path = moe_residency_test::real_trace("gptoss.route.csv");
  if (path.empty()) return;
  // Slow twin: one lookup per distinct (layer, expert) per load batch, where a
  // batch is (phase, turn, step, layer) for decode and (turn, layer) for prefill.
  const route_trace t = read_route_trace(path);
  std::set<std::tuple<int, std::uint32_t, std::uint32_t, std::size_t, std::size_t>> seen;
  for (const trace_row& r : t.rows) {
    const bool decode = r.phase == run_phase::decode;
    seen.insert({decode ? 1 : 0, r.turn, decode ? r.step : 0u, to_index(r.layer), to_index(r.expert)});
  }
  const std::size_t lookups = count_lookups(path);
  CHECK(lookups == seen.size());
  CHECK(lookups < t.rows.size());                                   // prefill batches hold duplicates
  CHECK(std::lround(to_mib(token_cycle_bytes(t.shape()))) == 908);  // docs/replay.md: 907.7 MiB
}

// ---------------------------------------------------------------------------
TEST_CASE("docs/session.md") {
  const std::vector<layer>& moe_layers = qwen().layers;
  const std::uint32_t position = 0;

  // clang-format off
  // docs/session.md, block 1 — keep in sync
#include "moe_residency/session.hpp"
using namespace moe_residency;

standard_session s(presets::qwen3_30b_a3b(8));            // shape: layers, experts, k, bytes
for (layer l : moe_layers) s.set_router(l.id, matrix_view::f16(l.w, 128, 2048), router_spec::qwen3moe(128, 8));
// every decode token:
s.begin_batch(run_phase::decode, position);
for (layer l : moe_layers) {
  s.gate_input(l.id, l.x, 2048);                         // the normalised vector the router multiplies
  s.routed(l.id, l.ids, l.weights, 8);                   // what the layer chose (rank order)
  s.layer_loaded(l.id);                                  // its demanded experts are in memory
}
// at the end:
std::fputs(format_text(s.report()).c_str(), stderr);     // the moe-predict report
  // ---
  // clang-format on

  check_one_token_report(format_text(s.report()));
}

// ---------------------------------------------------------------------------
TEST_CASE("docs/cache.md") {
  // One decode token's routing of layer 7 (top-6), and the engine's read.
  const std::vector<expert_id> routed{expert_id{17}, expert_id{3},  expert_id{99},
                                      expert_id{40}, expert_id{17}, expert_id{5}};
  std::vector<expert_id> reads;
  auto read_expert = [&](layer_id l, expert_id e) {
    CHECK(l == layer_id{7});
    reads.push_back(e);
  };

  // clang-format off
  // docs/cache.md, block 1 — keep in sync
#include "moe_residency/cache.hpp"
using namespace moe_residency;

cache_options opt;
opt.budget_bytes = from_mib(4000);               // MiB = 1048576 bytes
opt.guard = cycle_guard::refuse;                 // or warn / off
expert_cache<lru_policy> cache(presets::qwen3_30b_a3b(6), opt);

// per load batch of the engine (prefill: all prompt tokens of one layer, token-major;
// decode: one token of one layer)
cache.begin_batch(run_phase::decode, layer_id{7});
for (expert_id e : routed) {
  if (cache.lookup(e) == lookup_result::miss) read_expert(layer_id{7}, e);
}
cache.end_batch();                               // evicts here, never what this batch touched
// or: cache.access_batch(run_phase::decode, layer_id{7}, routed);

cache.is_resident(layer_id{8}, expert_id{3});
cache.pin(layer_id{0}, expert_id{12});           // never evicted once resident
cache.stats().decode.hit_pct();                  // also .all; lookups, hits, misses, bytes_read, evictions
  // ---
  // clang-format on

  const std::uint64_t bytes7 = presets::qwen3_30b_a3b(6).expert_bytes(layer_id{7});
  CHECK(reads.size() == 5);  // 17 is routed twice: one lookup, the duplicate only promotes
  const cache_counters& d = cache.stats().decode;
  CHECK(d.lookups == 5);
  CHECK(d.misses == 5);
  CHECK(d.bytes_read == 5 * bytes7);
  CHECK(cache.is_resident(layer_id{7}, expert_id{99}));
  CHECK_FALSE(cache.is_resident(layer_id{8}, expert_id{3}));
  // The one-call form: the same batch again is all hits.
  CHECK(cache.access_batch(run_phase::decode, layer_id{7}, routed) == 0);
  CHECK(d.hits == 5);
  CHECK(cache.stats().decode.hit_pct() == 50.0);
  CHECK(cache.stats().all.lookups == 10);
  // The guard's message, as quoted on the page.
  cache_options low;
  low.budget_bytes = from_mib(500);
  CHECK_THROWS_WITH_AS(expert_cache<lru_policy>(presets::qwen3_30b_a3b(6), low),
                       "expert_cache<lru>: budget 500.0 MiB is below the token cycle 784.7 MiB (48 MoE layers x "
                       "top-6 x expert bytes); a recency policy evicts each expert just before the cycle returns "
                       "to it and hits 0%. Raise the budget to at least 784.7 MiB, or use a policy that survives "
                       "below the cycle (lfu, layerlfu, cycle, belady)",
                       error);
  low.budget_bytes = 0;
  CHECK_THROWS_AS(expert_cache<lru_policy>(presets::qwen3_30b_a3b(6), low), error);
}

TEST_CASE("docs/cache.md, the adaptive policy") {
  // clang-format off
  // docs/cache.md, block 2 — keep in sync
using namespace moe_residency;
adaptive_policy_options o;                    // also: window_tokens, margin, first_leader, scope, cycle
o.objective = adaptive_objective::misses;     // hit rate instead of bytes read
cache_options co;
co.budget_bytes = from_mib(2000);
expert_cache<adaptive_policy> c(presets::qwen3_30b_a3b(6), co, adaptive_policy{o});
const expert_id routed[] = {expert_id{3}, expert_id{17}, expert_id{40}, expert_id{41}, expert_id{90}, expert_id{127}};
c.access_batch(run_phase::decode, layer_id{0}, routed);
const std::string& following = adaptive_rule_names()[c.policy().leader()];  // "cycle" at first
const cache_stats& alone = c.policy().rule_stats(3);  // what layerlfu alone would have done
  // ---
  // clang-format on
  CHECK(following == "cycle");  // one batch: every rule missed all six, nobody is cheaper
  CHECK(alone.all.lookups == 6);
  CHECK(alone.all.misses == 6);
  CHECK(c.stats().all.misses == 6);
  CHECK(adaptive_rule_names()[3] == "layerlfu");
}

// clang-format off
// docs/cache.md, block 3 — keep in sync
struct my_policy : policy_base {            // policy_base: global budget trigger, empty hooks
  static constexpr const char* name = "mine";
  static constexpr bool collapses_below_cycle = false;   // guard applies when true
  void init(const model_shape&, std::uint64_t budget);   // allocate here, never later
  void on_hit(std::uint32_t slot) noexcept;              // slot = layer × n_experts + expert
  void on_insert(std::uint32_t slot) noexcept;
  void on_evict(std::uint32_t slot) noexcept;
  template <class View> std::uint32_t victim(const View& v, std::size_t batch_layer) noexcept;
  // optional: on_repeat, on_batch_begin, on_batch_end, end_eviction,
  //           over_budget(view, layer) for a different trigger (see layer.hpp)
};
// ---
// clang-format on

// Definitions that make the declared policy a real one: FIFO by insertion
// order. Its state lives here because the page's declaration has no members.
namespace {
std::vector<std::uint64_t> my_policy_stamp;  // per slot: insertion order, 0 = not resident
std::uint64_t my_policy_clock = 0;
}  // namespace
void my_policy::init(const model_shape& shape, std::uint64_t) {
  my_policy_stamp.assign(shape.n_layers() * shape.n_experts(), 0);
  my_policy_clock = 0;
}
void my_policy::on_hit(std::uint32_t) noexcept {}
void my_policy::on_insert(std::uint32_t slot) noexcept { my_policy_stamp[slot] = ++my_policy_clock; }
void my_policy::on_evict(std::uint32_t slot) noexcept { my_policy_stamp[slot] = 0; }
template <class View>
std::uint32_t my_policy::victim(const View& v, std::size_t) noexcept {
  std::uint32_t best = no_slot;
  for (std::uint32_t s = 0; s < my_policy_stamp.size(); ++s)
    if (v.evictable(s) && (best == no_slot || my_policy_stamp[s] < my_policy_stamp[best])) best = s;
  return best;
}

TEST_CASE("docs/cache.md, writing a policy") {
  // Two layers of 1 MiB experts, top-2, a 3 MiB budget: below the 4 MiB token
  // cycle, allowed because my_policy does not declare that it collapses there.
  const model_shape shape("two-layer", 8, 2, std::vector<std::uint64_t>(2, 1u << 20));
  cache_options opt;
  opt.budget_bytes = from_mib(3);
  expert_cache<my_policy> cache(shape, opt);
  const std::vector<expert_id> a{expert_id{0}, expert_id{1}}, b{expert_id{2}, expert_id{3}};
  CHECK(cache.access_batch(run_phase::decode, layer_id{0}, a) == 2);
  CHECK(cache.access_batch(run_phase::decode, layer_id{1}, b) == 2);  // 4 MiB: evicts the oldest
  CHECK_FALSE(cache.is_resident(layer_id{0}, expert_id{0}));
  CHECK(cache.is_resident(layer_id{0}, expert_id{1}));
  CHECK(cache.is_resident(layer_id{1}, expert_id{2}));
  CHECK(cache.is_resident(layer_id{1}, expert_id{3}));
  CHECK(cache.stats().all.evictions == 1);
  CHECK(std::string(my_policy::name) == "mine");
}

// ---------------------------------------------------------------------------
TEST_CASE("docs/replay.md") {
  const std::string real = moe_residency_test::real_trace("qwen.route.csv");
  const std::string curve = moe_residency_test::real_trace("qwen.replay-curve.csv");
  if (real.empty() || curve.empty()) return;
  const std::string reference = moe_residency_test::read_file(curve);
  const trace_folder folder(real, "qwen.route.csv");

  // clang-format off
  // docs/replay.md, block 1 — keep in sync
#include "moe_residency/replay.hpp"
using namespace moe_residency;
const replay_input in = replay_input::from_file("qwen.route.csv");
const auto cells = replay_grid(in, {1000, 4000}, {"lru", "belady", "cycle"});
std::fputs(replay_csv(cells).c_str(), stdout);
  // ---
  // clang-format on

  // Exactly the reference's columns; every lru and belady cell as the engine
  // authors' curve prints it; cycle's decode (cumulative) hit % as the page's table.
  const std::string csv = replay_csv(cells);
  std::istringstream lines(csv);
  std::string line;
  std::getline(lines, line);
  CHECK(line == "budget_mib,policy,hit_pct_cum,hit_pct_decode,read_mib");
  int compared = 0;
  while (std::getline(lines, line)) {
    if (line.find(",cycle,") != std::string::npos) continue;
    CHECK_MESSAGE(reference.find(line + "\n") != std::string::npos, line);
    ++compared;
  }
  CHECK(compared == 4);
  REQUIRE(cells.size() == 6);
  CHECK(cells[2].policy == "cycle");
  CHECK(fmt1(cells[2].hit_pct_decode()) == "43.1");
  CHECK(fmt1(cells[2].hit_pct_cum()) == "40.2");
  CHECK(fmt1(cells[5].hit_pct_decode()) == "82.8");
  CHECK(fmt1(cells[5].hit_pct_cum()) == "77.2");
  CHECK(fmt1(cells[3].hit_pct_cum()) == "74.9");  // lru, 4000 MiB: the phone's figure
}

TEST_CASE("docs/replay.md's policy table is the policy registry") {
  // The page's table, row by row, against cache_policy_registry(): same names,
  // same order, same help text. docs/cache.md names each one as (`name`).
  const std::string root = MOE_RESIDENCY_SOURCE_DIR;
  std::istringstream page(moe_residency_test::read_file(root + "/docs/replay.md"));
  std::vector<std::pair<std::string, std::string>> rows;
  bool inside = false;
  for (std::string line; std::getline(page, line);) {
    const auto bar = line.find('|');
    if (line.find("| name | what it evicts |") != std::string::npos) inside = true;
    else if (inside && (bar == std::string::npos)) break;
    else if (inside && line.find("`") != std::string::npos) {
      const auto a = line.find('`'), b = line.find('`', a + 1);
      const auto c = line.find("| ", b), d = line.rfind(" |");
      REQUIRE(c != std::string::npos);
      rows.emplace_back(line.substr(a + 1, b - a - 1), line.substr(c + 2, d - c - 2));
    }
  }
  const auto& reg = cache_policy_registry();
  REQUIRE(rows.size() == reg.size());
  for (std::size_t i = 0; i < reg.size(); ++i) {
    CAPTURE(i);
    CHECK(rows[i].first == reg[i].name);
    CHECK(rows[i].second == reg[i].help);
  }
  const std::string cache_page = moe_residency_test::read_file(root + "/docs/cache.md");
  for (const auto& p : reg)
    CHECK_MESSAGE(cache_page.find("(`" + std::string(p.name) + "`)") != std::string::npos, p.name);
  // The page's alias sentence names exactly the registry's aliases.
  const std::string replay_page = moe_residency_test::read_file(root + "/docs/replay.md");
  for (const auto& a : cache_policy_aliases())
    CHECK(replay_page.find("`" + a.first + "`, the spelling earlier releases accepted, still means `" + a.second +
                           "`") != std::string::npos);
}

// ---------------------------------------------------------------------------
namespace {

std::string rstrip(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.pop_back();
  return s;
}

// The text with trailing whitespace removed from every line.
std::string normalised(const std::string& text) {
  std::istringstream in(text);
  std::string out, line;
  while (std::getline(in, line)) out += rstrip(line) + "\n";
  return out;
}

// The ```cpp blocks of a Markdown file, normalised, without the fences.
std::vector<std::string> cpp_blocks(const std::string& markdown) {
  std::vector<std::string> blocks;
  std::istringstream in(markdown);
  std::string line, block;
  bool inside = false;
  while (std::getline(in, line)) {
    line = rstrip(line);
    if (!inside && line == "```cpp") {
      inside = true;
      block.clear();
    } else if (inside && line == "```") {
      inside = false;
      blocks.push_back(block);
    } else if (inside) {
      block += line + "\n";
    }
  }
  return blocks;
}

}  // namespace

TEST_CASE("docs and tests/test_docs.cpp are in sync") {
  const std::string root = MOE_RESIDENCY_SOURCE_DIR;
  const std::string self = normalised(moe_residency_test::read_file(root + "/tests/test_docs.cpp"));
  REQUIRE(self.size() > 1000);
  // Page, and how many ```cpp blocks it has (a block added to a page must be
  // added here and above; speculation.md and llama-cpp.md have their own suites).
  const std::vector<std::pair<std::string, std::size_t>> pages = {
      {"README.md", 1},           {"docs/overview.md", 1},   {"docs/router.md", 1},
      {"docs/traces.md", 1},      {"docs/session.md", 1},    {"docs/cache.md", 3},
      {"docs/replay.md", 1},      {"docs/prediction.md", 0}, {"docs/configuration.md", 0},
      {"docs/limitations.md", 0}, {"docs/benchmarks.md", 0}, {"docs/reliability.md", 0}};
  for (const auto& entry : pages) {
    const std::string& page = entry.first;  // not a structured binding: doctest's lambdas capture it
    const std::size_t count = entry.second;
    const std::string text = moe_residency_test::read_file(root + "/" + page);
    REQUIRE_MESSAGE(!text.empty(), page << " is missing or empty under " << root);
    const std::vector<std::string> blocks = cpp_blocks(text);
    CHECK_MESSAGE(blocks.size() == count, page);
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const std::string marker = "// " + page + ", block " + std::to_string(i + 1) + " — keep in sync\n";
      const std::size_t at = self.find(marker);
      CHECK_MESSAGE(at != std::string::npos, page << " block " << i + 1 << " has no marker in tests/test_docs.cpp");
      // The block follows its marker (after the block's indentation-free paste).
      const bool found = at != std::string::npos && self.find(blocks[i], at) == at + marker.size();
      CHECK_MESSAGE(found, page << " block " << i + 1
                                << " is not in tests/test_docs.cpp verbatim after its marker; paste:\n"
                                << blocks[i]);
    }
  }
}
