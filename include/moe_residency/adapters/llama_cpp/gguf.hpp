#pragma once
/// Expert byte ranges in a GGUF file (gguf_expert_map) and the bytes of each
/// layer's non-expert tensors (gguf_dense_bytes), read with gguf.h.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gguf.h"
#include "moe_residency/adapters/llama_cpp/observer.hpp"

namespace moe_residency::llama_cpp {

namespace detail {
struct gguf_free_deleter {
  void operator()(gguf_context* c) const noexcept { gguf_free(c); }
};
/// Owns a gguf_context (metadata only: no_alloc).
using gguf_ptr = std::unique_ptr<gguf_context, gguf_free_deleter>;

/// Opens the GGUF file's metadata; throws `error` naming `who` and the path.
inline gguf_ptr open_gguf(const std::string& path, const char* who) {
  gguf_init_params p{};
  p.no_alloc = true;
  p.ctx = nullptr;
  gguf_ptr ctx(gguf_init_from_file(path.c_str(), p));
  if (!ctx) throw error(std::string(who) + ": " + path + ": not a readable GGUF file");
  return ctx;
}

/// The file's size in bytes; throws `error` naming `who` and the path.
inline std::uint64_t file_size(const std::string& path, const char* who) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  const std::streamoff n = f ? static_cast<std::streamoff>(f.tellg()) : std::streamoff(-1);
  if (n < 0) throw error(std::string(who) + ": " + path + ": cannot read the file's size");
  return static_cast<std::uint64_t>(n);
}
}  // namespace detail

// ---------------------------------------------------------------------------
// Expert byte ranges in the GGUF file, and a read callback over them.

/// Where one expert tensor's experts lie in the file: expert e is the bytes
/// [offset + e * bytes_per_expert, offset + (e+1) * bytes_per_expert).
struct expert_file_range {
  std::string tensor;
  std::uint64_t offset = 0;  ///< gguf_get_data_offset + gguf_get_tensor_offset
  std::uint64_t bytes_per_expert = 0;
  std::size_t n_expert = 0;
};

/// The file ranges of every MoE layer's expert tensors.
class gguf_expert_map {
 public:
  gguf_expert_map() = default;

  /// Looks up, in the GGUF file at `path`, the expert tensors the observer
  /// found through MUL_MAT_ID. Throws `error` when the file cannot be parsed,
  /// a tensor is missing, its size disagrees with the live tensor (a
  /// repacked or converted weight is not in the file's layout), or its
  /// experts lie past the end of the file (a truncated download: gguf.h
  /// reads only the header when it loads no data).
  gguf_expert_map(const std::string& path, const observer& obs) : path_(path) {
    auto ctx = open(path);
    const std::uint64_t size = detail::file_size(path, "gguf_expert_map");
    layers_.resize(obs.n_layer());
    for (std::size_t l = 0; l < obs.n_layer(); ++l) {
      const layer_structure& s = obs.layers()[l];
      for (const expert_tensor& e : s.experts) {
        expert_file_range r = find(ctx.get(), path, size, e.name);
        if (r.bytes_per_expert != e.bytes_per_expert || r.n_expert != e.n_expert)
          throw error("gguf_expert_map: " + path + ": tensor '" + e.name + "' has " +
                      std::to_string(r.bytes_per_expert) + " bytes per expert in the file but " +
                      std::to_string(e.bytes_per_expert) +
                      " in memory; expected the same (repacked weights are not in the file layout)");
        layers_[l].push_back(std::move(r));
      }
    }
  }

  /// From the file alone: every 3-D tensor named "blk.N.*_exps.*". For tools
  /// that have no live graph; the observer's version is the reference.
  /// Throws `error` as the constructor does.
  static gguf_expert_map by_name(const std::string& path) {
    gguf_expert_map m;
    m.path_ = path;
    auto ctx = open(path);
    const std::uint64_t size = detail::file_size(path, "gguf_expert_map");
    const std::int64_t n = gguf_get_n_tensors(ctx.get());
    for (std::int64_t i = 0; i < n; ++i) {
      const char* name = gguf_get_tensor_name(ctx.get(), i);
      const int il = detail::parse_blk_layer(name);
      if (il < 0 || std::strstr(name, "_exps.") == nullptr) continue;
      const std::int64_t* ne = gguf_get_tensor_ne(ctx.get(), i);
      if (ne[2] < 2 || ne[3] != 1) continue;
      if (static_cast<std::size_t>(il) >= m.layers_.size()) m.layers_.resize(static_cast<std::size_t>(il) + 1);
      m.layers_[static_cast<std::size_t>(il)].push_back(find(ctx.get(), path, size, name));
    }
    return m;
  }

  const std::string& path() const noexcept { return path_; }
  std::size_t n_layer() const noexcept { return layers_.size(); }
  const std::vector<expert_file_range>& ranges(layer_id l) const { return layers_.at(to_index(l)); }
  /// Bytes of one expert of layer l in the file (0 for a dense layer).
  std::uint64_t expert_bytes(layer_id l) const {
    std::uint64_t b = 0;
    for (const auto& r : ranges(l)) b += r.bytes_per_expert;
    return b;
  }

 private:
  static detail::gguf_ptr open(const std::string& path) { return detail::open_gguf(path, "gguf_expert_map"); }

  static expert_file_range find(const gguf_context* ctx, const std::string& path,
                                std::uint64_t file_size, const std::string& name) {
    const std::int64_t id = gguf_find_tensor(ctx, name.c_str());
    if (id < 0)
      throw error("gguf_expert_map: " + path + ": no tensor '" + name +
                  "'; expected the expert tensors the graph multiplies (split GGUFs are not supported)");
    const std::int64_t* ne = gguf_get_tensor_ne(ctx, id);
    const ggml_type type = gguf_get_tensor_type(ctx, id);
    expert_file_range r;
    r.tensor = name;
    const std::uint64_t data_offset = gguf_get_data_offset(ctx), tensor_offset = gguf_get_tensor_offset(ctx, id);
    r.bytes_per_expert = static_cast<std::uint64_t>(ggml_row_size(type, ne[0])) *
                         static_cast<std::uint64_t>(ne[1]);
    r.n_expert = static_cast<std::size_t>(ne[2]);
    // gguf.h bounds the tensor's size (it fits a size_t) but, loading no
    // data, not its place: the experts must lie inside the file.
    const std::uint64_t n = r.bytes_per_expert * static_cast<std::uint64_t>(r.n_expert);
    const bool wraps = tensor_offset > UINT64_MAX - data_offset;
    r.offset = wraps ? UINT64_MAX : data_offset + tensor_offset;
    if (wraps || r.offset > file_size || n > file_size - r.offset)
      throw error("gguf_expert_map: " + path + ": tensor '" + name + "' has " + std::to_string(n) +
                  " bytes of experts at file offset " + std::to_string(data_offset) + " + " +
                  std::to_string(tensor_offset) + " but the file has " + std::to_string(file_size) +
                  " bytes; expected its experts inside the file (is it truncated?)");
    return r;
  }

  std::string path_;
  std::vector<std::vector<expert_file_range>> layers_;
};
/// Bytes of each layer's non-expert tensors in a GGUF file ("blk.N.*" minus
/// the expert tensors of `map`), for a route trace's dense_bytes column.
inline std::vector<std::uint64_t> gguf_dense_bytes(const std::string& path, const gguf_expert_map& map,
                                                   std::size_t n_layer) {
  const detail::gguf_ptr holder = detail::open_gguf(path, "gguf_dense_bytes");
  const gguf_context* ctx = holder.get();
  std::vector<std::uint64_t> out(n_layer, 0);
  const std::int64_t n = gguf_get_n_tensors(ctx);
  for (std::int64_t i = 0; i < n; ++i) {
    const char* name = gguf_get_tensor_name(ctx, i);
    const int il = detail::parse_blk_layer(name);
    if (il < 0 || static_cast<std::size_t>(il) >= n_layer) continue;
    bool expert = false;
    if (static_cast<std::size_t>(il) < map.n_layer())
      for (const auto& r : map.ranges(layer_id(static_cast<std::uint16_t>(il))))
        expert = expert || r.tensor == name;
    if (!expert) out[static_cast<std::size_t>(il)] += gguf_get_tensor_size(ctx, i);
  }
  return out;
}
}  // namespace moe_residency::llama_cpp
