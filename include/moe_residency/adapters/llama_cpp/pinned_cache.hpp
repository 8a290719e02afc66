#pragma once
/// The residency manager's cache as `speculation<>` sees it (its engine API,
/// speculation.hpp): the policy's expert_cache with its evictions logged for
/// the manager to unpin, or none when the cache part is off (nothing is
/// resident and every batch is refused, so only the reads are speculation's).
/// An expert a completed speculative read made resident (`insert`) is pinned
/// at once by the owner (`Owner::pin_inserted`), which also releases what
/// that insertion evicted; a refused pin leaves it not resident.

#include <memory>
#include <utility>

#include "moe_residency/adapters/llama_cpp/residency_manager.hpp"
#include "moe_residency/cache/expert_cache.hpp"

namespace moe_residency::llama_cpp::detail {

template <class Policy, class Owner>
class pinned_cache {
 public:
  using cache_type = expert_cache<eviction_log<Policy>>;

  pinned_cache(const model_shape& shape, std::unique_ptr<cache_type> cache, Owner* owner) noexcept
      : shape_(shape), cache_(std::move(cache)), owner_(owner) {}

  const model_shape& shape() const noexcept { return shape_; }
  bool is_resident(layer_id l, expert_id e) const noexcept { return cache_ && cache_->is_resident(l, e); }
  bool insert(layer_id l, expert_id e, run_phase phase) noexcept {
    return cache_ && cache_->insert(l, e, phase) && owner_->pin_inserted(l, e);
  }
  bool invalidate(layer_id l, expert_id e) noexcept { return cache_ && cache_->invalidate(l, e); }
  bool begin_batch(run_phase phase, layer_id l) noexcept { return cache_ && cache_->begin_batch(phase, l); }
  lookup_result lookup(expert_id e) noexcept { return cache_ ? cache_->lookup(e) : lookup_result::rejected; }
  void end_batch() noexcept {
    if (cache_) cache_->end_batch();
  }
  const cache_stats& stats() const noexcept { return cache_ ? cache_->stats() : none_; }
  std::uint64_t budget_bytes() const noexcept { return cache_ ? cache_->budget_bytes() : 0; }

  /// The policy's cache, or null without the cache part.
  cache_type* get() noexcept { return cache_.get(); }
  const cache_type* get() const noexcept { return cache_.get(); }

 private:
  model_shape shape_;
  std::unique_ptr<cache_type> cache_;
  Owner* owner_;
  cache_stats none_{};
};

}  // namespace moe_residency::llama_cpp::detail
