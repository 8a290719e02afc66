// libFuzzer target: the llama.cpp adapter's GGUF expert map (gguf.hpp), from a
// file alone (gguf_expert_map::by_name) and the dense-byte count built on it
// (gguf_dense_bytes). The input is written to a file and read through ggml's
// gguf.h, as the adapter reads a model. Any input ends in moe_residency::error
// naming the file, or in a map whose every expert range lies inside the file,
// whose tensors are 3-D "blk.N.*_exps.*" tensors of at least two experts of
// the layer N they are filed under, and whose dense bytes are counted without
// the expert tensors. Built only with llama.cpp (MOE_RESIDENCY_BUILD_LLAMA_CPP;
// scripts/fuzz.sh does it when MOE_RESIDENCY_LLAMA_CPP_PREFIX is set).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "fuzz_check.hpp"
#include "moe_residency/adapters/llama_cpp/gguf.hpp"

namespace {
std::string& path() {
  static std::string p = "/tmp/moe_residency_fuzz_gguf_" + std::to_string(::getpid()) + ".gguf";
  return p;
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  ggml_log_set([](ggml_log_level, const char*, void*) {}, nullptr);  // gguf.h's refusals are expected
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace moe_residency;
  namespace mrl = moe_residency::llama_cpp;
  const std::string& file = path();
  {
    std::FILE* f = std::fopen(file.c_str(), "wb");
    moe_residency_fuzz::check(f != nullptr, "cannot write the temporary file", file);
    const bool ok = size == 0 || std::fwrite(data, 1, size, f) == size;
    std::fclose(f);
    moe_residency_fuzz::check(ok, "cannot write the temporary file", file);
  }
  struct remove_at_exit {  // a crash leaves the file behind, next to its input
    const std::string& f;
    ~remove_at_exit() { std::remove(f.c_str()); }
  } cleanup{file};
  mrl::gguf_expert_map m;
  try {
    m = mrl::gguf_expert_map::by_name(file);
  } catch (const error& e) {
    moe_residency_fuzz::check_message(e, file.c_str());
    return 0;
  }
  std::uint64_t expert_total = 0;
  for (std::size_t l = 0; l < m.n_layer(); ++l) {
    const layer_id lid = layer_id(static_cast<std::uint16_t>(l));
    std::uint64_t sum = 0;
    for (const mrl::expert_file_range& r : m.ranges(lid)) {
      const std::string where = r.tensor + " in layer " + std::to_string(l);
      moe_residency_fuzz::check(mrl::detail::parse_blk_layer(r.tensor.c_str()) == static_cast<int>(l),
                                "an expert tensor is filed under another layer", where);
      moe_residency_fuzz::check(r.tensor.find("_exps.") != std::string::npos, "not an expert tensor", where);
      moe_residency_fuzz::check(r.n_expert >= 2, "an expert tensor of fewer than 2 experts", where);
      moe_residency_fuzz::check(r.offset <= size && r.bytes_per_expert * r.n_expert <= size - r.offset,
                                "an expert range outside the file", where);
      sum += r.bytes_per_expert;
      expert_total += r.bytes_per_expert * r.n_expert;
    }
    moe_residency_fuzz::check(m.expert_bytes(lid) == sum, "expert_bytes is not the sum of the ranges");
  }
  moe_residency_fuzz::check(expert_total <= size, "more expert bytes than the file holds");
  try {
    const std::vector<std::uint64_t> dense = mrl::gguf_dense_bytes(file, m, m.n_layer());
    moe_residency_fuzz::check(dense.size() == m.n_layer(), "gguf_dense_bytes: one entry per layer");
  } catch (const error& e) {
    moe_residency_fuzz::fail("gguf_dense_bytes refused a file the map accepted", e.what());
  }
  return 0;
}
