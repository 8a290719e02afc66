#pragma once
/// Expert byte ranges in a GGUF model (gguf_expert_map) and the bytes of each
/// layer's non-expert tensors (gguf_dense_bytes), read with gguf.h.
///
/// A model may be split (llama.cpp's gguf-split: PREFIX-00001-of-0000N.gguf
/// and its siblings, the first holding the metadata, each holding some
/// tensors with its own data section). It is given as its first split, as
/// llama.cpp loads it; every range names the split that holds it.

#include <cstddef>
#include <cstdint>
#include <cstdio>
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

/// The name of split `no` (0-based) of `count` of a model whose first split is
/// `PREFIX-00001-of-COUNT.gguf`: llama.cpp's llama_split_path format.
inline std::string split_path(const std::string& prefix, int no, int count) {
  char tail[48];
  std::snprintf(tail, sizeof tail, "-%05d-of-%05d.gguf", no + 1, count);
  return prefix + tail;
}

/// One file of a model: its path, its metadata and its size.
struct gguf_split {
  std::string path;
  gguf_ptr ctx;
  std::uint64_t size = 0;
};

/// u16 value of `key` (split.no, split.count), or `fallback` when absent;
/// throws `error` when it has another type.
inline int split_key(const gguf_context* ctx, const char* key, int fallback, const std::string& path, const char* who) {
  const std::int64_t id = gguf_find_key(ctx, key);
  if (id < 0) return fallback;
  if (gguf_get_kv_type(ctx, id) != GGUF_TYPE_UINT16)
    throw error(std::string(who) + ": " + path + ": key '" + key + "' is not a u16; expected llama.cpp's split keys");
  return gguf_get_val_u16(ctx, id);
}

/// Every file of the model whose first file is `path`: itself alone, or its
/// split.count splits named as llama.cpp names them, each checked to carry
/// its split.no. Throws `error` naming `who`, the file and what was expected.
inline std::vector<gguf_split> open_gguf_splits(const std::string& path, const char* who) {
  std::vector<gguf_split> out;
  out.push_back(gguf_split{path, open_gguf(path, who), file_size(path, who)});
  const gguf_context* first = out.front().ctx.get();
  const int count = split_key(first, "split.count", 1, path, who);
  const int no = split_key(first, "split.no", 0, path, who);
  if (count <= 1) return out;
  if (no != 0)
    throw error(std::string(who) + ": " + path + ": split " + std::to_string(no + 1) + " of " + std::to_string(count) +
                "; expected the model's first split (its name ends in '" + split_path("", 0, count) +
                "'), which llama.cpp loads the others from");
  const std::string tail = split_path("", 0, count);
  const std::size_t t = tail.size();
  if (path.size() <= t || path.compare(path.size() - t, t, tail) != 0)
    throw error(std::string(who) + ": " + path + ": the first of " + std::to_string(count) +
                " splits, but its name does not end in '" + tail + "'; expected llama.cpp's split names");
  const std::string prefix = path.substr(0, path.size() - t);
  for (int i = 1; i < count; ++i) {
    const std::string p = split_path(prefix, i, count);
    if (!std::ifstream(p, std::ios::binary))
      throw error(std::string(who) + ": " + p + ": cannot open split " + std::to_string(i + 1) + " of " +
                  std::to_string(count) + " of " + path + "; expected every split beside the first");
    gguf_split s{p, open_gguf(p, who), file_size(p, who)};
    const int n = split_key(s.ctx.get(), "split.no", -1, p, who);
    if (n != i)
      throw error(std::string(who) + ": " + p + ": split.no " + (n < 0 ? std::string("missing") : std::to_string(n)) +
                  "; expected " + std::to_string(i) + " (split " + std::to_string(i + 1) + " of " +
                  std::to_string(count) + " of " + path + ")");
    out.push_back(std::move(s));
  }
  return out;
}
}  // namespace detail

// ---------------------------------------------------------------------------
// Expert byte ranges in the GGUF model, and a read callback over them.

/// Where one expert tensor's experts lie: expert e is the bytes
/// [offset + e * bytes_per_expert, offset + (e+1) * bytes_per_expert) of
/// the model's file `split` (0 for a single-file model).
struct expert_file_range {
  std::string tensor;
  std::uint64_t offset = 0;  ///< gguf_get_data_offset + gguf_get_tensor_offset, in its split
  std::uint64_t bytes_per_expert = 0;
  std::size_t n_expert = 0;
  std::size_t split = 0;  ///< index into gguf_expert_map::paths()
};

/// The file ranges of every MoE layer's expert tensors.
class gguf_expert_map {
 public:
  gguf_expert_map() = default;

  /// Looks up, in the GGUF model at `path` (its first split), the expert
  /// tensors the observer found through MUL_MAT_ID. Throws `error` when a
  /// file cannot be parsed, a split is missing or misnamed, a tensor is
  /// missing, its size disagrees with the live tensor (a repacked or
  /// converted weight is not in the file's layout), or its experts lie past
  /// the end of its file (a truncated download: gguf.h reads only the header
  /// when it loads no data).
  gguf_expert_map(const std::string& path, const observer& obs) {
    const auto splits = open(path);
    layers_.resize(obs.n_layer());
    for (std::size_t l = 0; l < obs.n_layer(); ++l) {
      const layer_structure& s = obs.layers()[l];
      for (const expert_tensor& e : s.experts) {
        expert_file_range r = find(splits, e.name);
        if (r.bytes_per_expert != e.bytes_per_expert || r.n_expert != e.n_expert)
          throw error("gguf_expert_map: " + paths_[r.split] + ": tensor '" + e.name + "' has " +
                      std::to_string(r.bytes_per_expert) + " bytes per expert in the file but " +
                      std::to_string(e.bytes_per_expert) +
                      " in memory; expected the same (repacked weights are not in the file layout)");
        layers_[l].push_back(std::move(r));
      }
    }
  }

  /// From the files alone: every 3-D tensor named "blk.N.*_exps.*". For tools
  /// that have no live graph; the observer's version is the reference.
  /// Throws `error` as the constructor does.
  static gguf_expert_map by_name(const std::string& path) {
    gguf_expert_map m;
    const auto splits = m.open(path);
    for (std::size_t sp = 0; sp < splits.size(); ++sp) {
      const gguf_context* ctx = splits[sp].ctx.get();
      const std::int64_t n = gguf_get_n_tensors(ctx);
      for (std::int64_t i = 0; i < n; ++i) {
        const char* name = gguf_get_tensor_name(ctx, i);
        const int il = detail::parse_blk_layer(name);
        if (il < 0 || std::strstr(name, "_exps.") == nullptr) continue;
        const std::int64_t* ne = gguf_get_tensor_ne(ctx, i);
        if (ne[2] < 2 || ne[3] != 1) continue;
        if (static_cast<std::size_t>(il) >= m.layers_.size()) m.layers_.resize(static_cast<std::size_t>(il) + 1);
        m.layers_[static_cast<std::size_t>(il)].push_back(range(splits[sp], sp, i));
      }
    }
    return m;
  }

  /// The model's first file (the path given).
  const std::string& path() const noexcept { return paths_.front(); }
  /// Every file of the model, the first split first; one for a single file.
  const std::vector<std::string>& paths() const noexcept { return paths_; }
  std::size_t n_layer() const noexcept { return layers_.size(); }
  const std::vector<expert_file_range>& ranges(layer_id l) const { return layers_.at(to_index(l)); }
  /// Bytes of one expert of layer l in the file (0 for a dense layer).
  std::uint64_t expert_bytes(layer_id l) const {
    std::uint64_t b = 0;
    for (const auto& r : ranges(l)) b += r.bytes_per_expert;
    return b;
  }

 private:
  std::vector<detail::gguf_split> open(const std::string& path) {
    auto splits = detail::open_gguf_splits(path, "gguf_expert_map");
    paths_.clear();
    for (const auto& s : splits) paths_.push_back(s.path);
    return splits;
  }

  static expert_file_range find(const std::vector<detail::gguf_split>& splits, const std::string& name) {
    for (std::size_t sp = 0; sp < splits.size(); ++sp) {
      const std::int64_t id = gguf_find_tensor(splits[sp].ctx.get(), name.c_str());
      if (id >= 0) return range(splits[sp], sp, id);
    }
    throw error("gguf_expert_map: " + splits.front().path + ": no tensor '" + name + "' in its " +
                std::to_string(splits.size()) + (splits.size() == 1 ? " file" : " splits") +
                "; expected the expert tensors the graph multiplies");
  }

  static expert_file_range range(const detail::gguf_split& s, std::size_t split, std::int64_t id) {
    const gguf_context* ctx = s.ctx.get();
    const std::int64_t* ne = gguf_get_tensor_ne(ctx, id);
    const ggml_type type = gguf_get_tensor_type(ctx, id);
    expert_file_range r;
    r.tensor = gguf_get_tensor_name(ctx, id);
    r.split = split;
    const std::uint64_t data_offset = gguf_get_data_offset(ctx), tensor_offset = gguf_get_tensor_offset(ctx, id);
    r.bytes_per_expert = static_cast<std::uint64_t>(ggml_row_size(type, ne[0])) * static_cast<std::uint64_t>(ne[1]);
    r.n_expert = static_cast<std::size_t>(ne[2]);
    // gguf.h bounds the tensor's size (it fits a size_t) but, loading no
    // data, not its place: the experts must lie inside the file.
    const std::uint64_t n = r.bytes_per_expert * static_cast<std::uint64_t>(r.n_expert);
    const bool wraps = tensor_offset > UINT64_MAX - data_offset;
    r.offset = wraps ? UINT64_MAX : data_offset + tensor_offset;
    if (wraps || r.offset > s.size || n > s.size - r.offset)
      throw error("gguf_expert_map: " + s.path + ": tensor '" + r.tensor + "' has " + std::to_string(n) +
                  " bytes of experts at file offset " + std::to_string(data_offset) + " + " +
                  std::to_string(tensor_offset) + " but the file has " + std::to_string(s.size) +
                  " bytes; expected its experts inside the file (is it truncated?)");
    return r;
  }

  std::vector<std::string> paths_{std::string()};
  std::vector<std::vector<expert_file_range>> layers_;
};

/// Bytes of each layer's non-expert tensors in a GGUF model ("blk.N.*" minus
/// the expert tensors of `map`; every split), for a route trace's dense_bytes column.
inline std::vector<std::uint64_t> gguf_dense_bytes(const std::string& path, const gguf_expert_map& map,
                                                   std::size_t n_layer) {
  std::vector<std::uint64_t> out(n_layer, 0);
  for (const detail::gguf_split& s : detail::open_gguf_splits(path, "gguf_dense_bytes")) {
    const gguf_context* ctx = s.ctx.get();
    const std::int64_t n = gguf_get_n_tensors(ctx);
    for (std::int64_t i = 0; i < n; ++i) {
      const char* name = gguf_get_tensor_name(ctx, i);
      const int il = detail::parse_blk_layer(name);
      if (il < 0 || static_cast<std::size_t>(il) >= n_layer) continue;
      bool expert = false;
      if (static_cast<std::size_t>(il) < map.n_layer())
        for (const auto& r : map.ranges(layer_id(static_cast<std::uint16_t>(il)))) expert = expert || r.tensor == name;
      if (!expert) out[static_cast<std::size_t>(il)] += gguf_get_tensor_size(ctx, i);
    }
  }
  return out;
}
}  // namespace moe_residency::llama_cpp
