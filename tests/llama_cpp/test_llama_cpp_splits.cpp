// Split GGUFs (llama.cpp's gguf-split layout: the first file holds the
// metadata, each file some tensors with its own data section) and all cores:
// the expert map, the reader and the residency manager on a model written as
// one file and as three splits, and the logits at 1 and 2 threads.

#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "llama_support.hpp"
#include "moe_residency/adapters/llama_cpp.hpp"

using namespace moe_residency_test;
using moe_residency::expert_id;
using moe_residency::layer_id;

namespace {

/// A model written by save_random_gguf as `splits` files, removed at scope exit.
struct written_model {
  std::vector<std::string> paths;
  written_model(const std::string& stem, const mre::random_model_spec& spec, int splits) {
    llama_init_once();
    const std::string base = "moe_residency_" + stem + "_" + std::to_string(::getpid());
    const std::string first = splits > 1 ? mrl::detail::split_path(base, 0, splits) : base + ".gguf";
    mre::save_random_gguf(spec, first, {}, splits);
    for (int i = 0; i < splits; ++i) paths.push_back(splits > 1 ? mrl::detail::split_path(base, i, splits) : first);
  }
  ~written_model() {
    for (const auto& p : paths) std::remove(p.c_str());
  }
  written_model(const written_model&) = delete;
  written_model& operator=(const written_model&) = delete;
  const std::string& path() const { return paths.front(); }
};

/// Every logit of a seeded run of `m` (a fresh context, `threads` threads;
/// with `residency`, the manager's every part on, acting although the model fits).
std::vector<float> logits_of(const std::string& path, int threads, bool residency,
                             mrl::residency_stats* stats = nullptr) {
  auto model = load_mmap(path);
  llama_context_params cp = test_context_params();
  cp.n_threads = cp.n_threads_batch = threads;
  if (!residency) {
    auto ctx = make_context(model.get(), cp);
    return run_tokens(ctx.get(), model.get(), 6, 10).logits;
  }
  observed_model om(std::move(model), nullptr, cp);
  om.warm_up();
  mrl::residency_options o = mrl::residency_options::none();
  o.fits = mrl::when_fits::act;
  o.pin_dense = o.exact = o.predicted = o.cache = true;
  o.cache_budget_bytes = 4ull << 20;
  mrl::mmap_residency<> res(om.obs, path, o);
  // A speculative read enters the cache once complete: the lanes drained
  // before each routing, the cache decides the same on both files.
  draining_sink front(res);
  om.obs.set_sink(&front);
  const auto got = om.run(6, 10).logits;
  res.settle();
  CHECK(res.active());
  CHECK(res.status() == "");
  CHECK(res.stats().advice_errors() == 0);
  if (stats) *stats = res.stats();
  om.obs.set_sink(nullptr);
  return got;
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("split GGUF: written as 3 splits, it is llama.cpp's split layout and the same model") {
  written_model one("split_one", small_moe_spec(), 1), three("split_three", small_moe_spec(), 3);
  REQUIRE(three.paths.size() == 3);
  // llama.cpp's own names for the splits
  char want[512];
  const std::string prefix = three.path().substr(0, three.path().size() - std::strlen("-00001-of-00003.gguf"));
  for (int i = 0; i < 3; ++i) {
    REQUIRE(llama_split_path(want, sizeof want, prefix.c_str(), i, 3) > 0);
    CHECK(three.paths[static_cast<std::size_t>(i)] == want);
  }
  // The map: every expert range in the split that holds it, and its bytes are
  // the single file's bytes of the same expert (read back through the reader).
  const mrl::gguf_expert_map m1 = mrl::gguf_expert_map::by_name(one.path());
  const mrl::gguf_expert_map m3 = mrl::gguf_expert_map::by_name(three.path());
  REQUIRE(m3.paths() == three.paths);
  REQUIRE(m1.n_layer() == m3.n_layer());
  std::vector<bool> used(3, false);
  mrl::gguf_expert_reader r1(m1), r3(m3);
  for (std::size_t l = 0; l < m1.n_layer(); ++l) {
    const layer_id lid = layer_id(static_cast<std::uint16_t>(l));
    REQUIRE(m1.ranges(lid).size() == m3.ranges(lid).size());
    for (const auto& r : m3.ranges(lid)) used.at(r.split) = true;
    CHECK(m1.expert_bytes(lid) == m3.expert_bytes(lid));
    for (std::uint16_t e : {0, 7, 15}) {
      REQUIRE(r1.read(lid, expert_id(e)));
      const std::vector<unsigned char> a(r1.data(), r1.data() + m1.expert_bytes(lid));
      REQUIRE(r3.read(lid, expert_id(e)));
      CHECK(std::memcmp(a.data(), r3.data(), a.size()) == 0);
    }
  }
  CHECK(used[1]);
  CHECK(used[2]);  // experts in more than one split: the test means something
  CHECK(mrl::gguf_dense_bytes(one.path(), m1, m1.n_layer()) == mrl::gguf_dense_bytes(three.path(), m3, m3.n_layer()));
  // llama.cpp loads it; the logits are the single file's.
  CHECK(same(logits_of(one.path(), 1, false), logits_of(three.path(), 1, false)));
}

TEST_CASE("split GGUF: the residency manager maps every split and leaves the logits bit-identical") {
  written_model one("split_res_one", small_moe_spec(), 1), three("split_res_three", small_moe_spec(), 3);
  const auto plain = logits_of(one.path(), 1, false);
  mrl::residency_stats s1, s3;
  CHECK(same(logits_of(one.path(), 1, true, &s1), plain));
  CHECK(same(logits_of(three.path(), 1, true, &s3), plain));
  // The same work on the same model: the dense weights of every split locked,
  // the same exact reads and cache admissions.
  CHECK(s3.dense_bytes == s1.dense_bytes);
  CHECK(s3.dense_bytes > 0);
  CHECK(s3.exact_reads == s1.exact_reads);
  CHECK(s3.exact_reads > 0);
  CHECK(s3.pinned_bytes == s1.pinned_bytes);
  CHECK(s3.lock_failed == 0);
}

TEST_CASE("split GGUF: a split that holds no expert tensor is located by the dense tensors the graph read") {
  // One tensor a split: most splits hold one dense tensor and no expert. The
  // manager finds each one's mapping by where llama.cpp's graph read it, so
  // it locks every dense weight, as with the single file.
  const int n = static_cast<int>((llama_init_once(), mre::random_model_tensors(small_moe_spec()).size()));
  written_model one("split_dense_one", small_moe_spec(), 1), many("split_dense_many", small_moe_spec(), n);
  const auto plain = logits_of(one.path(), 1, false);
  mrl::residency_stats s1, sn;
  CHECK(same(logits_of(one.path(), 1, true, &s1), plain));
  CHECK(same(logits_of(many.path(), 1, true, &sn), plain));
  CHECK(s1.dense_bytes > 0);
  CHECK(sn.dense_bytes == s1.dense_bytes);
  CHECK(sn.exact_reads == s1.exact_reads);
}

TEST_CASE("split GGUF: a later split, a missing split and a misnamed first split are refused by name") {
  written_model three("split_bad", small_moe_spec(), 3);
  CHECK_THROWS_WITH_AS(mrl::gguf_expert_map::by_name(three.paths[1]),
                       doctest::Contains("split 2 of 3; expected the model's first split (its name ends in "
                                         "'-00001-of-00003.gguf')"),
                       moe_residency::error);
  const std::string renamed = "moe_residency_split_renamed_" + std::to_string(::getpid()) + ".gguf";
  REQUIRE(std::rename(three.paths[0].c_str(), renamed.c_str()) == 0);
  CHECK_THROWS_WITH_AS(mrl::gguf_expert_map::by_name(renamed),
                       doctest::Contains("the first of 3 splits, but its name does not end in '-00001-of-00003.gguf'"),
                       moe_residency::error);
  REQUIRE(std::rename(renamed.c_str(), three.paths[0].c_str()) == 0);
  const std::string aside = three.paths[2] + ".aside";
  REQUIRE(std::rename(three.paths[2].c_str(), aside.c_str()) == 0);
  const std::string missing = three.paths[2] + ": cannot open split 3 of 3 of " + three.path();
  CHECK_THROWS_WITH_AS(mrl::gguf_expert_map::by_name(three.path()), doctest::Contains(missing.c_str()),
                       moe_residency::error);
  REQUIRE(std::rename(aside.c_str(), three.paths[2].c_str()) == 0);
  CHECK_NOTHROW(mrl::gguf_expert_map::by_name(three.path()));
  CHECK_THROWS_WITH_AS(mre::save_random_gguf(small_moe_spec(), "x.gguf", {}, 2),
                       doctest::Contains("expected a name ending in '-00001-of-00002.gguf'"), std::invalid_argument);
}

TEST_CASE("all cores: the logits at 1 and 2 threads are identical, residency off and on") {
  written_model one("threads", small_moe_spec(), 1);
  const auto t1 = logits_of(one.path(), 1, false);
  CHECK(same(logits_of(one.path(), 2, false), t1));
  mrl::residency_stats s1, s2;
  CHECK(same(logits_of(one.path(), 1, true, &s1), t1));
  CHECK(same(logits_of(one.path(), 2, true, &s2), t1));
  // The manager's figures do not depend on the thread count: the eval
  // callback runs on one thread while llama.cpp's workers wait.
  CHECK(s2.routed_experts == s1.routed_experts);
  CHECK(s2.exact_reads == s1.exact_reads);
  CHECK(s2.pinned_bytes == s1.pinned_bytes);
}
