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
/// own batches). So K(j) = v(j) + L / p(top of j) is time-invariant, and
/// ETNU = bytes(j) × (K(j) − t − L): within one byte size the largest K is
/// the victim at every t. Each layer keeps a heap of its entries (ordered by a
/// time-invariant usage key) and its K; each byte size keeps a tournament tree
/// over its layers' K; a victim is the best of the size winners (C = number
/// of distinct expert sizes, 1–3 in practice).
///
/// Cost, per access: O(log E) (a use raises the entry's key and sifts its
/// heap node down, so a heap's top is always current and an eviction reads
/// nodes only, never the cold slot of an entry unused for many tokens; an
/// entry inserted by the batch joins its heap when the batch's eviction
/// ends, since it cannot be a victim before). Per eviction: O(log E + log L);
/// a layer's K is recomputed (three divisions, skipped when its top node's
/// L / p is cached from the same decay epoch) at most once per eviction
/// round, only for the layers that changed. No exp or log on the hot path.
///
/// Never collapses below the token cycle: the layer just used has the
/// largest d.
///
/// Why this header is long: the rule is kept exact by several structures that
/// must agree at every eviction (layer heaps whose nodes copy the keys, keys
/// recomputed only for changed layers, L / p cached per heap node, a
/// tournament tree per byte size), each next to the comment that says why it does not change a
/// decision; tests/test_cache.cpp holds them to a slow twin that recomputes
/// the rule from scratch at every eviction. Splitting them across headers
/// would separate each invariant from the code that relies on it.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "moe_residency/cache/expert_cache.hpp"

namespace moe_residency {

/// Tuning of cycle_policy.
struct cycle_policy_options {
  /// Decay of usage per token of the layer, in (0, 1). Effective memory is
  /// about 1 / (1 − decay) tokens.
  double decay = 0.9;
  /// Pseudo-uses of the prior p0 = k / n_experts blended into the estimate.
  double prior_weight = 1.0;
  /// Multiply ETNU by the entry's bytes (free the most bytes per expected
  /// step first) — matters only when expert bytes differ between layers.
  bool weigh_bytes = true;
  /// Reference mode for tests: find each victim by scanning every layer
  /// (O(L × E) per eviction) instead of the heaps and trees. Same decisions.
  bool reference_scan = false;
};

class cycle_policy : public policy_base {
 public:
  static constexpr const char* name = "cycle";
  static constexpr bool collapses_below_cycle = false;

  /// Throws error on a decay outside (0, 1) or a negative prior weight.
  explicit cycle_policy(cycle_policy_options o = {}) : o_(o) {
    if (!(o_.decay > 0.0 && o_.decay < 1.0))
      throw error("cycle_policy: decay " + std::to_string(o_.decay) + " out of range; expected (0, 1)");
    if (!(o_.prior_weight >= 0.0))
      throw error("cycle_policy: prior_weight " + std::to_string(o_.prior_weight) +
                  " out of range; expected >= 0");
    inv_decay_ = 1.0 / o_.decay;
  }

  void init(const model_shape& shape, std::uint64_t /*budget*/) {
    n_experts_ = static_cast<std::uint32_t>(shape.n_experts());
    expert_shift_ = 0;
    while ((std::uint32_t{1} << expert_shift_) < n_experts_) ++expert_shift_;
    if ((std::uint32_t{1} << expert_shift_) != n_experts_) expert_shift_ = no_shift;
    n_layers_ = shape.n_layers();
    top_k_ = shape.top_k();
    p0_ = static_cast<double>(shape.top_k()) / static_cast<double>(shape.n_experts());
    const std::size_t n_slots = n_layers_ * n_experts_;
    use_.assign(n_slots, use_state{});
    nodes_.assign(n_slots, node{});
    pos_.assign(n_slots, none);
    deferred_.assign(n_slots, 0);
    deferred_list_.clear();
    deferred_list_.reserve(n_slots);
    stash_.clear();
    stash_.reserve(n_slots);
    size_.assign(n_layers_, 0);
    scale_.assign(n_layers_, 1.0);
    epoch_.assign(n_layers_, 1);
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
    // A tournament tree per class over its layers, ascending: node i's
    // children are 2i and 2i + 1, leaves at [P, 2P), each node holds the
    // layer with the largest K below it (ties to the left, the lower layer).
    leaf_of_.assign(n_layers_, 0);
    tree_root_.assign(class_bytes_.size(), 0);
    tree_.clear();
    for (std::size_t c = 0; c < class_bytes_.size(); ++c) {
      std::uint32_t n = 0;
      for (std::size_t l = 0; l < n_layers_; ++l)
        if (class_of_[l] == c) ++n;
      std::uint32_t p = 1;
      while (p < n) p *= 2;
      const auto off = static_cast<std::uint32_t>(tree_.size());
      tree_root_[c] = off + 1;
      tree_.resize(tree_.size() + 2 * p, tree_node{no_k, static_cast<std::uint32_t>(n_layers_)});  // padding
      n = 0;
      for (std::size_t l = 0; l < n_layers_; ++l)
        if (class_of_[l] == c) {
          leaf_of_[l] = off + p + n++;
          tree_[leaf_of_[l]].layer = static_cast<std::uint32_t>(l);
        }
      for (std::uint32_t i = p; i-- > 1;) tree_[off + i] = tree_[off + 2 * i];  // all no_k: the left
    }
    scan_k_.assign(class_bytes_.size(), -1.0);
    scan_l_.assign(class_bytes_.size(), no_slot);
    scan_e_.assign(class_bytes_.size(), no_slot);
    now_ = n_layers_ - 1;
    t_ = 0;
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
      const std::uint32_t root = tree_root_[c];
      std::uint32_t l = tree_[root].layer;
      for (;;) {
        if (k_[l] == no_k) break;  // every layer of the class is empty
        const std::uint32_t base = l * n_experts_;
        if (v.evictable(nodes_[base].slot)) break;
        // The top cannot go (touched by this batch, pinned): set it aside
        // until end_eviction(), with every next top that cannot go either.
        do {
          stash_top(l);
        } while (size_[l] != 0 && !v.evictable(nodes_[base].slot));
        refresh(l);
        l = tree_[root].layer;
      }
      if (k_[l] == no_k) continue;
      const double score = cost(class_bytes_[c], k_[l]);
      if (score > best) {
        best = score;
        best_l = l;
      }
    }
    return best_l == no_slot ? no_slot : nodes_[best_l * n_experts_].slot;
  }
  void end_eviction() noexcept {
    for (std::uint32_t s : stash_) {
      const std::uint32_t l = layer_of(s);
      push(l, s);
      mark(l);
    }
    stash_.clear();
    for (std::uint32_t s : deferred_list_) {
      if (deferred_[s] == 1) {
        const std::uint32_t l = layer_of(s);
        push(l, s);
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
    const double d = static_cast<double>(steps_to(l, to_index(now)));
    const double L = static_cast<double>(n_layers_);
    return d + L * (1.0 / prob(l, static_cast<std::uint32_t>(l * n_experts_ + to_index(expert))) - 1.0);
  }

 private:
  static constexpr std::uint32_t none = 0xffffffffu;
  static constexpr std::uint32_t no_shift = 0xffffffffu;
  static constexpr double no_k = -std::numeric_limits<double>::infinity();

  /// A slot's usage key (usage × γ^−τ(layer), order-preserving within a
  /// layer) and the tick of its last use: the layer order is (key, last),
  /// a total order (ticks are unique), so any heap shape has the same top.
  struct use_state {
    double key = 0.0;
    std::uint64_t last = 0;
  };
  /// A heap member: a copy of its order key, kept current by use() (so a
  /// refresh reads the node, not the slot's line: the top is usually an
  /// entry unused for many tokens, whose slot line is cold), its slot and
  /// its cached L / p. The key is held as its bits: keys are finite and
  /// >= +0 (uses add, rescaling multiplies by a positive factor), and for
  /// those the bits order as the values do, so a sift compares integers.
  struct node {
    std::uint64_t key = 0;
    std::uint64_t last = 0;
    double q = 0.0;               // cached L / p (see l_over_p)
    std::uint32_t slot = 0;
    std::uint32_t q_epoch = 0;    // the layer epoch q belongs to (0: none)
  };
  static bool before(double ka, std::uint64_t la, double kb, std::uint64_t lb) noexcept {
    return (ka < kb) | ((ka == kb) & (la < lb));  // branch-free
  }
  static bool first(const node& a, const node& b) noexcept {
    return (a.key < b.key) | ((a.key == b.key) & (a.last < b.last));  // branch-free
  }
  static std::uint64_t bits_of(double d) noexcept {
    std::uint64_t b;
    std::memcpy(&b, &d, sizeof b);
    return b;
  }
  static double double_of(std::uint64_t b) noexcept {
    double d;
    std::memcpy(&d, &b, sizeof d);
    return d;
  }

  // ---- the layer clock ----------------------------------------------------
  /// Absolute step of layer l's next visit, seen from the clock (t_, now_).
  double next_visit(std::size_t l) const noexcept { return static_cast<double>(t_ + steps_to(l, now_)); }
  /// Layer steps from `from` to l's next visit, 1 … L: (l + L − from − 1) mod L + 1
  /// for l, from < L, without a division.
  std::size_t steps_to(std::size_t l, std::size_t from) const noexcept {
    const std::size_t r = l + n_layers_ - from - 1;  // 0 … 2L − 2
    return (r >= n_layers_ ? r - n_layers_ : r) + 1;
  }
  std::uint32_t layer_of(std::uint32_t s) const noexcept {
    return expert_shift_ != no_shift ? s >> expert_shift_ : s / n_experts_;
  }
  /// Moves the clock to `layer`. In cycle order only that layer's v moves; a
  /// layer skipped over (out-of-order access) gets its K recomputed too.
  void advance(std::size_t layer) noexcept {
    if (layer == now_ || layer >= n_layers_) return;
    const std::size_t dist = steps_to(layer, now_);  // 1 … L−1
    const std::size_t from = now_;
    t_ += dist;
    now_ = layer;
    for (std::size_t i = 1; i <= dist; ++i) {
      const std::size_t l = from + i;
      mark(l >= n_layers_ ? l - n_layers_ : l);  // skipped + now
    }
  }

  // ---- estimates ------------------------------------------------------------
  double prob(std::size_t l, std::uint32_t s) const noexcept { return prob_of_key(l, use_[s].key); }
  /// p of an entry of layer l whose key is `key` (usage = key / scale).
  double prob_of_key(std::size_t l, double key) const noexcept {
    // Decayed count → per-token rate: u converges to r / (1 − γ) at rate r.
    const double w = 1.0 - o_.decay;
    const double rate = (key / scale_[l] * w + o_.prior_weight * p0_ * w) / (1.0 + o_.prior_weight * w);
    return rate > 1.0 ? 1.0 : (rate < 1e-9 ? 1e-9 : rate);
  }
  /// L / p of heap node n of layer l: constant while neither its key nor
  /// its layer's scale moves, so cached in the node with the layer's decay
  /// epoch (a use clears it; a node built by push() has none). Same value,
  /// bit for bit, as computed.
  double l_over_p(std::size_t l, node& n) noexcept {
    if (n.q_epoch == epoch_[l]) return n.q;
    const double q = static_cast<double>(n_layers_) / prob_of_key(l, double_of(n.key));
    n.q = q;
    n.q_epoch = epoch_[l];
    return q;
  }
  /// ETNU × bytes of a layer with key K at the current clock.
  double cost(std::uint64_t bytes, double k) const noexcept {
    const double steps = k - static_cast<double>(t_) - static_cast<double>(n_layers_);
    return steps * static_cast<double>(bytes);
  }

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
  /// Recomputes layer l's K from its heap top (no_k when the heap is empty)
  /// and replays its path in its class's tree. Reads the top node only: its
  /// key is current (see use()) and it caches L / p.
  void refresh(std::size_t l) noexcept {
    const std::uint32_t base = static_cast<std::uint32_t>(l * n_experts_);
    k_[l] = size_[l] == 0 ? no_k : next_visit(l) + l_over_p(l, nodes_[base]);
    tree_update(l, k_[l]);
  }

  /// Replays leaf l's path to its class's root: each node holds the larger
  /// K of its children, ties to the left (the lower layer); only the sibling
  /// is read at each level. The K rides up as a plain max (one instruction
  /// on the path from one eviction to the next: equal Ks are the same value,
  /// as no K is ±0 or NaN, so the tie rule only picks the layer), the layer
  /// beside it by a bit mask, not a branch (which child wins is data-dependent).
  void tree_update(std::size_t l, double k) noexcept {
    tree_node* const t = tree_.data();
    std::uint32_t i = leaf_of_[l], cl = static_cast<std::uint32_t>(l);
    t[i].k = k;
    double cur = k;
    // Node r of a class's tree is at base + r: root 1, children 2r and 2r + 1.
    const std::uint32_t root = tree_root_[class_of_[l]], base = root - 1;
    while (i != root) {
      const tree_node& sib = t[base + ((i - base) ^ 1u)];
      const double sk = sib.k;
      const bool left = ((i - base) & 1u) == 0;
      const bool keep = (cur > sk) | (left & (cur == sk));
      const std::uint32_t m = 0u - static_cast<std::uint32_t>(keep);
      cl = (cl & m) | (sib.layer & ~m);
      cur = cur < sk ? sk : cur;
      i = base + ((i - base) >> 1);
      t[i].k = cur;
      t[i].layer = cl;
    }
  }

  // ---- the layer heaps: layer l's at nodes_[l × E, l × E + size_[l]) ----------
  // The order is total (ticks are unique), so the top is the same entry
  // whatever the heap's shape (a four-ary heap measured no faster).
  void push(std::uint32_t l, std::uint32_t s) noexcept {
    const std::uint32_t base = l * n_experts_;
    up(base, size_[l]++, node{bits_of(use_[s].key), use_[s].last, 0.0, s, 0});
  }
  void erase(std::uint32_t l, std::uint32_t s) noexcept {
    const std::uint32_t base = l * n_experts_;
    std::uint32_t i = 0;
    if (size_[l] == 0 || nodes_[base].slot != s) {  // not the top (a victim is): look it up
      if (deferred_[s] == 1) deferred_[s] = 2;        // a heap member is never due
      i = pos_[s];
      if (i == none) return;
    }
    const std::uint32_t n = --size_[l];
    pos_[s] = none;
    if (i == n) return;
    const node last = nodes_[base + n];
    if (i == 0) {
      // The top (every eviction): walk the hole down the first children to
      // a leaf, one comparison a level and no data-dependent exit, then
      // sift the last node up from there (it was a leaf: rarely far).
      node* const h = nodes_.data() + base;
      std::uint32_t j = 0;
      for (std::uint32_t c = 1; c < n; c = 2 * j + 1) {
        if (c + 1 < n) c += static_cast<std::uint32_t>(first(h[c + 1], h[c]));
        h[j] = h[c];
        pos_[h[j].slot] = j;
        j = c;
      }
      up(base, j, last);
    } else if (first(last, nodes_[base + (i - 1) / 2]))
      up(base, i, last);
    else
      down(base, n, i, last);
  }
  void stash_top(std::uint32_t l) noexcept {
    const std::uint32_t s = nodes_[l * n_experts_].slot;
    erase(l, s);
    stash_.push_back(s);  // each slot at most once per eviction: never reallocates
  }
  void up(std::uint32_t base, std::uint32_t i, const node n) noexcept {
    node* const h = nodes_.data() + base;
    while (i > 0) {
      const std::uint32_t p = (i - 1) / 2;
      if (!first(n, h[p])) break;
      h[i] = h[p];
      pos_[h[i].slot] = i;
      i = p;
    }
    h[i] = n;
    pos_[n.slot] = i;
  }
  void down(std::uint32_t base, std::uint32_t n_nodes, std::uint32_t i, const node n) noexcept {
    node* const h = nodes_.data() + base;
    for (;;) {
      std::uint32_t c = 2 * i + 1;
      if (c >= n_nodes) break;
      // The first child by arithmetic, not a branch (data-dependent).
      if (c + 1 < n_nodes) c += static_cast<std::uint32_t>(first(h[c + 1], h[c]));
      if (!first(h[c], n)) break;
      h[i] = h[c];
      pos_[h[i].slot] = i;
      i = c;
    }
    h[i] = n;
    pos_[n.slot] = i;
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
        if (top == no_slot || before(use_[s].key, use_[s].last, use_[top].key, use_[top].last)) top = s;
      }
      if (top == no_slot) continue;
      const std::size_t c = class_of_[l];
      const double k = next_visit(l) + static_cast<double>(n_layers_) / prob(l, top);
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
      const double score = cost(class_bytes_[c], best_k[c]);
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
    u.key += scale_[l];  // usage += 1, in the layer's undecayed units
    u.last = ++tick_;
    ++occ_;
    const std::uint32_t i = pos_[s];
    if (i != none) {  // a heap member: its key grew, so it can only sift down
      const std::uint32_t base = l * n_experts_;
      down(base, size_[l], i, node{bits_of(u.key), u.last, 0.0, s, 0});
    }
    if (insert) {
      // Not a victim before this batch's eviction ends (the batch touched
      // it): it joins the heap in end_eviction(), not stashed off its top.
      // deferred_: 0 not listed, 1 listed and due, 2 listed but cancelled.
      if (deferred_[s] == 0) deferred_list_.push_back(s);  // listed once: never reallocates
      deferred_[s] = 1;
    } else {
      mark(l);  // the top may have moved later (a layer's use is its own batch: marked already)
    }
  }
  /// Advances layer l's decay by `tokens`; keeps its keys finite by rescaling
  /// them (a uniform positive factor: the order is unchanged, but the heap
  /// is rebuilt in case rounding made two keys equal).
  void decay_layer(std::size_t l, double tokens) noexcept {
    scale_[l] *= tokens == 1.0 ? inv_decay_ : std::pow(inv_decay_, tokens);
    const std::uint32_t base = static_cast<std::uint32_t>(l * n_experts_);
    if (++epoch_[l] == 0) {  // wrapped: forget the cached L / p of the layer
      for (std::uint32_t i = 0; i < size_[l]; ++i) nodes_[base + i].q_epoch = 0;
      epoch_[l] = 1;
    }
    if (scale_[l] < 1e150) return;
    const double f = 1.0 / scale_[l];
    for (std::uint32_t e = 0; e < n_experts_; ++e) use_[base + e].key *= f;
    scale_[l] = 1.0;
    const std::uint32_t n = size_[l];
    for (std::uint32_t i = 0; i < n; ++i) nodes_[base + i].key = bits_of(use_[nodes_[base + i].slot].key);
    for (std::uint32_t i = n / 2; i-- > 0;) down(base, n, i, nodes_[base + i]);
  }

  cycle_policy_options o_;
  double inv_decay_ = 1.0, p0_ = 0.0;
  std::uint32_t n_experts_ = 1;
  std::uint32_t expert_shift_ = no_shift;  // log2(n_experts) when a power of two
  std::size_t n_layers_ = 1, top_k_ = 1, now_ = 0;
  std::uint64_t tick_ = 0, occ_ = 0, t_ = 0;
  // Per slot (layer × E + expert).
  std::vector<use_state> use_;
  std::vector<node> nodes_;               // the layer heaps
  std::vector<std::uint32_t> pos_;        // heap position within its layer, or none
  std::vector<std::uint8_t> deferred_;
  std::vector<std::uint32_t> deferred_list_, stash_;
  // Per layer.
  std::vector<std::uint32_t> size_;       // heap size
  std::vector<double> scale_;             // γ^−τ(l): usage(l, e) = key / scale
  std::vector<std::uint32_t> epoch_;      // advances with scale_
  std::vector<double> k_;                 // K of the heap top, or no_k when empty
  std::vector<std::uint8_t> dirty_;
  std::vector<std::uint32_t> dirty_list_;
  std::vector<std::uint32_t> class_of_, leaf_of_;  // leaf_of_: index in tree_
  // Per class (distinct expert size).
  std::vector<std::uint64_t> class_bytes_;
  struct tree_node {
    double k;
    std::uint32_t layer;
  };
  std::vector<tree_node> tree_;               // every class's tree (see init)
  std::vector<std::uint32_t> tree_root_;
  std::vector<double> scan_k_;             // reference mode scratch
  std::vector<std::uint32_t> scan_l_, scan_e_;
};

}  // namespace moe_residency
