#pragma once
/// The session's `routed` events that read a routing in an engine's own
/// layout (session.hpp): one token's ids and weights, and a batch of int32
/// ids with row strides (routing_batch_view, as ggml stores ffn_moe_topk).
/// Each checks the layout, copies it into the session's routings and hands
/// them to the session's common path (accept_routings); a routing wider than
/// max_top_k is declined. Member definitions of the session class, declared
/// there; session.hpp includes this header after the class, and this header
/// includes session.hpp, so either one gives both.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "moe_residency/core.hpp"
#include "moe_residency/session.hpp"
#include "moe_residency/session_types.hpp"

namespace moe_residency {

template <class... P, class... X>
inline bool session<predictor_set<P...>, X...>::routed(layer_id l, const expert_id* ids, const float* weights,
                                                       std::size_t k) {
  if (!check_routing_event(l, 1)) return false;
  if (!ids)
    return anomaly(anomaly_kind::routing_shape, [&] { return where(l) + "routed: ids is null; expected k ids"; });
  if (k == 0) return anomaly(anomaly_kind::routing_shape, [&] { return where(l) + "routed: k is 0; expected k >= 1"; });
  bool declined = false;
  if (k > max_top_k) {
    declined = true;
  } else {
    buffer_[0].assign(ids, weights, k);
    buffer_[0].layer = l;
  }
  return accept_routings(l, 1, declined ? &declined : nullptr);
}

template <class... P, class... X>
inline bool session<predictor_set<P...>, X...>::routed(layer_id l, const routing_batch_view& b) {
  if (!check_routing_event(l, b.n_tokens)) return false;
  if (!b.ids)
    return anomaly(anomaly_kind::routing_shape,
                   [&] { return where(l) + "routed: routing_batch_view::ids is null; expected k ids per token"; });
  if (b.k == 0)
    return anomaly(anomaly_kind::routing_shape,
                   [&] { return where(l) + "routed: routing_batch_view::k is 0; expected k >= 1"; });
  const std::size_t is = b.ids_row_stride_bytes ? b.ids_row_stride_bytes : b.k * 4;
  const std::size_t ws = b.weights_row_stride_bytes ? b.weights_row_stride_bytes : b.k * 4;
  if (is < b.k * 4 || is % 4)
    return anomaly(anomaly_kind::routing_shape, [&] {
      return where(l) + "routed: ids_row_stride_bytes " + std::to_string(is) + " for k " + std::to_string(b.k) +
             "; expected a multiple of 4 >= k * 4 = " + std::to_string(b.k * 4) + " (or 0 = packed)";
    });
  if (b.weights && (ws < b.k * 4 || ws % 4))
    return anomaly(anomaly_kind::routing_shape, [&] {
      return where(l) + "routed: weights_row_stride_bytes " + std::to_string(ws) + " for k " + std::to_string(b.k) +
             "; expected a multiple of 4 >= k * 4 = " + std::to_string(b.k * 4) + " (or 0 = packed)";
    });
  const std::size_t n = b.n_tokens;
  if (b.k > max_top_k) {
    bool declined = true;
    return accept_routings(l, n, &declined);
  }
  for (std::size_t t = 0; t < n; ++t) {
    const auto* ids = reinterpret_cast<const std::int32_t*>(reinterpret_cast<const unsigned char*>(b.ids) + t * is);
    const float* w = b.weights ? row(b.weights, t, ws) : nullptr;
    routing& r = buffer_[t];
    r.clear();
    r.layer = l;
    for (std::size_t i = 0; i < b.k; ++i) {
      if (ids[i] < 0 || static_cast<std::size_t>(ids[i]) >= shape_.n_experts())
        return anomaly(anomaly_kind::expert_out_of_range, [&] {
          return where(l) + "routed: token " + std::to_string(token_of_row(n, t)) + " slot " + std::to_string(i) +
                 ": expert " + std::to_string(ids[i]) + " out of range [0, " + std::to_string(shape_.n_experts()) + ")";
        });
      r.push_back(expert_id(static_cast<std::uint16_t>(ids[i])), w ? w[i] : std::numeric_limits<float>::quiet_NaN());
    }
  }
  return accept_routings(l, n, nullptr);
}

}  // namespace moe_residency
