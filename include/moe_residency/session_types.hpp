#pragma once
/// The session's vocabulary (session.hpp): what it does with an anomaly and
/// the kinds it detects, its options, the views of gate inputs and routings
/// an engine hands it, and the anomaly counts. No third-party dependency.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "moe_residency/core.hpp"
#include "moe_residency/score.hpp"

namespace moe_residency {

/// What the session does with an out-of-order or malformed event.
enum class anomaly_action {
  throw_error,  ///< throw `error` naming the event (tests, development)
  count,        ///< count it, report it, ignore the event (engines, C callbacks)
};

// The one list of anomaly kinds, in enumerator order: X(name, the report's
// text), each after a comment saying what it is. The enum, anomaly_kind_count
// and to_string are generated from it, so a kind cannot be added without them.
#define MOE_RESIDENCY_ANOMALY_KINDS(X)                           \
  /* an event before begin_batch */                              \
  X(no_batch, "event before begin_batch")                        \
  /* begin_batch with 0 tokens */                                \
  X(bad_batch, "empty batch")                                    \
  /* a layer index beyond the shape */                           \
  X(layer_out_of_range, "layer out of range")                    \
  /* a gate input or routing for a dense layer */                \
  X(dense_layer, "event for a dense layer")                      \
  /* a batch ended after a gate input but before its routing */  \
  X(token_boundary_mid_layer, "token boundary mid-layer")        \
  /* a routing for a layer whose gate input never came */        \
  X(routing_without_gate_input, "routing without gate input")    \
  /* a second gate input for a layer in one batch */             \
  X(duplicate_gate_input, "duplicate gate input")                \
  /* a second routing for a layer in one batch */                \
  X(duplicate_routing, "duplicate routing")                      \
  /* null data, wrong length, short stride, wrong token count */ \
  X(gate_input_shape, "malformed gate input")                    \
  /* a NaN (or infinity) in a gate input */                      \
  X(nan_gate_input, "NaN in a gate input")                       \
  /* null ids, k of 0, wrong token count */                      \
  X(routing_shape, "malformed routing")                          \
  /* an expert id outside [0, n_experts) */                      \
  X(expert_out_of_range, "expert out of range")                  \
  /* an expert twice in one routing */                           \
  X(duplicate_expert, "duplicate expert in a routing")           \
  /* layer_loaded before the layer's routing */                  \
  X(loaded_without_routing, "layer loaded before its routing")   \
  /* a batch whose last position would pass 2^32 - 1 */          \
  X(position_overflow, "positions past 2^32 - 1")

/// The kinds of anomaly the session detects (listed above).
enum class anomaly_kind : std::uint8_t {
#define MOE_RESIDENCY_ANOMALY_ENUMERATOR(name, text) name,
  MOE_RESIDENCY_ANOMALY_KINDS(MOE_RESIDENCY_ANOMALY_ENUMERATOR)
#undef MOE_RESIDENCY_ANOMALY_ENUMERATOR
};

namespace detail {
#define MOE_RESIDENCY_ANOMALY_TEXT(name, text) text,
inline constexpr const char* anomaly_kind_texts[] = {MOE_RESIDENCY_ANOMALY_KINDS(MOE_RESIDENCY_ANOMALY_TEXT)};
#undef MOE_RESIDENCY_ANOMALY_TEXT
}  // namespace detail

/// How many anomaly kinds there are (the size of anomaly_counts::by_kind).
inline constexpr std::size_t anomaly_kind_count = sizeof(detail::anomaly_kind_texts) / sizeof(const char*);
#undef MOE_RESIDENCY_ANOMALY_KINDS

/// The kind as the report prints it ("duplicate routing"); "anomaly" for a value outside the enum.
inline const char* to_string(anomaly_kind k) noexcept {
  const auto i = static_cast<std::size_t>(k);
  return i < anomaly_kind_count ? detail::anomaly_kind_texts[i] : "anomaly";
}

/// Whether a routing must follow a gate input of the same layer.
enum class gate_input_requirement {
  automatic,  ///< required when a gate predictor is configured
  required,
  optional,
};

/// Configuration of a session.
struct session_options {
  anomaly_action on_anomaly = anomaly_action::throw_error;
  scorer_options scoring;  ///< decode only by default
  gate_input_requirement gate_inputs = gate_input_requirement::automatic;
  bool check_gate_inputs = true;  ///< scan gate inputs for NaN / infinity (d floats per layer)
  /// Tokens per batch the session reserves for at construction (routings,
  /// drop masks), so batches up to this size allocate nothing afterwards.
  /// 0 = one token; a larger batch is still accepted and grows them once.
  std::size_t max_batch_tokens = 0;
};

/// A batch of gate inputs for one layer: `n_tokens` rows of `length` floats,
/// row t at `data + t·row_stride_bytes` (ggml's nb[1]; 0 = packed).
struct gate_input_view {
  const float* data = nullptr;
  std::size_t length = 0;
  std::size_t n_tokens = 1;
  std::size_t row_stride_bytes = 0;
};

/// A batch of routings for one layer as engines store them: `n_tokens` rows of
/// `k` int32 expert ids in rank order (ggml's ffn_moe_topk: row stride
/// n_expert·4, not k·4), and optionally their weights.
struct routing_batch_view {
  const std::int32_t* ids = nullptr;
  std::size_t k = 0;
  std::size_t n_tokens = 1;
  std::size_t ids_row_stride_bytes = 0;      ///< 0 = packed (k·4)
  const float* weights = nullptr;            ///< may be null (weights NaN)
  std::size_t weights_row_stride_bytes = 0;  ///< 0 = packed (k·4)
};

/// Counted anomalies, by kind, and the first one's message.
struct anomaly_counts {
  std::array<std::uint64_t, anomaly_kind_count> by_kind{};
  std::string first_message;
  std::uint64_t total() const noexcept {
    std::uint64_t t = 0;
    for (auto v : by_kind) t += v;
    return t;
  }
  std::uint64_t operator[](anomaly_kind k) const noexcept { return by_kind[static_cast<std::size_t>(k)]; }
};

/// The set of predictors a session owns, in report order.
template <class... Predictors>
struct predictor_set {};

template <class PredictorSet, class... Extensions>
class session;

}  // namespace moe_residency
