// Routing from a recorded trace in an unmodified llama.cpp (forced_routing.hpp):
// the routing llama.cpp then computes with is the trace's, token by token and
// layer by layer (recorded back, it equals the source; forcing the model's own
// routing changes no logit, forcing another changes them); a model of another
// MoE shape is refused naming both; a run longer than the trace cycles and
// says so; and the residency manager's oracle predictor under forced routing
// plans, from the same seed, the reads the replay's oracle plans, so the live
// cache makes the replay's decisions.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "fake_advice.hpp"
#include "llama_support.hpp"
#include "moe_residency/adapters/llama_cpp/forced_routing.hpp"
#include "moe_residency/adapters/llama_cpp/residency.hpp"
#include "moe_residency/adapters/llama_cpp/residency/policies.hpp"
#include "moe_residency/adapters/llama_cpp/sinks.hpp"
#include "moe_residency/replay/dynamic.hpp"
#include "moe_residency/trace.hpp"

using namespace moe_residency;
using namespace moe_residency_test;

namespace {

/// The skewed popularity of each layer's experts (a few routed often, as
/// trained models route), each layer its own hot experts.
struct popularity {
  popularity(const model_shape& shape, std::uint64_t seed) : n(shape.n_experts()), seed(seed) {}
  std::size_t n;
  std::uint64_t seed;
  std::vector<double> of(std::size_t layer) const {
    std::vector<double> w(n);
    for (std::size_t e = 0; e < n; ++e) w[e] = 1.0 / std::pow(double(e + 1), 1.2);
    std::shuffle(w.begin(), w.end(), std::mt19937_64(seed ^ (layer * 7919)));
    return w;
  }
};

/// `own` (a model's own routing, recorded) with every routing's experts
/// redrawn: k distinct experts of a skewed popularity, weights descending.
/// The rows are the model's, so the trace has exactly the routings llama.cpp
/// computes (which layers a prompt's output rows alone reach is the
/// architecture's).
route_trace redraw(const route_trace& own, const model_shape& shape, std::uint64_t seed) {
  route_trace t = own;
  t.header.model = "synthetic";
  const popularity pop(shape, seed);
  std::mt19937_64 gen(seed);
  std::vector<double> w;
  for (trace_row& r : t.rows) {
    if (r.slot == 0) w = pop.of(to_index(r.layer));
    std::discrete_distribution<std::size_t> pick(w.begin(), w.end());
    const std::size_t e = pick(gen);
    w[e] = 0;  // distinct within the routing
    r.expert = expert_id(static_cast<std::uint16_t>(e));
    r.weight = 1.0f / static_cast<float>(r.slot + 2);
  }
  return t;
}

/// The model's own routing of `n_prompt` + `n_decode` tokens, recorded.
route_trace own_routing(observed_model& om, std::size_t n_prompt, std::size_t n_decode) {
  const model_shape shape = om.obs.shape();
  mrl::route_recorder<lru_policy> rec(shape, 0);
  om.obs.set_sink(&rec);
  om.restart();
  (void)om.run(n_prompt, n_decode);
  om.obs.set_sink(nullptr);
  return rec.trace();
}

/// A trace of `shape` for shape checks (the rows need not be any model's):
/// prompt tokens layer-major, decode token-major, slots 0..k-1.
route_trace shaped_trace(const model_shape& shape, std::size_t n_prompt, std::size_t n_decode) {
  route_trace t;
  t.header.model = "synthetic";
  t.header.arch = shape.name();
  t.header.n_layer = shape.n_layers();
  t.header.n_expert = shape.n_experts();
  t.header.n_expert_used = shape.top_k();
  t.header.expert_bytes = shape.all_expert_bytes();
  t.header.dense_bytes.assign(shape.n_layers(), 0);
  auto add = [&](run_phase phase, std::size_t step, std::size_t l) {
    for (std::size_t j = 0; j < shape.top_k(); ++j) {
      trace_row r;
      r.phase = phase;
      r.step = static_cast<std::uint32_t>(step);
      r.layer = layer_id(static_cast<std::uint16_t>(l));
      r.slot = static_cast<std::uint8_t>(j);
      r.expert = expert_id(static_cast<std::uint16_t>((step + l + j) % shape.n_experts()));
      r.weight = 0.5f;
      r.expert_bytes = shape.expert_bytes(r.layer);
      t.rows.push_back(r);
    }
  };
  for (std::size_t l = 0; l < shape.n_layers(); ++l)
    if (shape.is_moe(layer_id(static_cast<std::uint16_t>(l))))
      for (std::size_t p = 0; p < n_prompt; ++p) add(run_phase::prefill, p, l);
  for (std::size_t d = 0; d < n_decode; ++d)
    for (std::size_t l = 0; l < shape.n_layers(); ++l)
      if (shape.is_moe(layer_id(static_cast<std::uint16_t>(l)))) add(run_phase::decode, n_prompt + d, l);
  return t;
}

/// (phase, step, layer, slot) -> expert of every row.
std::map<std::tuple<int, std::uint32_t, std::size_t, int>, std::size_t> experts_of(const route_trace& t) {
  std::map<std::tuple<int, std::uint32_t, std::size_t, int>, std::size_t> m;
  for (const trace_row& r : t.rows)
    m[{static_cast<int>(r.phase), r.step, to_index(r.layer), r.slot}] = to_index(r.expert);
  return m;
}

}  // namespace

TEST_CASE("forced routing: llama.cpp routes as the trace says; recorded back, the trace is the source") {
  llama_init_once();
  for (const char* arch : {"qwen3moe", "gpt-oss", "deepseek2"}) {
    const std::string config = arch;
    CAPTURE(config);
    observed_model om(spec_for(arch, GGML_TYPE_F32));
    om.warm_up();
    const model_shape shape = om.obs.shape();
    const std::size_t n_prompt = 5, n_decode = 6;

    // The model's own routing, recorded: then forced, it changes no logit.
    mrl::route_recorder<lru_policy> own(shape, 0);
    om.obs.set_sink(&own);
    om.restart();
    const run_result unforced = om.run(n_prompt, n_decode);
    const auto own_trace = validate_route_trace(own.trace(), "own");
    const auto trace = validate_route_trace(redraw(own.trace(), shape, 11), "synthetic");
    mrl::forced_routing routes(trace, "synthetic");
    REQUIRE_NOTHROW(routes.check_layers(shape));
    mrl::forced_routing own_routes(own_trace, "own");
    mrl::route_recorder<lru_policy> again(shape, 0);
    om.obs.set_sink(&again);
    om.obs.force_routing(&own_routes);
    om.restart();
    const run_result forced_own = om.run(n_prompt, n_decode);
    CHECK(forced_own.logits == unforced.logits);
    CHECK(forced_own.tokens == unforced.tokens);
    CHECK(experts_of(again.trace()) == experts_of(own.trace()));
    CHECK(own_routes.stats().forced_routings == own.trace().rows.size() / shape.top_k());

    // Another routing: recorded back, exactly the source's experts, slot by
    // slot; and the logits are not the model's own.
    mrl::route_recorder<lru_policy> rec(shape, 0);
    om.obs.set_sink(&rec);
    om.obs.force_routing(&routes);
    om.restart();
    const run_result forced = om.run(n_prompt, n_decode);
    CHECK(experts_of(rec.trace()) == experts_of(trace.trace()));
    CHECK(rec.trace().rows.size() == trace.rows().size());
    CHECK(forced.logits != unforced.logits);
    CHECK(routes.stats().forced_routings == trace.rows().size() / shape.top_k());
    CHECK(routes.stats().unforced_routings == 0);
    CHECK(routes.stats().decode_wraps == 0);
    CHECK(routes.stats().prefill_tokens == n_prompt);
    CHECK(routes.stats().decode_tokens == n_decode);

    // Twice the same forced run: the same logits (nothing else moved).
    om.restart();
    CHECK(om.run(n_prompt, n_decode).logits == forced.logits);

    om.obs.force_routing(nullptr);
    om.obs.set_sink(nullptr);
  }
}

TEST_CASE("forced routing: a model of another MoE shape is refused, both shapes named; nothing is installed") {
  llama_init_once();
  observed_model om(spec_for("qwen3moe", GGML_TYPE_F32));  // 4 layers x 64 experts, top-8
  om.warm_up();
  const model_shape shape = om.obs.shape();
  struct variant {
    std::size_t layers, experts, k;
    const char* expected;
  };
  const variant variants[] = {
      {4, 64, 6,
       "forced routing from other.csv: the trace is 4 layers x 64 experts, top-6 but the model is 4 layers x 64 "
       "experts, top-8; expected the same MoE shape (a random model of the trace's shape: --shape-from)"},
      {4, 32, 8,
       "forced routing from other.csv: the trace is 4 layers x 32 experts, top-8 but the model is 4 layers x 64 "
       "experts, top-8; expected the same MoE shape (a random model of the trace's shape: --shape-from)"},
      {6, 64, 8,
       "forced routing from other.csv: the trace is 6 layers x 64 experts, top-8 but the model is 4 layers x 64 "
       "experts, top-8; expected the same MoE shape (a random model of the trace's shape: --shape-from)"},
  };
  for (const variant& v : variants) {
    CAPTURE(v.expected);
    const model_shape other("qwen3moe", v.experts, v.k, std::vector<std::uint64_t>(v.layers, 4096));
    const auto trace = validate_route_trace(shaped_trace(other, 3, 2), "other.csv");
    mrl::forced_routing routes(trace, "other.csv");
    std::string message;
    try {
      om.obs.force_routing(&routes);
    } catch (const error& e) {
      message = e.what();
    }
    CHECK(message == v.expected);
    CHECK(om.obs.forced() == nullptr);
  }
  // The same shape, other MoE layers: refused once the structure is known.
  std::vector<std::uint64_t> bytes = shape.all_expert_bytes();
  std::vector<bool> moe(shape.n_layers(), true);
  moe[0] = false;
  bytes[0] = 0;
  const model_shape first_dense("qwen3moe", shape.n_experts(), shape.top_k(), bytes, moe);
  const auto trace = validate_route_trace(shaped_trace(first_dense, 3, 2), "dense0.csv");
  mrl::forced_routing routes(trace, "dense0.csv");
  std::string message;
  try {
    routes.check_layers(shape);
  } catch (const error& e) {
    message = e.what();
  }
  CHECK(message ==
        "forced routing from dense0.csv: the trace routes layers 1,2,3 but the model's MoE layers are 0,1,2,3; "
        "expected the same layers");
}

TEST_CASE("forced routing: a run longer than the trace cycles through it, and says so") {
  llama_init_once();
  observed_model om(spec_for("qwen3moe", GGML_TYPE_F32));
  om.warm_up();
  const model_shape shape = om.obs.shape();
  const std::size_t n_prompt = 4, trace_decode = 3, run_decode = 8;
  const auto trace = validate_route_trace(redraw(own_routing(om, n_prompt, trace_decode), shape, 23), "short.csv");
  mrl::forced_routing routes(trace, "short.csv");
  mrl::route_recorder<lru_policy> rec(shape, 0);
  om.obs.set_sink(&rec);
  om.obs.force_routing(&routes);
  om.restart();
  (void)om.run(n_prompt, run_decode);
  // Decode token d routes as the trace's decode token d mod 3.
  const auto source = experts_of(trace.trace());
  std::size_t rows = 0, same = 0;
  for (const trace_row& r : rec.trace().rows) {
    if (r.phase != run_phase::decode) continue;
    const std::uint32_t d = r.step - static_cast<std::uint32_t>(n_prompt);
    const auto it =
        source.find({1, static_cast<std::uint32_t>(n_prompt + d % trace_decode), to_index(r.layer), r.slot});
    ++rows;
    same += it != source.end() && it->second == to_index(r.expert);
  }
  CHECK(rows == run_decode * shape.n_moe_layers() * shape.top_k());
  CHECK(same == rows);
  CHECK(routes.stats().decode_wraps == (run_decode - trace_decode) * shape.n_moe_layers());
  CHECK(routes.note() ==
        "routing forced from short.csv: " +
            std::to_string((n_prompt + run_decode) * shape.n_moe_layers() - (n_prompt - 1)) +
            " routings (4 prompt, 8 decode tokens; the trace has 4 and 3); the run decoded past the trace's 3 decode "
            "tokens: " +
            std::to_string((run_decode - trace_decode) * shape.n_moe_layers()) + " routings cycled from its first");
  om.obs.force_routing(nullptr);
  om.obs.set_sink(nullptr);
}

namespace {

/// Behind a manager: after each decode routing, the ranking the manager
/// predicted (token, target layer); every layer_loaded event to a recorder.
class prediction_ledger : public mrl::observer_sink {
 public:
  prediction_ledger(const mrl::residency_manager& res, mrl::observer_sink& next) : res_(res), next_(next) {}
  bool wants(engine_event e) const noexcept override {
    return e == engine_event::routed || e == engine_event::begin_batch || e == engine_event::layer_loaded;
  }
  void on_begin_batch(const batch_info& b) override {
    if (b.first_position == 0) decode_tokens_ = 0;
    if (b.phase == run_phase::decode) token_ = decode_tokens_++;
    next_.on_begin_batch(b);
  }
  void on_routed(const mrl::layer_batch& b) override {
    layer_id target{};
    ranking r;
    if (b.phase == run_phase::decode && res_.last_prediction(target, r)) predictions[{token_, to_index(target)}] = r;
  }
  void on_layer_loaded(const mrl::layer_batch& b) override { next_.on_layer_loaded(b); }
  std::map<std::pair<std::size_t, std::size_t>, ranking> predictions;

 private:
  const mrl::residency_manager& res_;
  mrl::observer_sink& next_;
  std::size_t decode_tokens_ = 0, token_ = 0;
};

}  // namespace

TEST_CASE(
    "forced routing: the manager's trace oracle plans the replay's oracle reads; the live cache decides as the "
    "replay") {
  // Live = replay on the same routing: llama.cpp forced to a trace with
  // reuse, the manager (fake advice: no kernel) with exact reads, the pinned
  // cache and predicted reads from the trace oracle at P = 0.7; the routing it
  // saw recorded behind it and replayed decode-only with the replay's own
  // oracle at the same P and seed. The lanes are drained before each routing,
  // so every speculative read completes before its layer, as the replay's
  // synchronous ones do: hits, misses, evictions and speculative reads are
  // equal; and the rankings are the replay's draws, in its order.
  mapped_model m("forced_oracle", small_moe_spec());
  m.warm_up();
  const model_shape shape = m.obs.shape();
  const std::uint64_t expert = shape.expert_bytes(layer_id(0));
  const std::size_t n_prompt = 6, n_decode = 24;
  const auto trace = validate_route_trace(redraw(own_routing(m, n_prompt, n_decode), shape, 3), "reuse.csv");
  const double p = 0.7;
  const std::uint64_t seed = 99;
  std::set<std::uint64_t> hits_seen;
  for (const std::string policy : {"lru", "adaptive"})
    for (const bool pool : {false, true}) {
      CAPTURE(policy);
      CAPTURE(pool);
      mrl::forced_routing routes(trace, "reuse.csv");
      mrl::trace_oracle oracle(routes, p, {}, seed);
      fake_advice fake;
      fake.pool = pool;
      fake.slow_reads = true;  // reads take time: the lanes really run concurrently
      mrl::residency_options o = mrl::residency_options::none();
      o.fits = mrl::when_fits::act;
      o.cache = o.exact = o.predicted = true;
      o.pool = pool;
      o.cache_budget_bytes = 24 * expert;  // the token cycle is 16 experts
      const auto res = mrl::make_residency_manager(policy, m.obs, m.path, o, &fake);
      res->set_predictor(&oracle);
      mrl::route_recorder<lru_policy> rec(shape, 0);
      prediction_ledger ledger(*res, rec);
      res->set_next(&ledger);
      draining_sink drain(*res);
      m.obs.force_routing(&routes);
      m.obs.set_sink(&drain);
      m.restart();
      (void)m.run(n_prompt, n_decode);
      m.obs.set_sink(nullptr);
      m.obs.force_routing(nullptr);
      res->settle();
      REQUIRE(res->active());
      CHECK(std::string(res->predictor_name()) == "oracle:0.7");
      CHECK(experts_of(rec.trace()) == experts_of(trace.trace()));

      // The rankings: the replay's oracle draws, token by token, layer by layer.
      const auto in = routed_replay_input::from_trace(rec.trace());
      std::uint64_t rng = seed;
      std::size_t same = 0, rankings = 0, slots = 0, true_slots = 0;
      for (std::uint32_t d = 0; d < n_decode; ++d)
        for (std::size_t l = 0; l + 1 < shape.n_layers(); ++l) {
          const routing* truth = in.decode_routing(d, layer_id(static_cast<std::uint16_t>(l + 1)));
          REQUIRE(truth != nullptr);
          ranking twin;
          moe_residency::detail::oracle_ranking(*truth, p, shape.n_experts(), rng, twin);
          ++rankings;
          const auto it = ledger.predictions.find({d, l + 1});
          if (it == ledger.predictions.end()) continue;
          bool eq = it->second.size() == twin.size();
          for (std::size_t i = 0; eq && i < twin.size(); ++i) eq = it->second.id(i) == twin.id(i);
          same += eq;
          for (std::size_t i = 0; i < it->second.size(); ++i) {
            ++slots;
            true_slots += truth->contains(it->second.id(i));
          }
        }
      CHECK(ledger.predictions.size() == rankings);
      CHECK(same == rankings);
      // P is honoured: about 70% of the predicted slots are routed (288 slots).
      const double accuracy = static_cast<double>(true_slots) / static_cast<double>(slots);
      CHECK(accuracy > p - 0.1);
      CHECK(accuracy < p + 0.1);

      // The replay of the recorded routing, decode-only, the same oracle.
      dynamic_replay_options ro;
      ro.policy = policy;
      ro.budget_mib = to_mib(o.cache_budget_bytes);
      ro.prefill_cached = false;
      ro.speculation.source = speculation_source::oracle;
      ro.speculation.oracle_p = p;
      ro.speculation.seed = seed;
      ro.speculation.cap = o.spec_cap;
      const dynamic_replay_result rp = replay_dynamic(in, ro);
      std::uint64_t spec_issued = 0;
      for (const load_event& e : rp.decode_loads) spec_issued += e.speculative_issued;
      const mrl::residency_stats st = res->stats();
      CHECK(st.cache_hits == rp.cache.decode.hits);
      CHECK(st.cache_misses == rp.cache.decode.misses);
      CHECK(st.evictions == rp.cache.all.evictions);
      CHECK(st.predicted_issued == spec_issued);
      CHECK(st.cache_miss_bytes == rp.cache.decode.bytes_read);
      CHECK(st.predicted_late == 0);
      hits_seen.insert(st.cache_hits);
      // The bound on reads in flight: the lanes, and spec_cap a layer.
      CHECK(fake.max_reading() <= o.lanes);
      CHECK(st.predicted_issued <= st.predictions * o.spec_cap);
      CHECK(st.predicted_issued > 0);
    }
  CHECK(hits_seen.size() > 1);  // the policies decided differently
}
