#pragma once
/// Core vocabulary: model shape, layer and expert ids, a routing, a ranking,
/// and the token cycle. Every other component speaks these types.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "moe_residency/error.hpp"

namespace moe_residency {

/// The widest routing the library represents. Wider routings are declined
/// (counted, never scored or cached).
inline constexpr std::size_t max_top_k = 32;

/// Index of a transformer layer as the engine numbers it (`il` in llama.cpp),
/// dense layers included. Strong-ish: `layer_id{3}`, `to_index(l)`.
enum class layer_id : std::uint16_t {};
/// Index of an expert within one layer, `[0, n_experts)`.
enum class expert_id : std::uint16_t {};

constexpr std::size_t to_index(layer_id l) noexcept { return static_cast<std::size_t>(l); }
constexpr std::size_t to_index(expert_id e) noexcept { return static_cast<std::size_t>(e); }

/// Prefill (a prompt batch) or decode (one token at a time). Values match the
/// `phase` column of route_trace v1.
enum class run_phase : std::uint8_t { prefill = 0, decode = 1 };

inline const char* to_string(run_phase p) noexcept { return p == run_phase::prefill ? "prefill" : "decode"; }

/// A non-owning view of contiguous elements (std::span is C++20).
template <class T>
class span {
 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;
  constexpr span() noexcept = default;
  constexpr span(T* data, std::size_t size) noexcept : data_(data), size_(size) {}
  template <class Container, class = decltype(std::declval<Container&>().data()),
            class = decltype(std::declval<Container&>().size())>
  constexpr span(Container& c) noexcept  // NOLINT(google-explicit-constructor)
      : data_(c.data()), size_(c.size()) {}
  template <std::size_t N>
  constexpr span(T (&a)[N]) noexcept : data_(a), size_(N) {}  // NOLINT
  constexpr T* data() const noexcept { return data_; }
  constexpr std::size_t size() const noexcept { return size_; }
  constexpr bool empty() const noexcept { return size_ == 0; }
  constexpr T& operator[](std::size_t i) const noexcept { return data_[i]; }
  constexpr T* begin() const noexcept { return data_; }
  constexpr T* end() const noexcept { return data_ + size_; }
  constexpr span subspan(std::size_t offset, std::size_t count) const noexcept { return span(data_ + offset, count); }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

/// The shape of a Mixture-of-Experts model as far as residency is concerned:
/// how many layers (dense ones included), which are MoE, experts per layer,
/// the routed top-k, and the bytes it costs to read one expert of each layer.
class model_shape {
 public:
  model_shape() = default;

  /// All layers MoE. `expert_bytes[l]` is the bytes to read one expert of
  /// layer l. Throws `error` on k outside [1, min(32, n_experts)], on
  /// n_experts outside [1, 65535], or on a MoE layer with zero bytes.
  model_shape(std::string name, std::size_t n_experts, std::size_t top_k, std::vector<std::uint64_t> expert_bytes)
      : model_shape(std::move(name), n_experts, top_k, std::move(expert_bytes), {}) {}

  /// `is_moe[l]` false marks a dense layer (its expert bytes must be 0).
  /// An empty `is_moe` means every layer is MoE.
  model_shape(std::string name, std::size_t n_experts, std::size_t top_k, std::vector<std::uint64_t> expert_bytes,
              std::vector<bool> is_moe)
      : name_(std::move(name)),
        n_experts_(n_experts),
        top_k_(top_k),
        expert_bytes_(std::move(expert_bytes)),
        is_moe_(std::move(is_moe)) {
    const std::string who = "model_shape '" + name_ + "': ";
    if (expert_bytes_.empty()) throw error(who + "no layers (expert_bytes is empty); expected one entry per layer");
    if (expert_bytes_.size() > std::numeric_limits<std::uint16_t>::max())
      throw error(who + std::to_string(expert_bytes_.size()) + " layers; expected at most 65535");
    if (n_experts_ < 1 || n_experts_ > std::numeric_limits<std::uint16_t>::max())
      throw error(who + "n_experts " + std::to_string(n_experts_) + " out of range; expected [1, 65535]");
    if (top_k_ < 1 || top_k_ > max_top_k)
      throw error(who + "top-k " + std::to_string(top_k_) + " out of range; expected [1, " + std::to_string(max_top_k) +
                  "]");
    if (top_k_ > n_experts_)
      throw error(who + "top-k " + std::to_string(top_k_) + " exceeds n_experts " + std::to_string(n_experts_));
    if (is_moe_.empty()) is_moe_.assign(expert_bytes_.size(), true);
    if (is_moe_.size() != expert_bytes_.size())
      throw error(who + "is_moe has " + std::to_string(is_moe_.size()) + " entries but expert_bytes has " +
                  std::to_string(expert_bytes_.size()) + "; expected one of each per layer");
    for (std::size_t l = 0; l < expert_bytes_.size(); ++l) {
      if (is_moe_[l]) {
        ++n_moe_layers_;
        if (expert_bytes_[l] == 0)
          throw error(who + "layer " + std::to_string(l) +
                      " is MoE but has zero or unknown expert bytes; expected > 0");
      } else if (expert_bytes_[l] != 0) {
        throw error(who + "layer " + std::to_string(l) + " is dense but has expert bytes " +
                    std::to_string(expert_bytes_[l]) + "; expected 0");
      }
    }
    if (n_moe_layers_ == 0) throw error(who + "no MoE layer; expected at least one");
  }

  const std::string& name() const noexcept { return name_; }
  /// Layers in the model, dense ones included.
  std::size_t n_layers() const noexcept { return expert_bytes_.size(); }
  std::size_t n_moe_layers() const noexcept { return n_moe_layers_; }
  std::size_t n_experts() const noexcept { return n_experts_; }
  std::size_t top_k() const noexcept { return top_k_; }
  bool is_moe(layer_id l) const noexcept { return to_index(l) < is_moe_.size() && is_moe_[to_index(l)]; }
  bool contains(layer_id l, expert_id e) const noexcept { return is_moe(l) && to_index(e) < n_experts_; }
  /// Bytes to read one expert of layer l (0 for a dense or unknown layer).
  std::uint64_t expert_bytes(layer_id l) const noexcept {
    return to_index(l) < expert_bytes_.size() ? expert_bytes_[to_index(l)] : 0;
  }
  const std::vector<std::uint64_t>& all_expert_bytes() const noexcept { return expert_bytes_; }

  /// The same model routed with a different top-k (engines expose
  /// `--n-expert-used`). Throws like the constructor.
  model_shape with_top_k(std::size_t k) const { return model_shape(name_, n_experts_, k, expert_bytes_, is_moe_); }

  friend bool operator==(const model_shape& a, const model_shape& b) noexcept {
    return a.n_experts_ == b.n_experts_ && a.top_k_ == b.top_k_ && a.expert_bytes_ == b.expert_bytes_ &&
           a.is_moe_ == b.is_moe_;
  }
  friend bool operator!=(const model_shape& a, const model_shape& b) noexcept { return !(a == b); }

 private:
  std::string name_;
  std::size_t n_experts_ = 0;
  std::size_t top_k_ = 0;
  std::size_t n_moe_layers_ = 0;
  std::vector<std::uint64_t> expert_bytes_;
  std::vector<bool> is_moe_;
};

/// Bytes one decode token reads if nothing is resident:
/// T = Σ over MoE layers of expert_bytes(l) × k. A recency policy with a
/// budget below T hits 0% (the least recently used entry is the soonest needed).
inline std::uint64_t token_cycle_bytes(const model_shape& shape) noexcept {
  std::uint64_t total = 0;
  for (std::size_t l = 0; l < shape.n_layers(); ++l)
    total += shape.expert_bytes(layer_id(static_cast<std::uint16_t>(l))) * shape.top_k();
  return total;
}

/// The MoE layer `horizon` MoE layers after `source` (horizon 0: source
/// itself when it is MoE), or false when there is none.
inline bool moe_layer_ahead(const model_shape& shape, layer_id source, std::size_t horizon, layer_id& target) noexcept {
  std::size_t l = to_index(source);
  if (horizon == 0) {
    target = source;
    return shape.is_moe(source);
  }
  while (horizon > 0) {
    ++l;
    if (l >= shape.n_layers()) return false;
    if (shape.is_moe(layer_id(static_cast<std::uint16_t>(l)))) --horizon;
  }
  target = layer_id(static_cast<std::uint16_t>(l));
  return true;
}

inline constexpr double bytes_per_mib = 1024.0 * 1024.0;
inline double to_mib(std::uint64_t bytes) noexcept { return static_cast<double>(bytes) / bytes_per_mib; }
inline std::uint64_t from_mib(double mib) noexcept {
  return static_cast<std::uint64_t>(std::llround(mib * bytes_per_mib));
}

/// What one MoE layer routed for one token: at most 32 expert ids with their
/// final applied weights, in rank order (slot 0 = highest weight). Weights
/// may be NaN when the engine did not record them.
struct routing {
  static constexpr std::size_t capacity = max_top_k;

  layer_id layer{};
  run_phase phase = run_phase::decode;
  std::uint32_t token = 0;  ///< absolute position of the token in the sequence

  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  void clear() noexcept { size_ = 0; }
  expert_id id(std::size_t slot) const noexcept { return ids_[slot]; }
  float weight(std::size_t slot) const noexcept { return weights_[slot]; }
  span<const expert_id> ids() const noexcept { return {ids_.data(), size_}; }
  span<const float> weights() const noexcept { return {weights_.data(), size_}; }

  /// Appends the next-ranked expert. Returns false (and changes nothing) when
  /// the routing already holds 32.
  bool push_back(expert_id e, float w = std::numeric_limits<float>::quiet_NaN()) noexcept {
    if (size_ == capacity) return false;
    ids_[size_] = e;
    weights_[size_] = w;
    ++size_;
    return true;
  }
  /// Replaces the contents. Returns false (and leaves the routing empty) when
  /// n > 32 — the caller counts that routing as declined. `w` may be null.
  bool assign(const expert_id* e, const float* w, std::size_t n) noexcept {
    size_ = 0;
    if (n > capacity) return false;
    for (std::size_t i = 0; i < n; ++i) {
      ids_[i] = e[i];
      weights_[i] = w ? w[i] : std::numeric_limits<float>::quiet_NaN();
    }
    size_ = static_cast<std::uint8_t>(n);
    return true;
  }
  bool contains(expert_id e) const noexcept {
    for (std::size_t i = 0; i < size_; ++i)
      if (ids_[i] == e) return true;
    return false;
  }

 private:
  std::array<expert_id, capacity> ids_{};
  std::array<float, capacity> weights_{};
  std::uint8_t size_ = 0;
};

/// A predictor's answer for one layer: up to 32 experts, best first, each
/// with the score it was ranked by (a logit, a count, ...) and the weight the
/// layer's gating would give it (NaN when the predictor cannot say).
class ranking {
 public:
  static constexpr std::size_t capacity = max_top_k;

  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  void clear() noexcept { size_ = 0; }
  expert_id id(std::size_t rank) const noexcept { return ids_[rank]; }
  float score(std::size_t rank) const noexcept { return scores_[rank]; }
  float weight(std::size_t rank) const noexcept { return weights_[rank]; }
  void set_weight(std::size_t rank, float w) noexcept { weights_[rank] = w; }
  span<const expert_id> ids() const noexcept { return {ids_.data(), size_}; }
  span<const float> scores() const noexcept { return {scores_.data(), size_}; }
  span<const float> weights() const noexcept { return {weights_.data(), size_}; }

  /// Appends the next-ranked expert; false when full.
  bool push_back(expert_id e, float score, float weight = std::numeric_limits<float>::quiet_NaN()) noexcept {
    if (size_ == capacity) return false;
    ids_[size_] = e;
    scores_[size_] = score;
    weights_[size_] = weight;
    ++size_;
    return true;
  }
  /// True when e is among the first n ranked experts.
  bool contains(expert_id e, std::size_t n = capacity) const noexcept {
    const std::size_t m = std::min<std::size_t>(n, size_);
    for (std::size_t i = 0; i < m; ++i)
      if (ids_[i] == e) return true;
    return false;
  }

 private:
  std::array<expert_id, capacity> ids_{};
  std::array<float, capacity> scores_{};
  std::array<float, capacity> weights_{};
  std::uint8_t size_ = 0;
};

/// Shapes of the models in the real traces and the design's measurements.
/// Expert bytes are Q4_K_M as the engine read them (see each function).
namespace presets {

/// Qwen3-30B-A3B Q4_K_M: 48 layers, 128 experts, top-8 by default. Expert
/// bytes per layer as recorded in shared/traces/qwen.route.csv: 2654208
/// (gate/up/down Q4_K) or 3059712 (down in Q6_K), per Q4_K_M's mix.
inline model_shape qwen3_30b_a3b(std::size_t k = 8) {
  std::vector<std::uint64_t> bytes(48, 3059712);
  for (std::size_t l = 6; l <= 40; ++l)
    if (l % 3 != 2) bytes[l] = 2654208;
  return model_shape("qwen3-30b-a3b", 128, k, std::move(bytes));
}

/// gpt-oss-120b (MXFP4 experts): 36 layers, 128 experts, top-4 by default,
/// 13219200 bytes per expert (3 × 2880 × 2880 weights at 4.25 bits).
inline model_shape gpt_oss_120b(std::size_t k = 4) {
  return model_shape("gpt-oss-120b", 128, k, std::vector<std::uint64_t>(36, 13219200));
}

/// Qwen3.6-35B-A3B: 40 layers, 256 experts, top-8. Expert bytes are an
/// estimate (3 × 2048 × 512 weights in Q4_K, 1769472 bytes), not a recording.
inline model_shape qwen3_6_35b_a3b(std::size_t k = 8) {
  return model_shape("qwen3.6-35b-a3b", 256, k, std::vector<std::uint64_t>(40, 1769472));
}

}  // namespace presets
}  // namespace moe_residency
