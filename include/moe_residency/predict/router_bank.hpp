#pragma once
/// The routers gate predictors read: a `router_bank` holds, per MoE layer, a
/// view of the host's dense router weight and the layer's selection rule.
/// Views only: the host keeps the weights alive while the bank is used.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/router.hpp"

namespace moe_residency {

/// One MoE layer's router as the host exposes it: a view of the dense weight
/// and the layer's selection rule.
struct layer_router {
  matrix_view matrix;
  router_spec spec;
};

/// The router of every MoE layer that has one, by layer. Dense layers and
/// layers the host has not described yet have none. Views are not copied:
/// the host keeps the weights alive while the bank is used.
class router_bank {
 public:
  router_bank() = default;
  explicit router_bank(const model_shape& shape)
      : shape_(shape), routers_(shape.n_layers()), present_(shape.n_layers(), 0) {}

  const model_shape& shape() const noexcept { return shape_; }

  /// Registers layer l's router. Throws `error` when l is out of range or
  /// dense, the view is unreadable, the spec is invalid, rows or
  /// spec.n_experts differ from the shape's experts, or the columns differ
  /// from the embedding length of routers set before.
  void set(layer_id l, const matrix_view& w, router_spec spec) {
    const std::string who = "router_bank: layer " + std::to_string(to_index(l)) + ": ";
    if (to_index(l) >= routers_.size())
      throw error(who + "out of range; expected [0, " + std::to_string(routers_.size()) + ")");
    if (!shape_.is_moe(l)) throw error(who + "is dense; expected a MoE layer");
    w.validate(("router_bank: layer " + std::to_string(to_index(l)) + " matrix").c_str());
    spec.validate();
    if (w.rows != shape_.n_experts() || spec.n_experts != shape_.n_experts())
      throw error(who + "router has " + std::to_string(w.rows) + " rows and spec " + std::to_string(spec.n_experts) +
                  " experts; expected " + std::to_string(shape_.n_experts()) + " (the model's experts)");
    if (n_embd_ != 0 && w.cols != n_embd_)
      throw error(who + "router has " + std::to_string(w.cols) + " columns; expected the embedding length " +
                  std::to_string(n_embd_) + " of the routers set before");
    n_embd_ = w.cols;
    routers_[to_index(l)] = layer_router{w, std::move(spec)};
    present_[to_index(l)] = 1;
  }
  /// Same as set (the name a session uses).
  void set_router(layer_id l, const matrix_view& w, router_spec spec) { set(l, w, std::move(spec)); }
  /// Layer l's router, or null when it has none (dense, or not set yet).
  const layer_router* find(layer_id l) const noexcept {
    const std::size_t i = to_index(l);
    return i < present_.size() && present_[i] ? &routers_[i] : nullptr;
  }
  /// The gate input's length (0 until a router is set).
  std::size_t n_embd() const noexcept { return n_embd_; }
  /// Routers set.
  std::size_t size() const noexcept {
    std::size_t n = 0;
    for (auto p : present_) n += p;
    return n;
  }

 private:
  model_shape shape_;
  std::vector<layer_router> routers_;
  std::vector<std::uint8_t> present_;
  std::size_t n_embd_ = 0;
};

}  // namespace moe_residency
