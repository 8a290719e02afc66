#pragma once
/// retention_policy<Inner>: prediction-aware eviction. A decorator over any policy
/// that keeps the experts a predictor names for the next layer(s) out of
/// eviction while they are still ahead in the cycle. It reads nothing (unlike
/// speculation it costs no I/O): it only changes which entry is evicted.
///
///   cache.policy().protect(layer_id{l + 1}, predicted_ids);  // before layer l's batch ends
///
/// Protection of layer j ends when a batch of layer j begins (the prediction
/// is being consumed: what the batch routes is kept by the batch itself, and a
/// predicted expert it does not route was a misprediction, evictable again at
/// that batch's own eviction) or is replaced by the next protect() for j. A
/// protect() for j made while j's own batch is open lasts until j's next
/// batch begins. When every candidate is protected, the inner policy's own
/// victim is evicted: the budget always wins over a prediction.

#include <cstdint>
#include <utility>
#include <vector>

#include "moe_residency/cache/expert_cache.hpp"

namespace moe_residency {
namespace detail {
template <class View>
class cache_protected_view {
 public:
  cache_protected_view(const View& v, const std::uint8_t* prot) noexcept : v_(v), prot_(prot) {}
  bool evictable(std::uint32_t s) const noexcept { return !prot_[s] && v_.evictable(s); }
  bool resident(std::uint32_t s) const noexcept { return v_.resident(s); }
  std::uint32_t layer_of(std::uint32_t s) const noexcept { return v_.layer_of(s); }
  std::uint64_t bytes_of(std::uint32_t s) const noexcept { return v_.bytes_of(s); }
  std::uint32_t layer_count(std::size_t l) const noexcept { return v_.layer_count(l); }
  std::uint64_t used_bytes() const noexcept { return v_.used_bytes(); }
  std::uint64_t budget_bytes() const noexcept { return v_.budget_bytes(); }

 private:
  const View& v_;
  const std::uint8_t* prot_;
};
}  // namespace detail

template <class Inner>
class retention_policy {
 public:
  static constexpr const char* name = "retention";
  static constexpr bool collapses_below_cycle = Inner::collapses_below_cycle;

  explicit retention_policy(Inner inner = Inner{}) : inner_(std::move(inner)) {}

  void init(const model_shape& shape, std::uint64_t budget) {
    inner_.init(shape, budget);
    n_experts_ = static_cast<std::uint32_t>(shape.n_experts());
    prot_.assign(shape.n_layers() * shape.n_experts(), 0);
    listed_.assign(shape.n_layers(), {});
    for (auto& l : listed_) l.reserve(shape.n_experts());
  }

  /// Protects `ids` of `layer` from eviction (replacing the layer's previous
  /// protection). Ids outside the shape are ignored. Allocation-free.
  void protect(layer_id layer, span<const expert_id> ids) noexcept {
    const std::size_t l = to_index(layer);
    if (l >= listed_.size()) return;
    unprotect(l);
    for (expert_id e : ids) {
      if (to_index(e) >= n_experts_) continue;
      const auto s = static_cast<std::uint32_t>(l * n_experts_ + to_index(e));
      if (prot_[s]) continue;
      prot_[s] = 1;
      listed_[l].push_back(s);  // capacity n_experts reserved: never reallocates
    }
  }
  /// Protects the first `n` experts of a predictor's ranking.
  void protect(layer_id layer, const ranking& r, std::size_t n = max_top_k) noexcept {
    const auto ids = r.ids();
    protect(layer, ids.subspan(0, n < ids.size() ? n : ids.size()));
  }
  void clear_protection() noexcept {
    for (std::size_t l = 0; l < listed_.size(); ++l) unprotect(l);
  }
  bool is_protected(layer_id layer, expert_id e) const noexcept {
    const std::size_t s = to_index(layer) * n_experts_ + to_index(e);
    return to_index(e) < n_experts_ && s < prot_.size() && prot_[s];
  }
  /// Evictions that had to take a protected entry (every candidate was protected).
  std::uint64_t overridden() const noexcept { return overridden_; }

  Inner& inner() noexcept { return inner_; }

  template <class View>
  bool over_budget(const View& v, std::size_t layer) const noexcept {
    return inner_.over_budget(v, layer);
  }
  void on_batch_begin(run_phase p, std::size_t layer) noexcept {
    inner_.on_batch_begin(p, layer);
    if (layer < listed_.size()) unprotect(layer);  // consumed: see the header comment
  }
  void on_hit(std::uint32_t s) noexcept { inner_.on_hit(s); }
  void on_repeat(std::uint32_t s) noexcept { inner_.on_repeat(s); }
  void on_insert(std::uint32_t s) noexcept { inner_.on_insert(s); }
  void on_admit(std::uint32_t s) noexcept {
    if constexpr (has_on_admit<Inner>) inner_.on_admit(s);
    else inner_.on_insert(s);
  }
  void on_evict(std::uint32_t s) noexcept { inner_.on_evict(s); }
  void end_eviction() noexcept { inner_.end_eviction(); }
  void on_batch_end(std::size_t layer) noexcept { inner_.on_batch_end(layer); }
  template <class View>
  std::uint32_t victim(const View& v, std::size_t layer) noexcept {
    const detail::cache_protected_view<View> pv(v, prot_.data());
    std::uint32_t s = inner_.victim(pv, layer);
    if (s == no_slot) {
      inner_.end_eviction();  // put back what the filtered search set aside
      s = inner_.victim(v, layer);
      overridden_ += s != no_slot;
    }
    return s;
  }

 private:
  void unprotect(std::size_t l) noexcept {
    for (std::uint32_t s : listed_[l]) prot_[s] = 0;
    listed_[l].clear();
  }

  Inner inner_;
  std::uint32_t n_experts_ = 1;
  std::vector<std::uint8_t> prot_;
  std::vector<std::vector<std::uint32_t>> listed_;
  std::uint64_t overridden_ = 0;
};

/// The name this decorator shipped with, before every policy was `*_policy`.
template <class Inner>
using retention = retention_policy<Inner>;

}  // namespace moe_residency
