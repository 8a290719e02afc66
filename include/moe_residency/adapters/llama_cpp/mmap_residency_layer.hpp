#pragma once
/// mmap_residency's members for one MoE layer's step at its routing: the
/// previous layer's reads settled; speculation's load (the completed
/// speculative reads made resident, the routed experts looked up in the
/// cache); the misses read in the matmuls' order (on the lanes, overlapped
/// with compute); the next layer's predicted reads handed to speculation; and
/// the admissions and evictions that pin and unpin pages.

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
  predicted_now_ = false;
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
  if (options_.measure && inspectable_ && decode) measure(li);

  // speculation's load (decode): the completed speculative reads made
  // resident and pinned, the routed experts looked up in the cache (one
  // routing per token, token-major), the misses listed for the reads below.
  to_read_.clear();
  const bool cached = cache() != nullptr && decode;
  if (decode && spec_) {
    if (routings_.size() < b.n_tokens) routings_.resize(b.n_tokens);
    drop_masks_.assign(b.n_tokens, 0);
    for (std::size_t t = 0; t < b.n_tokens; ++t) {
      routing& r = routings_[t];
      r.clear();
      r.layer = l;
      r.phase = run_phase::decode;
      r.token = b.position(t);
      for (std::size_t j = 0; j < b.k && r.size() < max_top_k; ++j) {
        const std::int32_t id = b.ids[t * b.ids_stride + j];
        if (id >= 0 && static_cast<std::size_t>(id) < n_expert)
          r.push_back(expert_id(static_cast<std::uint16_t>(id)), 0.0f);
      }
    }
    spec_->routed(span<const routing>(routings_.data(), b.n_tokens),
                  span<std::uint32_t>(drop_masks_.data(), b.n_tokens));
    settle_predictions(l);
    if (cached) {
      for (const read_request& r : spec_->demanded()) to_read_.push_back(r.expert);
      stats_.cache_misses += to_read_.size();
      stats_.cache_miss_bytes += to_read_.size() * pages_.layers()[li].bytes;
      stats_.cache_hits += routed_.size() - to_read_.size();
      // What the batch evicted is released before any miss is locked: a
      // page an evicted expert shares with a miss is unlocked, then locked
      // again by the miss's read (never the other way round, on two threads).
      release_evicted();
    }
  }
  if (!cached && options_.exact) to_read_ = routed_;

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
      if (!options_.overlap || placing) settle_demand();
    } else if (cached) {
      read_inline(l);
    }
  } else if (cache() != nullptr && !decode) {
    // The cache alone, a prompt batch: never pinned, but requested at once
    // (the expert ranges fault one page at a time under MADV_RANDOM).
    for (expert_id e : routed_) start_reads(l, e);
  }
  if (options_.predicted && decode && b.n_tokens > 0) issue_predictions(b);
}

template <class Policy>
void mmap_residency<Policy>::settle_predictions(layer_id l) {
  const std::size_t n_expert = shape_.n_experts();
  for (const completed_read& c : spec_->completed()) {
    for (issued_read& r : issued_)
      if (r.done == 0 && r.layer == c.request.layer && r.expert == c.request.expert) {
        r.done = c.outcome == read_outcome::ok ? 1 : 2;
        break;
      }
    // The pool: a placement the cache did not adopt (its read failed, or the
    // cache refused it) is mapped back and its slot freed.
    if (pool_) {
      const std::size_t li = to_index(c.request.layer), ei = to_index(c.request.expert);
      if (li * n_expert + ei < spec_slot_.size() && spec_slot_[li * n_expert + ei] != no_slot)
        release_speculative(li, ei, true);
    }
  }
  // The reads for this layer: useful (complete and routed), late (routed,
  // not complete) or wasted (not routed); a later layer's wait for theirs.
  std::size_t keep = 0;
  for (const issued_read& r : issued_) {
    if (to_index(r.layer) > to_index(l)) {
      issued_[keep++] = r;
      continue;
    }
    const bool demanded = r.layer == l && std::find(routed_.begin(), routed_.end(), r.expert) != routed_.end();
    if (!demanded) ++stats_.predicted_wasted;
    else if (r.done == 1) ++stats_.predicted_useful;
    else ++stats_.predicted_late;
  }
  issued_.resize(keep);
}

template <class Policy>
void mmap_residency<Policy>::issue_predictions(const layer_batch& b) {
  layer_id target{};
  const bool ranked =
      moe_layer_ahead(managed_shape_, b.layer, options_.horizon, target) && ranker_.rank(b, target, ranking_);
  if (ranked) {
    ++stats_.predictions;
    predicted_now_ = true;
    ranked_layer_ = target;
  }
  if (pool_) refill_spare();
  const std::uint64_t planned = spec_->stats().planned;
  spec_->layer_loaded(b.layer, ranked ? &ranking_ : nullptr);
  const span<const read_request> issued = spec_->issued();
  for (const read_request& r : issued) {
    if (issued_.size() < issued_.capacity()) issued_.push_back(issued_read{r.layer, r.expert, 0});
    ++stats_.predicted_issued;
    stats_.predicted_bytes += r.bytes;
  }
  stats_.predicted_rejected += spec_->stats().planned - planned - issued.size();
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
  spec_->scheduler().begin_demand(span<const read_request>(requests_.data(), n),
                                  span<read_outcome>(outcomes_.data(), n));
}

template <class Policy>
void mmap_residency<Policy>::settle_demand() noexcept {
  if (pending_demand_) {
    pending_demand_ = false;
    spec_->scheduler().end_demand();
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      const bool ok = outcomes_[i] == read_outcome::ok;
      ++stats_.exact_reads;
      stats_.exact_bytes += requests_[i].bytes;
      stats_.exact_failed += !ok;
      if (pending_lock_) admitted(pending_layer_, to_read_[i], ok);
    }
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
    spec_->cache().invalidate(l, e);
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
bool mmap_residency<Policy>::pin_inserted(layer_id l, expert_id e) noexcept {
  const std::size_t s = to_index(l) * shape_.n_experts() + to_index(e);
  bool ok = true;
  if (pool_) {
    // Placed by its lane in a spare slot: adopted, the slot now the cache's.
    ok = spec_slot_[s] != no_slot;
    if (ok) {
      slot_of_[s] = spec_slot_[s];
      spec_slot_[s] = no_slot;
    }
  } else {
    // Read into the page cache by its lane: locked here (the host's thread).
    for (const auto& t : pages_.layers()[to_index(l)].tensors) {
      const auto r = pages_.slice(t, to_index(e));
      ok = call(advice::lock, r.first, r.second - r.first) == 0 && ok;
    }
  }
  admitted(l, e, ok);
  release_evicted();
  return ok;
}

template <class Policy>
void mmap_residency<Policy>::release_evicted() noexcept {
  cache_type* c = spec_ ? spec_->cache().get() : nullptr;
  if (c == nullptr) return;
  auto& log = c->policy().log();  // cleared after each use
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
