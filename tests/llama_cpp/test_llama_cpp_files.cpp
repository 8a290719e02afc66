// The adapter against files: the expert byte ranges it maps in a GGUF saved
// by llama.cpp are exactly the bytes llama.cpp's mmap-loaded MUL_MAT_ID
// weights hold, the read callback reads exactly those bytes, and a route
// trace recorded from a live run replays (trace.hpp + replay.hpp) to the
// recorder's own cache counters.

#include <doctest/doctest.h>

#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <unistd.h>

#include "llama_support.hpp"
#include "moe_residency/cache/lru.hpp"
#include "moe_residency/replay.hpp"
#include "moe_residency/session.hpp"
#include "moe_residency/trace.hpp"

using namespace moe_residency;
using namespace moe_residency_test;

TEST_CASE("llama.cpp adapter: the read callback reads exactly expert e of layer l") {
  llama_init_once();
  for (const char* arch : {"qwen3moe", "deepseek2", "gpt-oss"}) {
    const std::string config = arch;
    CAPTURE(config);
    mapped_model m(arch, spec_for(arch, GGML_TYPE_F16));
    m.run(4, 1);
    const mrl::observer& obs = m.obs;
    const std::string& path = m.path;
    REQUIRE(obs.structure_known());

    const mrl::gguf_expert_map map(path, obs);
    const mrl::gguf_expert_map by_name = mrl::gguf_expert_map::by_name(path);
    mrl::gguf_expert_reader reader(map);
    std::size_t compared = 0;
    for (std::size_t l = 0; l < obs.n_layer(); ++l) {
      const layer_id L = layer_id(static_cast<std::uint16_t>(l));
      const mrl::layer_structure& s = obs.layers()[l];
      if (!s.moe) {
        CHECK(map.expert_bytes(L) == 0);
        continue;
      }
      CHECK(map.expert_bytes(L) == s.expert_bytes);
      CHECK(by_name.expert_bytes(L) == s.expert_bytes);  // the name convention agrees with the op
      REQUIRE(map.ranges(L).size() == s.experts.size());
      for (std::size_t e : {std::size_t{0}, std::size_t{1}, s.spec.n_experts / 2, s.spec.n_experts - 1}) {
        const expert_id E = expert_id(static_cast<std::uint16_t>(e));
        REQUIRE(reader.read(L, E));
        std::size_t at = 0;
        for (std::size_t i = 0; i < s.experts.size(); ++i) {
          const mrl::expert_tensor& et = s.experts[i];
          CHECK(map.ranges(L)[i].tensor == et.name);
          // The live weight llama.cpp multiplies (mmap of the same file).
          const auto* live = static_cast<const unsigned char*>(et.tensor->data) + e * et.bytes_per_expert;
          CHECK(std::memcmp(reader.data() + at, live, et.bytes_per_expert) == 0);
          // And the neighbour's bytes are not these (the offset is not off by one expert).
          if (e + 1 < s.spec.n_experts)
            CHECK(std::memcmp(reader.data() + at, live + et.bytes_per_expert, et.bytes_per_expert) != 0);
          at += static_cast<std::size_t>(et.bytes_per_expert);
          ++compared;
        }
      }
      CHECK_FALSE(reader.read(L, expert_id(static_cast<std::uint16_t>(s.spec.n_experts))));
    }
    CHECK(compared > 0);

    // The scheduler's callback form: same bytes, from another thread's buffer.
    {
      const read_callback cb = reader.callback();
      CHECK(cb(layer_id(1), expert_id(2), read_reason::speculative) == read_status::ok);
      CHECK(cb(layer_id(1), expert_id(static_cast<std::uint16_t>(obs.layer(layer_id(1)).spec.n_experts)),
               read_reason::demanded) == read_status::failed);
      std::vector<unsigned char> a(static_cast<std::size_t>(reader.widest_expert_bytes()));
      REQUIRE(reader.read_into(layer_id(1), expert_id(2), a.data()));
      REQUIRE(reader.read(layer_id(1), expert_id(2)));
      CHECK(std::memcmp(a.data(), reader.data(), static_cast<std::size_t>(map.expert_bytes(layer_id(1)))) == 0);
    }
    mrl::gguf_expert_reader advise(map, mrl::gguf_expert_reader::mode::fadvise);
    CHECK(advise.read(layer_id(1), expert_id(3)));
    CHECK(advise.bytes_read() == map.expert_bytes(layer_id(1)));

    const auto dense = mrl::gguf_dense_bytes(path, map, obs.n_layer());
    for (std::size_t l = 0; l < obs.n_layer(); ++l) CHECK(dense[l] > 0);  // norms, attention, router
  }
}

TEST_CASE("llama.cpp adapter: the recorded route trace replays to the recorder's cache counters") {
  for_each_warm_arch(GGML_TYPE_F32, [](observed_model& om, const std::string& config) {
    const model_shape shape = om.obs.shape();
    const double cycle_mib = to_mib(token_cycle_bytes(shape));
    for (double budget_mib : {cycle_mib * 1.5, cycle_mib * 4}) {
      budget_mib = std::round(budget_mib * 100) / 100;
      session_options so;
      so.on_anomaly = anomaly_action::count;
      standard_session s(shape, so);
      mrl::configure_routers(s, om.obs);
      mrl::route_recorder<lru_policy> rec(shape, from_mib(budget_mib));
      mrl::session_sink<standard_session> sink(s, &rec);
      om.obs.set_sink(&sink);
      om.run(20, 64);
      om.obs.set_sink(nullptr);
      om.restart();

      CHECK(s.anomalies().total() == 0);
      const prediction_report r = s.report();
      const std::size_t ctrl = r.control_index();
      REQUIRE(ctrl < r.predictors.size());
      CHECK(r.totals[ctrl].slot_hits == r.totals[ctrl].slots);  // control 100.0%

      std::ostringstream csv;
      write_route_trace_csv(rec.trace(), csv);
      const route_trace back = parse_route_trace_csv(csv.str(), "recorded");
      CHECK(back.rows.size() == rec.trace().rows.size());
      const replay_input in = replay_input::from_trace(back);
      const replay_result rr = replay_cell(in, "lru", budget_mib);
      const cache_stats& live = rec.cache().stats();
      MESSAGE(config << " at " << budget_mib << " MiB: " << rec.cache_line() << "; replay decode hit "
                     << rr.hit_pct_decode() << "%");
      CHECK(rr.stats.all.lookups == live.all.lookups);
      CHECK(rr.stats.all.hits == live.all.hits);
      CHECK(rr.stats.all.bytes_read == live.all.bytes_read);
      CHECK(rr.stats.decode.lookups == live.decode.lookups);
      CHECK(rr.stats.decode.hits == live.decode.hits);
      CHECK(rr.stats.all.evictions == live.all.evictions);
      CHECK(live.decode.hits > 0);
    }
  });
}

TEST_CASE("llama.cpp adapter: a general.name of 300 bytes reaches the recorded trace whole, CSV and binary") {
  // A regression: the observer read GGUF metadata into a 256-byte buffer, so a
  // longer model name was cut at 255 bytes without a word.
  std::string name = "Qwen3 30B A3B, a name longer than 255 bytes:";
  while (name.size() < 300) name += static_cast<char>('a' + name.size() % 26);
  temp_model saved("long_name_saved", spec_for("qwen3moe", GGML_TYPE_F32));
  temp_file renamed("long_name");
  {
    // The saved file again, with its key/values and tensors, but the long name.
    gguf_file f(saved.path);
    const std::unique_ptr<gguf_context, void (*)(gguf_context*)> out(gguf_init_empty(), gguf_free);
    gguf_set_kv(out.get(), f.g);
    gguf_set_val_str(out.get(), "general.name", name.c_str());
    for (std::int64_t i = 0; i < gguf_get_n_tensors(f.g); ++i)
      gguf_add_tensor(out.get(), ggml_get_tensor(f.data, gguf_get_tensor_name(f.g, i)));
    REQUIRE(gguf_write_to_file(out.get(), renamed.path.c_str(), false));
  }
  observed_model om(load_mmap(renamed.path));
  CHECK(om.obs.model_name().size() == 300);
  CHECK(om.obs.model_name() == name);
  om.warm_up();
  const model_shape shape = om.obs.shape();
  mrl::route_recorder<lru_policy> rec(shape, 0);
  // Until describe() names the model, the header knows only the shape's architecture.
  CHECK(rec.trace().header.model.empty());
  CHECK(rec.trace().header.arch == "qwen3moe");
  rec.describe(om.obs.model_name(), om.obs.arch(), std::vector<std::uint64_t>(shape.n_layers(), 0));
  om.obs.set_sink(&rec);
  om.run(4, 2);
  om.obs.set_sink(nullptr);
  REQUIRE(!rec.trace().rows.empty());
  std::ostringstream csv, bin;
  write_route_trace_csv(rec.trace(), csv);
  write_route_trace_binary(rec.trace(), bin);
  const route_trace from_csv = parse_route_trace_csv(csv.str(), "recorded.csv");
  const route_trace from_bin = parse_route_trace_binary(bin.str(), "recorded.bin");
  CHECK(from_csv.header.model == name);
  CHECK(from_bin.header.model == name);
  CHECK(from_bin.header.arch == "qwen3moe");
  CHECK(from_bin.rows.size() == rec.trace().rows.size());
}
