#pragma once
/// mmap_residency's members for the advice calls: a lane's read of one expert
/// (WILLNEED, POPULATE_READ, owned reads, locks), the expert pool's placements
/// and their undoing, and the page locks' release.

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
void mmap_residency<Policy>::start_reads(layer_id l, expert_id e) noexcept {
  for (const auto& t : pages_.layers()[to_index(l)].tensors) {
    const auto r = pages_.slice(t, to_index(e));
    call(advice::willneed, r.first, r.second - r.first);
  }
}

template <class Policy>
read_status mmap_residency<Policy>::read_expert(layer_id l, expert_id e, read_reason why) noexcept {
  // lock_demanded_ is written by the host before demand() hands the reads
  // to the lanes (under the scheduler's mutex), so lanes see this batch's.
  const bool lock = why == read_reason::demanded && lock_demanded_;
  const detail::expert_pages::layer_ranges& lr = pages_.layers()[to_index(l)];
  if (pool_) {
    const std::size_t s = to_index(l) * shape_.n_experts() + to_index(e);
    std::uint32_t slot = lock ? slot_of_[s] : no_slot;  // a miss's: set by the host before the read was handed over
    if (why == read_reason::speculative) {
      // A spare slot (refill_spare keeps enough for the reads in flight);
      // none: not read, its expert read at its routing if routed.
      {
        std::lock_guard<std::mutex> hold(spare_mu_);
        if (spare_.empty()) return read_status::failed;
        slot = spare_.back();
        spare_.pop_back();
      }
      spec_slot_[s] = slot;  // read by the host after the quiesce that collects this read
    }
    if (slot != no_slot) return place_expert(l, e, slot) ? read_status::ok : read_status::failed;
  }
  bool ok = true;
  if (owned_) {
    // Owned reads, in the order the layer's matmuls read the tensors; a lock
    // then only maps and pins what is cached, and an unlocked read is done:
    // the matmul's faults map the cached pages.
    for (const auto& t : lr.tensors) {
      const auto r = pages_.slice(t, to_index(e));
      ok = call(advice::read, r.first, r.second - r.first) == 0 && ok;
    }
    if (!lock) return ok ? read_status::ok : read_status::failed;
  } else if (why == read_reason::speculative) {
    start_reads(l, e);
  }
  for (const auto& t : lr.tensors) {
    const auto r = pages_.slice(t, to_index(e));
    if (lock) {
      ok = call(advice::lock, r.first, r.second - r.first) == 0 && ok;
    } else if (!populate_unsupported_.load(std::memory_order_relaxed)) {
      const int rc = call(advice::populate_read, r.first, r.second - r.first);
      if (rc == EINVAL || rc == ENOSYS) populate_unsupported_.store(true, std::memory_order_relaxed);
      else if (rc != 0) ok = false;  // e.g. EIO, EFAULT: the expert is not resident
    }
  }
  return ok ? read_status::ok : read_status::failed;
}

template <class Policy>
bool mmap_residency<Policy>::place_expert(layer_id l, expert_id e, std::uint32_t slot) noexcept {
  const std::size_t li = to_index(l), ei = to_index(e);
  const std::uint64_t slot_base = std::uint64_t{slot} * slot_bytes_;
  std::uint64_t at = 0;
  bool ok = true;
  for (const auto& t : pages_.layers()[li].tensors) {
    const unsigned char* a = t.data + ei * t.stride;
    const std::uintptr_t lo = pages_.floor(a), hi = pages_.ceil(a + t.stride);
    const std::uintptr_t ia = pages_.ceil(a), ib = pages_.floor(a + t.stride);
    if (ib > ia) {
      calls_[static_cast<std::size_t>(advice::place)].fetch_add(1, std::memory_order_relaxed);
      if (advice_->place(reinterpret_cast<void*>(ia), ib - ia, slot_base + at) != 0) {
        errors_[static_cast<std::size_t>(advice::place)].fetch_add(1, std::memory_order_relaxed);
        ok = false;
        break;
      }
      if (lo < ia) ok = call(advice::lock, lo, ia - lo) == 0 && ok;
      if (ib < hi) ok = call(advice::lock, ib, hi - ib) == 0 && ok;
    } else {
      ok = call(advice::lock, lo, hi - lo) == 0 && ok;
    }
    at += t.stride / page_ * page_;
  }
  if (!ok) restore_slices(li, ei);
  return ok;
}

template <class Policy>
void mmap_residency<Policy>::restore_slices(std::size_t li, std::size_t ei) noexcept {
  for (const auto& t : pages_.layers()[li].tensors) {
    const unsigned char* a = t.data + ei * t.stride;
    const std::uintptr_t ia = pages_.ceil(a), ib = pages_.floor(a + t.stride);
    if (ib <= ia) continue;
    call(advice::restore, ia, ib - ia);
    if (random_applied_) call(advice::random, ia, ib - ia);
  }
}

template <class Policy>
void mmap_residency<Policy>::unplace(std::size_t li, std::size_t ei) noexcept {
  std::uint32_t& slot = slot_of_[li * shape_.n_experts() + ei];
  restore_slices(li, ei);
  for (const auto& t : pages_.layers()[li].tensors) {
    const unsigned char* a = t.data + ei * t.stride;
    const std::uintptr_t lo = pages_.floor(a), hi = pages_.ceil(a + t.stride);
    const std::uintptr_t ia = pages_.ceil(a), ib = pages_.floor(a + t.stride);
    if (ib <= ia) {
      drop_refs(lo, hi);
      continue;
    }
    if (lo < ia) drop_refs(lo, ia);
    if (ib < hi) drop_refs(ib, hi);
  }
  free_slots_.push_back(slot);
  slot = no_slot;
}

template <class Policy>
void mmap_residency<Policy>::refill_spare() noexcept {
  std::lock_guard<std::mutex> hold(spare_mu_);
  while (spare_.size() < spare_target_ && !free_slots_.empty()) {
    spare_.push_back(free_slots_.back());
    free_slots_.pop_back();
  }
}

template <class Policy>
void mmap_residency<Policy>::release_speculative(std::size_t li, std::size_t ei, bool ran) noexcept {
  std::uint32_t& slot = spec_slot_[li * shape_.n_experts() + ei];
  if (ran) {
    restore_slices(li, ei);
    for (const auto& t : pages_.layers()[li].tensors) {
      const auto r = pages_.slice(t, ei);
      pages_.add_refs(r.first, r.second);
      drop_refs(r.first, r.second, false);
    }
  }
  free_slots_.push_back(slot);
  slot = no_slot;
}

template <class Policy>
void mmap_residency<Policy>::drop_refs(std::uintptr_t a, std::uintptr_t b, bool release) noexcept {
  pages_.drop_refs(a, b, [&](std::uintptr_t run, std::size_t len) {
    // A failed munlock (ENOMEM: a VMA split past vm.max_map_count) leaves
    // the pages locked outside the budget: counted, never hidden.
    if (call(advice::unlock, run, len) != 0) stats_.unlock_failed_bytes += len;
    if (release) call(options_.release, run, len);
  });
}

}  // namespace moe_residency::llama_cpp
