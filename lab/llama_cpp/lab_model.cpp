// moe-lab-model: writes the memory lab's random-weight models — a real
// llama.cpp architecture (qwen3moe, deepseek2, gpt-oss; qwen3 for a dense
// one), any size, or a real model's shape (--shape) — to a GGUF file,
// streamed tensor by tensor so a model larger than memory is never held in it
// (random_model.hpp; docs/memlab.md, "The random model").
//
//   moe-lab-model --layers 12 --experts 128 --k 8 --embd 1024 --expert-ff 512 --expert-type q4_K --out lab.gguf
//   moe-lab-model --shape qwen3-30b-a3b --out qwen3-30b-a3b-q4_K.gguf
//   moe-lab-model --layers 4 --out split-00001-of-00003.gguf --splits 3

#include <CLI/CLI.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>

#include "moe_residency/adapters/llama_cpp/gguf.hpp"
#include "moe_residency/core.hpp"
#include "moe_residency/error.hpp"
#include "checked_options.hpp"
#include "moe_residency/trace.hpp"
#include "random_model.hpp"
#include "trace_shape.hpp"

namespace {

using moe_residency::first_layers;
using moe_residency::read_route_trace;
using moe_residency::to_mib;
using moe_residency::validated_route_trace;
namespace mrl = moe_residency::llama_cpp;
namespace lab = moe_residency::llama_cpp::lab;

struct lab_model_args {
  std::string arch;  // "": the shape's, else qwen3moe
  lab::random_model_spec spec;
  std::string router = "f32";
  std::string expert_type = "f32";
  std::string dense_type = "f32";
  std::string shape;             // a named real model's shape (random_model.hpp's named_shapes)
  std::string shape_from;        // a recorded trace's shape (trace_shape.hpp)
  std::size_t trace_layers = 0;  // its first N layers only (0: all)
  std::string out;
  int splits = 1;  // as this many splits (llama.cpp's names)
};

void add_model_options(CLI::App& app, lab_model_args& a) {
  namespace opt = moe_residency_cli;  // checked_options.hpp: the numbers every option takes
  app.add_option("--arch", a.arch, "Architecture: qwen3moe (default), deepseek2, gpt-oss; qwen3 (dense, no experts)")
      ->check(opt::one_of({"qwen3moe", "deepseek2", "gpt-oss", "qwen3"}));
  app.add_option("--layers", a.spec.n_layer, "Layers")->check(opt::whole(2, 4096))->capture_default_str();
  app.add_option("--experts", a.spec.n_expert, "Experts per layer")->check(opt::whole(1, 65536))->capture_default_str();
  app.add_option("--k", a.spec.n_expert_used, "Experts used per token")
      ->check(opt::whole(1, 32))
      ->capture_default_str();
  app.add_option("--embd", a.spec.n_embd, "Embedding length (multiple of 64)")
      ->check(opt::whole(64, 1 << 20))
      ->capture_default_str();
  app.add_option("--expert-ff", a.spec.n_ff_exp, "Width of one expert")
      ->check(opt::whole(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--router", a.router, "Router type f32, f16 or bf16")->capture_default_str();
  app.add_option("--expert-type", a.expert_type,
                 "Expert weights f32, f16, bf16, q8_0 or q4_K (quantised ones from a pool; see random_model.hpp); "
                 "or a comma list, one type per layer")
      ->capture_default_str();
  app.add_option("--dense-type", a.dense_type,
                 "2-D dense weights (attention, embedding, output) f32, or quantised (rows from a pool)")
      ->capture_default_str();
  app.add_option("--heads", a.spec.n_head, "Attention query heads (0: embedding / 64)")
      ->check(opt::whole(0, 1 << 16))
      ->capture_default_str();
  app.add_option("--heads-kv", a.spec.n_head_kv, "Attention key/value heads")
      ->check(opt::whole(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--head-dim", a.spec.head_dim, "Width of one attention head")
      ->check(opt::whole(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--vocab", a.spec.n_vocab, "Vocabulary size")->check(opt::whole(1, 1 << 24))->capture_default_str();
  app.add_flag("--text-vocab", a.spec.text_vocab,
               "A text vocabulary (SentencePiece, byte tokens), so prompt text tokenizes (needs --vocab >= 512)");
  app.add_option("--expert-pool", a.spec.expert_pool, "Distinct quantised experts per kind")
      ->check(opt::whole(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--shape", a.shape,
                 "A real model's shape, every size above taken from it: qwen3-30b-a3b, qwen3-30b-a3b-half")
      ->excludes("--layers")
      ->excludes("--experts")
      ->excludes("--k")
      ->excludes("--embd")
      ->excludes("--expert-ff")
      ->excludes("--dense-type")
      ->excludes("--expert-type")
      ->excludes("--heads")
      ->excludes("--heads-kv")
      ->excludes("--head-dim")
      ->excludes("--vocab")
      ->excludes("--router");
  app.add_option("--shape-from", a.shape_from,
                 "A recorded route trace's shape (any route_trace v1 file): its layers, experts and top-k, every "
                 "layer's expert bytes exactly its header's, dense bytes as near as the types allow "
                 "(trace_shape.hpp); prints what it cannot match")
      ->excludes("--shape")
      ->excludes("--layers")
      ->excludes("--experts")
      ->excludes("--k")
      ->excludes("--embd")
      ->excludes("--expert-ff")
      ->excludes("--dense-type")
      ->excludes("--expert-type")
      ->excludes("--heads")
      ->excludes("--heads-kv")
      ->excludes("--head-dim")
      ->excludes("--vocab")
      ->excludes("--router");
  app.add_option("--trace-layers", a.trace_layers,
                 "--shape-from: only the trace's first N layers (a model cut to fit a disk; moe-lab-run "
                 "--trace-layers N drives it)")
      ->check(opt::whole(1, 65535));
}

void add_output_options(CLI::App& app, lab_model_args& a) {
  namespace opt = moe_residency_cli;
  app.add_option("--out", a.out, "The GGUF file to write (written as FILE.part, renamed when complete)")->required();
  app.add_option("--splits", a.splits,
                 "Write it as N splits, as llama.cpp's gguf-split names them (--out must end in -00001-of-0000N.gguf)")
      ->check(opt::whole(1, 99))
      ->capture_default_str();
}

/// The spec the options describe: a named shape's every field (the pool, the
/// seed and the vocabulary kind as given), or the sizes and types given.
lab::random_model_spec spec_of(const lab_model_args& a) {
  lab::random_model_spec spec = a.spec;
  if (!a.shape_from.empty()) {
    validated_route_trace t = read_route_trace(a.shape_from);
    if (a.trace_layers != 0) t = first_layers(t, a.trace_layers, a.shape_from);
    const lab::trace_shape ts = lab::shape_from_trace(t.header());
    spec = ts.spec;
    spec.expert_pool = a.spec.expert_pool;
    spec.seed = a.spec.seed;
    spec.text_vocab = a.spec.text_vocab;
    if (!a.arch.empty() && a.arch != spec.arch)
      throw std::invalid_argument("--shape-from " + a.shape_from + " is built as a " + spec.arch +
                                  " model; --arch is " + a.arch);
    std::printf("shape from %s%s: %s, %u layers x %u experts, top-%u, embedding %u, expert width %u%s%s\n",
                a.shape_from.c_str(),
                a.trace_layers != 0 ? (" (its first " + std::to_string(a.trace_layers) + " layers)").c_str() : "",
                spec.arch.c_str(), spec.n_layer, spec.n_expert, spec.n_expert_used, spec.n_embd, spec.n_ff_exp,
                ts.model.empty() ? "" : ", as ", ts.model.c_str());
    for (const std::string& n : ts.notes) std::printf("shape note: %s\n", n.c_str());
    std::fflush(stdout);
    return spec;
  }
  if (!a.shape.empty()) {
    spec = lab::shape_by_name(a.shape);
    spec.expert_pool = a.spec.expert_pool;
    spec.seed = a.spec.seed;
    spec.text_vocab = a.spec.text_vocab;
    if (!a.arch.empty() && a.arch != spec.arch)
      throw std::invalid_argument("--shape " + a.shape + " is a " + spec.arch + " model; --arch is " + a.arch);
    return spec;
  }
  spec.arch = a.arch.empty() ? "qwen3moe" : a.arch;
  spec.router_type = lab::parse_router_type(a.router);
  // One type, or a comma list of one per layer.
  spec.layer_expert_types.clear();
  for (std::size_t at = 0;;) {
    const std::size_t comma = a.expert_type.find(',', at);
    spec.layer_expert_types.push_back(lab::parse_expert_type(a.expert_type.substr(at, comma - at)));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  spec.expert_type = spec.layer_expert_types.front();
  if (spec.layer_expert_types.size() == 1) spec.layer_expert_types.clear();
  spec.dense_type = lab::parse_expert_type(a.dense_type);
  return spec;
}

int write_model(const lab_model_args& a) {
  llama_log_set(
      [](ggml_log_level level, const char* text, void*) {
        if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
      },
      nullptr);
  llama_backend_init();  // shape_from_trace asks llama.cpp for the architecture's tensors
  const lab::random_model_spec spec = spec_of(a);
  const auto t0 = std::chrono::steady_clock::now();
  int last = -1;
  const bool tty = isatty(fileno(stderr)) != 0;
  lab::save_random_gguf(
      spec, a.out,
      [&](std::uint64_t done, std::uint64_t total) {
        // A bar redrawn in place on a terminal (every 1%), a line every 10% otherwise.
        const int pct = total ? static_cast<int>(100 * done / total) : 100;
        if (pct == last || (!tty && pct / 10 == last / 10 && pct != 100)) return;
        last = pct;
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double rate = s > 0 ? to_mib(done) / s : 0.0;
        char bar[41];
        for (int i = 0; i < 40; ++i) bar[i] = i < pct * 40 / 100 ? '#' : '.';
        bar[40] = '\0';
        std::fprintf(stderr, "%smoe-lab-model: writing %s [%s] %3d%% %.0f / %.0f MiB, %.0f MiB/s, %.0f s left%s",
                     tty ? "\r" : "", a.out.c_str(), bar, pct, to_mib(done), to_mib(total), rate,
                     rate > 0 ? (to_mib(total) - to_mib(done)) / rate : 0.0, tty && pct < 100 ? "" : "\n");
      },
      a.splits);
  std::uint64_t bytes = 0;
  const mrl::gguf_expert_map saved = mrl::gguf_expert_map::by_name(a.out);
  for (const std::string& p : saved.paths()) {
    std::ifstream f(p, std::ios::binary | std::ios::ate);
    bytes += static_cast<std::uint64_t>(f.tellg());
  }
  const char* experts = spec.arch == "qwen3"              ? "none (dense)"
                        : !a.shape_from.empty()           ? "as the trace's bytes"
                        : spec.layer_expert_types.empty() ? ggml_type_name(spec.expert_type)
                                                          : a.expert_type.c_str();
  std::printf("saved: %s%s, %.1f MiB, experts %s, in %.1f s\n", a.out.c_str(),
              a.splits > 1 ? (" and its other " + std::to_string(a.splits - 1) + " splits").c_str() : "", to_mib(bytes),
              experts, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  lab_model_args a;
  CLI::App app{"moe-lab-model: write a random-weight MoE model of a llama.cpp architecture to a GGUF file"};
  add_model_options(app, a);
  add_output_options(app, a);
  CLI11_PARSE(app, argc, argv);
  try {
    if (a.trace_layers != 0 && a.shape_from.empty())
      throw std::invalid_argument("--trace-layers has no effect without --shape-from; give --shape-from, or drop it");
    return write_model(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-lab-model: %s\n", e.what());
    return 1;
  }
}
