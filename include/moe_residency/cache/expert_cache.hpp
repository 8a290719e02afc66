#pragma once
/// expert_cache<Policy>: a byte-budgeted cache of (layer, expert) entries with
/// the engine's batch accounting, pinning, counters and the token-cycle guard.
/// The eviction policy is a template parameter (see docs/cache.md, "Writing a
/// policy"); every call into it is static, none is virtual.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "moe_residency/cache/policy_contract.hpp"
#include "moe_residency/core.hpp"
#include "moe_residency/error.hpp"

namespace moe_residency {

/// Returned by a policy's victim() when nothing may be evicted.
inline constexpr std::uint32_t no_slot = 0xffffffffu;

/// What the cache does with a budget below one token cycle under a policy
/// that collapses there (a recency policy hits 0%).
enum class cycle_guard : std::uint8_t {
  refuse,  ///< the constructor throws moe_residency::error
  warn,    ///< the constructor reports through cache_options::on_warning
  off      ///< say nothing (offline replay that wants the 0% cell)
};

/// Configuration of an expert_cache.
struct cache_options {
  /// The byte budget (MiB = 1048576 bytes; see from_mib()). Must be > 0.
  std::uint64_t budget_bytes = 0;
  cycle_guard guard = cycle_guard::refuse;
  /// Receives the guard's message under cycle_guard::warn; stderr when empty.
  warning_sink on_warning;
};

/// Counters of one scope (all batches, or decode batches only). Bytes are bytes.
struct cache_counters {
  std::uint64_t lookups = 0;  ///< unique (layer, expert) per load batch
  std::uint64_t hits = 0;
  std::uint64_t misses = 0;
  std::uint64_t bytes_read = 0;  ///< Σ expert bytes of the misses
  std::uint64_t evictions = 0;
  /// Hits as a percentage of lookups (0 when there were none).
  double hit_pct() const noexcept {
    return lookups ? 100.0 * static_cast<double>(hits) / static_cast<double>(lookups) : 0.0;
  }
};

/// Cumulative (prefill + decode) and decode-only counters.
struct cache_stats {
  cache_counters all;
  cache_counters decode;
  std::uint64_t rejected = 0;     ///< lookups outside the shape (dense layer, bad id)
  std::uint64_t peak_bytes = 0;   ///< largest resident bytes seen after a batch
  std::uint64_t inserted = 0;     ///< entries made resident by insert() (no lookup)
  std::uint64_t invalidated = 0;  ///< entries dropped by invalidate() (not evictions)
};

/// Outcome of one lookup.
enum class lookup_result : std::uint8_t {
  hit,      ///< resident: promoted
  miss,     ///< not resident: inserted at the layer's expert bytes (one read)
  repeat,   ///< already looked up in this batch: promoted only, not counted
  rejected  ///< no open batch, dense layer or expert id out of range
};

namespace detail {
/// One slot's state, kept together so a lookup touches one place: the batch
/// stamp of its last lookup and its flags. 32-bit flags, not a byte: a store
/// through a byte may alias anything and forced the compiler to reload the
/// cache's members after every flag change on the hot path.
struct cache_slot_state {
  std::uint32_t touched = 0;
  std::uint32_t flags = 0;
};
}  // namespace detail

/// What a policy may ask the cache while choosing a victim. Slots are
/// `layer × n_experts + expert`.
class cache_view {
 public:
  static constexpr std::uint32_t resident_bit = 1, pinned_bit = 2;

  cache_view(const detail::cache_slot_state* slots, std::uint32_t batch, const std::uint64_t* layer_bytes,
             const std::uint32_t* layer_count, std::uint32_t n_experts, std::uint64_t used,
             std::uint64_t budget) noexcept
      : slots_(slots),
        batch_(batch),
        layer_bytes_(layer_bytes),
        layer_count_(layer_count),
        n_experts_(n_experts),
        used_(used),
        budget_(budget) {}

  /// Resident, not pinned, not touched by the current batch.
  bool evictable(std::uint32_t s) const noexcept {
    return (slots_[s].flags & (resident_bit | pinned_bit)) == resident_bit && slots_[s].touched != batch_;
  }
  bool resident(std::uint32_t s) const noexcept { return slots_[s].flags & resident_bit; }
  std::uint32_t layer_of(std::uint32_t s) const noexcept { return s / n_experts_; }
  std::uint64_t bytes_of(std::uint32_t s) const noexcept { return layer_bytes_[s / n_experts_]; }
  std::uint32_t layer_count(std::size_t layer) const noexcept { return layer_count_[layer]; }
  std::uint64_t used_bytes() const noexcept { return used_; }
  std::uint64_t budget_bytes() const noexcept { return budget_; }

 private:
  const detail::cache_slot_state* slots_;
  std::uint32_t batch_;
  const std::uint64_t* layer_bytes_;
  const std::uint32_t* layer_count_;
  std::uint32_t n_experts_;
  std::uint64_t used_, budget_;
};

namespace detail {
template <class P, class = void>
struct cache_has_on_admit : std::false_type {};
template <class P>
struct cache_has_on_admit<P, std::void_t<decltype(std::declval<P&>().on_admit(std::uint32_t{}))>> : std::true_type {};
}  // namespace detail

/// True when Policy has `on_admit(slot)`: the hook for an entry made resident
/// without a lookup (expert_cache::insert). Without it, on_insert is called.
template <class Policy>
inline constexpr bool has_on_admit = detail::cache_has_on_admit<Policy>::value;

/// Common parts of a policy: the global byte budget as the eviction trigger
/// and empty hooks. Policies derive from it and hide what they need.
struct policy_base {
  /// True when the cache must evict after a batch of `layer`.
  template <class View>
  bool over_budget(const View& v, std::size_t /*layer*/) const noexcept {
    return v.used_bytes() > v.budget_bytes();
  }
  void on_batch_begin(run_phase, std::size_t /*layer*/) noexcept {}
  void on_repeat(std::uint32_t) noexcept {}
  void end_eviction() noexcept {}
  void on_batch_end(std::size_t /*layer*/) noexcept {}
};

/// Statistics of a token-cycle check: the cycle in bytes and whether a budget
/// is below it.
inline std::string token_cycle_message(const std::string& who, std::uint64_t budget, const model_shape& shape) {
  char buf[512];
  const std::uint64_t t = token_cycle_bytes(shape);
  std::snprintf(buf, sizeof buf,
                "%s: budget %.1f MiB is below the token cycle %.1f MiB (%zu MoE layers x "
                "top-%zu x expert bytes); a recency policy evicts each expert just before "
                "the cycle returns to it and hits 0%%. Raise the budget to at least %.1f MiB, "
                "or use a policy that survives below the cycle (lfu, layerlfu, cycle, belady)",
                who.c_str(), to_mib(budget), to_mib(t), shape.n_moe_layers(), shape.top_k(), to_mib(t));
  return buf;
}

/// A byte-budgeted expert cache with the engine's batch accounting:
/// one lookup per unique (layer, expert) per load batch, duplicates only
/// promote, a miss inserts at the layer's expert bytes, eviction runs once
/// after the batch until the budget holds and never evicts an entry the batch
/// touched or a pinned one. Not thread-safe: mutate from one thread.
///
/// Hot path (begin_batch, lookup, end_batch, access_batch, is_resident) is
/// noexcept and allocation-free; all memory is sized at construction
/// (O(n_layers × n_experts)).
template <class Policy>
class expert_cache {
  static_assert(detail::check_cache_policy<Policy>(), "expert_cache: policy contract");

 public:
  using policy_type = Policy;

  /// Throws moe_residency::error on a zero budget, and on a budget below the
  /// token cycle under a collapsing policy with cycle_guard::refuse.
  expert_cache(const model_shape& shape, cache_options options, Policy policy = Policy{})
      : shape_(shape), options_(std::move(options)), policy_(std::move(policy)) {
    const std::string who = std::string("expert_cache<") + Policy::name + ">";
    if (options_.budget_bytes == 0) throw error(who + ": budget 0 bytes; expected a budget > 0 (bytes, MiB = 1048576)");
    n_experts_ = static_cast<std::uint32_t>(shape_.n_experts());
    const std::size_t n_layers = shape_.n_layers();
    const std::size_t n_slots = n_layers * n_experts_;
    if (n_slots >= no_slot)
      throw error(who + ": " + std::to_string(n_slots) + " (layer, expert) slots; expected < 2^32");
    layer_bytes_.assign(n_layers, 0);
    for (std::size_t l = 0; l < n_layers; ++l)
      layer_bytes_[l] = shape_.expert_bytes(layer_id(static_cast<std::uint16_t>(l)));
    slots_.assign(n_slots, detail::cache_slot_state{});
    slot_layer_.resize(n_slots);
    for (std::size_t i = 0; i < n_slots; ++i) slot_layer_[i] = static_cast<std::uint16_t>(i / n_experts_);
    layer_count_.assign(n_layers, 0);
    cycle_bytes_ = moe_residency::token_cycle_bytes(shape_);
    if (Policy::collapses_below_cycle && options_.budget_bytes < cycle_bytes_ && options_.guard != cycle_guard::off) {
      guard_message_ = token_cycle_message(who, options_.budget_bytes, shape_);
      if (options_.guard == cycle_guard::refuse) throw error(guard_message_);
      detail::emit_warning(options_.on_warning, guard_message_);
    }
    policy_.init(shape_, options_.budget_bytes);
  }

  // ---- engine API -------------------------------------------------------

  /// Opens the load batch of `layer` (ending an open one first). Returns
  /// false, and rejects the batch's lookups, for a dense or unknown layer.
  bool begin_batch(run_phase phase, layer_id layer) noexcept {
    if (open_) end_batch();
    if (!shape_.is_moe(layer)) {
      open_ = false;
      return false;
    }
    open_ = true;
    phase_ = phase;
    layer_ = to_index(layer);
    base_ = static_cast<std::uint32_t>(layer_ * n_experts_);
    policy_.on_batch_begin(phase, layer_);
    return true;
  }

  /// Looks up one routed expert of the open batch.
  lookup_result lookup(expert_id expert) noexcept {
    const std::size_t e = to_index(expert);
    if (!open_ || e >= n_experts_) {
      ++stats_.rejected;
      return lookup_result::rejected;
    }
    const std::uint32_t s = base_ + static_cast<std::uint32_t>(e);
    if (slots_[s].touched == batch_) {
      policy_.on_repeat(s);
      return lookup_result::repeat;
    }
    slots_[s].touched = batch_;
    const bool decode = phase_ == run_phase::decode;
    ++stats_.all.lookups;
    stats_.decode.lookups += decode;
    if (slots_[s].flags & cache_view::resident_bit) {
      ++stats_.all.hits;
      stats_.decode.hits += decode;
      policy_.on_hit(s);
      return lookup_result::hit;
    }
    const std::uint64_t b = layer_bytes_[layer_];
    ++stats_.all.misses;
    stats_.decode.misses += decode;
    stats_.all.bytes_read += b;
    if (decode) stats_.decode.bytes_read += b;
    make_resident(s);
    policy_.on_insert(s);
    return lookup_result::miss;
  }

  /// Closes the open batch: evicts until the policy's budget holds, never an
  /// entry this batch touched nor a pinned one. Returns the number evicted.
  std::size_t end_batch() noexcept {
    if (!open_) return 0;
    const std::size_t n = evict_to_budget(layer_, phase_ == run_phase::decode);
    stats_.peak_bytes = std::max(stats_.peak_bytes, used_);
    policy_.on_batch_end(layer_);
    open_ = false;
    next_batch();
    return n;
  }

  /// One whole load batch: begin, a lookup per id (token-major for prefill),
  /// end. Returns the number of misses (reads); 0 for a rejected layer.
  std::size_t access_batch(run_phase phase, layer_id layer, span<const expert_id> ids) noexcept {
    if (!begin_batch(phase, layer)) {
      stats_.rejected += ids.size();
      return 0;
    }
    // lookup() per id, with the batch's constants and counters in locals: the
    // policy's stores may alias the cache's members, which would otherwise be
    // reloaded and stored back around every hook. Same decisions, same order
    // of hook calls, same counters as the lookup() loop.
    detail::cache_slot_state* const st = slots_.data();
    const std::uint32_t batch = batch_, base = base_, n_experts = n_experts_;
    std::uint64_t looked = 0, hits = 0, misses = 0, rejected = 0;
    for (expert_id id : ids) {
      const std::size_t e = to_index(id);
      if (e >= n_experts) {
        ++rejected;
        continue;
      }
      const std::uint32_t s = base + static_cast<std::uint32_t>(e);
      if (st[s].touched == batch) {
        policy_.on_repeat(s);
        continue;
      }
      st[s].touched = batch;
      ++looked;
      if (st[s].flags & cache_view::resident_bit) {
        ++hits;
        policy_.on_hit(s);
        continue;
      }
      ++misses;
      st[s].flags |= cache_view::resident_bit;
      policy_.on_insert(s);
    }
    const bool decode = phase_ == run_phase::decode;
    const std::uint64_t b = layer_bytes_[layer_];
    stats_.rejected += rejected;
    stats_.all.lookups += looked;
    stats_.all.hits += hits;
    stats_.all.misses += misses;
    stats_.all.bytes_read += misses * b;
    if (decode) {
      stats_.decode.lookups += looked;
      stats_.decode.hits += hits;
      stats_.decode.misses += misses;
      stats_.decode.bytes_read += misses * b;
    }
    used_ += misses * b;
    layer_count_[layer_] += static_cast<std::uint32_t>(misses);
    end_batch();
    return static_cast<std::size_t>(misses);
  }

  /// True when (layer, expert) is resident. Out-of-range ids are not.
  bool is_resident(layer_id layer, expert_id expert) const noexcept {
    const std::size_t s = slot_of(layer, expert);
    return s != no_slot && (slots_[s].flags & cache_view::resident_bit);
  }

  // ---- residency control -----------------------------------------------

  /// Pins (layer, expert): once resident it is never evicted. Returns false
  /// for an id outside the shape.
  bool pin(layer_id layer, expert_id expert) noexcept { return set_pin(layer, expert, true); }
  bool unpin(layer_id layer, expert_id expert) noexcept { return set_pin(layer, expert, false); }
  bool is_pinned(layer_id layer, expert_id expert) const noexcept {
    const std::size_t s = slot_of(layer, expert);
    return s != no_slot && (slots_[s].flags & cache_view::pinned_bit);
  }

  /// Makes (layer, expert) resident without a lookup (a preload or a
  /// completed speculative read), then evicts to the budget without evicting
  /// it or the open batch's entries. Returns false if it was already resident
  /// or outside the shape. Counted in stats().inserted, not in bytes_read.
  /// The evictions it causes count as decode evictions when `phase` is decode
  /// (pass the phase of the load the read was made for).
  bool insert(layer_id layer, expert_id expert, run_phase phase) noexcept {
    const std::size_t s = slot_of(layer, expert);
    if (s == no_slot || (slots_[s].flags & cache_view::resident_bit)) return false;
    const auto slot = static_cast<std::uint32_t>(s);
    make_resident(slot);
    if constexpr (has_on_admit<Policy>) policy_.on_admit(slot);
    else policy_.on_insert(slot);
    ++stats_.inserted;
    const std::uint32_t saved = slots_[slot].touched;
    slots_[slot].touched = batch_;  // protect it during this eviction
    evict_to_budget(to_index(layer), phase == run_phase::decode);
    slots_[slot].touched = saved;
    return true;
  }
  /// As above, in the phase of the open batch (prefill when none is open).
  bool insert(layer_id layer, expert_id expert) noexcept {
    return insert(layer, expert, open_ ? phase_ : run_phase::prefill);
  }

  /// Drops (layer, expert) from residency without counting an eviction (a
  /// demanded read that failed after its lookup recorded it resident): its
  /// bytes leave the budget, the policy forgets it (its eviction hook), a pin
  /// stays. Returns false if it was not resident or outside the shape.
  /// Counted in stats().invalidated.
  bool invalidate(layer_id layer, expert_id expert) noexcept {
    const std::size_t s = slot_of(layer, expert);
    if (s == no_slot || !(slots_[s].flags & cache_view::resident_bit)) return false;
    drop_resident(static_cast<std::uint32_t>(s));
    ++stats_.invalidated;
    return true;
  }

  // ---- queries -----------------------------------------------------------

  const cache_stats& stats() const noexcept { return stats_; }
  /// Bytes resident now.
  std::uint64_t resident_bytes() const noexcept { return used_; }
  std::uint64_t budget_bytes() const noexcept { return options_.budget_bytes; }
  /// T = Σ expert_bytes(l) × k over MoE layers.
  std::uint64_t token_cycle_bytes() const noexcept { return cycle_bytes_; }
  /// The guard's message when the budget is below the cycle under a
  /// collapsing policy (empty otherwise or with cycle_guard::off).
  const std::string& guard_message() const noexcept { return guard_message_; }
  const model_shape& shape() const noexcept { return shape_; }
  std::size_t resident_count(layer_id layer) const noexcept {
    return to_index(layer) < layer_count_.size() ? layer_count_[to_index(layer)] : 0;
  }
  Policy& policy() noexcept { return policy_; }
  const Policy& policy() const noexcept { return policy_; }

 private:
  std::size_t slot_of(layer_id layer, expert_id expert) const noexcept {
    if (!shape_.is_moe(layer) || to_index(expert) >= n_experts_) return no_slot;
    return to_index(layer) * n_experts_ + to_index(expert);
  }

  bool set_pin(layer_id layer, expert_id expert, bool on) noexcept {
    const std::size_t s = slot_of(layer, expert);
    if (s == no_slot) return false;
    if (on) slots_[s].flags |= cache_view::pinned_bit;
    else slots_[s].flags &= ~cache_view::pinned_bit;
    return true;
  }

  void make_resident(std::uint32_t s) noexcept {
    const std::size_t l = slot_layer_[s];
    slots_[s].flags |= cache_view::resident_bit;
    used_ += layer_bytes_[l];
    ++layer_count_[l];
  }

  cache_view view() const noexcept {
    return cache_view(slots_.data(), batch_, layer_bytes_.data(), layer_count_.data(), n_experts_, used_,
                      options_.budget_bytes);
  }

  void drop_resident(std::uint32_t s) noexcept {
    const std::size_t l = slot_layer_[s];
    slots_[s].flags &= ~cache_view::resident_bit;
    used_ -= layer_bytes_[l];
    --layer_count_[l];
    policy_.on_evict(s);
  }

  std::size_t evict_to_budget(std::size_t layer, bool decode) noexcept {
    std::size_t n = 0;
    while (policy_.over_budget(view(), layer)) {
      const std::uint32_t v = policy_.victim(view(), layer);
      if (v == no_slot) break;
      MOE_RESIDENCY_ASSERT(view().evictable(v));
      ++stats_.all.evictions;
      stats_.decode.evictions += decode;
      drop_resident(v);
      ++n;
    }
    policy_.end_eviction();
    return n;
  }

  void next_batch() noexcept {
    if (++batch_ == 0) {  // wrapped after 2^32 batches: forget old stamps
      for (detail::cache_slot_state& st : slots_) st.touched = 0;
      batch_ = 1;
    }
  }

  model_shape shape_;
  cache_options options_;
  Policy policy_;
  std::uint32_t n_experts_ = 0;
  std::vector<std::uint64_t> layer_bytes_;
  std::vector<detail::cache_slot_state> slots_;  // batch stamp of the last lookup, flags
  std::vector<std::uint16_t> slot_layer_;        // layer of each slot (no division per eviction)
  std::vector<std::uint32_t> layer_count_;
  std::uint64_t used_ = 0;
  std::uint64_t cycle_bytes_ = 0;
  std::uint32_t batch_ = 1;
  bool open_ = false;
  run_phase phase_ = run_phase::decode;
  std::size_t layer_ = 0;
  std::uint32_t base_ = 0;
  cache_stats stats_;
  std::string guard_message_;
};

}  // namespace moe_residency
