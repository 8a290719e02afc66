#pragma once
// A small, valid GGUF with the tensors the adapter's expert map reads (expert
// tensors "blk.N.ffn_*_exps.weight" of several types, and dense ones), built
// with ggml's own gguf writer. The seed of fuzz_gguf_expert_map, and the
// reference file of its regression tests.

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "ggml.h"
#include "gguf.h"

namespace moe_residency_fuzz {

/// The GGUF's bytes. variant 0: two MoE layers (f32, f16, q4_0 experts) and
/// dense tensors; variant 1: one MoE layer after a dense one, 3-D tensors
/// that are not experts, and metadata strings.
inline std::vector<unsigned char> small_expert_gguf(int variant = 0) {
  ggml_init_params p{};
  p.mem_size = 1u << 20;
  p.no_alloc = false;
  ggml_context* ctx = ggml_init(p);
  if (ctx == nullptr) throw std::runtime_error("small_expert_gguf: ggml_init failed");
  gguf_context* g = gguf_init_empty();
  gguf_set_val_str(g, "general.architecture", "qwen3moe");
  gguf_set_val_str(g, "general.name", variant == 0 ? "fuzz-seed" : "fuzz-seed-dense-first");
  gguf_set_val_u32(g, "qwen3moe.block_count", 2);
  gguf_set_val_u32(g, "qwen3moe.expert_count", 4);
  auto add = [&](const char* name, ggml_type type, std::int64_t n0, std::int64_t n1, std::int64_t n2) {
    ggml_tensor* t = n2 > 1 ? ggml_new_tensor_3d(ctx, type, n0, n1, n2)
                            : (n1 > 1 ? ggml_new_tensor_2d(ctx, type, n0, n1) : ggml_new_tensor_1d(ctx, type, n0));
    ggml_set_name(t, name);
    unsigned char* d = static_cast<unsigned char*>(t->data);
    for (std::size_t i = 0; i < ggml_nbytes(t); ++i) d[i] = static_cast<unsigned char>((i * 37 + 11) & 0x3f);
    gguf_add_tensor(g, t);
  };
  if (variant == 0) {
    add("token_embd.weight", GGML_TYPE_F32, 16, 8, 1);
    add("blk.0.attn_norm.weight", GGML_TYPE_F32, 16, 1, 1);
    add("blk.0.ffn_gate_inp.weight", GGML_TYPE_F32, 16, 4, 1);
    add("blk.0.ffn_up_exps.weight", GGML_TYPE_F32, 16, 8, 4);
    add("blk.0.ffn_down_exps.weight", GGML_TYPE_F16, 8, 16, 4);
    add("blk.1.ffn_gate_exps.weight", GGML_TYPE_Q4_0, 32, 4, 4);
    add("blk.1.ffn_up_exps.weight", GGML_TYPE_Q4_0, 32, 4, 4);
  } else {
    add("blk.0.ffn_up.weight", GGML_TYPE_F32, 16, 8, 1);
    add("blk.0.attn_k.weight", GGML_TYPE_F16, 16, 4, 2);  // 3-D, not experts
    add("blk.1.ffn_down_exps.weight", GGML_TYPE_BF16, 8, 16, 3);
    add("blk.1.ffn_gate_inp.weight", GGML_TYPE_F32, 16, 3, 1);
  }
  std::FILE* f = std::tmpfile();
  std::vector<unsigned char> bytes;
  const bool ok = f != nullptr && gguf_write_to_file_ptr(g, f, false);
  if (ok) {
    std::fseek(f, 0, SEEK_END);
    bytes.resize(static_cast<std::size_t>(std::ftell(f)));
    std::rewind(f);
    if (std::fread(bytes.data(), 1, bytes.size(), f) != bytes.size()) bytes.clear();
  }
  if (f != nullptr) std::fclose(f);
  gguf_free(g);
  ggml_free(ctx);
  if (bytes.empty()) throw std::runtime_error("small_expert_gguf: writing the GGUF failed");
  return bytes;
}

}  // namespace moe_residency_fuzz
