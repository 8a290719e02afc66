#pragma once
/// Where a memory-mapped GGUF's experts sit in llama.cpp's mapping, page by
/// page, and how many locks hold each page: the geometry the mmap residency
/// manager (residency.hpp) advises and locks.
///
/// An expert's slice of an expert tensor rarely starts or ends on a page
/// boundary, so two neighbouring experts (and an expert and a dense tensor)
/// can share a page. Locks are therefore counted per page: a page is
/// unlocked only when the last expert (or dense tensor) holding it lets go.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/adapters/llama_cpp/gguf.hpp"
#include "moe_residency/adapters/llama_cpp/observer.hpp"
#include "moe_residency/error.hpp"

namespace moe_residency::llama_cpp::detail {

class expert_pages {
 public:
  struct tensor_range {
    unsigned char* data = nullptr;  // expert 0 in the mapping
    std::uint64_t stride = 0;       // bytes per expert (nb[2])
    std::size_t n_expert = 0;
  };
  struct layer_ranges {
    std::vector<tensor_range> tensors;
    std::uint64_t bytes = 0;  // one expert, all tensors
  };

  /// Reads the layout from the file llama.cpp mapped and the observer's
  /// structure. Throws `error` naming the tensor when an expert tensor is
  /// offloaded or not at its file offset in one mapping of the file.
  void map(const std::string& path, const observer& obs, std::size_t page) {
    page_ = page;
    dense_total_ = 0;
    widest_ = 0;
    gguf_expert_map map(path, obs);
    const gguf_ptr ctx = open_gguf(path, "mmap_residency");
    const std::uint64_t data_offset = gguf_get_data_offset(ctx.get());
    std::uint64_t file_end = data_offset;
    const std::int64_t n = gguf_get_n_tensors(ctx.get());
    for (std::int64_t i = 0; i < n; ++i)
      file_end = std::max<std::uint64_t>(file_end, data_offset + gguf_get_tensor_offset(ctx.get(), i) +
                                                       gguf_get_tensor_size(ctx.get(), i));
    // The mapping's base: every expert tensor must sit at base + its file offset.
    const unsigned char* base = nullptr;
    layers_.assign(obs.n_layer(), layer_ranges{});
    // Every weight an expert matmul multiplies is an expert tensor (also in a
    // layer whose routing the observer cannot express): never dense.
    std::vector<std::string> expert_names;
    for (const layer_structure& s : obs.layers())
      for (const expert_tensor& et : s.experts) expert_names.push_back(et.name);
    for (std::size_t l = 0; l < obs.n_layer(); ++l) {
      const layer_structure& s = obs.layers()[l];
      if (!s.moe) continue;
      const auto& ranges = map.ranges(layer_id(static_cast<std::uint16_t>(l)));
      for (std::size_t i = 0; i < s.experts.size(); ++i) {
        const expert_tensor& et = s.experts[i];
        const expert_file_range& fr = ranges[i];
        if (!host_readable(et.tensor))
          throw error("mmap_residency: expert tensor '" + et.name +
                      "' is not in host memory (offloaded); expected a memory-mapped CPU weight");
        const auto* data = static_cast<const unsigned char*>(et.tensor->data);
        const unsigned char* b = data - fr.offset;
        if (base == nullptr) base = b;
        if (b != base)
          throw error("mmap_residency: expert tensor '" + et.name + "' is not at its file offset " +
                      std::to_string(fr.offset) + " in the mapping of " + path +
                      "; expected every expert tensor in one mmap of the file (load with use_mmap = true "
                      "and use_extra_bufts = false: repacked weights are copies, not the file)");
        layers_[l].tensors.push_back(tensor_range{const_cast<unsigned char*>(data), et.bytes_per_expert, et.n_expert});
        layers_[l].bytes += et.bytes_per_expert;
      }
    }
    if (base == nullptr) throw error("mmap_residency: the model has no MoE layer with expert tensors");
    file_base_ = base;
    file_bytes_ = file_end;
    base_ = reinterpret_cast<unsigned char*>(floor(base));
    const std::uint64_t span_bytes = reinterpret_cast<std::uintptr_t>(base) + file_end - floor(base);
    refs_.assign(static_cast<std::size_t>((span_bytes + page_ - 1) / page_), 0);
    // Dense: every other tensor of the file.
    dense_.clear();
    for (std::int64_t i = 0; i < n; ++i) {
      const std::string name = gguf_get_tensor_name(ctx.get(), i);
      if (std::find(expert_names.begin(), expert_names.end(), name) != expert_names.end()) continue;
      const std::uint64_t off = data_offset + gguf_get_tensor_offset(ctx.get(), i);
      const std::uint64_t size = gguf_get_tensor_size(ctx.get(), i);
      if (size != 0) dense_.push_back({const_cast<unsigned char*>(base) + off, size});
      dense_total_ += size;
    }
    for (const layer_ranges& l : layers_) widest_ = std::max(widest_, l.bytes);
  }

  std::uintptr_t floor(const unsigned char* p) const noexcept {
    return reinterpret_cast<std::uintptr_t>(p) & ~static_cast<std::uintptr_t>(page_ - 1);
  }
  std::uintptr_t ceil(const unsigned char* p) const noexcept {
    return (reinterpret_cast<std::uintptr_t>(p) + page_ - 1) & ~static_cast<std::uintptr_t>(page_ - 1);
  }
  /// Expert e's slice of tensor t, page-aligned outward.
  std::pair<std::uintptr_t, std::uintptr_t> slice(const tensor_range& t, std::size_t e) const noexcept {
    const unsigned char* a = t.data + e * t.stride;
    return {floor(a), ceil(a + t.stride)};
  }

  /// Per model layer (empty for a dense layer).
  const std::vector<layer_ranges>& layers() const noexcept { return layers_; }
  /// The other tensors of the file: (address in the mapping, bytes).
  const std::vector<std::pair<unsigned char*, std::uint64_t>>& dense() const noexcept { return dense_; }
  std::uint64_t dense_bytes() const noexcept { return dense_total_; }
  /// One expert's bytes (all its tensors) in the widest layer.
  std::uint64_t widest_expert_bytes() const noexcept { return widest_; }
  /// The page the first expert tensor starts on.
  unsigned char* base() const noexcept { return base_; }
  /// Where the file's offset 0 is in the mapping (every expert tensor sits at it + its file offset).
  const unsigned char* file_base() const noexcept { return file_base_; }
  /// The file's bytes up to its last tensor's end.
  std::uint64_t file_bytes() const noexcept { return file_bytes_; }
  /// Bytes of the mapping from the first expert tensor's page to the file's end.
  std::uint64_t mapped_bytes() const noexcept { return static_cast<std::uint64_t>(refs_.size()) * page_; }

  /// One more lock on every page of [a, b).
  void add_refs(std::uintptr_t a, std::uintptr_t b) noexcept {
    for (std::uintptr_t p = a; p < b; p += page_) {
      const std::size_t i = (p - reinterpret_cast<std::uintptr_t>(base_)) / page_;
      if (i < refs_.size() && refs_[i] < 255) ++refs_[i];
    }
  }
  /// Drops one lock from every page of [a, b) and calls `freed(begin, bytes)`
  /// for each run of pages no lock holds any more: a page shared with a
  /// neighbour that is still locked stays out of every run.
  template <class Freed>
  void drop_refs(std::uintptr_t a, std::uintptr_t b, Freed&& freed) noexcept {
    const std::uintptr_t base = reinterpret_cast<std::uintptr_t>(base_);
    std::uintptr_t run = 0;
    bool in_run = false;
    for (std::uintptr_t p = a; p <= b; p += page_) {
      bool now_free = false;
      if (p < b) {
        const std::size_t i = (p - base) / page_;
        if (i < refs_.size() && refs_[i] > 0) now_free = --refs_[i] == 0;
      }
      if (now_free && !in_run) {
        run = p;
        in_run = true;
      } else if (!now_free && in_run) {
        freed(run, p - run);
        in_run = false;
      }
    }
  }
  /// Clears every lock count and calls `freed(begin, bytes)` for each run of
  /// pages that was held.
  template <class Freed>
  void drop_all(Freed&& freed) noexcept {
    for (std::size_t p = 0; p < refs_.size();) {
      if (refs_[p] == 0) {
        ++p;
        continue;
      }
      std::size_t q = p;
      while (q < refs_.size() && refs_[q] != 0) refs_[q++] = 0;
      freed(reinterpret_cast<std::uintptr_t>(base_ + p * page_), (q - p) * page_);
      p = q;
    }
  }

 private:
  std::size_t page_ = 4096;
  std::vector<layer_ranges> layers_;
  std::vector<std::pair<unsigned char*, std::uint64_t>> dense_;
  std::uint64_t dense_total_ = 0, widest_ = 0;
  unsigned char* base_ = nullptr;
  const unsigned char* file_base_ = nullptr;
  std::uint64_t file_bytes_ = 0;
  std::vector<std::uint8_t> refs_;  // locks held per page of the mapping
};

}  // namespace moe_residency::llama_cpp::detail
