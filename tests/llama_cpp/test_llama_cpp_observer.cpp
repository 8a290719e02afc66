// The llama.cpp observer against llama.cpp itself: the fresh-gate control
// (each layer's own router on its own gate input, selected by the spec the
// observer derived from the graph) reproduces llama.cpp's ffn_moe_topk on
// 100.0% of routings; the ids and positions it reports are the ones a plain
// callback copies out of ffn_moe_topk; the user's own callback is chained;
// attaching changes no logit; detaching stops the events.

#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <tuple>

#include "llama_support.hpp"
#include "moe_residency/router.hpp"
#include "moe_residency/session.hpp"
#include "moe_residency/speculation.hpp"
#include "moe_residency/cache/lru.hpp"

using namespace moe_residency;
using namespace moe_residency_test;

namespace {

/// The control: recompute every routing the observer reports and compare.
struct control_sink : mrl::observer_sink {
  std::size_t routings = 0, matches = 0, exact_order = 0, weight_mismatch = 0, bad = 0;
  std::size_t decode_routings = 0, prefill_routings = 0, outputs_only_batches = 0;
  std::size_t batches = 0;
  std::map<std::tuple<std::uint32_t, std::uint16_t>, std::vector<int>> ids;  // (pos, layer) -> ids
  std::vector<router_workspace> ws;

  void on_begin_batch(const moe_residency::batch_info&) override { ++batches; }

  void on_layer_loaded(const mrl::layer_batch& b) override {
    const mrl::layer_structure& s = *b.structure;
    if (ws.size() <= to_index(b.layer)) ws.resize(to_index(b.layer) + 1);
    router_workspace& w = ws[to_index(b.layer)];
    if (w.capacity() < s.spec.n_experts) w.resize(s.spec.n_experts);
    if (b.outputs_only) ++outputs_only_batches;
    for (std::size_t t = 0; t < b.n_tokens; ++t) {
      routing engine, ours;
      if (!b.routing_of(t, engine)) {
        ++bad;
        continue;
      }
      ++routings;
      (b.phase == run_phase::decode ? decode_routings : prefill_routings) += 1;
      auto& v = ids[{b.position(t), static_cast<std::uint16_t>(b.layer)}];
      for (std::size_t j = 0; j < b.k; ++j) v.push_back(b.ids[t * b.ids_stride + j]);
      if (!route_token(s.router, b.x(t), s.spec, ours, w)) {
        ++bad;
        continue;
      }
      const bool same = same_selection_tie_aware(engine.ids(), ours.ids(), w.selection_scores());
      if (same) ++matches;
      bool order = true;
      for (std::size_t j = 0; j < engine.size(); ++j) order = order && engine.id(j) == ours.id(j);
      if (order) {
        ++exact_order;
        for (std::size_t j = 0; j < engine.size(); ++j) {
          const float a = engine.weight(j), c = ours.weight(j);
          if (std::fabs(a - c) > 1e-4f * std::max(1.0f, std::fabs(a))) ++weight_mismatch;
        }
      }
    }
  }
};

/// A user's own callback: copies every ffn_moe_topk-il it sees, by layer.
struct topk_copier {
  std::size_t asks = 0, datas = 0;
  std::vector<std::tuple<int, std::size_t, std::vector<int>>> seen;  // (layer, n_tokens, ids token-major)
  static bool cb(ggml_tensor* t, bool ask, void* ud) {
    auto* self = static_cast<topk_copier*>(ud);
    int il = -1;
    const bool want = mrl::detail::parse_moe_node(t->name, il) == mrl::detail::moe_node::topk;
    if (ask) {
      ++self->asks;
      return want;
    }
    ++self->datas;
    REQUIRE(want);  // called with data only for what it asked for
    std::vector<int> v;
    for (int64_t tok = 0; tok < t->ne[1]; ++tok)
      for (int64_t j = 0; j < t->ne[0]; ++j) {
        int32_t id;
        std::memcpy(&id, static_cast<const char*>(t->data) + tok * t->nb[1] + j * t->nb[0], 4);
        v.push_back(id);
      }
    self->seen.emplace_back(il, static_cast<std::size_t>(t->ne[1]), std::move(v));
    return true;
  }
};

}  // namespace

TEST_CASE("llama.cpp observer: the control reproduces ffn_moe_topk on 100.0% of routings") {
  llama_init_once();
  const std::size_t n_prompt = 24, n_decode = 64;
  for (const char* arch : {"qwen3moe", "deepseek2", "gpt-oss"}) {
    for (ggml_type rt : {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16}) {
      const std::string config = std::string(arch) + " router " + type_name(rt);
      CAPTURE(config);
      const auto spec = spec_for(arch, rt);
      control_sink sink;
      observed_model om(spec, &sink);
      om.run(n_prompt, n_decode);

      const std::size_t n_moe = spec.arch == "deepseek2" ? spec.n_layer - 1 : spec.n_layer;
      CHECK(om.obs.stats().exceptions == 0);
      CHECK(om.obs.stats().unreadable == 0);
      CHECK(om.obs.stats().unsupported == 0);
      CHECK(om.obs.stats().metadata_mismatches == 0);  // deepseek2's keys agree with its graph
      CHECK(om.obs.structure_known());
      CHECK(sink.bad == 0);
      CHECK(sink.batches == 1 + n_decode);
      CHECK(sink.decode_routings == n_decode * n_moe);
      CHECK(sink.prefill_routings >= n_prompt * (n_moe - 1) + 1);
      REQUIRE(sink.routings > 0);
      MESSAGE(config << ": control " << sink.matches << "/" << sink.routings << " tie-aware, " << sink.exact_order
                     << " in the same order");
      CHECK(sink.matches == sink.routings);  // 100.0%, tie-aware
      CHECK(sink.weight_mismatch == 0);      // the final weights are the ones we compute
    }
  }
}

TEST_CASE("llama.cpp observer: the spec it derives from the graph") {
  llama_init_once();
  SUBCASE("qwen3moe: softmax, normalised, no bias") {
    observed_model om(spec_for("qwen3moe", GGML_TYPE_F32));
    om.run(4, 1);
    REQUIRE(om.obs.structure_known());
    const auto& s = om.obs.layer(layer_id(1));
    CHECK(s.moe);
    CHECK(s.spec.gating == gating_function::softmax);
    CHECK(s.spec.normalize_weights);
    CHECK_FALSE(s.spec.scale_weights);
    CHECK(s.spec.n_experts == 64);
    CHECK(s.spec.top_k == 8);
    CHECK(s.router.type == element_type::f32);
    CHECK(s.router.rows == 64);
    CHECK(s.router.cols == 128);
    CHECK(s.experts.size() == 3);  // gate, up, down (renamed node_N: found by op)
    CHECK(s.expert_bytes == 3ull * 128 * 64 * 4);
    const model_shape shape = om.obs.shape();
    CHECK(shape.n_layers() == 4);
    CHECK(shape.n_moe_layers() == 4);
  }
  SUBCASE("deepseek2: dense first layer, sigmoid, groups, selection bias, norm and scale") {
    observed_model om(spec_for("deepseek2", GGML_TYPE_BF16));
    om.run(4, 1);
    REQUIRE(om.obs.structure_known());
    CHECK_FALSE(om.obs.layer(layer_id(0)).moe);
    const auto& s = om.obs.layer(layer_id(2));
    CHECK(s.moe);
    CHECK(s.spec.gating == gating_function::sigmoid);
    CHECK(s.spec.n_groups == 8);
    CHECK(s.spec.n_group_used == 4);
    CHECK(s.spec.selection_bias.size() == 64);
    CHECK(s.spec.logit_bias.empty());
    CHECK(s.spec.normalize_weights);
    CHECK(s.spec.scale_weights);
    CHECK(s.spec.weight_scale == 2.5f);
    CHECK(s.router.type == element_type::bf16);
    CHECK(s.experts.size() == 2);  // merged gate_up, down
    const model_shape shape = om.obs.shape();
    CHECK_FALSE(shape.is_moe(layer_id(0)));
    CHECK(shape.is_moe(layer_id(1)));
    CHECK(shape.n_moe_layers() == 3);
  }
  SUBCASE("gpt-oss: logit bias, softmax over the selected") {
    observed_model om(spec_for("gpt-oss", GGML_TYPE_F16));
    om.run(4, 1);
    REQUIRE(om.obs.structure_known());
    const auto& s = om.obs.layer(layer_id(3));
    CHECK(s.spec.gating == gating_function::softmax_weight);
    CHECK(s.spec.logit_bias.size() == 32);
    CHECK_FALSE(s.spec.normalize_weights);
    CHECK(s.router.type == element_type::f16);
  }
}

TEST_CASE("llama.cpp observer: the graph wins over GGUF keys it contradicts, and says so") {
  llama_init_once();
  auto spec = spec_for("qwen3moe", GGML_TYPE_F32);
  spec.gating_func_key = 2;  // sigmoid; llama.cpp's qwen3moe graph hard-codes softmax
  control_sink sink;
  observed_model om(spec, &sink);
  om.run(8, 8);
  CHECK(om.obs.layer(layer_id(0)).spec.gating == gating_function::softmax);
  CHECK(om.obs.stats().metadata_mismatches == 4);
  CHECK(om.obs.metadata_note() == "layer 0: expert_gating_func is 2 in the GGUF but 1 in the graph");
  CHECK(sink.matches == sink.routings);  // and the control, on the graph's spec, is exact
}

TEST_CASE("llama.cpp observer: reports exactly what a plain callback copies from ffn_moe_topk") {
  llama_init_once();
  for (const char* arch : {"qwen3moe", "deepseek2", "gpt-oss"}) {
    const std::string config = arch;
    CAPTURE(config);
    auto model = mre::make_random_model(spec_for(arch, GGML_TYPE_F32));
    mrl::observer obs(model.get());
    control_sink sink;
    obs.set_sink(&sink);
    topk_copier user;
    auto cp = test_context_params();
    cp.cb_eval = &topk_copier::cb;
    cp.cb_eval_user_data = &user;
    obs.install(cp);
    CHECK_THROWS_AS(obs.install(cp), moe_residency::error);
    auto ctx = make_context(model.get(), cp);
    const std::size_t n_prompt = 9, n_decode = 5;
    run_tokens(ctx.get(), model.get(), n_prompt, n_decode);

    // The user's callback saw every topk, in order, with data.
    CHECK(user.datas == user.seen.size());
    REQUIRE_FALSE(user.seen.empty());
    // Rebuild (position, layer) -> ids from the user's copies: graphs are one
    // prompt batch then one token each; a layer with fewer columns than its
    // graph's first layer saw the last tokens (the output rows).
    std::map<std::tuple<std::uint32_t, std::uint16_t>, std::vector<int>> expected;
    std::uint32_t graph_first = 0, graph_tokens = 0;
    int last_layer = 1 << 30;
    for (const auto& [il, n_tok, v] : user.seen) {
      if (il <= last_layer) {
        graph_first += graph_tokens;
        graph_tokens = static_cast<std::uint32_t>(n_tok);
      }
      last_layer = il;
      const std::size_t k = v.size() / n_tok;
      for (std::size_t t = 0; t < n_tok; ++t) {
        const auto pos = graph_first + graph_tokens - static_cast<std::uint32_t>(n_tok) + static_cast<std::uint32_t>(t);
        expected[{pos, static_cast<std::uint16_t>(il)}] =
            std::vector<int>(v.begin() + static_cast<long>(t * k), v.begin() + static_cast<long>((t + 1) * k));
      }
    }
    CHECK(graph_first + graph_tokens == n_prompt + n_decode);
    CHECK(sink.ids == expected);
    if (std::string(arch) == "qwen3moe") CHECK(sink.outputs_only_batches == 1);
  }
}

namespace {

using phase_layer = std::tuple<int, std::uint16_t>;  // (phase, layer)

/// A session extension: the token of every routing the session accepted.
struct routed_tokens {
  static constexpr session_hook hooks = session_hook::routed;
  std::map<phase_layer, std::vector<std::uint32_t>> tokens;
  template <class S>
  void on_routed(S&, layer_id l, span<const routing> rs, span<std::uint32_t>) {
    for (const routing& r : rs) tokens[{static_cast<int>(r.phase), static_cast<std::uint16_t>(l)}].push_back(r.token);
  }
};

/// The sink after session_sink: the positions of every row the observer delivered.
struct delivered_tokens : mrl::observer_sink {
  std::map<phase_layer, std::vector<std::uint32_t>> tokens;
  std::size_t outputs_only = 0;
  void on_layer_loaded(const mrl::layer_batch& b) override {
    if (b.outputs_only) ++outputs_only;
    auto& v = tokens[{static_cast<int>(b.phase), static_cast<std::uint16_t>(b.layer)}];
    for (std::size_t t = 0; t < b.n_tokens; ++t) v.push_back(b.position(t));
  }
};

}  // namespace

TEST_CASE("llama.cpp observer: session_sink forwards the last prompt layer's output rows") {
  using tracing_session =
      session<predictor_set<stale_gate_predictor, prev_token_predictor, fresh_gate_control>, routed_tokens>;
  for_each_warm_arch(GGML_TYPE_F32, [](observed_model& om, const std::string& config) {
    const model_shape shape = om.obs.shape();

    session_options so;
    so.on_anomaly = anomaly_action::count;
    tracing_session s(shape, so);
    mrl::configure_routers(s, om.obs);
    delivered_tokens seen;
    mrl::session_sink<tracing_session> sink(s, &seen);
    om.obs.set_sink(&sink);
    const std::size_t n_prompt = 12, n_decode = 6;
    om.run(n_prompt, n_decode);
    om.obs.set_sink(nullptr);

    CHECK(om.obs.stats().exceptions == 0);
    CHECK(om.obs.stats().unreadable == 0);
    CHECK(s.anomalies().total() == 0);
    CHECK(sink.bad_layers() == 0);
    CHECK(s.prefill_tokens() == n_prompt);
    CHECK(s.decode_tokens() == n_decode);
    // Every row the observer delivered reached the session, at the same position.
    CHECK(s.extension<0>().tokens == seen.tokens);
    CHECK(sink.partial_layers() == seen.outputs_only);
    std::size_t last_moe = shape.n_layers() - 1;
    while (!shape.is_moe(layer_id(static_cast<std::uint16_t>(last_moe)))) --last_moe;
    const auto& prefill_last =
        s.extension<0>().tokens[{static_cast<int>(run_phase::prefill), static_cast<std::uint16_t>(last_moe)}];
    if (config == "gpt-oss") {
      // gpt-oss's graph keeps every row through its last MoE layer.
      CHECK(sink.partial_layers() == 0);
      CHECK(prefill_last.size() == n_prompt);
    } else {
      // llama.cpp computes the last prompt layer for the output row only: it is
      // now sent to the session, as the prompt's last token.
      CHECK(sink.partial_layers() == 1);
      CHECK(prefill_last == std::vector<std::uint32_t>{static_cast<std::uint32_t>(n_prompt - 1)});
    }
    for (std::size_t l = 0; l < shape.n_layers(); ++l) {
      if (!shape.is_moe(layer_id(static_cast<std::uint16_t>(l)))) continue;
      CAPTURE(l);
      const auto& d = s.extension<0>().tokens[{static_cast<int>(run_phase::decode), static_cast<std::uint16_t>(l)}];
      CHECK(d.size() == n_decode);
    }
    const prediction_report r = s.report();
    const std::size_t ctrl = r.control_index();
    REQUIRE(ctrl < r.predictors.size());
    CHECK(r.totals[ctrl].slots > 0);
    CHECK(r.totals[ctrl].slot_hits == r.totals[ctrl].slots);  // control 100.0%
  });
}

TEST_CASE("llama.cpp observer: attaching changes no logit; detaching stops the events") {
  llama_init_once();
  for (const char* arch : {"qwen3moe", "deepseek2", "gpt-oss"}) {
    const std::string config = arch;
    CAPTURE(config);
    auto model = mre::make_random_model(spec_for(arch, GGML_TYPE_F16));
    run_result plain, observed;
    {
      auto ctx = make_context(model.get(), test_context_params());
      plain = run_tokens(ctx.get(), model.get(), 16, 64);
    }
    mrl::observer obs(model.get());
    control_sink sink;
    obs.set_sink(&sink);
    {
      auto cp = test_context_params();
      obs.install(cp);
      auto ctx = make_context(model.get(), cp);
      observed = run_tokens(ctx.get(), model.get(), 16, 64);
      REQUIRE(sink.routings > 0);
      CHECK(plain.tokens == observed.tokens);
      REQUIRE(plain.logits.size() == observed.logits.size());
      CHECK(std::memcmp(plain.logits.data(), observed.logits.data(), plain.logits.size() * sizeof(float)) == 0);

      // Detached: the context still runs through the trampoline, but no event.
      obs.detach();
      const std::size_t before = sink.routings;
      const auto data_calls = obs.stats().data_calls;
      llama_memory_clear(llama_get_memory(ctx.get()), true);
      obs.set_position(0);
      run_tokens(ctx.get(), model.get(), 8, 4);
      CHECK(sink.routings == before);
      CHECK(obs.stats().data_calls == data_calls);
      obs.attach();
      llama_memory_clear(llama_get_memory(ctx.get()), true);
      obs.set_position(0);
      run_tokens(ctx.get(), model.get(), 8, 4);
      CHECK(sink.routings > before);
    }
  }
}

TEST_CASE("llama.cpp observer: a throwing sink is counted, never crosses into ggml") {
  llama_init_once();
  struct throwing_sink : mrl::observer_sink {
    void on_layer_loaded(const mrl::layer_batch&) override { throw std::runtime_error("sink failure"); }
  } sink;
  auto model = mre::make_random_model(spec_for("qwen3moe", GGML_TYPE_F32));
  mrl::observer obs(model.get());
  obs.set_sink(&sink);
  auto cp = test_context_params();
  obs.install(cp);
  auto ctx = make_context(model.get(), cp);
  run_tokens(ctx.get(), model.get(), 4, 3);
  CHECK(obs.stats().exceptions == 4 * 4);  // every layer of 4 graphs
  CHECK(std::string(obs.last_error()) == "sink failure");
}

TEST_CASE("llama.cpp observer: node names") {
  int il = -1;
  CHECK(mrl::detail::parse_moe_node("ffn_moe_topk-12", il) == mrl::detail::moe_node::topk);
  CHECK(il == 12);
  CHECK(mrl::detail::parse_moe_node("ffn_moe_weights_norm-3", il) == mrl::detail::moe_node::weights_norm);
  CHECK(il == 3);
  CHECK(mrl::detail::parse_moe_node("ffn_moe_weights_norm-3 (reshaped)", il) == mrl::detail::moe_node::none);
  CHECK(mrl::detail::parse_moe_node("ffn_moe_topk-", il) == mrl::detail::moe_node::none);
  CHECK(mrl::detail::parse_moe_node("ffn_moe_up-1", il) == mrl::detail::moe_node::none);
  CHECK(mrl::detail::parse_moe_node("attn_norm-1", il) == mrl::detail::moe_node::none);
  CHECK(mrl::detail::parse_blk_layer("blk.17.ffn_up_exps.weight") == 17);
  CHECK(mrl::detail::parse_blk_layer("blk.x.ffn_up_exps.weight") == -1);
  CHECK(mrl::detail::parse_blk_layer("output.weight") == -1);
}

namespace {
/// A session whose `routed` throws once, at the n-th call: an anomaly in the
/// middle of a graph, after the layer's gate input was accepted.
template <class S>
struct faulty_session {
  S* s;
  int throw_at = -1;
  int calls = 0;
  const model_shape& shape() const noexcept { return s->shape(); }
  const router_bank& routers() const noexcept { return s->routers(); }
  bool begin_batch(run_phase p, std::uint32_t first, std::size_t n) { return s->begin_batch(p, first, n); }
  bool gate_input(layer_id l, const float* x, std::size_t n_embd, std::size_t n, std::size_t stride) {
    return s->gate_input(l, x, n_embd, n, stride);
  }
  bool routed(layer_id l, span<const routing> r) {
    if (calls++ == throw_at) throw moe_residency::error("injected anomaly");
    return s->routed(l, r);
  }
  bool layer_loaded(layer_id l) { return s->layer_loaded(l); }
  std::uint32_t drop_mask(std::size_t t) const noexcept { return s->drop_mask(t); }
};
}  // namespace

TEST_CASE("llama.cpp observer: session_sink recovers a throw-mode session at the next graph") {
  llama_init_once();
  observed_model om(spec_for("qwen3moe", GGML_TYPE_F32));
  om.warm_up();  // learn the structure, then start afresh
  const model_shape shape = om.obs.shape();
  standard_session s(shape);  // throw mode, as in docs/llama-cpp.md
  mrl::configure_routers(s, om.obs);
  faulty_session<standard_session> fs{&s};
  fs.throw_at = static_cast<int>(shape.n_layers()) + 1;  // layer 1 of the first decode graph
  mrl::session_sink<faulty_session<standard_session>> sink(fs);
  om.obs.set_sink(&sink);
  const std::size_t n_decode = 6;
  om.run(4, n_decode);
  om.obs.set_sink(nullptr);
  // The injected throw, then the mid-layer boundary it left, rethrown once
  // the next graph's batch had begun; nothing else was lost.
  CHECK(om.obs.stats().exceptions == 2);
  CHECK(s.decode_tokens() == n_decode);
  const prediction_report r = s.report();
  const std::size_t ctrl = r.control_index();
  REQUIRE(ctrl < r.predictors.size());
  CHECK(r.totals[ctrl].routings == n_decode * shape.n_layers() - 1);
  CHECK(r.totals[ctrl].slot_hits == r.totals[ctrl].slots);
}

TEST_CASE("llama.cpp observer: session_sink refuses, loudly, drops llama.cpp cannot make") {
  llama_init_once();
  observed_model om(spec_for("qwen3moe", GGML_TYPE_F32));
  om.warm_up();  // learn the structure, then start afresh
  const model_shape shape = om.obs.shape();
  using spec_t = speculation<expert_cache<lru_policy>>;
  using drop_session = session<predictor_set<stale_gate_predictor>, spec_t>;
  speculation_options o;
  o.drop = drop_options{};  // F = 1.0
  o.scheduler.lanes = 0;
  cache_options co;
  co.budget_bytes = token_cycle_bytes(shape) * 2;
  session_options so;
  so.on_anomaly = anomaly_action::count;
  drop_session s(shape, so, std::tuple<stale_gate_predictor>{},
                 std::tuple<spec_t>{spec_t(
                     shape, expert_cache<lru_policy>(shape, co),
                     [](layer_id, expert_id, read_reason) noexcept { return read_status::ok; }, o)});
  mrl::configure_routers(s, om.obs);
  mrl::session_sink<drop_session> sink(s);
  om.obs.set_sink(&sink);
  om.run(4, 8);
  om.obs.set_sink(nullptr);
  CHECK(sink.ignored_drops() > 0);
  CHECK(om.obs.stats().exceptions == 1);  // loud once, counted always
  CHECK(std::string(om.obs.last_error()).find("disarm dropping") != std::string::npos);
}

TEST_CASE("llama.cpp observer: a second install over another chained callback is refused") {
  llama_init_once();
  auto model = mre::make_random_model(spec_for("qwen3moe", GGML_TYPE_F32));
  mrl::observer obs(model.get());
  struct user_cb {
    static bool a(ggml_tensor*, bool, void*) { return false; }
    static bool b(ggml_tensor*, bool, void*) { return false; }
  };
  auto cp1 = test_context_params();
  cp1.cb_eval = &user_cb::a;
  obs.install(cp1);
  auto cp2 = test_context_params();
  cp2.cb_eval = &user_cb::a;
  CHECK_NOTHROW(obs.install(cp2));  // the same chained callback: a replacement context
  auto cp3 = test_context_params();
  cp3.cb_eval = &user_cb::b;
  CHECK_THROWS_WITH_AS(obs.install(cp3), doctest::Contains("use one observer per live context"), moe_residency::error);
  const bool untouched = cp3.cb_eval == &user_cb::b;
  CHECK(untouched);  // refused: the params are untouched
}
