#pragma once
/// Router shapes without SIMD: views of dense router matrices (f32, f16,
/// bf16) and `router_spec`, each architecture's gating and selection rule as
/// llama.cpp's `build_moe_ffn` applies it, with the one statement of its
/// shape rules (detail::shape_fault). See docs/router.md.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/detail/format.hpp"
#include "moe_residency/detail/half.hpp"
#include "moe_residency/detail/topk.hpp"
#include "moe_residency/element_type.hpp"
#include "moe_residency/error.hpp"
namespace moe_residency {

/// Bytes of one element of type t.
constexpr std::size_t element_size(element_type t) noexcept { return t == element_type::f32 ? 4 : 2; }

inline const char* to_string(element_type t) noexcept {
  switch (t) {
    case element_type::f16: return "f16";
    case element_type::bf16: return "bf16";
    case element_type::f32: break;
  }
  return "f32";
}

/// Read-only view of a dense router weight: rows = experts, cols = embedding
/// (the gate input's length), `row_stride_bytes` between the starts of rows
/// (ggml's nb[1]). The library never copies the data.
struct matrix_view {
  const void* data = nullptr;
  element_type type = element_type::f32;
  std::size_t rows = 0;
  std::size_t cols = 0;
  std::size_t row_stride_bytes = 0;

  /// Row-major f32 matrix; `row_stride_bytes` 0 means packed (cols * 4).
  static matrix_view f32(const float* d, std::size_t rows, std::size_t cols,
                         std::size_t row_stride_bytes = 0) noexcept {
    return make(d, element_type::f32, rows, cols, row_stride_bytes);
  }
  /// Row-major IEEE binary16 matrix (raw bits); stride 0 means packed (cols * 2).
  static matrix_view f16(const std::uint16_t* d, std::size_t rows, std::size_t cols,
                         std::size_t row_stride_bytes = 0) noexcept {
    return make(d, element_type::f16, rows, cols, row_stride_bytes);
  }
  /// Row-major bfloat16 matrix (raw bits); stride 0 means packed (cols * 2).
  static matrix_view bf16(const std::uint16_t* d, std::size_t rows, std::size_t cols,
                          std::size_t row_stride_bytes = 0) noexcept {
    return make(d, element_type::bf16, rows, cols, row_stride_bytes);
  }

  /// Bytes of the matrix as laid out (last row counted to cols only).
  std::size_t bytes() const noexcept {
    return rows == 0 ? 0 : (rows - 1) * row_stride_bytes + cols * element_size(type);
  }

  /// Throws `error` naming `what` when the view cannot be read safely: null
  /// data, zero rows or columns, more than 65535 rows (expert ids are 16-bit),
  /// a stride shorter than a row, or data/stride not aligned to the element
  /// size (the kernels load whole elements).
  void validate(const char* what) const {
    const std::string who = std::string(what) + ": ";
    const std::size_t es = element_size(type);
    if (data == nullptr) throw error(who + "data is null; expected a router matrix");
    if (rows == 0 || rows > 65535)
      throw error(who + "rows " + std::to_string(rows) + " out of range; expected [1, 65535] experts");
    if (cols == 0) throw error(who + "cols 0; expected the embedding length (> 0)");
    if (row_stride_bytes < cols * es)
      throw error(who + "row stride " + std::to_string(row_stride_bytes) + " bytes is shorter than a row (" +
                  std::to_string(cols) + " " + to_string(type) + " = " + std::to_string(cols * es) +
                  " bytes); expected >= " + std::to_string(cols * es));
    if (reinterpret_cast<std::uintptr_t>(data) % es != 0)
      throw error(who + "data is not aligned to " + std::to_string(es) + " bytes; expected " + to_string(type) +
                  " elements at aligned addresses");
    if (row_stride_bytes % es != 0)
      throw error(who + "row stride " + std::to_string(row_stride_bytes) +
                  " bytes is not a multiple of the element size " + std::to_string(es) + "; expected whole elements");
  }

 private:
  static matrix_view make(const void* d, element_type t, std::size_t rows, std::size_t cols,
                          std::size_t stride) noexcept {
    matrix_view v;
    v.data = d;
    v.type = t;
    v.rows = rows;
    v.cols = cols;
    v.row_stride_bytes = stride != 0 ? stride : cols * element_size(t);
    return v;
  }
};

/// How an architecture turns logits into probabilities (llama.cpp's
/// llama_expert_gating_func_type).
enum class gating_function : std::uint8_t {
  softmax,         ///< softmax over all experts (Qwen3-MoE, Mixtral, ...)
  sigmoid,         ///< per-expert sigmoid (DeepSeek-V3, llama4, ...)
  softmax_weight,  ///< rank the (biased) logits, softmax over the selected k only (gpt-oss)
  sqrt_softplus,   ///< sqrt(softplus(logit))
};

inline const char* to_string(gating_function g) noexcept {
  switch (g) {
    case gating_function::sigmoid: return "sigmoid";
    case gating_function::softmax_weight: return "softmax_weight";
    case gating_function::sqrt_softplus: return "sqrt_softplus";
    case gating_function::softmax: break;
  }
  return "softmax";
}

/// One MoE layer's selection rule, as llama.cpp's build_moe_ffn applies it:
///   z = logits (+ logit_bias); p = gating(z); s = p (+ selection_bias), or
///   s = z when select_on_logits; groups: keep the n_group_used groups whose
///   top-2 sum of s is highest, others -inf; ids = top_k(s); weights = p[ids]
///   (softmax over them for softmax_weight), / their sum when
///   normalize_weights (sum clamped to >= 6.103515625e-5), * weight_scale
///   when scale_weights.
struct router_spec;
namespace detail {
/// The first shape rule a router_spec breaks (`none`: usable). The one
/// implementation of those rules: router_spec::validate turns a fault into a
/// message, selection refuses a spec with one.
enum class spec_fault : std::uint8_t {
  none,
  n_experts_range,
  top_k_range,
  top_k_above_experts,
  logit_bias_size,
  selection_bias_size,
  n_groups_zero,
  group_used_without_groups,
  groups_not_dividing,
  groups_too_small,
  group_used_range,
  groups_keep_too_few,
};
spec_fault shape_fault(const router_spec& s) noexcept;
}  // namespace detail

struct router_spec {
  gating_function gating = gating_function::softmax;
  std::size_t n_experts = 0;
  std::size_t top_k = 0;
  std::vector<float> logit_bias;  ///< added to logits before gating (gpt-oss ffn_gate_inp_b); empty = none
  std::vector<float>
      selection_bias;             ///< added to probabilities for selection only (DeepSeek-V3 exp_probs_b); empty = none
  std::size_t n_groups = 1;       ///< expert groups (contiguous ids); 1 = off
  std::size_t n_group_used = 1;   ///< groups kept
  bool select_on_logits = false;  ///< llama4: rank raw logits, weights still from probabilities
  bool normalize_weights = false;  ///< divide the k weights by their (clamped) sum
  float weight_scale = 1.0f;       ///< factor applied when scale_weights
  bool scale_weights = false;

  std::size_t experts_per_group() const noexcept { return n_groups == 0 ? 0 : n_experts / n_groups; }

  /// Throws `error` ("router_spec: <input> <value> ...; expected ...") on:
  /// n_experts outside [1, 65535], top_k outside [1, 32] or above n_experts,
  /// a bias whose size is neither 0 nor n_experts or that holds a NaN/inf,
  /// n_groups 0 or not dividing n_experts or leaving < 2 experts per group,
  /// n_group_used outside [1, n_groups], groups that keep fewer than top_k
  /// experts, and a non-finite weight_scale.
  void validate() const {
    const std::string who = "router_spec: ";
    const std::size_t per_group = n_groups != 0 ? n_experts / n_groups : 0;
    switch (detail::shape_fault(*this)) {
      case detail::spec_fault::none: break;
      case detail::spec_fault::n_experts_range:
        throw error(who + "n_experts " + std::to_string(n_experts) + " out of range; expected [1, 65535]");
      case detail::spec_fault::top_k_range:
        throw error(who + "top_k " + std::to_string(top_k) + " out of range; expected [1, " +
                    std::to_string(max_top_k) + "]");
      case detail::spec_fault::top_k_above_experts:
        throw error(who + "top_k " + std::to_string(top_k) + " exceeds n_experts " + std::to_string(n_experts) +
                    "; expected top_k <= n_experts");
      case detail::spec_fault::logit_bias_size: bias_size_error(logit_bias, "logit_bias");
      case detail::spec_fault::selection_bias_size: bias_size_error(selection_bias, "selection_bias");
      case detail::spec_fault::n_groups_zero: throw error(who + "n_groups 0; expected >= 1 (1 = groups off)");
      case detail::spec_fault::group_used_without_groups:
        throw error(who + "n_group_used " + std::to_string(n_group_used) +
                    " with n_groups 1; expected 1 when groups are off");
      case detail::spec_fault::groups_not_dividing:
        throw error(who + "n_groups " + std::to_string(n_groups) + " does not divide n_experts " +
                    std::to_string(n_experts) + "; expected a divisor");
      case detail::spec_fault::groups_too_small:
        throw error(who + "n_groups " + std::to_string(n_groups) + " leaves " + std::to_string(per_group) +
                    " expert per group; expected at least 2 (groups are scored by their top-2)");
      case detail::spec_fault::group_used_range:
        throw error(who + "n_group_used " + std::to_string(n_group_used) + " out of range; expected [1, " +
                    std::to_string(n_groups) + "]");
      case detail::spec_fault::groups_keep_too_few:
        throw error(who + "n_group_used " + std::to_string(n_group_used) + " keeps " +
                    std::to_string(n_group_used * per_group) + " experts, fewer than top_k " + std::to_string(top_k) +
                    "; expected n_group_used * experts_per_group >= top_k");
    }
    check_bias_values(logit_bias, "logit_bias");
    check_bias_values(selection_bias, "selection_bias");
    if (!std::isfinite(weight_scale))
      throw error(who + "weight_scale " + detail::format_number(weight_scale) + "; expected a finite value");
  }

  /// Qwen3-MoE (and Qwen2-MoE style): softmax over all experts, top-k,
  /// weights renormalised over the k (llama.cpp passes norm_w = true).
  static router_spec qwen3moe(std::size_t n_experts, std::size_t k) {
    router_spec s;
    s.gating = gating_function::softmax;
    s.n_experts = n_experts;
    s.top_k = k;
    s.normalize_weights = true;
    s.validate();
    return s;
  }

  /// gpt-oss: logits + ffn_gate_inp_b, top-k on those, softmax over the k
  /// selected (no normalisation, no scale). n_experts = logit_bias.size().
  static router_spec gpt_oss(std::vector<float> logit_bias, std::size_t k) {
    router_spec s;
    s.gating = gating_function::softmax_weight;
    s.n_experts = logit_bias.size();
    s.top_k = k;
    s.logit_bias = std::move(logit_bias);
    s.validate();
    return s;
  }

  /// DeepSeek-V3 (deepseek2 arch in llama.cpp): sigmoid, exp_probs_b added
  /// for selection, n_groups groups of which n_group_used are kept, weights
  /// normalised then multiplied by `scale` (expert_weights_scale, 2.5 for V3).
  /// A scale of 0 or 1 means "no scaling", as in llama.cpp.
  static router_spec deepseek_v3(std::vector<float> selection_bias, std::size_t n_experts, std::size_t k,
                                 std::size_t n_groups, std::size_t n_group_used, float scale) {
    router_spec s;
    s.gating = gating_function::sigmoid;
    s.n_experts = n_experts;
    s.top_k = k;
    s.selection_bias = std::move(selection_bias);
    s.n_groups = n_groups;
    s.n_group_used = n_group_used;
    s.normalize_weights = true;
    s.weight_scale = scale;
    s.scale_weights = scale != 0.0f && scale != 1.0f;
    s.validate();
    return s;
  }

  /// llama4: top-k on the raw logits, weights = sigmoid of the chosen logits.
  static router_spec llama4(std::size_t n_experts, std::size_t k) {
    router_spec s;
    s.gating = gating_function::sigmoid;
    s.n_experts = n_experts;
    s.top_k = k;
    s.select_on_logits = true;
    s.validate();
    return s;
  }

 private:
  [[noreturn]] void bias_size_error(const std::vector<float>& b, const char* name) const {
    throw error("router_spec: " + std::string(name) + " has " + std::to_string(b.size()) +
                " entries; expected 0 or n_experts (" + std::to_string(n_experts) + ")");
  }
  void check_bias_values(const std::vector<float>& b, const char* name) const {
    for (std::size_t i = 0; i < b.size(); ++i)
      if (!std::isfinite(b[i]))
        throw error("router_spec: " + std::string(name) + "[" + std::to_string(i) + "] is " +
                    detail::format_number(b[i]) + "; expected a finite value");
  }
};

namespace detail {
/// The memory-safety part of router_spec::validate, as a few compares for the
/// noexcept selection functions (they read spec fields, which are public):
/// n_experts in [1, 65535]; top_k in [1, min(32, n_experts)]; each bias empty
/// or n_experts long; n_groups >= 1 dividing n_experts, leaving >= 2 experts
/// per group when > 1; n_group_used in [1, n_groups]; the kept groups holding
/// at least top_k experts. Bias values are not scanned (a non-finite one gives
/// a NaN probability, which the callers report, or a +-inf score).
inline spec_fault shape_fault(const router_spec& s) noexcept {
  const std::size_t n = s.n_experts;
  if (n == 0 || n > 65535) return spec_fault::n_experts_range;
  if (s.top_k == 0 || s.top_k > max_top_k) return spec_fault::top_k_range;
  if (s.top_k > n) return spec_fault::top_k_above_experts;
  if (!s.logit_bias.empty() && s.logit_bias.size() != n) return spec_fault::logit_bias_size;
  if (!s.selection_bias.empty() && s.selection_bias.size() != n) return spec_fault::selection_bias_size;
  if (s.n_groups == 0) return spec_fault::n_groups_zero;
  if (s.n_groups == 1) return s.n_group_used == 1 ? spec_fault::none : spec_fault::group_used_without_groups;
  if (n % s.n_groups != 0) return spec_fault::groups_not_dividing;
  if (n / s.n_groups < 2) return spec_fault::groups_too_small;
  if (s.n_group_used == 0 || s.n_group_used > s.n_groups) return spec_fault::group_used_range;
  if (s.n_group_used * (n / s.n_groups) < s.top_k) return spec_fault::groups_keep_too_few;
  return spec_fault::none;
}

/// True when selection may run on `s` (bias values and weight_scale aside).
inline bool spec_usable(const router_spec& s) noexcept { return shape_fault(s) == spec_fault::none; }
}  // namespace detail

}  // namespace moe_residency
