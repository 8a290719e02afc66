// The llama.cpp observer at its C boundary, fed graphs built by hand with
// ggml (named like build_moe_ffn's nodes) and driven through its eval
// callback as ggml_backend_sched would call it: the ask phase for every node,
// the data phase for the nodes asked for. These are the graphs a real model
// does not produce — missing nodes, odd shapes and types, non-contiguous gate
// inputs, a sink that throws, a decode layer with fewer or more rows than its
// batch, one observer entered from two threads at once. Each must end in a
// counted anomaly (observer_stats) or a delivered event, never a crash, and
// lose nothing already accounted: the well-formed layers of the same graph
// are delivered with exactly the ids and weights written into it.

#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "../../fuzz/gguf_seed.hpp"
#include "llama_support.hpp"
#include "moe_residency/adapters/llama_cpp/gguf.hpp"
#include "moe_residency/session.hpp"

using namespace moe_residency;
using namespace moe_residency_test;

namespace {

constexpr int n_layer = 4, n_embd = 128, n_expert = 64, k = 8, n_ff = 16;

/// One MoE layer's nodes as build_moe_ffn names them (qwen3moe: softmax
/// gating, weights normalised), with ids and weights written by the test.
struct layer_nodes {
  ggml_tensor *router = nullptr, *x = nullptr, *logits = nullptr, *probs = nullptr, *argsort = nullptr, *topk = nullptr,
              *weights = nullptr, *weights_norm = nullptr, *up = nullptr;
  std::vector<ggml_tensor*> order() const {
    std::vector<ggml_tensor*> v;
    for (ggml_tensor* t : {logits, probs, argsort, topk, weights, weights_norm, up})
      if (t != nullptr) v.push_back(t);
    return v;
  }
};

/// A ggml context owning one hand-built graph.
struct hand_graph {
  ggml_context* ctx = nullptr;
  std::vector<layer_nodes> layers;
  hand_graph() {
    ggml_init_params p{};
    p.mem_size = 64u << 20;
    p.no_alloc = false;  // host data, no backend buffer: host_readable
    ctx = ggml_init(p);
    REQUIRE(ctx != nullptr);
  }
  ~hand_graph() { ggml_free(ctx); }
  hand_graph(const hand_graph&) = delete;
  hand_graph& operator=(const hand_graph&) = delete;

  /// Every layer, each over n_tok tokens (see add).
  void add_all(int n_tok) {
    for (int il = 0; il < n_layer; ++il) add(il, n_tok);
  }

  /// Layer il over n_tok tokens; ids of token t are (t*7 + il*3 + j*5) % n_expert
  /// for slot j (distinct: 5 is a unit mod 64), weights (j+1)/100 + t + il.
  layer_nodes& add(int il, int n_tok, ggml_type x_type = GGML_TYPE_F32) {
    layer_nodes n;
    char name[64];
    n.router = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_embd, n_expert);
    n.x = ggml_new_tensor_2d(ctx, x_type, n_embd, n_tok);
    fill(n.router, 0.01f);
    fill(n.x, 1.0f);
    n.logits = ggml_mul_mat(ctx, n.router, n.x);
    std::snprintf(name, sizeof name, "ffn_moe_logits-%d", il);
    ggml_set_name(n.logits, name);
    n.probs = ggml_soft_max(ctx, n.logits);
    std::snprintf(name, sizeof name, "ffn_moe_probs-%d", il);
    ggml_set_name(n.probs, name);
    n.argsort = ggml_argsort(ctx, n.probs, GGML_SORT_ORDER_DESC);
    std::snprintf(name, sizeof name, "ffn_moe_argsort-%d", il);
    ggml_set_name(n.argsort, name);
    n.topk = ggml_view_2d(ctx, n.argsort, k, n_tok, n.argsort->nb[1], 0);
    std::snprintf(name, sizeof name, "ffn_moe_topk-%d", il);
    ggml_set_name(n.topk, name);
    n.weights = ggml_get_rows(ctx, ggml_reshape_3d(ctx, n.probs, 1, n_expert, n_tok), n.topk);
    std::snprintf(name, sizeof name, "ffn_moe_weights-%d", il);
    ggml_set_name(n.weights, name);
    ggml_tensor* w2 = ggml_reshape_2d(ctx, n.weights, k, n_tok);
    n.weights_norm = ggml_div(ctx, w2, ggml_sum_rows(ctx, w2));
    std::snprintf(name, sizeof name, "ffn_moe_weights_norm-%d", il);
    ggml_set_name(n.weights_norm, name);
    ggml_tensor* up_exps = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, n_embd, n_ff, n_expert);
    std::snprintf(name, sizeof name, "blk.%d.ffn_up_exps.weight", il);
    ggml_set_name(up_exps, name);
    n.up = ggml_mul_mat_id(ctx, up_exps, ggml_reshape_3d(ctx, n.x, n_embd, 1, n_tok), n.topk);
    for (int t = 0; t < n_tok; ++t)
      for (int j = 0; j < k; ++j) {
        auto* ids = reinterpret_cast<std::int32_t*>(static_cast<char*>(n.argsort->data) + t * n.argsort->nb[1]);
        ids[j] = id(il, t, j);
        auto* w = reinterpret_cast<float*>(static_cast<char*>(n.weights_norm->data) + t * n.weights_norm->nb[1]);
        w[j] = weight(il, t, j);
      }
    layers.push_back(n);
    return layers.back();
  }
  static int id(int il, int t, int j) { return (t * 7 + il * 3 + j * 5) % n_expert; }
  static float weight(int il, int t, int j) { return static_cast<float>(j + 1) / 100.0f + t + il; }
  static void fill(ggml_tensor* t, float v) {
    if (t->type != GGML_TYPE_F32) return;
    float* p = static_cast<float*>(t->data);
    for (int64_t i = 0; i < ggml_nelements(t); ++i) p[i] = v * static_cast<float>(i % 13);
  }
};

/// What ggml_backend_sched does with cb_eval, node by node.
void drive(ggml_tensor* t, mrl::observer& obs) {
  if (mrl::observer::eval_callback(t, true, &obs)) mrl::observer::eval_callback(t, false, &obs);
}
void drive(const hand_graph& g, mrl::observer& obs) {
  for (const layer_nodes& n : g.layers)
    for (ggml_tensor* t : n.order()) drive(t, obs);
}

/// Copies every event, so a test can check what was delivered and how.
struct recording_sink : mrl::observer_sink {
  struct event {
    int layer;
    std::uint32_t first_position;
    std::size_t n_tokens;
    bool outputs_only;
    std::vector<int> ids;
    std::vector<float> weights;
    std::vector<float> x0;  // the first gate-input element of each token
  };
  std::vector<moe_residency::batch_info> batches;
  std::vector<event> events;
  bool throw_in_batch = false;
  int throw_at_layer = -1;
  void on_begin_batch(const moe_residency::batch_info& b) override {
    batches.push_back(b);
    if (throw_in_batch) throw std::runtime_error("on_begin_batch failure");
  }
  void on_layer_loaded(const mrl::layer_batch& b) override {
    if (static_cast<int>(to_index(b.layer)) == throw_at_layer) throw std::runtime_error("on_layer_loaded failure");
    event e{static_cast<int>(to_index(b.layer)), b.first_position, b.n_tokens, b.outputs_only, {}, {}, {}};
    for (std::size_t t = 0; t < b.n_tokens; ++t) {
      e.x0.push_back(b.x(t)[1]);
      for (std::size_t j = 0; j < b.k; ++j) {
        e.ids.push_back(b.ids[t * b.ids_stride + j]);
        e.weights.push_back(b.weights[t * b.weight_token_stride + j * b.weight_slot_stride]);
      }
    }
    events.push_back(std::move(e));
  }
};

/// The event of layer il holds exactly what hand_graph::add wrote for
/// tokens [t0, t0 + n) of its graph.
void check_event(const recording_sink::event& e, int il, int t0, std::size_t n) {
  CAPTURE(il);
  CHECK(e.layer == il);
  REQUIRE(e.n_tokens == n);
  REQUIRE(e.ids.size() == n * k);
  for (std::size_t t = 0; t < n; ++t)
    for (int j = 0; j < k; ++j) {
      CHECK(e.ids[t * k + static_cast<std::size_t>(j)] == hand_graph::id(il, t0 + static_cast<int>(t), j));
      CHECK(e.weights[t * k + static_cast<std::size_t>(j)] == hand_graph::weight(il, t0 + static_cast<int>(t), j));
    }
}

struct fixture {
  mre::model_ptr model;
  std::unique_ptr<mrl::observer> obs;
  recording_sink sink;
  // The graph that taught the structure: its router tensors are the routers
  // the structure points at (as a model's are in llama.cpp), so it lives on.
  hand_graph teach;
  fixture() {
    llama_init_once();
    mre::random_model_spec s = spec_for("qwen3moe", GGML_TYPE_F32);
    REQUIRE(s.n_layer == n_layer);
    REQUIRE(s.n_embd == n_embd);
    REQUIRE(s.n_expert == n_expert);
    REQUIRE(s.n_expert_used == k);
    model = mre::make_random_model(s);
    obs = std::make_unique<mrl::observer>(model.get());
    obs->set_sink(&sink);
    // One well-formed decode graph teaches the structure of every layer.
    for (int il = 0; il < n_layer; ++il) teach.add(il, 1);
    drive(teach, *obs);
    REQUIRE(obs->structure_known());
    REQUIRE(sink.events.size() == n_layer);
    for (int il = 0; il < n_layer; ++il) check_event(sink.events[static_cast<std::size_t>(il)], il, 0, 1);
    sink.events.clear();
    sink.batches.clear();
    obs->reset_stats();
  }
};

/// One graph of one token per layer in which layer 1 lost the nodes `remove`
/// clears, driven through the fixture's observer.
template <class Remove>
void drive_without(fixture& f, Remove remove) {
  hand_graph g;
  g.add_all(1);
  remove(g.layers[1]);  // not shown to the observer
  drive(g, *f.obs);
}

/// A session in count mode on the fixture's structure, fed by a session_sink
/// that is now the observer's sink.
struct counting_session {
  standard_session s;
  mrl::session_sink<standard_session> sink;
  static session_options counting() {
    session_options so;
    so.on_anomaly = anomaly_action::count;
    return so;
  }
  explicit counting_session(fixture& f) : s(f.obs->shape(), counting()), sink(s) {
    mrl::configure_routers(s, *f.obs);
    f.obs->set_sink(&sink);
  }
};

}  // namespace

TEST_CASE("llama.cpp boundary: a hand-built graph is read exactly, positions continue across graphs") {
  fixture f;
  hand_graph g;
  g.add_all(3);
  drive(g, *f.obs);
  REQUIRE(f.sink.batches.size() == 1);
  CHECK(f.sink.batches[0].first_position == 1);  // after the fixture's decode token
  CHECK(f.sink.batches[0].n_tokens == 3);
  CHECK(f.sink.batches[0].phase == run_phase::prefill);
  REQUIRE(f.sink.events.size() == n_layer);
  for (int il = 0; il < n_layer; ++il) {
    check_event(f.sink.events[static_cast<std::size_t>(il)], il, 0, 3);
    CHECK(f.sink.events[static_cast<std::size_t>(il)].first_position == 1);
  }
  CHECK(f.obs->stats().layer_batches == n_layer);
  CHECK(f.obs->stats().unreadable == 0);
  CHECK(f.obs->stats().exceptions == 0);
}

TEST_CASE("llama.cpp boundary: missing nodes skip only their layer") {
  fixture f;
  SUBCASE("no ffn_moe_weights* node: the layer is counted unreadable (it dereferenced null)") {
    drive_without(f, [](layer_nodes& n) { n.weights = n.weights_norm = nullptr; });
    CHECK(f.obs->stats().unreadable == 1);
  }
  SUBCASE("no ffn_moe_logits node: the layer never routed in this graph") {
    drive_without(f, [](layer_nodes& n) { n.logits = nullptr; });
    CHECK(f.obs->stats().unreadable == 1);
  }
  SUBCASE("no ffn_moe_topk node: the expert matmul is not build_moe_ffn's and is ignored") {
    drive_without(f, [](layer_nodes& n) { n.topk = nullptr; });
    CHECK(f.obs->stats().unreadable == 0);
  }
  SUBCASE("no expert matmul: nothing to trigger the layer's data") {
    drive_without(f, [](layer_nodes& n) { n.up = nullptr; });
    CHECK(f.obs->stats().unreadable == 0);
  }
  CHECK(f.obs->stats().exceptions == 0);
  CHECK(f.obs->stats().graphs == 1);
  REQUIRE(f.sink.events.size() == n_layer - 1);
  check_event(f.sink.events[0], 0, 0, 1);
  check_event(f.sink.events[1], 2, 0, 1);
  check_event(f.sink.events[2], 3, 0, 1);
  CHECK(f.obs->stats().layer_batches == n_layer - 1);
}

TEST_CASE("llama.cpp boundary: odd shapes and types are counted unreadable, the rest delivered") {
  fixture f;
  hand_graph g;
  g.add_all(2);
  layer_nodes& bad = g.layers[2];
  SUBCASE("gate input of f16") {
    hand_graph h;
    for (int il = 0; il < n_layer; ++il) h.add(il, 2, il == 2 ? GGML_TYPE_F16 : GGML_TYPE_F32);
    drive(h, *f.obs);
  }
  SUBCASE("gate input not contiguous (every other float)") {
    bad.logits->src[1] = ggml_view_2d(g.ctx, ggml_new_tensor_2d(g.ctx, GGML_TYPE_F32, 2 * n_embd, 2), n_embd, 2,
                                      2 * n_embd * sizeof(float), 0);
    bad.logits->src[1]->nb[0] = 2 * sizeof(float);
    drive(g, *f.obs);
  }
  SUBCASE("gate input with fewer columns than the ids") {
    bad.logits->src[1] = ggml_new_tensor_2d(g.ctx, GGML_TYPE_F32, n_embd, 1);
    drive(g, *f.obs);
  }
  SUBCASE("ids of another top-k") {
    ggml_tensor* ids = ggml_view_2d(g.ctx, bad.argsort, k - 2, 2, bad.argsort->nb[1], 0);
    ggml_set_name(ids, "ffn_moe_topk-2");
    bad.topk = ids;
    bad.up->src[2] = ids;
    drive(g, *f.obs);
  }
  SUBCASE("ids not i32") {
    ggml_tensor* ids = ggml_new_tensor_2d(g.ctx, GGML_TYPE_F32, k, 2);
    ggml_set_name(ids, "ffn_moe_topk-2");
    bad.topk = ids;
    bad.up->src[2] = ids;
    drive(g, *f.obs);
  }
  SUBCASE("weights neither [k, T] nor [1, k, T]") {
    ggml_tensor* w = ggml_new_tensor_2d(g.ctx, GGML_TYPE_F32, k + 1, 2);
    ggml_set_name(w, "ffn_moe_weights_norm-2");
    bad.weights_norm = w;
    drive(g, *f.obs);
  }
  SUBCASE("weights not f32") {
    ggml_tensor* w = ggml_new_tensor_2d(g.ctx, GGML_TYPE_F16, k, 2);
    ggml_set_name(w, "ffn_moe_weights_norm-2");
    bad.weights_norm = w;
    drive(g, *f.obs);
  }
  SUBCASE("a layer with more rows than its batch") {
    hand_graph h;
    for (int il = 0; il < n_layer; ++il) h.add(il, il == 2 ? 3 : 2);
    drive(h, *f.obs);
  }
  SUBCASE("gate input with no data") {
    bad.logits->src[1] = ggml_view_2d(g.ctx, bad.x, n_embd, 2, bad.x->nb[1], 0);
    bad.logits->src[1]->data = nullptr;
    drive(g, *f.obs);
  }
  CHECK(f.obs->stats().unreadable == 1);
  CHECK(f.obs->stats().exceptions == 0);
  CHECK(f.obs->stats().graphs == 1);
  REQUIRE(f.sink.events.size() == n_layer - 1);
  check_event(f.sink.events[0], 0, 0, 2);
  check_event(f.sink.events[1], 1, 0, 2);
  check_event(f.sink.events[2], 3, 0, 2);
}

TEST_CASE("llama.cpp boundary: a decode layer with fewer rows than its batch is delivered as outputs only") {
  fixture f;
  hand_graph g;
  for (int il = 0; il < n_layer; ++il) g.add(il, il == n_layer - 1 ? 1 : 4);
  drive(g, *f.obs);
  REQUIRE(f.sink.events.size() == n_layer);
  const recording_sink::event& last = f.sink.events.back();
  CHECK(last.outputs_only);
  CHECK(last.first_position == 1 + 3);  // the batch's last token
  check_event(last, n_layer - 1, 0, 1);
  CHECK_FALSE(f.sink.events[0].outputs_only);
  // session_sink refuses a decode layer with fewer rows (and counts it); a
  // prefill one goes to the session with its own rows.
  f.obs->set_phase(run_phase::decode);
  counting_session cs(f);
  const mrl::session_sink<standard_session>& ss = cs.sink;
  hand_graph h;
  for (int il = 0; il < n_layer; ++il) h.add(il, il == n_layer - 1 ? 1 : 4);
  drive(h, *f.obs);
  CHECK(ss.bad_layers() == 1);
  CHECK(ss.partial_layers() == 0);
  CHECK(f.obs->stats().exceptions == 0);
}

TEST_CASE("llama.cpp boundary: ids out of range reach the sink, and session_sink counts the layer") {
  fixture f;
  counting_session cs(f);
  const standard_session& s = cs.s;
  const mrl::session_sink<standard_session>& ss = cs.sink;
  hand_graph g;
  g.add_all(1);
  static_cast<std::int32_t*>(g.layers[1].argsort->data)[3] = n_expert;  // one past the last expert
  static_cast<std::int32_t*>(g.layers[2].argsort->data)[0] = -1;
  drive(g, *f.obs);
  CHECK(ss.bad_layers() == 2);
  CHECK(f.obs->stats().layer_batches == n_layer);
  // The next graph is whole; the two layers left with a gate input and no
  // routing are counted once each when it begins, and nothing else.
  hand_graph h;
  for (int il = 0; il < n_layer; ++il) h.add(il, 1);
  drive(h, *f.obs);
  CHECK(ss.bad_layers() == 2);
  CHECK(f.obs->stats().layer_batches == 2 * n_layer);
  CHECK(f.obs->stats().exceptions == 0);
  CHECK(s.decode_tokens() == 2);
  CHECK(s.anomalies().total() == 2);
  const prediction_report r = s.report();
  const std::size_t ctrl = r.control_index();
  REQUIRE(ctrl < r.predictors.size());
  CHECK(r.totals[ctrl].routings == 2 * n_layer - 2);
}

TEST_CASE("llama.cpp boundary: a throwing sink is counted, and the next layer and graph are delivered") {
  fixture f;
  f.sink.throw_in_batch = true;
  f.sink.throw_at_layer = 1;
  hand_graph g;
  g.add_all(1);
  drive(g, *f.obs);
  CHECK(f.obs->stats().exceptions == 2);
  CHECK(std::string(f.obs->last_error()) == "on_layer_loaded failure");
  REQUIRE(f.sink.events.size() == n_layer - 1);
  check_event(f.sink.events[0], 0, 0, 1);
  check_event(f.sink.events[1], 2, 0, 1);
  f.sink.throw_in_batch = false;
  f.sink.throw_at_layer = -1;
  hand_graph h;
  for (int il = 0; il < n_layer; ++il) h.add(il, 1);
  drive(h, *f.obs);
  CHECK(f.obs->stats().exceptions == 2);
  REQUIRE(f.sink.batches.size() == 2);
  CHECK(f.sink.batches[1].first_position == 2);
  CHECK(f.sink.events.size() == 2 * n_layer - 1);
}

namespace {
/// A chained user callback that, on the first node it sees, holds the
/// calling thread inside the observer until released.
struct gate_cb {
  std::mutex m;
  std::condition_variable cv;
  bool inside = false, release = false;
  std::atomic<int> calls{0};
  static bool cb(ggml_tensor*, bool ask, void* ud) {
    auto* self = static_cast<gate_cb*>(ud);
    if (self->calls++ == 0) {
      std::unique_lock<std::mutex> lock(self->m);
      self->inside = true;
      self->cv.notify_all();
      self->cv.wait(lock, [&] { return self->release; });
    }
    return ask ? false : true;
  }
};
}  // namespace

TEST_CASE("llama.cpp boundary: one observer entered from two threads at once refuses the second, counted") {
  llama_init_once();
  auto model = mre::make_random_model(spec_for("qwen3moe", GGML_TYPE_F32));
  mrl::observer obs(model.get());
  recording_sink sink;
  obs.set_sink(&sink);
  gate_cb gate;
  llama_context_params cp = test_context_params();
  cp.cb_eval = &gate_cb::cb;
  cp.cb_eval_user_data = &gate;
  obs.install(cp);
  hand_graph a, b;
  for (int il = 0; il < n_layer; ++il) {
    a.add(il, 1);
    b.add(il, 1);
  }
  // Thread 1 enters with a's first node and is held in the chained callback.
  std::thread t1([&] { drive(a.layers[0].logits, obs); });
  {
    std::unique_lock<std::mutex> lock(gate.m);
    gate.cv.wait(lock, [&] { return gate.inside; });
  }
  // Meanwhile this thread evaluates a whole graph through the same observer.
  drive(b, obs);
  CHECK(obs.stats().concurrent_calls == b.layers.size() * b.layers[0].order().size());
  {
    std::lock_guard<std::mutex> lock(gate.m);
    gate.release = true;
  }
  gate.cv.notify_all();
  t1.join();
  CHECK(sink.events.empty());  // the refused graph was not half-read
  // Thread 1 goes on with graph a (another thread, one at a time: fine).
  for (std::size_t i = 0; i < a.layers.size(); ++i) {
    const auto nodes = a.layers[i].order();
    for (std::size_t j = i == 0 ? 1 : 0; j < nodes.size(); ++j) drive(nodes[j], obs);
  }
  CHECK(obs.structure_known());
  REQUIRE(sink.events.size() == n_layer);
  for (int il = 0; il < n_layer; ++il) check_event(sink.events[static_cast<std::size_t>(il)], il, 0, 1);
  std::thread t2([&] {
    hand_graph c;
    for (int il = 0; il < n_layer; ++il) c.add(il, 1);
    drive(c, obs);
  });
  t2.join();
  CHECK(sink.events.size() == 2 * n_layer);
  CHECK(obs.stats().concurrent_calls == b.layers.size() * b.layers[0].order().size());
  CHECK(obs.stats().exceptions == 0);
}

// ---------------------------------------------------------------------------
// The GGUF expert map at the file boundary (fuzz/fuzz_gguf_expert_map.cpp
// fuzzes it; these are its reference file and the regression of what writing
// that fuzzer found).

namespace {
std::string write_temp(const std::vector<unsigned char>& bytes, const char* name) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("moe-residency-" + std::to_string(::getpid()) + "-" + name)).string();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
  std::fclose(f);
  return path;
}
}  // namespace

TEST_CASE("gguf_expert_map: the expert ranges of a small GGUF hold exactly its experts' bytes") {
  const std::vector<unsigned char> bytes = moe_residency_fuzz::small_expert_gguf(0);
  const std::string path = write_temp(bytes, "boundary-small.gguf");
  const mrl::gguf_expert_map m = mrl::gguf_expert_map::by_name(path);
  REQUIRE(m.n_layer() == 2);
  REQUIRE(m.ranges(layer_id(0)).size() == 2);
  REQUIRE(m.ranges(layer_id(1)).size() == 2);
  struct want {
    const char* tensor;
    std::uint64_t bytes_per_expert;
  };
  // f32 [16, 8, 4]: 16*4*8; f16 [8, 16, 4]: 8*2*16; q4_0 [32, 4, 4]: one 18-byte block a row, 4 rows.
  const want w[] = {{"blk.0.ffn_up_exps.weight", 512},
                    {"blk.0.ffn_down_exps.weight", 256},
                    {"blk.1.ffn_gate_exps.weight", 72},
                    {"blk.1.ffn_up_exps.weight", 72}};
  std::size_t i = 0;
  for (std::size_t l = 0; l < 2; ++l)
    for (const mrl::expert_file_range& r : m.ranges(layer_id(static_cast<std::uint16_t>(l)))) {
      CAPTURE(r.tensor);
      CHECK(r.tensor == w[i].tensor);
      CHECK(r.bytes_per_expert == w[i].bytes_per_expert);
      CHECK(r.n_expert == 4);
      // Every byte of every expert is the seed's pattern over the tensor's bytes.
      for (std::uint64_t b = 0; b < r.bytes_per_expert * r.n_expert; ++b)
        REQUIRE(bytes.at(r.offset + b) == static_cast<unsigned char>((b * 37 + 11) & 0x3f));
      ++i;
    }
  CHECK(m.expert_bytes(layer_id(0)) == 512 + 256);
  const std::vector<std::uint64_t> dense = mrl::gguf_dense_bytes(path, m, 2);
  CHECK(dense[0] == 16 * 4 + 16 * 4 * 4);  // attn_norm, ffn_gate_inp
  CHECK(dense[1] == 0);
  std::filesystem::remove(path);
}

TEST_CASE("fuzz_gguf_expert_map: a truncated GGUF whose experts lie past its end is refused") {
  std::vector<unsigned char> bytes = moe_residency_fuzz::small_expert_gguf(0);
  // gguf.h loads the header of a file cut anywhere in its data section (it
  // reads no data), so before the map checked, its ranges pointed past EOF.
  for (const std::size_t cut : {std::size_t{1}, std::size_t{72 * 4}, bytes.size() / 2}) {
    CAPTURE(cut);
    std::vector<unsigned char> truncated(bytes.begin(), bytes.end() - static_cast<std::ptrdiff_t>(cut));
    const std::string path = write_temp(truncated, "boundary-truncated.gguf");
    CHECK_THROWS_WITH_AS(mrl::gguf_expert_map::by_name(path),
                         doctest::Contains("bytes; expected its experts inside the file (is it truncated?)"),
                         moe_residency::error);
    CHECK_THROWS_WITH_AS(mrl::gguf_expert_map::by_name(path), doctest::Contains(path.c_str()), moe_residency::error);
    std::filesystem::remove(path);
  }
}
