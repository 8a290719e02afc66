#pragma once
/// The per-layer key arithmetic of cycle_policy (moe_residency/cache/cycle.hpp,
/// which says why these keys make the rule exact): an entry's usage key and
/// its order within a layer, the layer-array node that carries a copy of it,
/// and cycle_layer_keys, which holds the layer clock and each layer's decay
/// scale and computes p, the cached L / p of a node, a layer's K and its
/// cost, and the integer form of K its tournament tree orders.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace moe_residency {
namespace detail {

/// An array member: a copy of its order key, kept current by use() (so a
/// refresh reads the node, not the slot's line: the front is usually an
/// entry unused for many tokens, whose slot line is cold), its slot and
/// its cached L / p. The key is held as its bits: keys are finite and
/// >= +0 (uses add, rescaling multiplies by a positive factor), and for
/// those the bits order as the values do, so a move compares integers.
struct cycle_node {
  std::uint64_t key = 0;
  std::uint64_t last = 0;
  double q = 0.0;  // cached L / p (see l_over_p)
  std::uint32_t slot = 0;
  std::uint32_t q_epoch = 0;  // the layer epoch q belongs to (0: none)
};

/// The layer order, (key, last), on a slot's usage key and the tick of its last use.
inline bool cycle_before(double ka, std::uint64_t la, double kb, std::uint64_t lb) noexcept {
  return (ka < kb) | ((ka == kb) & (la < lb));  // branch-free
}
/// cycle_first() for a loop whose exit is its only unpredictable branch: the
/// ticks are compared only on equal keys (rare but for fresh entries).
inline bool cycle_first_lazy(const cycle_node& a, const cycle_node& b) noexcept {
  return a.key < b.key || (a.key == b.key && a.last < b.last);
}
inline bool cycle_first(const cycle_node& a, const cycle_node& b) noexcept {
  return (a.key < b.key) | ((a.key == b.key) & (a.last < b.last));  // branch-free
}
inline std::uint64_t cycle_bits_of(double d) noexcept {
  std::uint64_t b;
  std::memcpy(&b, &d, sizeof b);
  return b;
}
inline double cycle_double_of(std::uint64_t b) noexcept {
  double d;
  std::memcpy(&d, &b, sizeof d);
  return d;
}

class cycle_layer_keys {
 public:
  /// The K of an empty layer.
  static constexpr double no_k = -std::numeric_limits<double>::infinity();

  /// decay in (0, 1), prior_weight >= 0 (checked by the policy).
  cycle_layer_keys(double decay, double prior_weight) noexcept
      : decay_(decay), prior_weight_(prior_weight), inv_decay_(1.0 / decay) {}

  /// n_layers layers, prior p0 = k / n_experts; the clock at the last layer,
  /// every layer's usage undecayed.
  void reset(std::size_t n_layers, double p0) {
    n_layers_ = n_layers;
    p0_ = p0;
    scale_.assign(n_layers_, 1.0);
    epoch_.assign(n_layers_, 1);
    now_ = n_layers_ - 1;
    t_ = 0;
  }

  // ---- the layer clock ----------------------------------------------------
  /// The layer the clock is at (the layer just processed).
  std::size_t now() const noexcept { return now_; }
  /// Absolute step of layer l's next visit, seen from the clock (t_, now_).
  double next_visit(std::size_t l) const noexcept { return static_cast<double>(t_ + steps_to(l, now_)); }
  /// Layer steps from `from` to l's next visit, 1 … L: (l + L − from − 1) mod L + 1
  /// for l, from < L, without a division.
  std::size_t steps_to(std::size_t l, std::size_t from) const noexcept {
    const std::size_t r = l + n_layers_ - from - 1;  // 0 … 2L − 2
    return (r >= n_layers_ ? r - n_layers_ : r) + 1;
  }
  /// Moves the clock to `layer`; returns the steps it moved, 1 … L−1, or 0
  /// when it stays (`layer` is the layer just processed, or out of range).
  std::size_t advance(std::size_t layer) noexcept {
    if (layer == now_ || layer >= n_layers_) return 0;
    const std::size_t dist = steps_to(layer, now_);  // 1 … L−1
    t_ += dist;
    now_ = layer;
    return dist;
  }

  // ---- estimates ------------------------------------------------------------
  /// γ^−τ(l): a use adds it to a key, and usage(l, e) = key / scale.
  double scale(std::size_t l) const noexcept { return scale_[l]; }
  /// p of an entry of layer l whose key is `key` (usage = key / scale).
  double prob_of_key(std::size_t l, double key) const noexcept {
    // Decayed count → per-token rate: u converges to r / (1 − γ) at rate r.
    const double w = 1.0 - decay_;
    const double rate = (key / scale_[l] * w + prior_weight_ * p0_ * w) / (1.0 + prior_weight_ * w);
    return rate > 1.0 ? 1.0 : (rate < 1e-9 ? 1e-9 : rate);
  }
  /// L / p of node n of layer l: constant while neither its key nor
  /// its layer's scale moves, so cached in the node with the layer's decay
  /// epoch (a use clears it; a node built for an insert has none). Same value,
  /// bit for bit, as computed.
  double l_over_p(std::size_t l, cycle_node& n) noexcept {
    if (n.q_epoch == epoch_[l]) return n.q;
    const double q = static_cast<double>(n_layers_) / prob_of_key(l, cycle_double_of(n.key));
    n.q = q;
    n.q_epoch = epoch_[l];
    return q;
  }
  /// ETNU × bytes of a layer with key K at the current clock.
  double cost(std::uint64_t bytes, double k) const noexcept {
    const double steps = k - static_cast<double>(t_) - static_cast<double>(n_layers_);
    return steps * static_cast<double>(bytes);
  }
  /// A K as the tree orders it: the bits of a K (finite, >= 1) order as its
  /// value; an empty layer's no_k is 0, below every K.
  static std::uint64_t tree_key(double k) noexcept { return k == no_k ? 0 : cycle_bits_of(k); }

  // ---- decay ----------------------------------------------------------------
  /// Advances layer l's decay by `tokens` (a new epoch); returns true when
  /// the epoch wrapped: the caller forgets the cached L / p of the layer.
  bool decay(std::size_t l, double tokens) noexcept {
    scale_[l] *= tokens == 1.0 ? inv_decay_ : std::pow(inv_decay_, tokens);
    if (++epoch_[l] != 0) return false;
    epoch_[l] = 1;
    return true;
  }
  /// Layer l's scale is large enough that its keys must be rescaled to stay finite.
  bool rescale_due(std::size_t l) const noexcept { return !(scale_[l] < 1e150); }
  /// Resets layer l's scale to 1; returns the factor its keys are multiplied by.
  double rescale(std::size_t l) noexcept {
    const double f = 1.0 / scale_[l];
    scale_[l] = 1.0;
    return f;
  }

 private:
  double decay_, prior_weight_, inv_decay_, p0_ = 0.0;
  std::size_t n_layers_ = 1, now_ = 0;
  std::uint64_t t_ = 0;
  std::vector<double> scale_;         // γ^−τ(l): usage(l, e) = key / scale
  std::vector<std::uint32_t> epoch_;  // advances with scale_
};

}  // namespace detail
}  // namespace moe_residency
