#pragma once
/// cycle: a layer-cycle-aware online approximation of Belady (this library's
/// own policy). MoE decode visits layers in a fixed cycle, so an expert of
/// layer j can next be needed only when the cycle returns to j. The policy
/// estimates each entry's expected time to next use, in layer steps,
///
///   ETNU(j, e) = d(j) + L × (1 / p(j, e) − 1)      (× expert bytes, by default)
///
/// where d(j) is the number of layer steps until the cycle reaches j again
/// (1 … L; L for the layer just processed), L the number of layers, and
/// p(j, e) the expert's per-token routing probability estimated from
/// exponentially decayed usage (decay γ per token of that layer; a duplicate
/// in a prefill batch counts as a use; usage persists across evictions), and
/// evicts the largest ETNU.
///
/// Why it is exact and cheap: write d(j) = v(j) − t with t a layer clock and
/// v(j) the absolute step of j's next visit. Between two visits of j, v(j)
/// does not move, and neither does any p(j, ·) (decay advances only at j's
/// own batches). So K(j) = v(j) + L / p(front of j) is time-invariant, and
/// ETNU = bytes(j) × (K(j) − t − L): within one byte size the largest K is
/// the victim at every t. Each layer keeps its entries in a sorted array
/// (ordered by a time-invariant usage key, the next victim at the front)
/// and its K; each byte size keeps a tournament tree over its layers' K; a
/// victim is the best of the size winners (C = number of distinct expert
/// sizes, 1–3 in practice).
///
/// Cost, per access: O(moved entries) (a use raises the entry's key and
/// slides its node towards the back, a few places for the hot entries that
/// hit, so a front is always current and an eviction reads nodes only,
/// never the cold slot of an entry unused for many tokens; an entry
/// inserted by the batch joins its array when the batch's eviction ends,
/// since it cannot be a victim before, moving the shorter side of the
/// array by one place). Per eviction: O(1) for the pop and O(log L) for the
/// tree; a layer's K is recomputed (three divisions, skipped when its front
/// node's L / p is cached from the same decay epoch) at most once per
/// eviction round, only for the layers that changed. No exp or log on the
/// hot path.
///
/// Never collapses below the token cycle: the layer just used has the
/// largest d.
///
/// Where the parts are: the options and their check in cache/cycle_options.hpp,
/// the keys (the layer clock, p, L / p cached per node, K, the layer order)
/// in detail/cycle_keys.hpp, the tournament tree per byte size in
/// detail/cache_tournament.hpp; here the policy: the layer arrays whose nodes
/// copy the keys, and which layers' K are recomputed. tests/test_cache.cpp
/// holds them to a slow twin that recomputes the rule from scratch at every
/// eviction.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "moe_residency/cache/cycle_options.hpp"
#include "moe_residency/cache/expert_cache.hpp"
#include "moe_residency/detail/cache_tournament.hpp"
#include "moe_residency/detail/cycle_keys.hpp"

namespace moe_residency {

class cycle_policy : public policy_base {
 public:
  static constexpr const char* name = "cycle";
  static constexpr bool collapses_below_cycle = false;

  /// Throws error on a decay outside (0, 1) or a negative prior weight.
  explicit cycle_policy(cycle_policy_options o = {})
      : o_(detail::checked_cycle_options(o)), keys_(o_.decay, o_.prior_weight) {}

  void init(const model_shape& shape, std::uint64_t /*budget*/) {
    n_experts_ = static_cast<std::uint32_t>(shape.n_experts());
    expert_shift_ = 0;
    while ((std::uint32_t{1} << expert_shift_) < n_experts_) ++expert_shift_;
    if ((std::uint32_t{1} << expert_shift_) != n_experts_) expert_shift_ = no_shift;
    n_layers_ = shape.n_layers();
    top_k_ = shape.top_k();
    keys_.reset(n_layers_, static_cast<double>(shape.top_k()) / static_cast<double>(shape.n_experts()));
    const std::size_t n_slots = n_layers_ * n_experts_;
    use_.assign(n_slots, use_state{});
    nodes_.assign(n_slots, node{});
    pos_.assign(n_slots, none);
    deferred_.assign(n_slots, 0);
    deferred_list_.clear();
    deferred_list_.reserve(n_slots);
    stash_.clear();
    stash_.reserve(n_slots);
    head_.resize(n_layers_);
    end_.resize(n_layers_);
    // Each array starts in the middle of its room: it grows at either end.
    for (std::size_t l = 0; l < n_layers_; ++l)
      head_[l] = end_[l] = static_cast<std::uint32_t>(l * n_experts_ + n_experts_ / 2);
    k_.assign(n_layers_, no_k);
    dirty_.assign(n_layers_, 0);
    dirty_list_.clear();
    dirty_list_.reserve(n_layers_);
    // One class per distinct expert size (all layers in one when bytes are not weighed).
    const std::vector<std::uint64_t> layer_bytes = shape.all_expert_bytes();
    class_of_.assign(n_layers_, 0);
    class_bytes_.clear();
    for (std::size_t l = 0; l < n_layers_; ++l) {
      const std::uint64_t b = o_.weigh_bytes ? layer_bytes[l] : 1;
      std::size_t c = 0;
      while (c < class_bytes_.size() && class_bytes_[c] != b) ++c;
      if (c == class_bytes_.size()) class_bytes_.push_back(b);
      class_of_[l] = static_cast<std::uint32_t>(c);
    }
    trees_.reset(class_of_, class_bytes_.size());
    scan_k_.assign(class_bytes_.size(), -1.0);
    scan_l_.assign(class_bytes_.size(), no_slot);
    scan_e_.assign(class_bytes_.size(), no_slot);
    tick_ = 0;
    occ_ = 0;
  }
  void on_batch_begin(run_phase, std::size_t layer) noexcept {
    advance(layer);
    occ_ = 0;
  }
  void on_hit(std::uint32_t s) noexcept { use(s, false); }
  void on_repeat(std::uint32_t s) noexcept { use(s, false); }
  void on_insert(std::uint32_t s) noexcept { use(s, true); }
  void on_evict(std::uint32_t s) noexcept {
    const std::uint32_t l = layer_of(s);
    erase(l, s);
    mark(l);
  }
  void on_batch_end(std::size_t layer) noexcept {
    // A batch of n routed ids is n / k tokens of this layer (prefill holds many).
    const double tokens = static_cast<double>(occ_) / static_cast<double>(top_k_);
    decay_layer(layer, tokens < 1.0 ? 1.0 : tokens);
    mark(layer);
  }

  template <class View>
  std::uint32_t victim(const View& v, std::size_t) noexcept {
    // The clock stays at the layer just processed: an insert() outside a
    // batch (a speculative read for the next layer, a warm-up) is no visit of
    // its layer, so it must not make that layer the farthest from its use.
    if (o_.reference_scan) return victim_scan(v);
    flush();
    std::uint32_t best_l = no_slot;
    double best = -1.0;
    for (std::size_t c = 0; c < class_bytes_.size(); ++c) {
      std::uint32_t l = trees_.winner(c);
      for (;;) {
        if (k_[l] == no_k) break;  // every layer of the class is empty
        if (v.evictable(nodes_[head_[l]].slot)) break;
        // The front cannot go (touched by this batch, pinned): set it aside
        // until end_eviction(), with every next front that cannot go either.
        do {
          stash_front(l);
        } while (head_[l] != end_[l] && !v.evictable(nodes_[head_[l]].slot));
        refresh(l);
        l = trees_.winner(c);
      }
      if (k_[l] == no_k) continue;
      const double score = keys_.cost(class_bytes_[c], k_[l]);
      if (score > best) {
        best = score;
        best_l = l;
      }
    }
    return best_l == no_slot ? no_slot : nodes_[head_[best_l]].slot;
  }
  void end_eviction() noexcept {
    // The set-aside fronts go back in front of their arrays, in order: each
    // was before every entry left in its layer, and the positions before a
    // head are free (a stashed node is still where it was: nothing writes
    // below a head). Last stashed first, so no unread node is overwritten.
    for (std::size_t i = stash_.size(); i-- > 0;) {
      const node n = nodes_[stash_[i]];
      const std::uint32_t l = layer_of(n.slot);
      const std::uint32_t h = --head_[l];
      nodes_[h] = n;
      pos_[n.slot] = h;
      mark(l);
    }
    stash_.clear();
    for (std::uint32_t s : deferred_list_) {
      if (deferred_[s] == 1) {
        const std::uint32_t l = layer_of(s);
        insert_node(l, node{detail::cycle_bits_of(use_[s].key), use_[s].last, 0.0, s, 0});
        mark(l);
      }
      deferred_[s] = 0;
    }
    deferred_list_.clear();
  }

  /// Expected layer steps until (layer, expert) is needed, seen from a
  /// cache that just processed layer `now` (ETNU without the bytes factor).
  double expected_steps(layer_id layer, expert_id expert, layer_id now) const noexcept {
    const std::size_t l = to_index(layer);
    const double d = static_cast<double>(keys_.steps_to(l, to_index(now)));
    const double L = static_cast<double>(n_layers_);
    return d + L * (1.0 / prob(l, static_cast<std::uint32_t>(l * n_experts_ + to_index(expert))) - 1.0);
  }

 private:
  static constexpr std::uint32_t none = 0xffffffffu;
  static constexpr std::uint32_t no_shift = 0xffffffffu;
  static constexpr double no_k = detail::cycle_layer_keys::no_k;

  /// A slot's usage key (usage × γ^−τ(layer), order-preserving within a
  /// layer) and the tick of its last use: the layer order is (key, last),
  /// a total order (ticks are unique).
  struct use_state {
    double key = 0.0;
    std::uint64_t last = 0;
  };
  using node = detail::cycle_node;  // an array member: its order key, slot and cached L / p

  // ---- the layer clock ----------------------------------------------------
  std::uint32_t layer_of(std::uint32_t s) const noexcept {
    return expert_shift_ != no_shift ? s >> expert_shift_ : s / n_experts_;
  }
  /// Moves the clock to `layer`. In cycle order only that layer's v moves; a
  /// layer skipped over (out-of-order access) gets its K recomputed too.
  void advance(std::size_t layer) noexcept {
    const std::size_t from = keys_.now();
    const std::size_t dist = keys_.advance(layer);  // 1 … L−1, or 0: the clock stays
    for (std::size_t i = 1; i <= dist; ++i) {
      const std::size_t l = from + i;
      mark(l >= n_layers_ ? l - n_layers_ : l);  // skipped + now
    }
  }

  // ---- estimates ------------------------------------------------------------
  double prob(std::size_t l, std::uint32_t s) const noexcept { return keys_.prob_of_key(l, use_[s].key); }

  // ---- layer keys and the trees ---------------------------------------------
  /// Layer l's K may have changed: recomputed at the next victim() (once,
  /// however many changes came before it).
  void mark(std::size_t l) noexcept {
    if (dirty_[l]) return;
    dirty_[l] = 1;
    dirty_list_.push_back(static_cast<std::uint32_t>(l));  // at most L listed: never reallocates
  }
  void flush() noexcept {
    for (std::uint32_t l : dirty_list_) {
      dirty_[l] = 0;
      refresh(l);
    }
    dirty_list_.clear();
  }
  /// Recomputes layer l's K from its front (no_k when the array is empty)
  /// and replays its path in its class's tree. Reads the front node only: its
  /// key is current (see use()) and it caches L / p.
  void refresh(std::size_t l) noexcept {
    const std::uint32_t h = head_[l];
    k_[l] = h == end_[l] ? no_k : keys_.next_visit(l) + keys_.l_over_p(l, nodes_[h]);
    // The next front's L / p, while nothing waits for it: it is the one
    // the next eviction from this layer needs (its divisions were on the
    // path from one eviction to the next).
    if (h + 1 < end_[l]) keys_.l_over_p(l, nodes_[h + 1]);
    trees_.update(l, detail::cycle_layer_keys::tree_key(k_[l]));
  }

  // ---- the layer arrays: layer l's at nodes_[head_[l], end_[l]) inside [l × E, (l + 1) × E)
  // Each layer keeps its entries sorted in its order (first = the next
  // victim at the front). Why a sorted array and not a heap: the order
  // moves only at a use, and a use only raises a key, so a used member
  // slides a few places towards the back (a hot entry, near the back
  // already); an entry inserted by a batch joins when that batch's
  // eviction ends (it cannot be a victim before), mostly near the front
  // (one use), where the array grows into the free room before its head;
  // and every victim is the front, popped by moving the head: O(1), and
  // the next front is the next node in memory, known before the pop is
  // decided. The order is total (ticks are unique), so the front is the
  // entry a heap would have had on top.

  /// Adds x to layer l's array, moving the shorter side by one place (one
  /// comparison with the middle node picks it; the move is an insertion
  /// step, a branch that mispredicts once, where a binary search would
  /// mispredict at every level).
  void insert_node(std::uint32_t l, const node& x) noexcept {
    node* const a = nodes_.data();
    const std::uint32_t h = head_[l], e = end_[l];
    const std::uint32_t lo = l * n_experts_, hi = lo + n_experts_;
    if (h != lo && (e == hi || h == e || detail::cycle_first(x, a[h + (e - h) / 2]))) {
      std::uint32_t i = h;
      for (; i != e && detail::cycle_first_lazy(a[i], x); ++i) {
        a[i - 1] = a[i];
        pos_[a[i - 1].slot] = i - 1;
      }
      a[i - 1] = x;
      pos_[x.slot] = i - 1;
      head_[l] = h - 1;
    } else {  // e != hi: the array holds at most E − 1 entries before this one
      std::uint32_t i = e;
      for (; i != h && detail::cycle_first_lazy(x, a[i - 1]); --i) {
        a[i] = a[i - 1];
        pos_[a[i].slot] = i;
      }
      a[i] = x;
      pos_[x.slot] = i;
      end_[l] = e + 1;
    }
  }
  /// Slot s of layer l leaves its array (an eviction, an invalidate());
  /// a deferred slot is cancelled.
  void erase(std::uint32_t l, std::uint32_t s) noexcept {
    node* const a = nodes_.data();
    const std::uint32_t h = head_[l], e = end_[l];
    if (h != e && a[h].slot == s) {  // the front (every victim): no lookup
      pos_[s] = none;
      head_[l] = h + 1;
      return;
    }
    if (deferred_[s] == 1) deferred_[s] = 2;  // a member is never due
    const std::uint32_t i = pos_[s];
    if (i == none) return;
    pos_[s] = none;
    if (i - h <= e - 1 - i) {  // close the gap from the shorter side
      for (std::uint32_t j = i; j != h; --j) {
        a[j] = a[j - 1];
        pos_[a[j].slot] = j;
      }
      head_[l] = h + 1;
    } else {
      for (std::uint32_t j = i + 1; j != e; ++j) {
        a[j - 1] = a[j];
        pos_[a[j - 1].slot] = j - 1;
      }
      end_[l] = e - 1;
    }
  }
  void stash_front(std::uint32_t l) noexcept {
    const std::uint32_t h = head_[l];
    pos_[nodes_[h].slot] = none;
    stash_.push_back(h);  // each slot at most once per eviction: never reallocates
    head_[l] = h + 1;
  }
  /// The reference: the same decision by scanning every layer's entries.
  template <class View>
  std::uint32_t victim_scan(const View& v) noexcept {
    auto& best_k = scan_k_;
    auto& best_l = scan_l_;
    auto& best_e = scan_e_;
    std::fill(best_k.begin(), best_k.end(), -1.0);
    std::fill(best_l.begin(), best_l.end(), no_slot);
    for (std::size_t l = 0; l < n_layers_; ++l) {
      std::uint32_t top = no_slot;  // first by the layer's order among evictable
      for (std::uint32_t e = 0; e < n_experts_; ++e) {
        const auto s = static_cast<std::uint32_t>(l * n_experts_ + e);
        if (pos_[s] == none || !v.evictable(s)) continue;
        if (top == no_slot || detail::cycle_before(use_[s].key, use_[s].last, use_[top].key, use_[top].last)) top = s;
      }
      if (top == no_slot) continue;
      const std::size_t c = class_of_[l];
      const double k = keys_.next_visit(l) + static_cast<double>(n_layers_) / prob(l, top);
      if (k > best_k[c]) {  // ties to the lower layer (scanned first)
        best_k[c] = k;
        best_l[c] = static_cast<std::uint32_t>(l);
        best_e[c] = top;
      }
    }
    double best = -1.0;
    std::uint32_t pick = no_slot;
    for (std::size_t c = 0; c < class_bytes_.size(); ++c) {
      if (best_l[c] == no_slot) continue;
      const double score = keys_.cost(class_bytes_[c], best_k[c]);
      if (score > best) {
        best = score;
        pick = best_e[c];
      }
    }
    return pick;
  }

  void use(std::uint32_t s, bool insert) noexcept {
    const std::uint32_t l = layer_of(s);
    use_state& u = use_[s];
    u.key += keys_.scale(l);  // usage += 1, in the layer's undecayed units
    u.last = ++tick_;
    ++occ_;
    const std::uint32_t i = pos_[s];
    if (i != none) {  // a member: its key grew, so it slides towards the back
      node* const a = nodes_.data();
      const node x{detail::cycle_bits_of(u.key), u.last, 0.0, s, 0};
      const std::uint32_t e = end_[l];
      std::uint32_t j = i + 1;
      for (; j != e && detail::cycle_first_lazy(a[j], x); ++j) {
        a[j - 1] = a[j];
        pos_[a[j - 1].slot] = j - 1;
      }
      a[j - 1] = x;
      pos_[s] = j - 1;
    }
    if (insert) {
      // Not a victim before this batch's eviction ends (the batch touched
      // it): it joins its array in end_eviction(), not stashed off its front.
      // deferred_: 0 not listed, 1 listed and due, 2 listed but cancelled.
      if (deferred_[s] == 0) deferred_list_.push_back(s);  // listed once: never reallocates
      deferred_[s] = 1;
    } else {
      mark(l);  // the front may have moved (a layer's use is its own batch: marked already)
    }
  }
  /// Advances layer l's decay by `tokens`; keeps its keys finite by rescaling
  /// them (a uniform positive factor: the order is unchanged, but the array
  /// is re-sorted in case rounding made two keys equal).
  void decay_layer(std::size_t l, double tokens) noexcept {
    if (keys_.decay(l, tokens)) {  // wrapped: forget the cached L / p of the layer
      for (std::uint32_t i = head_[l]; i < end_[l]; ++i) nodes_[i].q_epoch = 0;
    }
    if (!keys_.rescale_due(l)) return;
    const double f = keys_.rescale(l);
    const std::uint32_t base = static_cast<std::uint32_t>(l * n_experts_);
    for (std::uint32_t e = 0; e < n_experts_; ++e) use_[base + e].key *= f;
    node* const a = nodes_.data();
    const std::uint32_t h = head_[l], end = end_[l];
    for (std::uint32_t i = h; i < end; ++i) {  // insertion sort: already in order but for ties
      node x = a[i];
      x.key = detail::cycle_bits_of(use_[x.slot].key);
      x.q_epoch = 0;
      std::uint32_t j = i;
      for (; j > h && detail::cycle_first(x, a[j - 1]); --j) {
        a[j] = a[j - 1];
        pos_[a[j].slot] = j;
      }
      a[j] = x;
      pos_[x.slot] = j;
    }
  }
  cycle_policy_options o_;
  detail::cycle_layer_keys keys_;  // the layer clock, each layer's decay scale and epoch
  std::uint32_t n_experts_ = 1;
  std::uint32_t expert_shift_ = no_shift;  // log2(n_experts) when a power of two
  std::size_t n_layers_ = 1, top_k_ = 1;
  std::uint64_t tick_ = 0, occ_ = 0;
  // Per slot (layer × E + expert).
  std::vector<use_state> use_;
  std::vector<node> nodes_;         // the layer arrays
  std::vector<std::uint32_t> pos_;  // index in nodes_ while in its array, or none
  std::vector<std::uint8_t> deferred_;
  std::vector<std::uint32_t> deferred_list_, stash_;  // stash_: positions in nodes_
  // Per layer.
  std::vector<std::uint32_t> head_, end_;  // the array
  std::vector<double> k_;                  // K of the front, or no_k when empty
  std::vector<std::uint8_t> dirty_;
  std::vector<std::uint32_t> dirty_list_;
  std::vector<std::uint32_t> class_of_;
  // Per class (distinct expert size).
  std::vector<std::uint64_t> class_bytes_;
  detail::cache_tournament trees_;  // a tree per class over its layers' tree_key(K)
  std::vector<double> scan_k_;      // reference mode scratch
  std::vector<std::uint32_t> scan_l_, scan_e_;
};

}  // namespace moe_residency
