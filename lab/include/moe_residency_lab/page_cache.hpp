#pragma once
/// The memory lab's page cache (moe_residency_lab/lab.hpp's fault model): the model
/// file's pages as the kernel maps them, and a page cache in which a fault
/// reads the read-around window around it, with Linux's two lists or a plain
/// LRU choosing the victims. docs/lab-predict.md.
///
/// Standard library only.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <list>
#include <utility>
#include <vector>

#include "moe_residency/error.hpp"
#include "moe_residency/trace/types.hpp"

namespace moe_residency::lab {

/// The file as the fault model sees it: per layer, its dense bytes and then
/// `tensors` expert tensors (gate, up, down) of n_expert slices each, every
/// block page-aligned. An approximation of the GGUF's layout (its global
/// tensors sit elsewhere; the dense share is what matters for the LRU).
struct lab_file_layout {
  std::uint64_t page = 4096;
  std::uint64_t pages = 0;
  struct layer_blocks {
    std::uint64_t dense_first = 0, dense_pages = 0;
    std::vector<std::uint64_t> tensor_first;  ///< first page of each expert tensor
    std::uint64_t slice_bytes = 0;            ///< one expert's bytes in one tensor
  };
  std::vector<layer_blocks> layers;

  /// Pages [first, last) of expert e's slice in tensor t of layer l.
  std::pair<std::uint64_t, std::uint64_t> slice_pages(std::size_t l, std::size_t t, std::size_t e) const {
    const layer_blocks& b = layers[l];
    const std::uint64_t off = b.tensor_first[t] * page + static_cast<std::uint64_t>(e) * b.slice_bytes;
    return {off / page, (off + b.slice_bytes + page - 1) / page};
  }
};

inline lab_file_layout make_lab_file_layout(const trace_header& h, std::size_t tensors = 3, std::uint64_t page = 4096) {
  if (tensors == 0 || page == 0) throw error("make_lab_file_layout: tensors and page must be > 0");
  lab_file_layout f;
  f.page = page;
  auto pages_of = [&](std::uint64_t bytes) { return (bytes + page - 1) / page; };
  for (std::size_t l = 0; l < h.n_layer; ++l) {
    lab_file_layout::layer_blocks b;
    b.dense_first = f.pages;
    b.dense_pages = pages_of(l < h.dense_bytes.size() ? h.dense_bytes[l] : 0);
    f.pages += b.dense_pages;
    const std::uint64_t eb = l < h.expert_bytes.size() ? h.expert_bytes[l] : 0;
    b.slice_bytes = eb / tensors;
    for (std::size_t t = 0; t < tensors; ++t) {
      b.tensor_first.push_back(f.pages);
      f.pages += pages_of(b.slice_bytes * h.n_expert);
    }
    f.layers.push_back(std::move(b));
  }
  return f;
}

/// How the modelled page cache chooses its victims.
enum class page_reclaim : std::uint8_t {
  /// One LRU list: a touch moves a page to the most recent end.
  lru,
  /// Linux's two lists, reduced to what decides which file pages stay: a new
  /// page (faulted or read around) enters the inactive list; a touch only
  /// marks it referenced (the page table's accessed bit — mapped pages are
  /// not moved on access); reclaim takes the inactive list's oldest page,
  /// but a referenced one is rotated instead (its bit cleared, the second
  /// reference remembered) and one found referenced on two scans is
  /// activated; the active list keeps at most half the pages, its oldest
  /// demoted to the inactive list. So read-around pages that are never
  /// touched go first and pages the matmuls used get a second chance —
  /// which is why a limit of 1/1.5 of the file keeps part of it (docs).
  two_list,
};

/// A page cache of `capacity` pages in which touching a missing page is a
/// fault that reads the window of `window` pages centred on it (clipped to the
/// file; only missing pages are read), as Linux's mmap read-around does.
/// Pinned pages are resident and outside the lists.
class readaround_page_cache {
 public:
  readaround_page_cache(std::uint64_t pages, std::uint64_t capacity, std::uint64_t window,
                        page_reclaim reclaim = page_reclaim::lru)
      : state_(pages, absent),
        ref_(pages, 0),
        seen_(pages, 0),
        pos_(pages),
        capacity_(capacity),
        window_(std::max<std::uint64_t>(1, window)),
        reclaim_(reclaim) {
    if (capacity == 0) throw error("readaround_page_cache: capacity 0 pages; expected > 0");
  }

  /// Locks pages [first, last) resident (dense pinned); not counted as reads.
  void pin(std::uint64_t first, std::uint64_t last) {
    for (std::uint64_t p = first; p < last && p < state_.size(); ++p) {
      if (state_[p] == inactive) inactive_.erase(pos_[p]);
      if (state_[p] == active) active_.erase(pos_[p]);
      state_[p] = pinned;
    }
  }

  /// Touches pages [first, last) in order. Returns the faults taken; adds the pages read to `pages_read`.
  std::uint32_t touch(std::uint64_t first, std::uint64_t last, std::uint64_t& pages_read) {
    std::uint32_t faults = 0;
    for (std::uint64_t p = first; p < last && p < state_.size(); ++p) {
      if (state_[p] == pinned) continue;
      if (state_[p] != absent) {
        if (reclaim_ == page_reclaim::lru) inactive_.splice(inactive_.end(), inactive_, pos_[p]);
        else ref_[p] = 1;
        continue;
      }
      ++faults;
      const std::uint64_t lo = p >= window_ / 2 ? p - window_ / 2 : 0;
      const std::uint64_t hi = std::min<std::uint64_t>(state_.size(), lo + window_);
      for (std::uint64_t q = lo; q < hi; ++q)
        if (state_[q] == absent && q != p) insert(q, 0), ++pages_read;
      insert(p, 1);  // the faulting page last: the most recently used, referenced
      ++pages_read;
    }
    return faults;
  }

  /// Pages of [first, last) not resident (what a read of the range would read).
  std::uint64_t missing(std::uint64_t first, std::uint64_t last) const noexcept {
    std::uint64_t n = 0;
    for (std::uint64_t p = first; p < last && p < state_.size(); ++p) n += state_[p] == absent;
    return n;
  }

  /// Reads the missing pages of [first, last) without read-around and maps
  /// them (MADV_WILLNEED, then MADV_POPULATE_READ: referenced); no fault is
  /// taken. Returns the pages read.
  std::uint64_t read(std::uint64_t first, std::uint64_t last) {
    std::uint64_t n = 0;
    for (std::uint64_t p = first; p < last && p < state_.size(); ++p)
      if (state_[p] == absent) insert(p, 1), ++n;
    return n;
  }

  std::uint64_t resident_pages() const noexcept { return inactive_.size() + active_.size(); }
  std::uint64_t active_pages() const noexcept { return active_.size(); }
  bool is_resident(std::uint64_t p) const noexcept { return state_[p] != absent; }

 private:
  enum : std::uint8_t { absent, inactive, active, pinned };
  using list = std::list<std::uint64_t>;
  void push(list& l, std::uint64_t p, std::uint8_t st) {
    l.push_back(p);
    pos_[p] = std::prev(l.end());
    state_[p] = st;
  }
  void evict_one() {
    for (;;) {
      if (inactive_.empty()) {  // everything active: its oldest goes
        const std::uint64_t v = active_.front();
        active_.pop_front();
        state_[v] = absent;
        ref_[v] = seen_[v] = 0;
        return;
      }
      const std::uint64_t v = inactive_.front();
      if (reclaim_ == page_reclaim::two_list && ref_[v]) {
        ref_[v] = 0;
        inactive_.pop_front();
        if (seen_[v]) {  // referenced on two scans: activate
          seen_[v] = 0;
          push(active_, v, active);
          while (active_.size() > capacity_ / 2) {
            const std::uint64_t q = active_.front();
            active_.pop_front();
            push(inactive_, q, inactive);
          }
        } else {
          seen_[v] = 1;
          push(inactive_, v, inactive);
        }
        continue;
      }
      inactive_.pop_front();
      state_[v] = absent;
      ref_[v] = seen_[v] = 0;
      return;
    }
  }
  void insert(std::uint64_t p, std::uint8_t referenced) {
    if (resident_pages() >= capacity_) evict_one();
    push(inactive_, p, inactive);
    ref_[p] = reclaim_ == page_reclaim::two_list ? referenced : 0;
  }
  std::vector<std::uint8_t> state_, ref_, seen_;
  std::vector<list::iterator> pos_;
  list inactive_, active_;
  std::uint64_t capacity_, window_;
  page_reclaim reclaim_;
};

}  // namespace moe_residency::lab
