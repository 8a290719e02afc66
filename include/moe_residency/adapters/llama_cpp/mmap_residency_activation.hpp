#pragma once
/// mmap_residency's members for the activation: the mapping's layout, every
/// refusal (lock limit, mapping, budget, pool) before any advice, the one-time
/// advice (dense lock, MADV_RANDOM), the cache, the pool and the lanes.

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
void mmap_residency<Policy>::activate() {
  if (active_) return;
  if (!obs_->structure_known())
    throw error("mmap_residency: the graph structure is not known yet; evaluate one batch first");
  shape_ = obs_->shape();
  // Everything that can refuse runs before any advice is applied, so a
  // refusal leaves the mapping exactly as llama.cpp left it.
  map_layout();
  check_mapping();
  if (options_.fits == when_fits::stand_down && model_fits()) {
    standing_down_ = true;
    active_ = true;
    return;
  }
  bool attached = false;  // every file with experts attached (advice::read, place, restore)
  try {
    // The lock limit is checked as soon as each figure is known: the dense
    // weights and a given budget first, an automatic budget once sized.
    budget_ = options_.cache ? options_.cache_budget_bytes : 0;
    check_lock_limit();
    if (options_.cache && budget_ == 0) {
      budget_ = auto_budget();
      check_lock_limit();
    }
    if (options_.predicted) ranker_.init(*obs_, shape_, options_, predictor_);
    const bool lanes = options_.exact || options_.predicted;
    if (lanes || options_.cache) make_speculation();
    if ((options_.owned_reads && lanes) || options_.pool) {
      attached = true;
      for (const auto& f : pages_.files())
        if (f.file_base != nullptr) {
          const int rc = advice_->attach_file(f.path, f.file_base, f.file_bytes);
          if (rc != 0 && options_.pool)
            throw error("mmap_residency: pool: cannot open " + f.path + " for its own reads: " + std::strerror(rc) +
                        "; expected a readable file (or pool = false)");
          attached = attached && rc == 0;
        }
    }
    if (options_.pool) make_pool();
  } catch (...) {
    spec_.reset();
    throw;
  }
  owned_ = options_.owned_reads && (options_.exact || options_.predicted) && attached;
  if (options_.pin_dense) pin_dense();
  // With exact or the cache, the manager reads every routed expert itself
  // (the cache's misses and, for a prompt, its WILLNEED below), so a fault
  // on an expert is stray: it should read one page, not a read-around
  // window (and under mlock, not start the kernel's asynchronous readahead
  // from a marked page). `predicted` alone leaves the faults on.
  if ((options_.exact || options_.cache) && options_.random_faults) {
    advise_expert_ranges(advice::random);
    random_applied_ = true;
  }
  active_ = true;
}

template <class Policy>
void mmap_residency<Policy>::map_layout() {
  pages_.map(path_, *obs_, page_);
  pinned_.assign(shape_.n_layers() * shape_.n_experts(), 0);
  // The cache counts what it pins: each layer's expert tensors in the
  // mapping; a layer with none (offloaded or repacked) is not its business.
  std::vector<std::uint64_t> bytes(shape_.n_layers(), 0);
  std::vector<bool> moe(shape_.n_layers(), false);
  for (std::size_t l = 0; l < shape_.n_layers() && l < pages_.layers().size(); ++l) {
    bytes[l] = pages_.layers()[l].bytes;
    moe[l] = bytes[l] != 0;
  }
  managed_shape_ = model_shape(shape_.name(), shape_.n_experts(), shape_.top_k(), std::move(bytes), std::move(moe));
}

template <class Policy>
void mmap_residency<Policy>::check_lock_limit() {
  const std::uint64_t limit = advice_->lock_limit();
  const std::uint64_t dense = options_.pin_dense ? pages_.dense_bytes() : 0;
  const std::uint64_t cache = options_.cache ? budget_ : 0;  // 0 while an automatic budget is not sized yet
  if (limit == UINT64_MAX || dense + cache <= limit) return;
  throw error("mmap_residency: locking needs " + detail::mib(dense + cache) + " (dense " + detail::mib(dense) +
              (options_.cache ? " + the cache's budget " + detail::mib(cache) : std::string()) +
              ") but RLIMIT_MEMLOCK is " + detail::mib(limit) +
              "; raise it (ulimit -l, memlock in limits.conf, LimitMEMLOCK= in a systemd unit) or give the "
              "process CAP_IPC_LOCK");
}

template <class Policy>
void mmap_residency<Policy>::check_mapping() {
  inspectable_ = true;
  for (const auto& f : pages_.files()) {
    if (f.base != nullptr && detail::mapping_locked(f.base))
      throw error("mmap_residency: the model's mapping of " + f.path +
                  " is already locked (llama.cpp's mlock load mode); the manager's unlocks would undo those "
                  "locks: load with LLAMA_LOAD_MODE_MMAP");
    const bool may = detail::may_inspect_file(f.path);
    inspectable_ = inspectable_ && may;
    if (!may && options_.release == advice::pageout)
      throw error("mmap_residency: release = pageout, but the kernel ignores MADV_PAGEOUT on " + f.path +
                  " for a process that neither owns nor may write it; use release = cold");
  }
}

template <class Policy>
void mmap_residency<Policy>::pin_dense() {
  for (const auto& d : pages_.dense()) {
    const std::uintptr_t a = pages_.floor(d.first), b = pages_.ceil(d.first + d.second);
    if (call(advice::lock, a, b - a) == 0) {
      pages_.add_refs(a, b);
      stats_.dense_bytes += d.second;
    } else {
      // mlock marks the range locked before faulting it in: undo a partial lock
      // of the pages no other lock holds.
      pages_.add_refs(a, b);
      drop_refs(a, b, false);
    }
  }
}

template <class Policy>
void mmap_residency<Policy>::advise_expert_ranges(advice a) noexcept {
  for (const auto& l : pages_.layers())
    for (const auto& t : l.tensors)
      call(a, pages_.floor(t.data), pages_.ceil(t.data + t.stride * t.n_expert) - pages_.floor(t.data));
}

template <class Policy>
void mmap_residency<Policy>::make_speculation() {
  std::unique_ptr<cache_type> cache;
  if (options_.cache) {
    cache_options o;
    o.budget_bytes = budget_;
    o.guard = cycle_guard::warn;
    o.on_warning = [this](const std::string& m) { cache_warning_ = m; };
    cache = std::make_unique<cache_type>(managed_shape_, std::move(o));
  }
  speculation_options so;
  so.enabled = options_.predicted;
  so.cap = options_.spec_cap;
  so.horizon = options_.horizon;
  // The lanes read with exact or predicted; the cache alone reads inline.
  so.scheduler.lanes = options_.exact || options_.predicted ? options_.lanes : 0;
  // Never wait for a speculative read, but with the pool: a disowned read
  // would go on writing a slot the manager then gives to another expert.
  so.scheduler.mode = options_.pool ? quiesce_mode::wait : quiesce_mode::disown;
  so.scheduler.queue_capacity = std::max<std::size_t>(16, 4 * options_.spec_cap);
  so.demanded_reads = false;  // the manager reads its misses itself (overlap, pool, inline)
  spec_ = std::make_unique<speculation_type>(
      managed_shape_, detail::pinned_cache<Policy, mmap_residency>(managed_shape_, std::move(cache), this),
      [this](layer_id l, expert_id e, read_reason r) noexcept { return read_expert(l, e, r); }, std::move(so));
  requests_.reserve(shape_.n_experts());
  outcomes_.resize(shape_.n_experts());
  routings_.resize(1);
  issued_.reserve(4 * max_top_k);
}

template <class Policy>
void mmap_residency<Policy>::make_pool() {
  std::uint64_t smallest = UINT64_MAX;
  slot_bytes_ = 0;
  for (const auto& l : pages_.layers()) {
    if (l.tensors.empty()) continue;
    smallest = std::min(smallest, l.bytes);
    std::uint64_t b = 0;
    for (const auto& t : l.tensors) b += t.stride / page_ * page_;
    slot_bytes_ = std::max(slot_bytes_, b);
  }
  if (slot_bytes_ == 0)
    throw error("mmap_residency: pool: every expert slice is smaller than a page (" + std::to_string(page_) +
                " bytes); nothing to hold in a pool: expected pool = false");
  // + the speculative placements in flight (options_.predicted): up to
  // spec_cap a layer (the planner takes no more than the top-k), for
  // `horizon` layers ahead.
  const std::uint64_t slots =
      budget_ / smallest + shape_.top_k() + (options_.predicted ? spec_reads() * options_.horizon : 0);
  // Each placed slice is a mapping of its own, splits the file's, and its
  // locked shared pages split it again (up to four mappings a slice):
  // the kernel's vm.max_map_count bounds them.
  std::size_t tensors = 0;
  for (const auto& l : pages_.layers()) tensors = std::max(tensors, l.tensors.size());
  const std::uint64_t maps_needed = slots * tensors * 4 + detail::process_map_count();
  const std::uint64_t max_maps = detail::max_map_count();
  if (max_maps != 0 && maps_needed > max_maps)
    throw error("mmap_residency: pool: " + std::to_string(slots) + " slots of " + std::to_string(tensors) +
                " slices need up to " + std::to_string(maps_needed) + " mappings but vm.max_map_count is " +
                std::to_string(max_maps) + "; raise it (sysctl vm.max_map_count=" + std::to_string(2 * maps_needed) +
                ") or give a smaller budget");
  const std::uint64_t bytes = slots * slot_bytes_;
  const int rc = advice_->attach_pool(bytes);
  if (rc != 0)
    throw error("mmap_residency: pool: " + detail::mib(bytes) + " (" + std::to_string(slots) + " slots of " +
                detail::mib(slot_bytes_) + ") could not be allocated: " + std::strerror(rc) +
                (rc == ENOSYS ? std::string("; this system has no expert pool: expected pool = false")
                              : std::string("; expected a smaller budget or a higher memory limit")));
  slot_of_.assign(shape_.n_layers() * shape_.n_experts(), no_slot);
  spec_slot_.assign(shape_.n_layers() * shape_.n_experts(), no_slot);
  free_slots_.clear();
  for (std::uint64_t i = slots; i-- > 0;) free_slots_.push_back(static_cast<std::uint32_t>(i));
  spare_target_ = options_.predicted ? spec_reads() * options_.horizon : 0;
  spare_.reserve(spare_target_);
  refill_spare();
  stats_.pool_bytes = bytes;
  pool_ = true;
}

template <class Policy>
bool mmap_residency<Policy>::model_fits() {
  const memory_limit lim = detail::process_memory_limit();
  const std::uint64_t mapped = pages_.mapped_bytes();
  const std::uint64_t anon = detail::process_anon_bytes();
  const std::uint64_t need = mapped + anon + margin_for(lim.bytes);
  const bool fits = lim.bytes != 0 && need <= lim.bytes;
  fit_note_ = "model " + detail::mib(mapped) + " + llama.cpp anonymous " + detail::mib(anon) + " + margin " +
              detail::mib(margin_for(lim.bytes)) + (fits ? " fit" : " exceed") + " the limit " +
              detail::mib(lim.bytes) + " (" + lim.source + ")";
  return fits;
}

template <class Policy>
std::uint64_t mmap_residency<Policy>::auto_budget() {
  const memory_limit lim = detail::process_memory_limit();
  if (lim.bytes == 0)
    throw error("mmap_residency: auto budget: no cgroup limit and no MemAvailable; give cache_budget_bytes");
  const std::uint64_t anon = detail::process_anon_bytes();
  const std::uint64_t margin = margin_for(lim.bytes);
  const std::uint64_t need = pages_.dense_bytes() + anon + margin;
  std::ostringstream note;
  note << "limit " << detail::mib(lim.bytes) << " (" << lim.source << ") - dense " << detail::mib(pages_.dense_bytes())
       << " - llama.cpp anonymous " << detail::mib(anon) << " - margin " << detail::mib(margin);
  const std::uint64_t layer_need = pages_.widest_expert_bytes() * shape_.top_k();
  if (lim.bytes <= need || lim.bytes - need < layer_need)
    throw error("mmap_residency: auto budget: " + note.str() + " leaves " +
                detail::mib(lim.bytes > need ? lim.bytes - need : 0) +
                "; expected at least one layer's routed experts (" + detail::mib(layer_need) +
                "): raise the memory limit or give a smaller margin_bytes");
  std::uint64_t b = lim.bytes - need;
  if (options_.cache_ceiling_bytes != 0 && b > options_.cache_ceiling_bytes) {
    b = options_.cache_ceiling_bytes;
    note << ", capped at " << detail::mib(b);
  }
  note << " = " << detail::mib(b);
  budget_note_ = note.str();
  return b;
}

}  // namespace moe_residency::llama_cpp
