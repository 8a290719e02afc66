#pragma once
/// mmap_residency's members for one MoE layer's step at its routing: the
/// previous layer's reads settled, the routed experts looked up in the cache,
/// the misses read in the matmuls' order (on the lanes, overlapped with
/// compute), the predictions issued; and the admissions and evictions that pin
/// and unpin pages.

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/adapters/llama_cpp/mmap_residency.hpp"

namespace moe_residency::llama_cpp {

template <class Policy>
void mmap_residency<Policy>::manage(const layer_batch& b) {
  ++stats_.routed_layers;
  settle_demand();  // the previous layer's reads: its matmuls, which needed them, are done
  const layer_id l = b.layer;
  const std::size_t li = to_index(l);
  if (li >= pages_.layers().size() || pages_.layers()[li].tensors.empty()) return;
  const bool decode = b.phase == run_phase::decode;

  // The experts this layer reads: the union over its tokens, first-seen order.
  routed_.clear();
  const std::size_t n_expert = shape_.n_experts();
  if (seen_.size() != n_expert) seen_.assign(n_expert, 0);
  for (std::size_t t = 0; t < b.n_tokens; ++t)
    for (std::size_t j = 0; j < b.k; ++j) {
      const std::int32_t id = b.ids[t * b.ids_stride + j];
      if (id < 0 || static_cast<std::size_t>(id) >= n_expert || seen_[static_cast<std::size_t>(id)]) continue;
      seen_[static_cast<std::size_t>(id)] = 1;
      routed_.push_back(expert_id(static_cast<std::uint16_t>(id)));
    }
  for (expert_id e : routed_) seen_[to_index(e)] = 0;

  if (scheduler_ && pool_) {
    // The pool: what the lanes placed for this layer is adopted by the
    // cache if routed (a miss that needs no read), released otherwise.
    predictions_.settle(*scheduler_, l, routed_, stats_,
                        [this](layer_id pl, expert_id pe, detail::predicted_reads::fate f, bool demanded) noexcept {
                          const std::size_t ps = to_index(pl) * shape_.n_experts() + to_index(pe);
                          if (spec_slot_[ps] == no_slot) return;
                          if (f == detail::predicted_reads::fate::ok && demanded) return;  // adopted below
                          release_speculative(to_index(pl), to_index(pe), f != detail::predicted_reads::fate::not_run);
                        });
  } else if (scheduler_) {
    predictions_.settle(*scheduler_, l, routed_, stats_);
  }
  if (options_.measure && inspectable_ && decode) measure(li);

  // The cache decides what is read and pinned (decode only).
  to_read_.clear();
  const bool cached = cache_ != nullptr && decode;
  if (cached) {
    cache_->begin_batch(run_phase::decode, l);
    for (expert_id e : routed_) {
      if (cache_->lookup(e) == lookup_result::miss) {
        ++stats_.cache_misses;
        const std::size_t s = li * n_expert + to_index(e);
        if (pool_ && spec_slot_[s] != no_slot) {  // placed ahead by the lanes: adopted, no read
          slot_of_[s] = spec_slot_[s];
          spec_slot_[s] = no_slot;
          admitted(l, e, true);
          continue;
        }
        to_read_.push_back(e);
      } else {
        ++stats_.cache_hits;
      }
    }
    // A placement ahead of an expert the cache already holds cannot happen
    // (the planner skips residents); should one, it is released, not leaked.
    if (pool_)
      for (expert_id e : routed_)
        if (spec_slot_[li * n_expert + to_index(e)] != no_slot) release_speculative(li, to_index(e), true);
  } else if (options_.exact) {
    to_read_ = routed_;
  }

  bool settles_cache = false;  // the lanes' admissions close the batch (settle_demand)
  if (!to_read_.empty()) {
    // ggml's mul_mat_id multiplies a layer's experts in id order, tensor
    // by tensor (the observer lists the tensors in the graph's order): the
    // reads go to the device in that order, so the first matmul can start
    // on the first expert while the later ones are still being read.
    std::sort(to_read_.begin(), to_read_.end(), [](expert_id a, expert_id b) { return to_index(a) < to_index(b); });
    const bool lanes_read = options_.exact && owned_;
    if (cached && pool_) take_slots(l);
    const bool placing = pool_ && cached;  // the misses go to the pool, past the page cache
    if (!lanes_read && !placing) start_layer_reads(l);
    if (options_.exact) {
      begin_lane_reads(l, cached);
      pending_cache_ = settles_cache = cached;
      if (!options_.overlap || placing) settle_demand();
    } else if (cached) {
      read_inline(l);
    }
  } else if (cache_ != nullptr && !decode) {
    // The cache alone, a prompt batch: never pinned, but requested at once
    // (the expert ranges fault one page at a time under MADV_RANDOM).
    for (expert_id e : routed_) start_reads(l, e);
  }
  if (cached && !settles_cache) close_cache_batch();
  if (options_.predicted && decode && b.n_tokens > 0) {
    const cache_type* c = cache_.get();
    auto resident = [c](layer_id tl, expert_id e) noexcept { return c != nullptr && c->is_resident(tl, e); };
    if (pool_) {
      // The pool: each speculative read places its expert in a spare slot.
      predictions_.issue(
          *scheduler_, l, b.x(b.n_tokens - 1), pages_.layers(), stats_, resident,
          [this](layer_id tl, expert_id e) noexcept {
            const std::size_t s = to_index(tl) * shape_.n_experts() + to_index(e);
            if (free_slots_.empty() || spec_slot_[s] != no_slot || slot_of_[s] != no_slot) return false;
            spec_slot_[s] = free_slots_.back();
            free_slots_.pop_back();
            return true;
          },
          [this](layer_id tl, expert_id e) noexcept { release_speculative(to_index(tl), to_index(e), false); });
    } else {
      predictions_.issue(*scheduler_, l, b.x(b.n_tokens - 1), pages_.layers(), stats_, resident);
    }
  }
}

template <class Policy>
void mmap_residency<Policy>::measure(std::size_t li) {
  for (expert_id e : routed_) {
    ++stats_.routed_experts;
    bool all = true;
    for (const auto& t : pages_.layers()[li].tensors) {
      const auto r = pages_.slice(t, to_index(e));
      const long pages = advice_->resident_pages(reinterpret_cast<void*>(r.first), r.second - r.first);
      all = all && pages >= 0 && static_cast<std::uint64_t>(pages) == (r.second - r.first) / page_;
    }
    stats_.routed_resident += all;
  }
}

template <class Policy>
void mmap_residency<Policy>::take_slots(layer_id l) noexcept {
  for (expert_id e : to_read_) {
    if (free_slots_.empty()) {
      ++stats_.pool_fallbacks;
      start_reads(l, e);
      continue;
    }
    slot_of_[to_index(l) * shape_.n_experts() + to_index(e)] = free_slots_.back();
    free_slots_.pop_back();
  }
}

template <class Policy>
void mmap_residency<Policy>::start_layer_reads(layer_id l) noexcept {
  for (const auto& t : pages_.layers()[to_index(l)].tensors)
    for (expert_id e : to_read_) {
      const auto r = pages_.slice(t, to_index(e));
      call(advice::willneed, r.first, r.second - r.first);
    }
}

template <class Policy>
void mmap_residency<Policy>::begin_lane_reads(layer_id l, bool lock) {
  lock_demanded_ = lock;
  requests_.clear();
  for (expert_id e : to_read_) requests_.push_back(read_request{l, e, pages_.layers()[to_index(l)].bytes});
  const std::size_t n = requests_.size();
  pending_layer_ = l;
  pending_lock_ = lock;
  pending_demand_ = true;
  scheduler_->begin_demand(span<const read_request>(requests_.data(), n), span<read_outcome>(outcomes_.data(), n));
}

template <class Policy>
void mmap_residency<Policy>::settle_demand() noexcept {
  if (pending_demand_) {
    pending_demand_ = false;
    scheduler_->end_demand();
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      const bool ok = outcomes_[i] == read_outcome::ok;
      ++stats_.exact_reads;
      stats_.exact_bytes += requests_[i].bytes;
      stats_.exact_failed += !ok;
      if (pending_lock_) admitted(pending_layer_, to_read_[i], ok);
    }
  }
  if (pending_cache_) {
    pending_cache_ = false;
    close_cache_batch();
  }
}

template <class Policy>
void mmap_residency<Policy>::read_inline(layer_id l) {
  lock_demanded_ = true;
  for (expert_id e : to_read_) admitted(l, e, read_expert(l, e, read_reason::demanded) == read_status::ok);
}

template <class Policy>
void mmap_residency<Policy>::admitted(layer_id l, expert_id e, bool ok) noexcept {
  const std::size_t s = to_index(l) * shape_.n_experts() + to_index(e);
  const bool pooled = pool_ && slot_of_[s] != no_slot;
  if (!ok && pooled) {  // place_expert mapped the file back; the slot is free again
    free_slots_.push_back(slot_of_[s]);
    slot_of_[s] = no_slot;
  }
  if (!ok) {
    ++stats_.lock_failed;
    cache_->invalidate(l, e);
    // A partly locked expert: unlock what no other lock holds (without
    // releasing it: the layer multiplies it next), then make sure it is
    // resident the way exact reads do.
    for (const auto& t : pages_.layers()[to_index(l)].tensors) {
      const auto r = pages_.slice(t, to_index(e));
      pages_.add_refs(r.first, r.second);
      drop_refs(r.first, r.second, false);
      call(advice::populate_read, r.first, r.second - r.first);
    }
    return;
  }
  pinned_[s] = 1;
  for (const auto& t : pages_.layers()[to_index(l)].tensors) {
    const auto r = pages_.slice(t, to_index(e));
    if (!pooled) {
      pages_.add_refs(r.first, r.second);
      continue;
    }
    // Pooled: only the pages shared with a neighbour are locked.
    const unsigned char* a = t.data + to_index(e) * t.stride;
    const std::uintptr_t ia = pages_.ceil(a), ib = pages_.floor(a + t.stride);
    if (ib <= ia) {
      pages_.add_refs(r.first, r.second);
      continue;
    }
    if (r.first < ia) pages_.add_refs(r.first, ia);
    if (ib < r.second) pages_.add_refs(ib, r.second);
  }
  stats_.pinned_bytes += pages_.layers()[to_index(l)].bytes;
}

template <class Policy>
void mmap_residency<Policy>::close_cache_batch() noexcept {
  auto& log = cache_->policy().log();  // cleared after each use: it may hold a reopened batch's
  cache_->end_batch();
  for (std::uint32_t s : log) {
    if (!pinned_[s]) continue;  // invalidated after a failed lock
    pinned_[s] = 0;
    ++stats_.evictions;
    const std::size_t li = s / shape_.n_experts(), e = s % shape_.n_experts();
    if (pool_ && slot_of_[s] != no_slot) {
      unplace(li, e);
    } else {
      for (const auto& t : pages_.layers()[li].tensors) {
        const auto r = pages_.slice(t, e);
        drop_refs(r.first, r.second);
      }
    }
    stats_.pinned_bytes -= pages_.layers()[li].bytes;
  }
  log.clear();
  stats_.pinned_peak_bytes = std::max(stats_.pinned_peak_bytes, stats_.pinned_bytes);
}

}  // namespace moe_residency::llama_cpp
