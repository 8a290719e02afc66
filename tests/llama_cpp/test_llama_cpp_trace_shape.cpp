// A random model in a recorded trace's shape (trace_shape.hpp): every layer's
// expert bytes exactly the trace header's, for the shared traces (Qwen3-30B-A3B's
// q4_K/q6_K mix, gpt-oss-120b's mxfp4) and for a trace of an architecture no
// known model has (widths searched); the dense bytes exact where a type mix
// reaches them; the file written honours every tensor's type, so llama.cpp's
// own graph (the observer's shape) has the trace's bytes; a trace no widths
// and types can make is refused, naming its bytes.

#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>

#include "../support.hpp"
#include "llama_support.hpp"
#include "trace_shape.hpp"

using namespace moe_residency;
using namespace moe_residency_test;

namespace {

/// Per layer, one expert's bytes (Σ of its expert tensors' slices) and the
/// non-expert bytes, from llama.cpp's own tensor list of the spec.
struct layer_bytes {
  std::vector<std::uint64_t> expert, dense;
  /// Of the dense: llama.cpp's optional tensors a real Qwen3 file does not
  /// have (attention biases, per-tensor scales), which the random writer makes.
  std::vector<std::uint64_t> optional;
};
layer_bytes bytes_of(const mre::random_model_spec& spec) {
  layer_bytes b;
  b.expert.assign(spec.n_layer, 0);
  b.dense.assign(spec.n_layer, 0);
  b.optional.assign(spec.n_layer, 0);
  for (const mre::tensor_entry& e : mre::random_model_tensors(spec)) {
    const int l = mrl::detail::parse_blk_layer(e.name.c_str());
    if (l < 0) continue;
    std::uint64_t rows = 1;
    for (int i = 1; i < GGML_MAX_DIMS; ++i) rows *= static_cast<std::uint64_t>(e.ne[i]);
    const std::uint64_t bytes = rows * ggml_row_size(e.type, e.ne[0]);
    if (mre::detail::is_expert_weight(e.name)) b.expert[static_cast<std::size_t>(l)] += bytes / e.ne[2];
    else b.dense[static_cast<std::size_t>(l)] += bytes;
    const bool optional = e.name.find(".bias") != std::string::npos || e.name.find("scale") != std::string::npos;
    if (optional && !mre::detail::is_expert_weight(e.name)) b.optional[static_cast<std::size_t>(l)] += bytes;
  }
  return b;
}

trace_header header(const std::string& arch, std::size_t layers, std::size_t experts, std::size_t k,
                    std::vector<std::uint64_t> expert_bytes) {
  trace_header h;
  h.arch = arch;
  h.n_layer = layers;
  h.n_expert = experts;
  h.n_expert_used = k;
  h.expert_bytes = std::move(expert_bytes);
  h.dense_bytes.assign(layers, 0);
  return h;
}

}  // namespace

TEST_CASE("trace shape: the shared traces' every layer's expert bytes, and Qwen's dense bytes, exactly") {
  llama_init_once();
  const std::string qwen = real_trace("qwen.route.csv");
  const std::string gptoss = real_trace("gptoss.route.csv");
  if (qwen.empty() || gptoss.empty()) return;

  const trace_header q = read_route_trace(qwen).header();
  const mre::trace_shape qs = mre::shape_from_trace(q);
  CHECK(qs.model == "Qwen3-30B-A3B");
  CHECK(qs.spec.arch == "qwen3moe");
  CHECK(qs.spec.n_layer == 48);
  CHECK(qs.spec.n_expert == 128);
  CHECK(qs.spec.n_expert_used == 6);
  const layer_bytes qb = bytes_of(qs.spec);
  CHECK(qb.expert == q.expert_bytes);  // 2 654 208 (q4_K) and 3 059 712 (q6_K down)
  // 11 953 152 and 11 682 816: one of attn_k/attn_v in q6_K or neither; the
  // optional tensors on top (23 584 bytes a layer), and said.
  std::vector<std::uint64_t> without_optional(48);
  for (std::size_t l = 0; l < 48; ++l) without_optional[l] = qb.dense[l] - qb.optional[l];
  CHECK(without_optional == q.dense_bytes);
  CHECK(qb.optional[0] == 23584);
  std::map<std::string, int> down;
  for (std::size_t l = 0; l < 48; ++l)
    ++down[ggml_type_name(qs.spec.tensor_types.at("blk." + std::to_string(l) + ".ffn_down_exps.weight"))];
  CHECK(down == std::map<std::string, int>{{"q4_K", 24}, {"q6_K", 24}});
  REQUIRE(qs.notes.size() == 2);
  CHECK(qs.notes[1] ==
        "dense bytes: 48 layers off the header's, at most by 23584 of 11953152 bytes: the random model carries "
        "llama.cpp's optional bias and scale tensors, and no usual mix of the attention's types makes up the rest "
        "exactly");

  const trace_header g = read_route_trace(gptoss).header();
  const mre::trace_shape gs = mre::shape_from_trace(g);
  CHECK(gs.model == "gpt-oss-120b");
  CHECK(gs.spec.arch == "gpt-oss");
  CHECK(gs.spec.n_expert_used == 2);
  CHECK(gs.spec.expert_type == GGML_TYPE_MXFP4);  // 13 219 200 = 3 x 2880 x 2880 x 17/32
  CHECK(bytes_of(gs.spec).expert == g.expert_bytes);
}

TEST_CASE(
    "trace shape: an architecture no known model has: widths searched, expert bytes exact, what is assumed said") {
  llama_init_once();
  // Mixtral-like: embedding 4096, experts 14336 wide, q4_K, every third layer's down in q6_K.
  std::vector<std::uint64_t> bytes;
  for (int l = 0; l < 6; ++l) bytes.push_back(l % 3 == 0 ? 114229248u : 99090432u);
  const mre::trace_shape s = mre::shape_from_trace(header("mixtral", 6, 8, 2, bytes));
  CHECK(s.model.empty());
  CHECK(s.spec.arch == "qwen3moe");
  CHECK(bytes_of(s.spec).expert == bytes);
  REQUIRE(s.notes.size() >= 2);
  CHECK(s.notes[0].find("architecture mixtral is built as qwen3moe") == 0);
  CHECK(s.notes[1].find("are searched") != std::string::npos);

  // Bytes no widths and types make: refused, naming them.
  std::string message;
  try {
    (void)mre::shape_from_trace(header("mixtral", 4, 8, 2, {1000003, 1000003, 1000003, 1000003}));
  } catch (const std::invalid_argument& e) {
    message = e.what();
  }
  CHECK(message ==
        "--shape-from: a trace of 4 layers x 8 experts, top-2 (mixtral): no embedding and expert width with the "
        "random writer's weight types make every layer's expert bytes (1000003)");
  // Dense layers the writer cannot make: refused, naming both.
  message.clear();
  try {
    (void)mre::shape_from_trace(header("qwen3moe", 4, 16, 4, {0, 110592, 110592, 110592}));
  } catch (const std::invalid_argument& e) {
    message = e.what();
  }
  CHECK(message ==
        "--shape-from: a trace of 4 layers x 16 experts, top-4 (qwen3moe): its dense layers are {0} but a random "
        "qwen3moe model's are {}; expected every layer MoE (deepseek2: all but the first)");
}

TEST_CASE("trace shape: the file written has the trace's expert bytes in llama.cpp's own graph") {
  llama_init_once();
  // 4 layers x 16 experts, top-4; 256 wide: q4_K (110 592 bytes) and, on layer 2, q6_K down (127 488).
  const std::vector<std::uint64_t> bytes = {110592, 110592, 127488, 110592};
  mre::trace_shape s = mre::shape_from_trace(header("qwen3moe", 4, 16, 4, bytes));
  CHECK(s.spec.n_embd == 256);
  CHECK(s.spec.n_ff_exp == 256);
  s.spec.n_vocab = 512;  // small, for the test
  temp_file file("trace_shape");
  mre::save_random_gguf(s.spec, file.path);
  observed_model om(load_mmap(file.path));
  om.warm_up();
  CHECK(om.obs.shape().all_expert_bytes() == bytes);
}
