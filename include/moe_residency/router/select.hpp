#pragma once
/// Expert selection without SIMD: from n_experts logits to the routing of
/// router_spec (router/spec.hpp), each architecture's rule,
/// reproducing llama.cpp's `build_moe_ffn` (logits -> probabilities ->
/// optional selection bias and expert-group masking -> top-k -> weights), and
/// the tie-aware match of two selections. No third-party dependency: a
/// consumer that selects experts from logits it computed needs nothing else.
/// router.hpp adds the GEMV kernels (xsimd) and route_token. See docs/router.md.

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
#include "moe_residency/router/spec.hpp"
namespace moe_residency {

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
    case gating_function::sqrt_softplus: return std::sqrt(z > 20.0f ? z : std::log(1.0f + std::exp(z)));
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
inline bool selection_scores_of_usable(const router_spec& spec, const float* logits, router_workspace& ws) noexcept {
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
  for (std::size_t i = 0; i < n; ++i) s[i] = spec.select_on_logits ? z[i] : (sb ? p[i] + spec.selection_bias[i] : p[i]);
  if (spec.n_groups > 1) {
    // Groups are contiguous runs of experts_per_group ids (ggml reshapes the
    // scores to [experts_per_group, n_groups]); a group's score is the sum of
    // its two best (ggml sums the pair in double, then rounds to float).
    const std::size_t epg = n / spec.n_groups;
    float* g = acc::groups(ws).data();
    for (std::size_t grp = 0; grp < spec.n_groups; ++grp) {
      std::size_t top2[2];
      detail::top_k_indices(s + grp * epg, epg, 2, top2);
      g[grp] =
          static_cast<float>(static_cast<double>(s[grp * epg + top2[0]]) + static_cast<double>(s[grp * epg + top2[1]]));
    }
    // Keep group grp iff fewer than n_group_used groups rank before it
    // (higher score, then lower group id): O(n_groups^2), n_groups is small.
    for (std::size_t grp = 0; grp < spec.n_groups; ++grp) {
      std::size_t ahead = 0;
      for (std::size_t o = 0; o < spec.n_groups; ++o) ahead += detail::ranks_before(g[o], o, g[grp], grp) ? 1u : 0u;
      if (ahead >= spec.n_group_used)
        for (std::size_t i = grp * epg; i < (grp + 1) * epg; ++i) s[i] = -std::numeric_limits<float>::infinity();
    }
  }
  acc::set_size(ws, n);
  return true;
}
}  // namespace detail

inline bool compute_selection_scores(const router_spec& spec, const float* logits, router_workspace& ws) noexcept {
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
inline void weights_from_probs(const router_spec& spec, const router_workspace& ws, const expert_id* ids, std::size_t k,
                               float* w) noexcept {
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
inline bool select_experts(const router_spec& spec, const float* logits, routing& out, router_workspace& ws) noexcept {
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
inline bool rank_experts(const router_spec& spec, const float* logits, ranking& out, router_workspace& ws,
                         std::size_t n = 0) noexcept {
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
    out.push_back(ids[i], s[to_index(ids[i])], i < k ? w[i] : std::numeric_limits<float>::quiet_NaN());
  return true;
}

/// Predicted weights for a predicted set: the spec's weight function applied
/// to `ids` (any order, at most 32, each < n_experts) given the logits the
/// prediction came from. False on NaN, a bad id, a too-small workspace, or
/// an invalid spec shape (see compute_selection_scores).
inline bool expert_weights(const router_spec& spec, const float* logits, span<const expert_id> ids, float* weights,
                           router_workspace& ws) noexcept {
  if (!detail::spec_usable(spec)) return false;
  if (ids.size() > max_top_k) return false;
  for (const expert_id e : ids)
    if (to_index(e) >= spec.n_experts) return false;
  if (!detail::selection_scores_of_usable(spec, logits, ws)) return false;
  weights_from_probs(spec, ws, ids.data(), ids.size(), weights);
  return true;
}

/// Tie-aware match of two selections: true when they have the same size and,
/// after sorting each one's selection scores (descending), the scores are
/// equal within a relative rel_tol (|a-b| <= rel_tol * max(|a|,|b|); equal
/// infinities match). ggml's argsort is an unstable std::sort, so experts
/// with (nearly) tied scores may be picked either way; this does not count
/// that as a miss. `selection_scores` must cover every id of both (e.g.
/// router_workspace::selection_scores()).
inline bool same_selection_tie_aware(span<const expert_id> a, span<const expert_id> b, const float* selection_scores,
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
                                     span<const float> selection_scores, float rel_tol = 1e-6f) noexcept {
  for (const expert_id e : a)
    if (to_index(e) >= selection_scores.size()) return false;
  for (const expert_id e : b)
    if (to_index(e) >= selection_scores.size()) return false;
  return same_selection_tie_aware(a, b, selection_scores.data(), rel_tol);
}

}  // namespace moe_residency
