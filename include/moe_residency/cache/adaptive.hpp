#pragma once
/// adaptive: follow the leader among shadow caches. The policy runs, beside
/// the real cache, one shadow cache per built-in online rule (lru, lfu, layer,
/// layerlfu, arc, s3fifo, sieve, cycle), each with the real cache's budget and
/// fed the same lookups and admissions. After every batch it charges each
/// shadow what that rule would have cost (the bytes it read, or its misses),
/// decayed over a window of tokens, and follows the cheapest of those that
/// kept the budget: the leader. (A layer partition keeps top-k entries of
/// every layer, so below the token cycle it holds more than the budget and
/// hits at a rate the real cache cannot reach; it does not lead then.)
///
/// Following means: the real cache evicts first what the leader no longer
/// holds (the orphans), so while one rule leads the real cache holds what it
/// holds and hits as it hits. Among the orphans, and among the leader's own
/// entries when nothing is orphaned (a layer partition leaves part of the
/// budget free, or a switch left the real cache without some of the new
/// leader's entries), it evicts first what the fewest other rules still
/// hold: the rules vote on what to keep. Ties go to the entry whose use or
/// vote changed least recently. A switch costs the misses on the new
/// leader's entries the real cache lacks; a margin (hysteresis) keeps a near
/// tie from switching back and forth.
///
/// The bound this gives: while one rule leads and holds no more than the
/// budget, the real cache holds all it holds, so it hits at least as often
/// (as often, for a rule that fills the budget); the loss against the best
/// rule is the cost of the switches plus the time spent following a rule
/// that was worse over the window. A rule that holds more than the budget (a
/// layer partition after a wide prefill batch, or below the token cycle) is
/// followed as far as the budget allows.
///
/// Per layer (adaptive_scope::layer), each layer's batches are charged to
/// that layer's counters too and each layer follows its own cheapest rule:
/// its entries are orphans when its leader no longer holds them. It lost to
/// the global lead on both shared traces (docs/cache.md); it is there so
/// that the comparison can be rerun.
///
/// Cost: every lookup is a lookup in each of the eight shadows (O(1) each,
/// O(8) in all), and each change of a shadow's residency relinks the entry
/// (O(1)); each batch's end closes the shadows' batches and compares eight
/// decayed counters; a switch reorders the 256 vote lists (O(1) in the
/// number of experts; per layer, a layer's change of lead moves its entries
/// whose leader bit changed: O(experts per layer)). An eviction looks at the
/// lists' tails in order (at most 256, per layer 512, most of them empty).
/// State: eight caches' state, a byte of shadow residency and a list link
/// per (layer, expert) slot, per layer eight counters and a leader per
/// layer: bounded in the number of experts. Below the token cycle lfu and
/// cycle are the cheapest rules that keep the budget, and lead: the policy
/// does not collapse there.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "moe_residency/cache/arc.hpp"
#include "moe_residency/cache/cycle.hpp"
#include "moe_residency/cache/expert_cache.hpp"
#include "moe_residency/cache/layer.hpp"
#include "moe_residency/cache/lfu.hpp"
#include "moe_residency/cache/lru.hpp"
#include "moe_residency/cache/s3fifo.hpp"
#include "moe_residency/cache/sieve.hpp"
#include "moe_residency/detail/cache_list.hpp"
#include "moe_residency/error.hpp"

namespace moe_residency {

/// Where the adaptive policy chooses whom to follow.
enum class adaptive_scope : std::uint8_t {
  global,  ///< one leader for the whole cache: the rule cheapest over all layers
  layer    ///< a leader per layer: the rule cheapest in that layer's batches
};

/// What the adaptive policy minimises.
enum class adaptive_objective : std::uint8_t {
  bytes,  ///< the bytes a rule reads (misses × that layer's expert bytes): a token's I/O
  misses  ///< the number of misses (hit rate), whatever their size
};

struct adaptive_policy_options {
  adaptive_objective objective = adaptive_objective::bytes;
  /// Memory of the cost counters, in tokens (each MoE layer's batch is
  /// 1 / n_moe_layers of a token); 0 = no decay (the whole run so far).
  /// The defaults (8 tokens, margin 0.1) were chosen on the Qwen trace only
  /// (docs/cache.md, "`adaptive`").
  double window_tokens = 8.0;
  /// A rule takes the lead when its cost is below the leader's × (1 − margin).
  double margin = 0.1;
  /// Index of the rule that leads before any cost is known (adaptive_rule_names()).
  std::uint32_t first_leader = 7;  // cycle
  /// One leader, or one per layer (each layer's costs decayed over its own
  /// batches, window_tokens of them). Global is the default: per layer lost
  /// on both shared traces (docs/cache.md, "`adaptive`").
  adaptive_scope scope = adaptive_scope::global;
  /// The cycle shadow's tuning (the replay's --decay).
  cycle_policy_options cycle{};
};

/// The rules the adaptive policy follows, in the order of its counters.
inline const std::vector<std::string>& adaptive_rule_names() {
  static const std::vector<std::string> n = {lru_policy::name,       lfu_policy::name,  layer_lru_policy::name,
                                             layer_lfu_policy::name, arc_policy::name,  s3fifo_policy::name,
                                             sieve_policy::name,     cycle_policy::name};
  return n;
}

namespace detail {

class adaptive_core;

/// A shadow rule: the rule itself, telling the core which slots it holds.
template <class P>
class adaptive_shadow : public P {
 public:
  adaptive_shadow(P p, adaptive_core* core, std::uint32_t index) : P(std::move(p)), core_(core), index_(index) {}
  void on_insert(std::uint32_t s) noexcept;
  void on_admit(std::uint32_t s) noexcept;
  void on_evict(std::uint32_t s) noexcept;

 private:
  adaptive_core* core_;
  std::uint32_t index_;
};

/// The adaptive policy's state, at a fixed address (the shadows point at it).
class adaptive_core {
 public:
  static constexpr std::uint32_t n_rules = 8;
  /// The real cache's entries are in one list per vote: the set of rules
  /// holding the entry (a byte, bit r for rule r).
  static constexpr std::uint32_t n_votes = 1u << n_rules;

  adaptive_core(const model_shape& shape, std::uint64_t budget, const adaptive_policy_options& o)
      : o_(o), budget_(budget), leader_(o.first_leader) {
    n_experts_ = static_cast<std::uint32_t>(shape.n_experts());
    const std::size_t n_slots = shape.n_layers() * shape.n_experts();
    held_.assign(n_slots, 0);
    per_layer_ = o.scope == adaptive_scope::layer;
    lists_.reset(n_slots, per_layer_ ? 2 * n_votes : n_votes);
    if (per_layer_) {
      layer_leader_.assign(shape.n_layers(), o.first_leader);
      layer_cost_.assign(shape.n_layers() * n_rules, 0.0);
      layer_decay_ = o.window_tokens > 0.0 ? 1.0 - 1.0 / std::max(o.window_tokens, 1.0) : 1.0;
    }
    order_votes();
    const double per_batch = o.window_tokens * static_cast<double>(std::max<std::size_t>(shape.n_moe_layers(), 1));
    decay_ = o.window_tokens > 0.0 ? 1.0 - 1.0 / std::max(per_batch, 1.0) : 1.0;
    const cache_options co{budget, cycle_guard::off, {}};
    std::get<0>(rules_).emplace(shape, co, adaptive_shadow<lru_policy>(lru_policy{}, this, 0));
    std::get<1>(rules_).emplace(shape, co, adaptive_shadow<lfu_policy>(lfu_policy{}, this, 1));
    std::get<2>(rules_).emplace(shape, co, adaptive_shadow<layer_lru_policy>(layer_lru_policy{}, this, 2));
    std::get<3>(rules_).emplace(shape, co, adaptive_shadow<layer_lfu_policy>(layer_lfu_policy{}, this, 3));
    std::get<4>(rules_).emplace(shape, co, adaptive_shadow<arc_policy>(arc_policy{}, this, 4));
    std::get<5>(rules_).emplace(shape, co, adaptive_shadow<s3fifo_policy>(s3fifo_policy{}, this, 5));
    std::get<6>(rules_).emplace(shape, co, adaptive_shadow<sieve_policy>(sieve_policy{}, this, 6));
    std::get<7>(rules_).emplace(shape, co, adaptive_shadow<cycle_policy>(cycle_policy{o.cycle}, this, 7));
  }
  adaptive_core(const adaptive_core&) = delete;
  adaptive_core& operator=(const adaptive_core&) = delete;

  // ---- the real cache's hooks --------------------------------------------

  void begin(run_phase phase, std::size_t layer) noexcept {
    sync();
    phase_ = phase;
    base_ = static_cast<std::uint32_t>(layer) * n_experts_;
    each([&](auto& c) { c->begin_batch(phase, layer_id{static_cast<std::uint16_t>(layer)}); });
    open_ = true;
  }
  /// A lookup of the real cache (hit, miss or repeat): the same lookup in
  /// every shadow; then every rule holds the slot (a shadow never evicts what
  /// its open batch touched) and it is the most recent of its vote.
  void looked_up(std::uint32_t s) noexcept {
    const expert_id e{static_cast<std::uint16_t>(s - base_)};
    each([&](auto& c) { c->lookup(e); });
    lists_.move_to_front(list_of(s), s);
  }
  /// An entry made resident without a lookup: inserted in every shadow.
  void admitted(std::uint32_t s) noexcept {
    const layer_id l{static_cast<std::uint16_t>(s / n_experts_)};
    const expert_id e{static_cast<std::uint16_t>(s % n_experts_)};
    each([&](auto& c) { c->insert(l, e, phase_); });
    lists_.move_to_front(list_of(s), s);
    admitting_ = true;
  }
  void evicted(std::uint32_t s) noexcept { lists_.erase(s); }

  /// Closes the shadows' batch (their own evictions), charges each rule its
  /// cost and lets the cheapest that kept the budget lead: it takes the lead
  /// from a leader that kept the budget when cheaper by the margin, from one
  /// that did not at once. Once per batch; a no-op otherwise, and during an
  /// admission's eviction (the batch is still open). Per layer, the batch's
  /// cost is also charged to its layer, whose lead is decided the same way.
  void sync() noexcept {
    if (!open_ || admitting_) return;
    open_ = false;
    const std::uint32_t layer = base_ / n_experts_;
    double* layer_cost = per_layer_ ? &layer_cost_[layer * n_rules] : nullptr;
    std::uint32_t i = 0;
    each([&](auto& c) {
      c->end_batch();
      const cache_counters& k = c->stats().all;
      const std::uint64_t now = o_.objective == adaptive_objective::bytes ? k.bytes_read : k.misses;
      const double spent = static_cast<double>(now - charged_[i]);
      cost_[i] = cost_[i] * decay_ + spent;
      if (layer_cost) layer_cost[i] = layer_cost[i] * layer_decay_ + spent;
      charged_[i] = now;
      kept_[i] = c->resident_bytes() <= budget_;
      ++i;
    });
    std::uint32_t global = leader_;
    if (choose(cost_, global)) {
      leader_ = global;
      if (!per_layer_) {
        ++switches_;
        order_votes();
      }
    }
    if (per_layer_ && choose(layer_cost, layer_leader_[layer])) {
      ++switches_;
      relink_layer(layer);
    }
  }
  void end_eviction() noexcept { admitting_ = false; }

  /// The first evictable entry of the votes in eviction order (orphans
  /// first, then fewest other rules), the oldest of its vote.
  template <class View>
  std::uint32_t victim(const View& v) const noexcept {
    for (std::uint32_t i = 0, n = per_layer_ ? 2 * n_votes : n_votes; i < n; ++i)
      for (std::uint32_t s = lists_.tail(order_[i]); s != cache_slot_lists::none; s = lists_.newer(s))
        if (v.evictable(s)) return s;
    return no_slot;
  }

  // ---- the shadows' events -------------------------------------------------

  void shadow_holds(std::uint32_t rule, std::uint32_t s) noexcept {
    held_[s] = static_cast<std::uint8_t>(held_[s] | (1u << rule));
    if (lists_.owner(s) != cache_slot_lists::none) lists_.move_to_front(list_of(s), s);
  }
  void shadow_drops(std::uint32_t rule, std::uint32_t s) noexcept {
    held_[s] = static_cast<std::uint8_t>(held_[s] & ~(1u << rule));
    if (lists_.owner(s) != cache_slot_lists::none) lists_.move_to_front(list_of(s), s);
  }

  // ---- queries -------------------------------------------------------------

  std::uint32_t leader() const noexcept { return leader_; }
  std::uint32_t layer_leader(std::size_t layer) const noexcept {
    return per_layer_ && layer < layer_leader_.size() ? layer_leader_[layer] : leader_;
  }
  std::uint64_t switches() const noexcept { return switches_; }
  double cost(std::uint32_t rule) const noexcept {
    MOE_RESIDENCY_ASSERT(rule < n_rules);
    return cost_[rule];
  }
  bool held_by(std::uint32_t rule, std::uint32_t s) const noexcept { return (held_[s] >> rule) & 1u; }
  /// The shadow of rule r's counters (what that rule alone would have done).
  const cache_stats& rule_stats(std::uint32_t r) const noexcept {
    MOE_RESIDENCY_ASSERT(r < n_rules);
    const cache_stats* out = nullptr;
    std::uint32_t i = 0;
    each([&](const auto& c) {
      if (i++ == r) out = &c->stats();
    });
    return *out;
  }

 private:
  template <class F>
  void each(F&& f) {
    std::apply([&](auto&... c) { (f(c), ...); }, rules_);
  }
  template <class F>
  void each(F&& f) const {
    std::apply([&](const auto&... c) { (f(c), ...); }, rules_);
  }

  /// The cheapest rule that kept the budget takes the lead from `leader`
  /// (a leader that kept it only when cheaper by the margin); true if it did.
  bool choose(const double* cost, std::uint32_t& leader) const noexcept {
    std::uint32_t best = n_rules;
    for (std::uint32_t r = 0; r < n_rules; ++r)
      if (kept_[r] && (best == n_rules || cost[r] < cost[best] || (r == leader && cost[r] == cost[best]))) best = r;
    if (best == n_rules || best == leader) return false;  // none kept it (a wide batch): the lead stays
    if (kept_[leader] && !(cost[best] < cost[leader] * (1.0 - o_.margin))) return false;
    leader = best;
    return true;
  }

  /// The list an entry of the real cache is in: its vote, and per layer
  /// whether its layer's leader is among the voters.
  std::uint32_t list_of(std::uint32_t s) const noexcept {
    if (!per_layer_) return held_[s];
    return held_[s] | (((static_cast<std::uint32_t>(held_[s]) >> layer_leader_[s / n_experts_]) & 1u) << n_rules);
  }
  /// A layer's lead changed: its entries whose leader bit changed move to
  /// their new lists (as most recent: a change of vote), in slot order.
  void relink_layer(std::uint32_t layer) noexcept {
    for (std::uint32_t s = layer * n_experts_, end = s + n_experts_; s < end; ++s)
      if (lists_.owner(s) != cache_slot_lists::none && lists_.owner(s) != list_of(s))
        lists_.move_to_front(list_of(s), s);
  }

  /// The lists in eviction order: without the leader before with it, then
  /// fewer rules before more, then by the vote's bits. Globally the lists
  /// are the votes, reordered at a change of leader; per layer they carry
  /// the leader bit themselves, and the order is fixed.
  void order_votes() noexcept {
    const auto key = [this](std::uint32_t list) {
      const std::uint32_t v = list & (n_votes - 1);
      std::uint32_t n = 0;
      for (std::uint32_t b = v; b != 0; b &= b - 1) ++n;
      const std::uint32_t led = per_layer_ ? list >> n_rules : (v >> leader_) & 1u;
      return (led << 16) | (n << 8) | v;
    };
    const std::uint32_t n = per_layer_ ? 2 * n_votes : n_votes;
    for (std::uint32_t v = 0; v < n; ++v) order_[v] = v;
    std::sort(order_, order_ + n, [&](std::uint32_t a, std::uint32_t b) { return key(a) < key(b); });
  }

  adaptive_policy_options o_;
  std::uint64_t budget_ = 0;
  std::uint32_t n_experts_ = 1;
  std::tuple<std::optional<expert_cache<adaptive_shadow<lru_policy>>>,
             std::optional<expert_cache<adaptive_shadow<lfu_policy>>>,
             std::optional<expert_cache<adaptive_shadow<layer_lru_policy>>>,
             std::optional<expert_cache<adaptive_shadow<layer_lfu_policy>>>,
             std::optional<expert_cache<adaptive_shadow<arc_policy>>>,
             std::optional<expert_cache<adaptive_shadow<s3fifo_policy>>>,
             std::optional<expert_cache<adaptive_shadow<sieve_policy>>>,
             std::optional<expert_cache<adaptive_shadow<cycle_policy>>>>
      rules_;
  std::vector<std::uint8_t> held_;         // bit r: rule r's shadow holds the slot
  cache_slot_lists lists_;                 // the real cache's entries, one list per vote (and leader bit)
  std::uint32_t order_[2 * n_votes] = {};  // the lists in eviction order
  double cost_[n_rules] = {};
  bool kept_[n_rules] = {};  // the rule's shadow held no more than the budget after the batch
  std::uint64_t charged_[n_rules] = {};
  double decay_ = 1.0;
  std::uint32_t leader_ = 7;
  std::uint64_t switches_ = 0;
  bool per_layer_ = false;
  std::vector<std::uint32_t> layer_leader_;  // per layer: each layer's leader
  std::vector<double> layer_cost_;           // per layer: [layer × n_rules + rule]
  double layer_decay_ = 1.0;
  run_phase phase_ = run_phase::prefill;
  std::uint32_t base_ = 0;
  bool open_ = false, admitting_ = false;
};

template <class P>
void adaptive_shadow<P>::on_insert(std::uint32_t s) noexcept {
  P::on_insert(s);
  core_->shadow_holds(index_, s);
}
template <class P>
void adaptive_shadow<P>::on_admit(std::uint32_t s) noexcept {
  if constexpr (has_on_admit<P>) P::on_admit(s);
  else P::on_insert(s);
  core_->shadow_holds(index_, s);
}
template <class P>
void adaptive_shadow<P>::on_evict(std::uint32_t s) noexcept {
  P::on_evict(s);
  core_->shadow_drops(index_, s);
}

}  // namespace detail

class adaptive_policy : public policy_base {
 public:
  static constexpr const char* name = "adaptive";
  static constexpr bool collapses_below_cycle = false;

  /// Throws error on a negative or non-finite window, a margin outside
  /// [0, 1), a first leader out of range, a scope or objective that is not
  /// one of the enumerators, or a cycle decay outside (0, 1).
  explicit adaptive_policy(adaptive_policy_options o = {}) : o_(o) {
    if (!(std::isfinite(o_.window_tokens) && o_.window_tokens >= 0.0))
      throw error("adaptive_policy: window_tokens " + std::to_string(o_.window_tokens) +
                  " out of range; expected a finite number of tokens >= 0 (0 = no decay)");
    if (!(o_.margin >= 0.0 && o_.margin < 1.0))
      throw error("adaptive_policy: margin " + std::to_string(o_.margin) + " out of range; expected [0, 1)");
    if (o_.first_leader >= detail::adaptive_core::n_rules)
      throw error("adaptive_policy: first_leader " + std::to_string(o_.first_leader) +
                  " out of range; expected 0 to 7 (adaptive_rule_names())");
    if (o_.scope != adaptive_scope::global && o_.scope != adaptive_scope::layer)
      throw error("adaptive_policy: scope " + std::to_string(static_cast<int>(o_.scope)) +
                  " is not a scope; expected adaptive_scope::global or adaptive_scope::layer");
    if (o_.objective != adaptive_objective::bytes && o_.objective != adaptive_objective::misses)
      throw error("adaptive_policy: objective " + std::to_string(static_cast<int>(o_.objective)) +
                  " is not an objective; expected adaptive_objective::bytes or adaptive_objective::misses");
    cycle_policy check(o_.cycle);  // refuses a bad decay now, not at init
    (void)check;
  }

  /// A copy is a new policy with the same options (a cache calls init() on
  /// its policy, which starts the learning afresh anyway); moves keep the state.
  adaptive_policy(const adaptive_policy& o) : policy_base(o), o_(o.o_) {}
  adaptive_policy& operator=(const adaptive_policy& o) {
    o_ = o.o_;
    core_.reset();
    return *this;
  }
  adaptive_policy(adaptive_policy&&) noexcept = default;
  adaptive_policy& operator=(adaptive_policy&&) noexcept = default;

  void init(const model_shape& shape, std::uint64_t budget) {
    core_ = std::make_unique<detail::adaptive_core>(shape, budget, o_);
  }
  void on_batch_begin(run_phase phase, std::size_t layer) noexcept { core_->begin(phase, layer); }
  void on_hit(std::uint32_t s) noexcept { core_->looked_up(s); }
  void on_repeat(std::uint32_t s) noexcept { core_->looked_up(s); }
  void on_insert(std::uint32_t s) noexcept { core_->looked_up(s); }
  void on_admit(std::uint32_t s) noexcept { core_->admitted(s); }
  void on_evict(std::uint32_t s) noexcept { core_->evicted(s); }
  /// Const as the contract has it; the shadows' batch closes here (the
  /// first call after a batch), which changes the core, not the policy.
  template <class View>
  bool over_budget(const View& v, std::size_t /*layer*/) const noexcept {
    core_->sync();
    return v.used_bytes() > v.budget_bytes();
  }
  template <class View>
  std::uint32_t victim(const View& v, std::size_t /*layer*/) const noexcept {
    return core_->victim(v);
  }
  void end_eviction() noexcept { core_->end_eviction(); }

  /// The rule cheapest over all layers (an index into adaptive_rule_names()):
  /// the rule followed, in global scope.
  std::uint32_t leader() const noexcept { return core_->leader(); }
  /// The rule layer l follows (leader() in global scope).
  std::uint32_t leader(layer_id l) const noexcept { return core_->layer_leader(to_index(l)); }
  /// How many times the lead changed (a layer's lead, per layer).
  std::uint64_t switches() const noexcept { return core_->switches(); }
  /// Rule r's decayed cost (bytes or misses, per the objective); r < 8.
  double rule_cost(std::uint32_t r) const noexcept { return core_->cost(r); }
  /// What rule r alone would have done on the same lookups; r < 8.
  const cache_stats& rule_stats(std::uint32_t r) const noexcept { return core_->rule_stats(r); }
  const adaptive_policy_options& options() const noexcept { return o_; }

 private:
  adaptive_policy_options o_;
  std::unique_ptr<detail::adaptive_core> core_;
};

}  // namespace moe_residency
