#pragma once
/// Router math: views of dense router matrices (f32, f16, bf16), GEMV kernels
/// (xsimd, templated on the architecture, plus a scalar reference that is
/// always built) that round like ggml's CPU path, and `router_spec`: each
/// architecture's gating and selection rule, reproducing llama.cpp's
/// `build_moe_ffn` (logits -> probabilities -> optional selection bias and
/// expert-group masking -> top-k -> weights). See docs/router.md.

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
#include "moe_residency/detail/gemv.hpp"
#include "moe_residency/detail/half.hpp"
#include "moe_residency/detail/topk.hpp"
#include "moe_residency/error.hpp"

namespace moe_residency {

/// Bytes of one element of type t.
constexpr std::size_t element_size(element_type t) noexcept {
  return t == element_type::f32 ? 4 : 2;
}

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
      throw error(who + "data is not aligned to " + std::to_string(es) + " bytes; expected " +
                  to_string(type) + " elements at aligned addresses");
    if (row_stride_bytes % es != 0)
      throw error(who + "row stride " + std::to_string(row_stride_bytes) +
                  " bytes is not a multiple of the element size " + std::to_string(es) +
                  "; expected whole elements");
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

namespace detail {
/// The tag gemv/gemv_scalar pass down so their helpers are per-target copies.
#ifndef XSIMD_NO_SUPPORTED_ARCHITECTURE
using gemv_default_tag = xsimd::default_arch;
#else
using gemv_default_tag = void;
#endif
}  // namespace detail

inline namespace MOE_RESIDENCY_GEMV_ABI {  // see detail/gemv.hpp

/// Scalar reference GEMV: y[r] = dot(row r, x) for r < w.rows; x has w.cols
/// floats. Same accumulation order and rounding as the SIMD kernels (see
/// detail/gemv.hpp), so results are bit-identical. noexcept, allocation-free;
/// the view must be valid (matrix_view::validate).
inline void gemv_scalar(const matrix_view& w, const float* x, float* y,
                        activation_rounding rounding = activation_rounding::engine) noexcept {
  MOE_RESIDENCY_ASSERT(w.data != nullptr && w.row_stride_bytes >= w.cols * element_size(w.type));
  detail::gemv_scalar_impl<detail::gemv_default_tag, (MOE_RESIDENCY_FUSED_MADD != 0)>(
      w.data, w.type, w.rows, w.cols, w.row_stride_bytes, x, y, rounding);
}

/// SIMD GEMV for the xsimd architecture Arch (xsimd::batch<float, Arch>), for
/// users who dispatch at run time with xsimd::dispatch from their own
/// translation units. F16 weights convert with F16C / AVX-512 / NEON
/// instructions where the TU is compiled for them, else with an inlined
/// branch-free fallback. noexcept, allocation-free (6 KiB of stack). Fused:
/// whether the multiply-add rounds once; the default is the TU's
/// MOE_RESIDENCY_FUSED_MADD. Everything it calls is instantiated per
/// <Arch, Fused>, so TUs built for different architectures may each call it
/// (see docs/router.md, Limits).
template <class Arch, bool Fused = (MOE_RESIDENCY_FUSED_MADD != 0)>
inline void gemv_simd(const matrix_view& w, const float* x, float* y,
                      activation_rounding rounding = activation_rounding::engine) noexcept {
  MOE_RESIDENCY_ASSERT(w.data != nullptr && w.row_stride_bytes >= w.cols * element_size(w.type));
  detail::gemv_simd_impl<Arch, Fused>(w.data, w.type, w.rows, w.cols, w.row_stride_bytes, x, y,
                               rounding);
}

/// True when `gemv` in this translation unit takes the run-time dispatched
/// AVX2+FMA+F16C kernel: x86-64 GCC/Clang, the TU not compiled for all three
/// (e.g. no -march flags), MOE_RESIDENCY_NO_RUNTIME_DISPATCH not defined, and
/// the CPU (and OS) supporting them. Checked once per process.
inline bool gemv_dispatched() noexcept {
#if MOE_RESIDENCY_DETAIL_GEMV_DISPATCH
  return detail::x86_has_avx2_fma_f16c();
#else
  return false;
#endif
}

/// Name of the kernel `gemv` runs in this translation unit: "scalar", the
/// xsimd architecture's name (e.g. "sse2", "avx512bw"), or, when dispatched,
/// that name + "+avx2-fma-f16c-dispatch" (e.g. "sse2+avx2-fma-f16c-dispatch").
inline const char* gemv_arch_name() noexcept {
#if MOE_RESIDENCY_DETAIL_GEMV_DISPATCH
  if (gemv_dispatched()) {
    static char name[64] = {};
    static const bool once = (std::snprintf(name, sizeof name, "%s+avx2-fma-f16c-dispatch",
                                            xsimd::default_arch::name()),
                              true);
    (void)once;
    return name;
  }
#endif
#ifndef XSIMD_NO_SUPPORTED_ARCHITECTURE
  return xsimd::default_arch::name();
#else
  return "scalar";
#endif
}

/// GEMV with the fastest kernel available: on x86-64 (GCC/Clang) an
/// AVX2+FMA+F16C kernel chosen at run time when the TU is not compiled for
/// those and the CPU has them (see gemv_dispatched), else the best
/// architecture this TU is compiled for (xsimd::default_arch), else the
/// scalar kernel. Bit-identical to gemv_scalar in the same TU (one exception:
/// MOE_RESIDENCY_FUSED_MADD=0 in a TU built with FMA, see docs/router.md).
inline void gemv(const matrix_view& w, const float* x, float* y,
                 activation_rounding rounding = activation_rounding::engine) noexcept {
  MOE_RESIDENCY_ASSERT(w.data != nullptr && w.row_stride_bytes >= w.cols * element_size(w.type));
#if MOE_RESIDENCY_DETAIL_GEMV_DISPATCH
  if (detail::x86_has_avx2_fma_f16c()) {
    detail::gemv_x86_impl<detail::gemv_default_tag, (MOE_RESIDENCY_FUSED_MADD != 0)>(
        w.data, w.type, w.rows, w.cols, w.row_stride_bytes, x, y, rounding);
    return;
  }
#endif
#ifndef XSIMD_NO_SUPPORTED_ARCHITECTURE
  gemv_simd<xsimd::default_arch>(w, x, y, rounding);
#else
  gemv_scalar(w, x, y, rounding);
#endif
}

/// The ABI tag of this TU's GEMV kernels, e.g. "gemv_abi_sse2_nofma_nof16c_unfused_dispatch".
inline const char* gemv_abi_name() noexcept { return MOE_RESIDENCY_GEMV_ABI_STRING(MOE_RESIDENCY_GEMV_ABI); }

}  // inline namespace MOE_RESIDENCY_GEMV_ABI

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
  std::vector<float> logit_bias;      ///< added to logits before gating (gpt-oss ffn_gate_inp_b); empty = none
  std::vector<float> selection_bias;  ///< added to probabilities for selection only (DeepSeek-V3 exp_probs_b); empty = none
  std::size_t n_groups = 1;           ///< expert groups (contiguous ids); 1 = off
  std::size_t n_group_used = 1;       ///< groups kept
  bool select_on_logits = false;      ///< llama4: rank raw logits, weights still from probabilities
  bool normalize_weights = false;     ///< divide the k weights by their (clamped) sum
  float weight_scale = 1.0f;          ///< factor applied when scale_weights
  bool scale_weights = false;

  std::size_t experts_per_group() const noexcept {
    return n_groups == 0 ? 0 : n_experts / n_groups;
  }

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
        throw error(who + "top_k " + std::to_string(top_k) + " exceeds n_experts " +
                    std::to_string(n_experts) + "; expected top_k <= n_experts");
      case detail::spec_fault::logit_bias_size: bias_size_error(logit_bias, "logit_bias");
      case detail::spec_fault::selection_bias_size: bias_size_error(selection_bias, "selection_bias");
      case detail::spec_fault::n_groups_zero:
        throw error(who + "n_groups 0; expected >= 1 (1 = groups off)");
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
        throw error(who + "n_group_used " + std::to_string(n_group_used) +
                    " out of range; expected [1, " + std::to_string(n_groups) + "]");
      case detail::spec_fault::groups_keep_too_few:
        throw error(who + "n_group_used " + std::to_string(n_group_used) + " keeps " +
                    std::to_string(n_group_used * per_group) + " experts, fewer than top_k " +
                    std::to_string(top_k) + "; expected n_group_used * experts_per_group >= top_k");
    }
    check_bias_values(logit_bias, "logit_bias");
    check_bias_values(selection_bias, "selection_bias");
    if (!std::isfinite(weight_scale))
      throw error(who + "weight_scale " + detail::format_number(weight_scale) +
                  "; expected a finite value");
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
  static router_spec deepseek_v3(std::vector<float> selection_bias, std::size_t n_experts,
                                 std::size_t k, std::size_t n_groups, std::size_t n_group_used,
                                 float scale) {
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

/// Preallocated per-expert scratch for selection (and the logits of
/// route_token). Size it once per layer (`resize(n_experts)` or the
/// constructor); select_experts and friends then allocate nothing. After a
/// call it exposes what the ranking was computed on, so a scorer can be
/// tie-aware. Not thread-safe: one per layer per thread.
class router_workspace {
 public:
  router_workspace() = default;
  explicit router_workspace(std::size_t n_experts) { resize(n_experts); }
  explicit router_workspace(const router_spec& spec) { resize(spec.n_experts); }

  /// Makes room for n_experts (allocates; call outside the hot path).
  void resize(std::size_t n_experts) {
    logits_.assign(n_experts, 0.0f);
    biased_.assign(n_experts, 0.0f);
    probs_.assign(n_experts, 0.0f);
    selection_.assign(n_experts, 0.0f);
    group_scores_.assign(n_experts, 0.0f);
    n_ = 0;
  }
  /// Experts the workspace can hold.
  std::size_t capacity() const noexcept { return probs_.size(); }

  /// W·x of the last route_token call.
  span<const float> logits() const noexcept { return {logits_.data(), n_}; }
  /// Unbiased probabilities (the gating output; for softmax_weight the biased
  /// logits, which is what ggml gathers weights from) of the last call.
  span<const float> probs() const noexcept { return {probs_.data(), n_}; }
  /// The scores the top-k ranked: probabilities + selection bias (or logits
  /// for select_on_logits), with masked groups at -inf.
  span<const float> selection_scores() const noexcept { return {selection_.data(), n_}; }

  /// Scratch the size of capacity() for callers that compute logits themselves.
  float* logits_buffer() noexcept { return logits_.data(); }

 private:
  std::vector<float> logits_, biased_, probs_, selection_, group_scores_;
  std::size_t n_ = 0;
  friend struct router_workspace_access;
};

namespace detail {

/// softmax as ggml_compute_forward_soft_max_f32: max-subtracted exp in float,
/// sum in double, then multiplied by (float)(1 / sum).
inline void softmax_inplace(float* v, std::size_t n) noexcept {
  float mx = -std::numeric_limits<float>::infinity();
  for (std::size_t i = 0; i < n; ++i) mx = v[i] > mx ? v[i] : mx;
  double sum = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = std::exp(v[i] - mx);
    sum += static_cast<double>(v[i]);
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (std::size_t i = 0; i < n; ++i) v[i] *= inv;
}

inline float gate_one(gating_function g, float z) noexcept {
  switch (g) {
    case gating_function::sigmoid: return 1.0f / (1.0f + std::exp(-z));
    case gating_function::sqrt_softplus:
      return std::sqrt(z > 20.0f ? z : std::log(1.0f + std::exp(z)));
    case gating_function::softmax:
    case gating_function::softmax_weight: break;
  }
  return z;
}

inline bool any_nan(const float* v, std::size_t n) noexcept {
  bool nan = false;
  for (std::size_t i = 0; i < n; ++i) nan |= v[i] != v[i];
  return nan;
}

}  // namespace detail

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

struct router_workspace_access {
  static std::vector<float>& biased(router_workspace& w) noexcept { return w.biased_; }
  static std::vector<float>& probs(router_workspace& w) noexcept { return w.probs_; }
  static std::vector<float>& selection(router_workspace& w) noexcept { return w.selection_; }
  static std::vector<float>& groups(router_workspace& w) noexcept { return w.group_scores_; }
  static std::vector<float>& logits(router_workspace& w) noexcept { return w.logits_; }
  static void set_size(router_workspace& w, std::size_t n) noexcept { w.n_ = n; }
};

/// Fills the workspace's probs() and selection_scores() from n_experts
/// logits. False (and nothing usable) on a NaN logit or probability, when
/// the workspace is smaller than spec.n_experts, or when the spec's shape is
/// invalid (what router_spec::validate would throw for, bias values aside:
/// top_k 0 or > min(32, n_experts), a bias neither empty nor n_experts long,
/// n_groups 0 or not dividing n_experts or leaving < 2 experts per group,
/// n_group_used 0 or > n_groups, kept groups holding < top_k experts) — the
/// fields are public, so this is checked on every call, not assumed.
namespace detail {
inline bool select_from_usable(const router_spec& spec, const float* logits, routing& out,
                               router_workspace& ws) noexcept;

// compute_selection_scores for a spec already found usable (each public entry
// point checks the spec once, not once per layer of calls).
inline bool selection_scores_of_usable(const router_spec& spec, const float* logits,
                                       router_workspace& ws) noexcept {
  using acc = router_workspace_access;
  const std::size_t n = spec.n_experts;
  acc::set_size(ws, 0);
  if (ws.capacity() < n) return false;
  if (detail::any_nan(logits, n)) return false;
  float* z = acc::biased(ws).data();
  float* p = acc::probs(ws).data();
  float* s = acc::selection(ws).data();
  const bool lb = !spec.logit_bias.empty();
  for (std::size_t i = 0; i < n; ++i) z[i] = lb ? logits[i] + spec.logit_bias[i] : logits[i];
  if (spec.gating == gating_function::softmax) {
    for (std::size_t i = 0; i < n; ++i) p[i] = z[i];
    detail::softmax_inplace(p, n);
  } else {
    for (std::size_t i = 0; i < n; ++i) p[i] = detail::gate_one(spec.gating, z[i]);
  }
  if (detail::any_nan(p, n)) return false;
  const bool sb = !spec.selection_bias.empty();
  for (std::size_t i = 0; i < n; ++i)
    s[i] = spec.select_on_logits ? z[i] : (sb ? p[i] + spec.selection_bias[i] : p[i]);
  if (spec.n_groups > 1) {
    // Groups are contiguous runs of experts_per_group ids (ggml reshapes the
    // scores to [experts_per_group, n_groups]); a group's score is the sum of
    // its two best (ggml sums the pair in double, then rounds to float).
    const std::size_t epg = n / spec.n_groups;
    float* g = acc::groups(ws).data();
    for (std::size_t grp = 0; grp < spec.n_groups; ++grp) {
      std::size_t top2[2];
      detail::top_k_indices(s + grp * epg, epg, 2, top2);
      g[grp] = static_cast<float>(static_cast<double>(s[grp * epg + top2[0]]) +
                                  static_cast<double>(s[grp * epg + top2[1]]));
    }
    // Keep group grp iff fewer than n_group_used groups rank before it
    // (higher score, then lower group id): O(n_groups^2), n_groups is small.
    for (std::size_t grp = 0; grp < spec.n_groups; ++grp) {
      std::size_t ahead = 0;
      for (std::size_t o = 0; o < spec.n_groups; ++o)
        ahead += detail::ranks_before(g[o], o, g[grp], grp) ? 1u : 0u;
      if (ahead >= spec.n_group_used)
        for (std::size_t i = grp * epg; i < (grp + 1) * epg; ++i)
          s[i] = -std::numeric_limits<float>::infinity();
    }
  }
  acc::set_size(ws, n);
  return true;
}
}  // namespace detail

inline bool compute_selection_scores(const router_spec& spec, const float* logits,
                                     router_workspace& ws) noexcept {
  router_workspace_access::set_size(ws, 0);
  return detail::spec_usable(spec) && detail::selection_scores_of_usable(spec, logits, ws);
}

/// The k best of scores[0, n), best first, into out[0, min(k, n, 32)). Tie
/// rule: higher score first, then lower expert id; NaN ranks last.
/// Deterministic (ggml's argsort is an unstable std::sort, so exact ties
/// there may go either way: compare with same_selection_tie_aware). One pass,
/// O(n) for routing-like inputs, no allocation.
inline void top_k(const float* scores, std::size_t n, std::size_t k, expert_id* out) noexcept {
  MOE_RESIDENCY_ASSERT(k <= n && k <= max_top_k);
  if (k > n) k = n;
  if (k > max_top_k) k = max_top_k;
  detail::top_k_indices(scores, n, k, out);
}

/// Applies the spec's weight function to the experts `ids` (in the given
/// order) using the probabilities already in `ws` (compute_selection_scores):
/// gather, softmax for softmax_weight, normalise (clamped sum), scale.
inline void weights_from_probs(const router_spec& spec, const router_workspace& ws,
                               const expert_id* ids, std::size_t k, float* w) noexcept {
  const span<const float> p = ws.probs();
  for (std::size_t i = 0; i < k; ++i) w[i] = p[to_index(ids[i])];
  if (spec.gating == gating_function::softmax_weight) detail::softmax_inplace(w, k);
  if (spec.normalize_weights) {
    double sum = 0.0;  // ggml_sum_rows accumulates in double
    for (std::size_t i = 0; i < k; ++i) sum += static_cast<double>(w[i]);
    float s = static_cast<float>(sum);
    s = s < 6.103515625e-5f ? 6.103515625e-5f : s;  // clamp to the smallest normal f16
    for (std::size_t i = 0; i < k; ++i) w[i] /= s;
  }
  if (spec.scale_weights)
    for (std::size_t i = 0; i < k; ++i) w[i] *= spec.weight_scale;
}

/// From n_experts logits (W·x) to the engine's routing: spec.top_k ids in rank
/// order and their final weights. Returns false, leaving `out` empty, when a
/// logit (or a probability) is NaN, the workspace is too small, or the spec's
/// shape is invalid (see compute_selection_scores; e.g. top_k > 32 or a bias
/// of the wrong length) — never a silent wrong answer, never an out-of-bounds
/// access. Leaves out.layer/phase/token alone. noexcept, allocation-free.
/// Call router_spec::validate once to learn *why* a spec is rejected.
inline bool select_experts(const router_spec& spec, const float* logits, routing& out,
                           router_workspace& ws) noexcept {
  out.clear();
  if (!detail::spec_usable(spec)) return false;
  return detail::select_from_usable(spec, logits, out, ws);
}

namespace detail {
inline bool select_from_usable(const router_spec& spec, const float* logits, routing& out,
                               router_workspace& ws) noexcept {
  if (!selection_scores_of_usable(spec, logits, ws)) return false;
  expert_id ids[max_top_k];
  float w[max_top_k];
  const std::size_t k = spec.top_k;
  top_k(ws.selection_scores().data(), spec.n_experts, k, ids);
  weights_from_probs(spec, ws, ids, k, w);
  return out.assign(ids, w, k);
}
}  // namespace detail

/// Like select_experts, into a ranking of n (0 = top_k, at most 32) experts
/// with their selection scores; the first min(n, top_k) get the weights the
/// layer would give that top-k set, the rest NaN. For predictors. False, with
/// `out` empty, in the cases select_experts reports.
inline bool rank_experts(const router_spec& spec, const float* logits, ranking& out,
                         router_workspace& ws, std::size_t n = 0) noexcept {
  out.clear();
  if (!detail::spec_usable(spec)) return false;
  if (!detail::selection_scores_of_usable(spec, logits, ws)) return false;
  if (n == 0) n = spec.top_k;
  if (n > max_top_k) n = max_top_k;
  if (n > spec.n_experts) n = spec.n_experts;
  expert_id ids[max_top_k];
  float w[max_top_k];
  top_k(ws.selection_scores().data(), spec.n_experts, n, ids);
  const std::size_t k = n < spec.top_k ? n : spec.top_k;
  weights_from_probs(spec, ws, ids, k, w);
  const span<const float> s = ws.selection_scores();
  for (std::size_t i = 0; i < n; ++i)
    out.push_back(ids[i], s[to_index(ids[i])],
                  i < k ? w[i] : std::numeric_limits<float>::quiet_NaN());
  return true;
}

/// Predicted weights for a predicted set: the spec's weight function applied
/// to `ids` (any order, at most 32, each < n_experts) given the logits the
/// prediction came from. False on NaN, a bad id, a too-small workspace, or
/// an invalid spec shape (see compute_selection_scores).
inline bool expert_weights(const router_spec& spec, const float* logits,
                           span<const expert_id> ids, float* weights,
                           router_workspace& ws) noexcept {
  if (!detail::spec_usable(spec)) return false;
  if (ids.size() > max_top_k) return false;
  for (const expert_id e : ids)
    if (to_index(e) >= spec.n_experts) return false;
  if (!detail::selection_scores_of_usable(spec, logits, ws)) return false;
  weights_from_probs(spec, ws, ids.data(), ids.size(), weights);
  return true;
}

inline namespace MOE_RESIDENCY_GEMV_ABI {  // calls gemv: see detail/gemv.hpp

/// Route one token: logits = W·x (gemv, engine rounding by default) into the
/// workspace, then select_experts. False when w.rows != spec.n_experts, on
/// NaN, when the workspace is too small, or on an invalid spec shape.
inline bool route_token(const matrix_view& w, const float* x, const router_spec& spec,
                        routing& out, router_workspace& ws,
                        activation_rounding rounding = activation_rounding::engine) noexcept {
  out.clear();
  if (!detail::spec_usable(spec)) return false;
  if (w.rows != spec.n_experts || ws.capacity() < spec.n_experts) return false;
  float* logits = router_workspace_access::logits(ws).data();
  gemv(w, x, logits, rounding);
  return detail::select_from_usable(spec, logits, out, ws);
}

}  // inline namespace MOE_RESIDENCY_GEMV_ABI

/// Tie-aware match of two selections: true when they have the same size and,
/// after sorting each one's selection scores (descending), the scores are
/// equal within a relative rel_tol (|a-b| <= rel_tol * max(|a|,|b|); equal
/// infinities match). ggml's argsort is an unstable std::sort, so experts
/// with (nearly) tied scores may be picked either way; this does not count
/// that as a miss. `selection_scores` must cover every id of both (e.g.
/// router_workspace::selection_scores()).
inline bool same_selection_tie_aware(span<const expert_id> a, span<const expert_id> b,
                                     const float* selection_scores,
                                     float rel_tol = 1e-6f) noexcept {
  if (a.size() != b.size() || a.size() > max_top_k) return false;
  float sa[max_top_k], sb[max_top_k];
  const std::size_t n = a.size();
  for (std::size_t i = 0; i < n; ++i) {
    sa[i] = selection_scores[to_index(a[i])];
    sb[i] = selection_scores[to_index(b[i])];
  }
  auto sort_desc = [](float* v, std::size_t m) {
    for (std::size_t i = 1; i < m; ++i)
      for (std::size_t j = i; j > 0 && v[j] > v[j - 1]; --j) std::swap(v[j], v[j - 1]);
  };
  sort_desc(sa, n);
  sort_desc(sb, n);
  for (std::size_t i = 0; i < n; ++i) {
    const float x = sa[i], y = sb[i];
    if (x == y) continue;
    if (x != x || y != y || std::isinf(x) || std::isinf(y)) return false;
    const float m = std::fabs(x) > std::fabs(y) ? std::fabs(x) : std::fabs(y);
    if (std::fabs(x - y) > rel_tol * m) return false;
  }
  return true;
}

/// Same, with the scores as a span: ids outside it make the answer false.
inline bool same_selection_tie_aware(span<const expert_id> a, span<const expert_id> b,
                                     span<const float> selection_scores,
                                     float rel_tol = 1e-6f) noexcept {
  for (const expert_id e : a)
    if (to_index(e) >= selection_scores.size()) return false;
  for (const expert_id e : b)
    if (to_index(e) >= selection_scores.size()) return false;
  return same_selection_tie_aware(a, b, selection_scores.data(), rel_tol);
}

}  // namespace moe_residency
