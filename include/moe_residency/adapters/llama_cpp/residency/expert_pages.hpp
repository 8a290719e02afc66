#pragma once
/// Where a memory-mapped GGUF's experts sit in llama.cpp's mappings (one per
/// file of a split model), page by page, and how many locks hold each page:
/// the geometry the mmap residency manager (residency.hpp) advises and locks.
///
/// An expert's slice of an expert tensor rarely starts or ends on a page
/// boundary, so two neighbouring experts (and an expert and a dense tensor)
/// can share a page. Locks are therefore counted per page: a page is
/// unlocked only when the last expert (or dense tensor) holding it lets go.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/adapters/llama_cpp/gguf.hpp"
#include "moe_residency/adapters/llama_cpp/residency/memory_limit.hpp"
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

  /// One file of the model as llama.cpp mapped it (a split model maps each
  /// of its splits on its own).
  struct file_mapping {
    std::string path;
    const unsigned char* file_base = nullptr;  // where the file's offset 0 is mapped (null: not located)
    std::uint64_t file_bytes = 0;              // up to its last tensor's end
    unsigned char* base = nullptr;             // the page file_base is on
    std::vector<std::uint8_t> refs;            // locks held per page of the mapping
  };

  /// A tensor the manager leaves to llama.cpp: not in the file's mapping
  /// (offloaded to a device, or copied out of the file, e.g. repacked by the
  /// CPU backend).
  struct unmapped_tensor {
    std::size_t layer = 0;  // an expert tensor's
    std::string name;
    std::string where;  // "offloaded to CUDA0", "repacked by the CPU backend (CPU_REPACK)", ...
    std::uint64_t bytes = 0;
    bool expert = true;  // false: a dense tensor
  };

  /// Reads the layout from the files llama.cpp mapped (a single file or the
  /// first split of a split model) and the observer's structure. An expert
  /// tensor that is not in a mapping of its file at its file offset (on
  /// Linux, as /proc/self/maps says; elsewhere, at the address most of the
  /// file's expert tensors agree on) is left out of its layer and listed in
  /// unmapped(): the rest is managed. Throws `error` when no expert tensor is
  /// in the mapping (nothing to manage) or when a file's expert tensors sit
  /// in two different mappings of it.
  void map(const std::string& path, const observer& obs, std::size_t page) {
    page_ = page;
    dense_total_ = 0;
    dense_unmapped_ = 0;
    dense_elsewhere_ = 0;
    widest_ = 0;
    unmapped_.clear();
    gguf_expert_map map(path, obs);
    const std::vector<gguf_split> splits = open_gguf_splits(path, "mmap_residency");
    files_.assign(splits.size(), file_mapping{});
    std::vector<std::vector<file_region>> regions(splits.size());
    std::vector<bool> regions_known(splits.size(), false);
    for (std::size_t f = 0; f < splits.size(); ++f) {
      const gguf_context* ctx = splits[f].ctx.get();
      const std::uint64_t data_offset = gguf_get_data_offset(ctx);
      std::uint64_t file_end = data_offset;
      for (std::int64_t i = 0; i < gguf_get_n_tensors(ctx); ++i)
        file_end = std::max<std::uint64_t>(file_end,
                                           data_offset + gguf_get_tensor_offset(ctx, i) + gguf_get_tensor_size(ctx, i));
      files_[f].path = splits[f].path;
      files_[f].file_bytes = file_end;
      regions_known[f] = file_regions(splits[f].path, regions[f]);
    }
    layers_.assign(obs.n_layer(), layer_ranges{});
    // Every weight an expert matmul multiplies is an expert tensor (also in a
    // layer whose routing the observer cannot express): never dense.
    std::vector<std::string> expert_names;
    for (const layer_structure& s : obs.layers())
      for (const expert_tensor& et : s.experts) expert_names.push_back(et.name);
    // Where each file's offset 0 would be by each host tensor; without the
    // process's map list, the address most of them agree on is the mapping.
    std::vector<std::vector<std::pair<const unsigned char*, std::size_t>>> votes(splits.size());
    for (std::size_t l = 0; l < obs.n_layer(); ++l) {
      const layer_structure& s = obs.layers()[l];
      if (!s.moe) continue;
      const auto& ranges = map.ranges(layer_id(static_cast<std::uint16_t>(l)));
      for (std::size_t i = 0; i < s.experts.size(); ++i) {
        if (!host_readable(s.experts[i].tensor)) continue;
        const unsigned char* b = static_cast<const unsigned char*>(s.experts[i].tensor->data) - ranges[i].offset;
        auto& v = votes[ranges[i].split];
        auto it = std::find_if(v.begin(), v.end(), [b](const auto& p) { return p.first == b; });
        if (it == v.end()) v.push_back({b, 1});
        else ++it->second;
      }
    }
    for (std::size_t l = 0; l < obs.n_layer(); ++l) {
      const layer_structure& s = obs.layers()[l];
      if (!s.moe) continue;
      const auto& ranges = map.ranges(layer_id(static_cast<std::uint16_t>(l)));
      for (std::size_t i = 0; i < s.experts.size(); ++i) {
        const expert_tensor& et = s.experts[i];
        const expert_file_range& fr = ranges[i];
        const std::uint64_t bytes = et.bytes_per_expert * et.n_expert;
        const auto* data = static_cast<const unsigned char*>(et.tensor->data);
        file_mapping& fm = files_[fr.split];
        std::string where;
        if (!host_readable(et.tensor) ||
            !in_mapping(data, bytes, fr.offset, regions_known[fr.split], regions[fr.split], votes[fr.split]))
          where = whereabouts(et.tensor);
        if (!where.empty()) {
          unmapped_.push_back(unmapped_tensor{l, et.name, std::move(where), bytes});
          continue;
        }
        // Where this tensor's file's offset 0 is: every expert tensor of a
        // file sits at that base + its offset in the file.
        const unsigned char* b = data - fr.offset;
        if (fm.file_base == nullptr) fm.file_base = b;
        if (b != fm.file_base)
          throw refusal("mmap_residency: expert tensor '" + et.name + "' is in a second mapping of " + fm.path +
                        " (its file offset " + std::to_string(fr.offset) +
                        " is at another address than the other expert tensors'); expected every expert tensor in "
                        "one mmap of its file");
        layers_[l].tensors.push_back(tensor_range{const_cast<unsigned char*>(data), et.bytes_per_expert, et.n_expert});
        layers_[l].bytes += et.bytes_per_expert;
      }
    }
    bool any = false;
    for (const file_mapping& fm : files_) any = any || fm.file_base != nullptr;
    if (!any && !unmapped_.empty())
      throw refusal("mmap_residency: no expert tensor is in the model's file mapping: " + unmapped_note() +
                    "; nothing to manage: expected the experts memory-mapped on the CPU (use_mmap = true, "
                    "use_extra_bufts = false, and no expert tensor offloaded)");
    if (!any) throw refusal("mmap_residency: the model has no MoE layer with expert tensors");
    // Dense: every other tensor of every file that the first graph read (the
    // observer's weights), where it read it: in the mapping (pinned), or a
    // copy elsewhere (repacked, offloaded: llama.cpp's, listed in unmapped(),
    // not counted). A tensor the graph never read is never touched: neither
    // pinned nor counted. Without the observer's weights (none recorded),
    // every other tensor is taken to be read where its file's mapping puts
    // it. A file whose mapping is not known (no expert and no read tensor in
    // it, off Linux) has its tensors counted, not pinned (dense_unmapped_bytes).
    const std::vector<const ggml_tensor*>& read = obs.weights();
    auto read_as = [&read](const std::string& name) -> const ggml_tensor* {
      for (const ggml_tensor* w : read)
        if (name == w->name) return w;
      return nullptr;
    };
    dense_.clear();
    for (std::size_t f = 0; f < splits.size(); ++f) {
      const gguf_context* ctx = splits[f].ctx.get();
      const std::uint64_t data_offset = gguf_get_data_offset(ctx);
      file_mapping& fm = files_[f];
      for (std::int64_t i = 0; i < gguf_get_n_tensors(ctx); ++i) {
        const std::string name = gguf_get_tensor_name(ctx, i);
        if (std::find(expert_names.begin(), expert_names.end(), name) != expert_names.end()) continue;
        const ggml_tensor* w = read_as(name);
        if (w == nullptr && !read.empty()) continue;  // never read: never touched
        const std::uint64_t off = data_offset + gguf_get_tensor_offset(ctx, i), size = gguf_get_tensor_size(ctx, i);
        if (w != nullptr) {
          const auto* data = static_cast<const unsigned char*>(w->data);
          const bool host = host_readable(w);
          bool mapped = host && (regions_known[f] ? in_mapping(data, size, off, true, regions[f], {})
                                                  : fm.file_base != nullptr && data - off == fm.file_base);
          if (mapped && fm.file_base == nullptr) fm.file_base = data - off;  // a split with no expert tensor
          mapped = mapped && data - off == fm.file_base;                     // not a second mapping of the file
          // Not mapped, and known not to be (off Linux, a split not located is unknown: counted below).
          if (!mapped && (regions_known[f] || fm.file_base != nullptr || !host)) {
            unmapped_.push_back(unmapped_tensor{0, name, whereabouts(w), size, false});
            dense_elsewhere_ += size;
            continue;
          }
        }
        dense_total_ += size;
        if (fm.file_base == nullptr) dense_unmapped_ += size;
        else if (size != 0) dense_.push_back({const_cast<unsigned char*>(fm.file_base) + off, size});
      }
    }
    for (file_mapping& fm : files_) {
      if (fm.file_base == nullptr) continue;
      fm.base = reinterpret_cast<unsigned char*>(floor(fm.file_base));
      const std::uint64_t span_bytes =
          reinterpret_cast<std::uintptr_t>(fm.file_base) + fm.file_bytes - floor(fm.file_base);
      fm.refs.assign(static_cast<std::size_t>((span_bytes + page_ - 1) / page_), 0);
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
  /// Dense bytes llama.cpp reads from the files' pages (those in dense()
  /// and the unmapped ones), not its copies elsewhere.
  std::uint64_t dense_bytes() const noexcept { return dense_total_; }
  /// Dense bytes llama.cpp copied out of the files (repacked, offloaded).
  std::uint64_t dense_elsewhere_bytes() const noexcept { return dense_elsewhere_; }
  /// One expert's bytes (all its tensors) in the widest layer.
  std::uint64_t widest_expert_bytes() const noexcept { return widest_; }
  /// The tensors left to llama.cpp (not in the mapping): the expert ones in
  /// layer order, then the dense ones.
  const std::vector<unmapped_tensor>& unmapped() const noexcept { return unmapped_; }
  /// One phrase per kind and place of the unmapped tensors, an expert
  /// one with its layers: "6 expert tensors (48.0 MiB) of layers 2-3
  /// repacked by the CPU backend (CPU_REPACK); 8 dense tensors (1.0 MiB)
  /// repacked by the CPU backend (CPU_REPACK)"; "" when every tensor is in
  /// the mapping.
  std::string unmapped_note() const {
    std::vector<std::pair<bool, std::string>> places;
    for (const unmapped_tensor& u : unmapped_)
      if (std::find(places.begin(), places.end(), std::make_pair(u.expert, u.where)) == places.end())
        places.emplace_back(u.expert, u.where);
    std::string out;
    for (const auto& [expert, w] : places) {
      std::size_t n = 0;
      std::uint64_t bytes = 0;
      std::vector<std::size_t> layers;
      for (const unmapped_tensor& u : unmapped_)
        if (u.expert == expert && u.where == w) {
          ++n;
          bytes += u.bytes;
          if (layers.empty() || layers.back() != u.layer) layers.push_back(u.layer);
        }
      if (!out.empty()) out += "; ";
      out += std::to_string(n) + (expert ? " expert" : " dense") + " tensor" + (n == 1 ? "" : "s") + " (" +
             mib_text(bytes) + ")" +
             (expert ? std::string(" of layer") + (layers.size() == 1 ? " " : "s ") + ranges_text(layers) : "") + " " +
             w;
    }
    return out;
  }
  /// Dense bytes in files whose mapping is not known: a split with no expert
  /// tensor and, off Linux, no tensor the graph read (counted, not in dense()).
  std::uint64_t dense_unmapped_bytes() const noexcept { return dense_unmapped_; }
  /// The model's files as mapped, the first split first (one for a single file).
  const std::vector<file_mapping>& files() const noexcept { return files_; }
  /// Bytes of the model's mappings: each file's from its first page to its
  /// end (a file with no expert tensor: its bytes).
  std::uint64_t mapped_bytes() const noexcept {
    std::uint64_t n = 0;
    for (const file_mapping& f : files_)
      n += f.refs.empty() ? f.file_bytes : static_cast<std::uint64_t>(f.refs.size()) * page_;
    return n;
  }

  /// One more lock on every page of [a, b) (one file's pages).
  void add_refs(std::uintptr_t a, std::uintptr_t b) noexcept {
    file_mapping* f = file_of(a);
    if (f == nullptr) return;
    const std::uintptr_t base = reinterpret_cast<std::uintptr_t>(f->base);
    for (std::uintptr_t p = a; p < b; p += page_) {
      const std::size_t i = (p - base) / page_;
      if (i < f->refs.size() && f->refs[i] < 255) ++f->refs[i];
    }
  }
  /// Drops one lock from every page of [a, b) (one file's pages) and calls
  /// `freed(begin, bytes)` for each run of pages no lock holds any more: a
  /// page shared with a neighbour that is still locked stays out of every run.
  template <class Freed>
  void drop_refs(std::uintptr_t a, std::uintptr_t b, Freed&& freed) noexcept {
    file_mapping* f = file_of(a);
    if (f == nullptr) return;
    const std::uintptr_t base = reinterpret_cast<std::uintptr_t>(f->base);
    std::uintptr_t run = 0;
    bool in_run = false;
    for (std::uintptr_t p = a; p <= b; p += page_) {
      bool now_free = false;
      if (p < b) {
        const std::size_t i = (p - base) / page_;
        if (i < f->refs.size() && f->refs[i] > 0) now_free = --f->refs[i] == 0;
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
    for (file_mapping& f : files_)
      for (std::size_t p = 0; p < f.refs.size();) {
        if (f.refs[p] == 0) {
          ++p;
          continue;
        }
        std::size_t q = p;
        while (q < f.refs.size() && f.refs[q] != 0) f.refs[q++] = 0;
        freed(reinterpret_cast<std::uintptr_t>(f.base + p * page_), (q - p) * page_);
        p = q;
      }
  }

 private:
  // Where a tensor that is not in its file's mapping is, in words: on a
  // device that is not the CPU (offloaded), or in a CPU buffer (a repacked
  // copy, by its buffer type's name, or a plain copy: loaded without mmap).
  static std::string whereabouts(const ggml_tensor* t) {
    const ggml_backend_buffer_t buf = t->view_src != nullptr ? t->view_src->buffer : t->buffer;
    if (buf == nullptr) return "copied out of the file (no buffer)";
    const ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(buf);
    const char* n = ggml_backend_buft_name(buft);
    const std::string name = n != nullptr ? n : "an unnamed buffer type";
    const ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
    if (dev != nullptr && ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU) return "offloaded to " + name;
    if (name.find("REPACK") != std::string::npos) return "repacked by the CPU backend (" + name + ")";
    return "copied out of the file (" + name + ")";
  }
  // True when [data, data + bytes) maps the file from `offset`: inside one of
  // the file's mappings at that offset (the process's map list), or, without
  // the list, at the base most of the file's expert tensors agree on.
  static bool in_mapping(const unsigned char* data, std::uint64_t bytes, std::uint64_t offset, bool known,
                         const std::vector<file_region>& regions,
                         const std::vector<std::pair<const unsigned char*, std::size_t>>& votes) {
    const auto a = reinterpret_cast<std::uintptr_t>(data);
    if (known) {
      for (const file_region& r : regions)
        if (a >= r.begin && a + bytes <= r.end && r.offset + (a - r.begin) == offset) return true;
      return false;
    }
    const auto best =
        std::max_element(votes.begin(), votes.end(), [](const auto& x, const auto& y) { return x.second < y.second; });
    return best != votes.end() && best->first == data - offset;
  }
  static std::string mib_text(std::uint64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
    return buf;
  }
  // "0-3, 5, 7-8"
  static std::string ranges_text(const std::vector<std::size_t>& v) {
    std::string out;
    for (std::size_t i = 0; i < v.size();) {
      std::size_t j = i;
      while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
      if (!out.empty()) out += ", ";
      out += std::to_string(v[i]) + (j > i ? "-" + std::to_string(v[j]) : std::string());
      i = j + 1;
    }
    return out;
  }

  /// The mapping [a, …) lies in; null outside every tracked file.
  file_mapping* file_of(std::uintptr_t a) noexcept {
    for (file_mapping& f : files_) {
      const auto base = reinterpret_cast<std::uintptr_t>(f.base);
      if (f.base != nullptr && a >= base && a < base + f.refs.size() * page_) return &f;
    }
    return nullptr;
  }

  std::size_t page_ = 4096;
  std::vector<layer_ranges> layers_;
  std::vector<std::pair<unsigned char*, std::uint64_t>> dense_;
  std::uint64_t dense_total_ = 0, dense_unmapped_ = 0, dense_elsewhere_ = 0, widest_ = 0;
  std::vector<file_mapping> files_;
  std::vector<unmapped_tensor> unmapped_;
};

}  // namespace moe_residency::llama_cpp::detail
