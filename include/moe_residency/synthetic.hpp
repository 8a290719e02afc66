#pragma once
/// A synthetic MoE workload with the structure real routing has: a residual
/// stream that every layer nudges by a tunable amount (so layer l's gate input
/// predicts layer l+1's routing, less so in early layers, which nudge more),
/// token-to-token correlation (so the previous token predicts a little),
/// skewed expert popularity (so a hot list predicts a little), and routings
/// computed through each layer's `router_spec` and the engine-rounding GEMV
/// (so a faithful fresh-gate control reads exactly 100.0%). Deterministic
/// from a seed on every platform (own RNG and normal sampler; every product
/// that meets an addition is rounded on its own, see detail::rounded, so a
/// compiler that contracts a*b+c into a fused multiply-add — GCC does by
/// default on aarch64 — generates the same bits). The routers and gate inputs
/// are therefore the same everywhere; the routings are the GEMV's, which
/// fuses its multiply-adds where ggml does (MOE_RESIDENCY_FUSED_MADD), so
/// they are the same on every platform with the same fusion. Shared by the
/// tests, the `moe-residency demo` and the benchmarks.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/detail/half.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/router.hpp"

namespace moe_residency {

/// Which architecture's selection rule the synthetic routers use.
enum class synthetic_router {
  qwen3moe,  ///< softmax over all experts, top-k, weights renormalised
  deepseek,  ///< sigmoid + per-expert selection bias + expert groups, scaled weights
  gpt_oss,   ///< logits + logit bias, top-k, softmax over the selected (softmax_weight)
  llama4,    ///< top-k on raw logits, sigmoid weights
};

inline const char* to_string(synthetic_router r) noexcept {
  switch (r) {
    case synthetic_router::deepseek: return "deepseek";
    case synthetic_router::gpt_oss: return "gpt-oss";
    case synthetic_router::llama4: return "llama4";
    case synthetic_router::qwen3moe: break;
  }
  return "qwen3moe";
}

/// Everything that shapes a synthetic workload. Fractions are of the residual
/// stream's RMS.
struct synthetic_config {
  model_shape shape;       ///< layers (dense ones too), experts, top-k, expert bytes
  std::size_t n_embd = 0;  ///< gate input length
  element_type router_type = element_type::f16;
  synthetic_router rule = synthetic_router::qwen3moe;
  std::size_t n_groups = 8;      ///< deepseek rule: expert groups
  std::size_t n_group_used = 4;  ///< deepseek rule: groups kept
  /// How much layer l nudges the residual stream (relative RMS of the update),
  /// linearly from the first to the last layer: bigger early = early layers
  /// less predictable from the layer before.
  float nudge_first = 0.28f;
  float nudge_last = 0.08f;
  /// Correlation of a token's stream (and its per-layer updates) with the
  /// previous token's, in [0, 1).
  float token_correlation = 0.6f;
  /// Spread (standard deviation, in logit units) of a per-expert popularity
  /// offset carried by a persistent direction of the stream; 0 = uniform.
  float popularity_skew = 0.9f;
  /// Standard deviation of the content part of the router logits.
  float logit_scale = 1.6f;
  std::uint64_t seed = 1;

  /// Throws `error` on an inconsistent configuration.
  void validate() const {
    const std::string who = "synthetic_config '" + shape.name() + "': ";
    if (shape.n_layers() == 0) throw error(who + "no shape; expected a model_shape");
    if (n_embd < 8 || n_embd > (1u << 16))
      throw error(who + "n_embd " + std::to_string(n_embd) + " out of range; expected [8, 65536]");
    if (!(token_correlation >= 0.0f && token_correlation < 1.0f))
      throw error(who + "token_correlation " + std::to_string(token_correlation) + " out of range; expected [0, 1)");
    for (float v : {nudge_first, nudge_last, popularity_skew, logit_scale})
      if (!(v >= 0.0f && v < 100.0f))
        throw error(who + "nudge, skew and scale must be in [0, 100); got " + std::to_string(v));
  }
};

namespace detail {

/// x, rounded to its type at this point: an optimisation barrier, so that a
/// product passed through it is never contracted with the addition that
/// follows into a fused multiply-add (which rounds once, not twice, and so
/// gives other bits). `#pragma STDC FP_CONTRACT OFF` would say the same, but
/// GCC ignores it in C++, and GCC's default (-ffp-contract=fast outside ISO
/// modes) contracts across statements on every target with an FMA
/// instruction (every aarch64; x86 with -mfma). A volatile round trip is
/// portable and costs a store and a load; the generator is not a hot path.
/// A product of two floats computed in double is exact, so contracting it
/// changes nothing; those are left alone.
inline float rounded(float x) noexcept {
  volatile float v = x;
  return v;
}

/// xoshiro256** seeded by splitmix64: the same numbers on every platform.
class synthetic_rng {
 public:
  explicit synthetic_rng(std::uint64_t seed) noexcept {
    for (auto& s : s_) {
      seed += 0x9E3779B97F4A7C15ull;
      std::uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      s = z ^ (z >> 31);
    }
  }
  std::uint64_t next() noexcept {
    const std::uint64_t r = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return r;
  }
  /// Uniform in (0, 1).
  double uniform() noexcept { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }
  /// Standard normal (Box–Muller, both values used).
  float normal() noexcept {
    if (have_spare_) {
      have_spare_ = false;
      return spare_;
    }
    const double u1 = uniform(), u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double a = 6.283185307179586 * u2;
    spare_ = static_cast<float>(r * std::sin(a));
    have_spare_ = true;
    return static_cast<float>(r * std::cos(a));
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4];
  float spare_ = 0.0f;
  bool have_spare_ = false;
};

}  // namespace detail

/// The routers of a synthetic model: one dense router matrix (stored in the
/// configured element type) and `router_spec` per MoE layer, and the
/// persistent direction that carries expert popularity.
class synthetic_model {
 public:
  /// Generates every router from the config's seed. Throws `error` on a bad
  /// config. Allocates n_moe_layers × n_experts × n_embd elements.
  explicit synthetic_model(synthetic_config c) : c_(std::move(c)) {
    c_.validate();
    const std::size_t L = c_.shape.n_layers(), E = c_.shape.n_experts(), d = c_.n_embd;
    const std::size_t k = c_.shape.top_k();
    detail::synthetic_rng rng(c_.seed * 0x2545F4914F6CDD1Dull + 17);
    // A persistent unit direction of the stream (like the large, constant
    // features of real residual streams); expert popularity rides on it.
    persistent_.resize(d);
    double n2 = 0.0;
    for (auto& v : persistent_) {
      v = rng.normal();
      n2 += static_cast<double>(v) * v;
    }
    for (auto& v : persistent_) v = static_cast<float>(v / std::sqrt(n2));
    specs_.resize(L);
    offsets_.resize(L);
    layer_offset_.assign(L, 0);
    std::size_t n_moe = 0;
    for (std::size_t l = 0; l < L; ++l)
      if (c_.shape.is_moe(lid(l))) layer_offset_[l] = (n_moe++) * E * d;
    if (c_.router_type == element_type::f32) f32_.assign(n_moe * E * d, 0.0f);
    else bits16_.assign(n_moe * E * d, 0);
    std::vector<float> row(d);
    const float content = c_.logit_scale / std::sqrt(static_cast<float>(d));
    // Gate inputs are RMS-normalised (norm sqrt(d)), and the persistent
    // component has weight `persist` in them: see synthetic_stream.
    const float along = 1.0f / (std::sqrt(static_cast<float>(d)) * persist_fraction());
    for (std::size_t l = 0; l < L; ++l) {
      if (!c_.shape.is_moe(lid(l))) continue;
      auto& pop = offsets_[l];
      pop.resize(E);
      for (auto& p : pop) p = c_.popularity_skew * rng.normal();
      for (std::size_t e = 0; e < E; ++e) {
        for (std::size_t i = 0; i < d; ++i)
          row[i] = detail::rounded(content * rng.normal()) + detail::rounded(pop[e] * along * persistent_[i]);
        store_row(l, e, row.data());
      }
      specs_[l] = make_spec(rng, E, k);
    }
  }

  const synthetic_config& config() const noexcept { return c_; }
  const model_shape& shape() const noexcept { return c_.shape; }
  std::size_t n_embd() const noexcept { return c_.n_embd; }
  /// Layer l's router (experts × n_embd, packed), or a null view for a dense layer.
  matrix_view router(layer_id l) const noexcept {
    if (!c_.shape.is_moe(l)) return {};
    const std::size_t off = layer_offset_[to_index(l)];
    const std::size_t E = c_.shape.n_experts(), d = c_.n_embd;
    switch (c_.router_type) {
      case element_type::f16: return matrix_view::f16(bits16_.data() + off, E, d);
      case element_type::bf16: return matrix_view::bf16(bits16_.data() + off, E, d);
      case element_type::f32: break;
    }
    return matrix_view::f32(f32_.data() + off, E, d);
  }
  /// Layer l's selection rule (meaningless for a dense layer).
  const router_spec& spec(layer_id l) const noexcept { return specs_[to_index(l)]; }
  /// Bytes of all router matrices (what one token's router GEMVs read).
  std::size_t router_bytes() const noexcept {
    std::size_t b = 0;
    for (std::size_t l = 0; l < c_.shape.n_layers(); ++l) b += router(lid(l)).bytes();
    return b;
  }
  /// The persistent unit direction of the stream (n_embd floats).
  const std::vector<float>& persistent_direction() const noexcept { return persistent_; }
  /// Weight of the persistent direction in a gate input, relative to its norm.
  static constexpr float persist_fraction() noexcept { return 0.35f; }

 private:
  static layer_id lid(std::size_t l) noexcept { return layer_id(static_cast<std::uint16_t>(l)); }

  void store_row(std::size_t l, std::size_t e, const float* row) {
    const std::size_t d = c_.n_embd;
    const std::size_t off = layer_offset_[l] + e * d;
    if (c_.router_type == element_type::f32) {
      std::copy(row, row + d, f32_.data() + off);
      return;
    }
    std::uint16_t* dst = bits16_.data() + off;
    for (std::size_t i = 0; i < d; ++i)
      dst[i] = c_.router_type == element_type::f16 ? detail::f32_to_f16_bits(row[i]) : detail::f32_to_bf16_bits(row[i]);
  }

  router_spec make_spec(detail::synthetic_rng& rng, std::size_t E, std::size_t k) const {
    switch (c_.rule) {
      case synthetic_router::deepseek: {
        std::vector<float> bias(E);
        for (auto& b : bias) b = 0.05f * rng.normal();
        return router_spec::deepseek_v3(std::move(bias), E, k, c_.n_groups, c_.n_group_used, 2.5f);
      }
      case synthetic_router::gpt_oss: {
        std::vector<float> bias(E);
        for (auto& b : bias) b = 0.5f * rng.normal();
        return router_spec::gpt_oss(std::move(bias), k);
      }
      case synthetic_router::llama4: return router_spec::llama4(E, k);
      case synthetic_router::qwen3moe: break;
    }
    return router_spec::qwen3moe(E, k);
  }

  synthetic_config c_;
  std::vector<float> persistent_;
  std::vector<router_spec> specs_;
  std::vector<std::vector<float>> offsets_;
  std::vector<std::size_t> layer_offset_;  ///< [layer] first element of the layer's router
  // One typed buffer, whichever matches router_type (the other stays empty):
  // elements are written and read through their own type, never reinterpreted.
  std::vector<float> f32_;
  std::vector<std::uint16_t> bits16_;  ///< f16 or bf16 bits
};

/// Tokens of a synthetic run, a batch at a time: for every MoE layer, each
/// token's gate input (RMS-normalised, f32) and the routing the layer's router
/// selects for it (route_token: engine-rounding GEMV + router_spec).
class synthetic_stream {
 public:
  /// `stream_seed` picks one of many runs over the same model.
  explicit synthetic_stream(const synthetic_model& m, std::uint64_t stream_seed = 0)
      : m_(&m),
        rng_(m.config().seed * 0x9E3779B97F4A7C15ull + stream_seed * 0xD1B54A32D192ED03ull + 3),
        ws_(m.shape().n_experts()) {
    const std::size_t L = m.shape().n_layers(), d = m.n_embd();
    base_.assign(d, 0.0f);
    nudge_.assign(L * d, 0.0f);
    h_.assign(d, 0.0f);
    for (auto& v : base_) v = rng_.normal();
    for (auto& v : nudge_) v = rng_.normal();
  }

  const synthetic_model& model() const noexcept { return *m_; }
  /// Position of the batch's first token.
  std::uint32_t first_token() const noexcept { return first_; }
  std::size_t batch_size() const noexcept { return n_; }

  /// Generates the next `n_tokens` tokens (n ≥ 1). Allocates only when the
  /// batch is larger than any before.
  void next(std::size_t n_tokens = 1) {
    if (n_tokens == 0) throw error("synthetic_stream: batch of 0 tokens; expected >= 1");
    const std::size_t L = m_->shape().n_layers(), d = m_->n_embd();
    first_ = next_pos_;
    n_ = n_tokens;
    next_pos_ += static_cast<std::uint32_t>(n_tokens);
    if (gate_.size() < L * n_tokens * d) gate_.resize(L * n_tokens * d);
    if (routed_.size() < L * n_tokens) routed_.resize(L * n_tokens);
    const float rho = m_->config().token_correlation;
    const float fresh = std::sqrt(1.0f - detail::rounded(rho * rho));
    const float pf = synthetic_model::persist_fraction();
    const std::vector<float>& dir = m_->persistent_direction();
    const float sd = std::sqrt(static_cast<float>(d));
    for (std::size_t t = 0; t < n_tokens; ++t) {
      for (auto& v : base_) v = detail::rounded(rho * v) + detail::rounded(fresh * rng_.normal());
      for (auto& v : nudge_) v = detail::rounded(rho * v) + detail::rounded(fresh * rng_.normal());
      h_ = base_;
      for (std::size_t l = 0; l < L; ++l) {
        const layer_id lid = layer_id(static_cast<std::uint16_t>(l));
        if (m_->shape().is_moe(lid)) {
          // Gate input: the stream's RMS-normalised direction, with the
          // persistent component at a fixed share (it carries popularity).
          float* x = &gate_[(l * n_tokens + t) * d];
          normalise(h_.data(), x, d);
          const float keep = std::sqrt(1.0f - detail::rounded(pf * pf));
          for (std::size_t i = 0; i < d; ++i) x[i] = detail::rounded(keep * x[i]) + detail::rounded(pf * sd * dir[i]);
          routing& r = routed_[l * n_tokens + t];
          route_token(m_->router(lid), x, m_->spec(lid), r, ws_);
          r.layer = lid;
          r.token = first_ + static_cast<std::uint32_t>(t);
        }
        // The layer's update: a fraction of the stream's RMS, in a direction
        // correlated with the previous token's update of the same layer.
        const float a = nudge(l) * rms(h_.data(), d);
        const float* z = &nudge_[l * d];
        for (std::size_t i = 0; i < d; ++i) h_[i] += detail::rounded(a * z[i]);
      }
    }
  }

  /// Layer l's gate inputs for the batch: batch_size() rows of n_embd floats.
  const float* gate_inputs(layer_id l) const noexcept { return &gate_[to_index(l) * n_ * m_->n_embd()]; }
  /// The routing layer l selected for token i of the batch (phase left at decode).
  const routing& routed(layer_id l, std::size_t i) const noexcept { return routed_[to_index(l) * n_ + i]; }
  /// The nudge (relative RMS) of layer l.
  float nudge(std::size_t l) const noexcept {
    const std::size_t L = m_->shape().n_layers();
    const float f = L > 1 ? static_cast<float>(l) / static_cast<float>(L - 1) : 0.0f;
    return m_->config().nudge_first + detail::rounded(f * (m_->config().nudge_last - m_->config().nudge_first));
  }

 private:
  static float rms(const float* v, std::size_t d) noexcept {
    double s = 0.0;
    for (std::size_t i = 0; i < d; ++i) s += static_cast<double>(v[i]) * v[i];
    return static_cast<float>(std::sqrt(s / static_cast<double>(d)));
  }
  static void normalise(const float* v, float* out, std::size_t d) noexcept {
    const float r = rms(v, d);
    const float inv = r > 0.0f ? 1.0f / r : 0.0f;
    for (std::size_t i = 0; i < d; ++i) out[i] = v[i] * inv;
  }

  const synthetic_model* m_;
  detail::synthetic_rng rng_;
  router_workspace ws_;
  std::vector<float> base_, nudge_, h_, gate_;
  std::vector<routing> routed_;
  std::uint32_t first_ = 0, next_pos_ = 0;
  std::size_t n_ = 0;
};

/// Describes every MoE layer's router of `m` to a session (or anything with
/// `set_router(layer_id, const matrix_view&, router_spec)`).
template <class Session>
void install_routers(Session& s, const synthetic_model& m) {
  for (std::size_t l = 0; l < m.shape().n_layers(); ++l) {
    const layer_id lid = layer_id(static_cast<std::uint16_t>(l));
    if (m.shape().is_moe(lid)) s.set_router(lid, m.router(lid), m.spec(lid));
  }
}

/// Feeds the stream's current batch to a session as an engine would:
/// begin_batch, then per MoE layer gate_input, routed, layer_loaded; then
/// end_batch. Returns false if any event was refused (an anomaly).
template <class Session>
bool feed_batch(Session& s, const synthetic_stream& st, run_phase phase) {
  const synthetic_model& m = st.model();
  const std::size_t n = st.batch_size(), d = m.n_embd();
  bool ok = s.begin_batch(phase, st.first_token(), n);
  for (std::size_t l = 0; l < m.shape().n_layers(); ++l) {
    const layer_id lid = layer_id(static_cast<std::uint16_t>(l));
    if (!m.shape().is_moe(lid)) continue;
    ok = s.gate_input(lid, st.gate_inputs(lid), d, n, d * sizeof(float)) && ok;
    ok = s.routed(lid, span<const routing>(&st.routed(lid, 0), n)) && ok;
    ok = s.layer_loaded(lid) && ok;
  }
  return s.end_batch() && ok;
}

/// Synthetic workloads shaped like real models.
namespace synthetic_presets {

/// Qwen3-30B-A3B: 48 layers × 128 experts × 2048, top-8, qwen3moe softmax,
/// f16 routers by default; expert bytes from presets::qwen3_30b_a3b.
inline synthetic_config qwen3_30b(element_type router = element_type::f16, std::uint64_t seed = 1) {
  synthetic_config c;
  c.shape = presets::qwen3_30b_a3b(8);
  c.n_embd = 2048;
  c.router_type = router;
  c.rule = synthetic_router::qwen3moe;
  c.seed = seed;
  return c;
}

/// gpt-oss-120b: 36 layers × 128 experts × 2880, top-4, logit bias and
/// softmax over the selected (softmax_weight); f32 routers by default.
inline synthetic_config gpt_oss_120b(element_type router = element_type::f32, std::uint64_t seed = 1) {
  synthetic_config c;
  c.shape = presets::gpt_oss_120b(4);
  c.n_embd = 2880;
  c.router_type = router;
  c.rule = synthetic_router::gpt_oss;
  c.seed = seed;
  return c;
}

/// A small model for tests: `layers` × `experts` × `embd`, top-k, any rule;
/// with `dense_first` the first layer is dense (as in DeepSeek).
inline synthetic_config small(synthetic_router rule, element_type router, std::size_t layers = 8,
                              std::size_t experts = 64, std::size_t embd = 256, std::size_t k = 6,
                              bool dense_first = false, std::uint64_t seed = 1) {
  std::vector<std::uint64_t> bytes(layers, 1u << 20);
  std::vector<bool> moe(layers, true);
  if (dense_first) {
    bytes[0] = 0;
    moe[0] = false;
  }
  synthetic_config c;
  c.shape = model_shape(std::string("synthetic-") + to_string(rule), experts, k, std::move(bytes), std::move(moe));
  c.n_embd = embd;
  c.router_type = router;
  c.rule = rule;
  c.n_groups = 8;
  c.n_group_used = 4;
  c.seed = seed;
  return c;
}

}  // namespace synthetic_presets
}  // namespace moe_residency
