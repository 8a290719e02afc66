#pragma once
/// The dynamic replay: a trace through one cache with the drop policy and/or
/// speculative reads planned by speculation_planner, through the same
/// speculation<> glue an engine uses, decode figures per token, and hooks a
/// timing model plugs into (timing.hpp).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "moe_residency/cache.hpp"
#include "moe_residency/core.hpp"
#include "moe_residency/detail/numbers.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/plan.hpp"
#include "moe_residency/predict/history.hpp"
#include "moe_residency/replay/cells.hpp"
#include "moe_residency/replay/static_drop.hpp"
#include "moe_residency/speculation.hpp"
#include "moe_residency/trace.hpp"

namespace moe_residency {

// ---- dynamic replay: drop and speculation ------------------------------------

/// A trace ready for the dynamic replay: its routings grouped into the
/// engine's load batches (the same grouping as group_load_batches), decode
/// tokens numbered from 0, and the next-use indexes Belady needs: one over
/// every batch (base().next_use(), the prompt cached) and one over the decode
/// batches alone (decode_next_use(), for a replay whose prompt batches skip
/// the cache: Belady must know the future of the lookups it will see).
class routed_replay_input {
 public:
  struct batch {
    std::size_t first = 0;  ///< index of the batch's first routing
    std::size_t count = 0;  ///< routings in the batch (prompt tokens for prefill, 1 for decode)
    run_phase phase = run_phase::decode;
    layer_id layer{};
    std::uint32_t decode_token = 0;  ///< decode batches: the token's index, from 0
    bool first_of_token = false;     ///< decode batches: the token's first layer
  };

  /// Throws like route_trace::shape(), group_load_batches() and read_recorded_routings().
  static routed_replay_input from_trace(const route_trace& t) {
    routed_replay_input in(replay_input::from_trace(t), read_recorded_routings(t));
    return in;
  }
  static routed_replay_input from_file(const std::string& path) { return from_trace(read_route_trace(path)); }

  const model_shape& shape() const noexcept { return base_.shape(); }
  const replay_input& base() const noexcept { return base_; }
  const recorded_routings& recorded() const noexcept { return rec_; }
  const std::vector<routing>& routings() const noexcept { return rec_.routings; }
  const std::vector<batch>& batches() const noexcept { return batches_; }
  std::size_t decode_tokens() const noexcept { return decode_tokens_; }
  /// Belady's next-use index over the decode batches only, in order.
  std::shared_ptr<const next_use_index> decode_next_use() const noexcept { return decode_next_use_; }
  /// The decode routing of (token, layer), or null.
  const routing* decode_routing(std::uint32_t token, layer_id l) const noexcept {
    const std::size_t i = static_cast<std::size_t>(token) * shape().n_layers() + to_index(l);
    if (i >= decode_index_.size() || decode_index_[i] == npos) return nullptr;
    return &rec_.routings[decode_index_[i]];
  }

 private:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);
  routed_replay_input(replay_input base, recorded_routings rec) : base_(std::move(base)), rec_(std::move(rec)) {
    const auto& rs = rec_.routings;
    for (std::size_t i = 0; i < rs.size(); ++i) {
      const routing& r = rs[i];
      const bool same = !batches_.empty() && batches_.back().phase == r.phase && batches_.back().layer == r.layer &&
                        rec_.turns[batches_.back().first] == rec_.turns[i] &&
                        (r.phase == run_phase::prefill || rs[batches_.back().first].token == r.token);
      if (same) {
        ++batches_.back().count;
        continue;
      }
      batch b;
      b.first = i;
      b.count = 1;
      b.phase = r.phase;
      b.layer = r.layer;
      if (r.phase == run_phase::decode) {
        const batch* prev = nullptr;
        for (auto it = batches_.rbegin(); it != batches_.rend(); ++it)
          if (it->phase == run_phase::decode) {
            prev = &*it;
            break;
          }
        const bool new_token = !prev || rs[prev->first].token != r.token || rec_.turns[prev->first] != rec_.turns[i];
        b.first_of_token = new_token;
        b.decode_token = new_token ? static_cast<std::uint32_t>(decode_tokens_++) : prev->decode_token;
      }
      batches_.push_back(b);
    }
    if (batches_.size() != base_.batches().batches.size())
      throw error("replay: " + std::to_string(batches_.size()) + " routing batches but " +
                  std::to_string(base_.batches().batches.size()) +
                  " load batches; expected the same grouping (a routing split across load batches?)");
    auto idx = std::make_shared<next_use_index>(shape());
    for (const load_batch& b : base_.batches().batches)
      if (b.phase == run_phase::decode) idx->add_batch(b.layer, base_.batches().experts_of(b));
    idx->finish();
    decode_next_use_ = std::move(idx);
    decode_index_.assign(decode_tokens_ * shape().n_layers(), npos);
    for (const batch& b : batches_)
      if (b.phase == run_phase::decode && to_index(b.layer) < shape().n_layers())
        decode_index_[static_cast<std::size_t>(b.decode_token) * shape().n_layers() + to_index(b.layer)] = b.first;
  }

  replay_input base_;
  recorded_routings rec_;
  std::vector<batch> batches_;
  std::vector<std::size_t> decode_index_;
  std::size_t decode_tokens_ = 0;
  std::shared_ptr<const next_use_index> decode_next_use_;
};

/// Where the speculative reads' predictions come from.
enum class speculation_source : std::uint8_t {
  none,        ///< no speculation
  prev_token,  ///< the same layer's routing one token earlier (prev_token_predictor)
  frequency,   ///< running counts of the layer (frequency_predictor)
  oracle,      ///< the true routing of the target layer, each slot kept with probability P
  given,       ///< the host's own rankings (replay_speculation::given), e.g. a live manager's
};

/// Speculation in a dynamic replay: the predictor, and the planner's cap and
/// horizon exactly as `speculation` takes them.
struct replay_speculation {
  speculation_source source = speculation_source::none;
  /// oracle: probability in [0, 1] that a true slot is kept; otherwise it is
  /// replaced by an expert the layer does not route (same predicted weight).
  double oracle_p = 1.0;
  /// oracle: per-layer P (one entry per layer of the shape), overriding oracle_p when not empty.
  std::vector<double> oracle_profile;
  std::uint64_t seed = 0x5eed;  ///< seed of the oracle's draws
  std::size_t cap = speculation_planner::default_cap;
  std::size_t horizon = 1;  ///< 1: the next MoE layer; 2: the one after
  /// given: `given(token, target, out)` fills `out` with the ranking of MoE
  /// layer `target` predicted after the load `horizon` layers before it in
  /// decode token `token` (from 0), or returns false for none.
  std::function<bool(std::uint32_t token, layer_id target, ranking& out)> given;

  /// "prev-token", "frequency", "oracle:0.886", "none" for people; parses back
  /// (parse_replay_speculation) to a speculation of the same name ("given",
  /// which names a function, does not parse).
  std::string name() const {
    switch (source) {
      case speculation_source::none: return "none";
      case speculation_source::prev_token: return "prev-token";
      case speculation_source::frequency: return "frequency";
      case speculation_source::oracle:
        if (!oracle_profile.empty()) return "oracle:profile";
        // %g's six digits name a normal double that prints back the same; a
        // subnormal P (below 2.2e-308) lacks the precision, so it is named exactly.
        return "oracle:" + (std::fpclassify(oracle_p) == FP_SUBNORMAL ? detail::format_printf("%.17g", oracle_p)
                                                                      : detail::format_number(oracle_p));
      case speculation_source::given: return "given";
    }
    return "?";
  }
};

/// Parses `prev-token`, `frequency`, `oracle:P` (0 <= P <= 1) or `none`.
/// Throws `error` naming the text otherwise (an empty text too: "none" says
/// no speculation, nothing does not).
inline replay_speculation parse_replay_speculation(const std::string& text) {
  replay_speculation s;
  if (text.empty()) throw error("--speculate: empty; expected none, prev-token, frequency or oracle:P (0 <= P <= 1)");
  if (text == "none") return s;
  if (text == "prev-token" || text == "prev") {
    s.source = speculation_source::prev_token;
  } else if (text == "frequency") {
    s.source = speculation_source::frequency;
  } else if (text.rfind("oracle:", 0) == 0) {
    s.source = speculation_source::oracle;
    const std::string v = text.substr(7);
    s.oracle_p = detail::parse_real(v, "--speculate: '" + text + "': P of oracle:P", detail::real_domain::closed(0, 1));
  } else {
    throw error("--speculate: '" + text + "'; expected prev-token, frequency or oracle:P (0 <= P <= 1)");
  }
  return s;
}

/// One decode load of a dynamic replay: what the cache and speculation did.
struct load_event {
  std::uint32_t token = 0;  ///< decode token index, from 0
  layer_id layer{};
  std::uint16_t routed = 0;                      ///< routed experts (slots)
  std::uint16_t dropped = 0;                     ///< of those, skipped by the drop policy
  std::uint16_t hits = 0;                        ///< unique lookups that hit
  std::uint16_t misses = 0;                      ///< unique lookups that missed: demanded reads
  std::uint16_t speculative_hits = 0;            ///< of the hits, thanks to a speculative read (useful)
  std::uint16_t speculative_inserted = 0;        ///< speculative reads made resident at this load's quiesce
  std::uint64_t speculative_inserted_bytes = 0;  ///< the bytes those reads read
  std::uint32_t evictions = 0;                   ///< evictions in this load (its batch and the integration)
  std::uint64_t demanded_bytes = 0;              ///< bytes of the demanded reads
  std::uint16_t speculative_issued = 0;          ///< reads planned after this load (for a later layer)
  std::uint16_t speculative_cancelled = 0;       ///< of those, cancelled by the observer's admit()
  std::uint64_t speculative_bytes = 0;           ///< bytes of the issued reads that were not cancelled
  std::uint64_t expert_bytes = 0;                ///< bytes of one expert of this layer
  /// Set by a timing model of an engine, not by the replay (0 here): experts
  /// the engine's manager requests at this load whether resident or not (its
  /// advice calls and lane hand-off), and misses of a pinned cache it keeps
  /// inside the page cache (a lock, and the eviction's unlock). moe_residency_lab/lab.hpp.
  std::uint16_t requested = 0;
  std::uint16_t pinned = 0;
};

/// Hooks a timing model plugs into a dynamic replay (called on its thread).
struct replay_observer {
  /// Each decode load, after its demanded batch, before its speculative reads are planned.
  std::function<void(const load_event&)> on_load;
  /// Each speculative read, in issue order, right after the load it follows:
  /// true lets it complete (it enters the cache at the next load's quiesce),
  /// false cancels it (it never does). Empty: every read completes.
  std::function<bool(layer_id target, std::uint64_t bytes)> admit;
};

/// One dynamic replay cell.
struct dynamic_replay_options {
  std::string policy = "lru";
  double budget_mib = 0;
  std::optional<double> drop;  ///< F: cache-aware dropping armed (decode only)
  replay_speculation speculation;
  cycle_guard guard = cycle_guard::warn;
  std::uint64_t seed = 0x5eed;  ///< of the random policy
  cycle_policy_options cycle{};
  adaptive_policy_options adaptive{};  ///< the adaptive policy's tuning (its cycle rule takes `cycle`)
  /// true: prompt batches go through the cache as an engine's own cache does
  /// (the recorded hit rates count them). false: they leave the cache alone,
  /// as the live residency manager does (it manages decode only), so the
  /// replay makes the manager's decisions (llama_cpp/mmap_residency_layer.hpp).
  bool prefill_cached = true;
};

/// What a dynamic replay did, decode figures per token.
struct dynamic_replay_result {
  dynamic_replay_options options;
  cache_stats cache;
  speculation_stats speculation;
  scheduler_stats reads;
  drop_stats drops;
  std::vector<load_event> decode_loads;
  std::size_t decode_tokens = 0;
  std::uint64_t token_cycle_bytes = 0;
  std::string warning;

  double hit_pct_decode() const noexcept { return cache.decode.hit_pct(); }
  double demanded_mib_per_token() const noexcept {
    return decode_tokens ? to_mib(cache.decode.bytes_read) / static_cast<double>(decode_tokens) : 0.0;
  }
  /// MiB of speculative reads that completed (were not cancelled), per decode token.
  double speculative_mib_per_token() const noexcept {
    std::uint64_t b = 0;
    for (const auto& e : decode_loads) b += e.speculative_bytes;
    return decode_tokens ? to_mib(b) / static_cast<double>(decode_tokens) : 0.0;
  }
};

namespace detail {

inline std::uint64_t replay_splitmix(std::uint64_t& x) noexcept {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// The oracle's prediction of `truth`: slot by slot, the true expert with
/// probability p, else an expert of [0, n_experts) that `truth` does not route
/// and `out` does not hold yet (skipped when none is left); predicted weight =
/// the slot's true weight. Deterministic in `rng`.
inline void oracle_ranking(const routing& truth, double p, std::size_t n_experts, std::uint64_t& rng,
                           ranking& out) noexcept {
  out.clear();
  for (std::size_t s = 0; s < truth.size(); ++s) {
    const double u = static_cast<double>(replay_splitmix(rng) >> 11) * 0x1.0p-53;
    expert_id e = truth.id(s);
    if (!(u < p)) {
      if (n_experts <= truth.size() + out.size()) continue;
      do {
        e = expert_id(static_cast<std::uint16_t>(replay_splitmix(rng) % n_experts));
      } while (truth.contains(e) || out.contains(e));
    }
    out.push_back(e, static_cast<float>(truth.size() - s), truth.weight(s));
  }
}

/// Calls f(policy) with the base policy `name` (no retention decorators).
/// Belady's future is the sequence of lookups the cache will see: every
/// batch, or the decode batches alone when the prompt skips the cache.
template <class F>
void with_replay_policy(const std::string& name, const routed_replay_input& in, const dynamic_replay_options& o,
                        F&& f) {
  if (name.find('+') != std::string::npos)
    throw error("replay: policy '" + name + "' with --drop/--speculate/--decode-only; expected a base policy: " +
                cache_policy_names() + " (retention decorators are not combined with them)");
  cache_policy_args a = replay_policy_args(in.base(), o.seed, o.cycle, o.adaptive);
  if (!o.prefill_cached) a.next_use = in.decode_next_use();
  with_cache_policy(name, a, std::forward<F>(f));
}

template <class Policy>
void replay_dynamic_run(const routed_replay_input& in, Policy policy, const dynamic_replay_options& o,
                        const replay_observer& obs, dynamic_replay_result& out) {
  using cache_t = expert_cache<Policy>;
  const model_shape& shape = in.shape();
  const replay_speculation& sp = o.speculation;
  std::string warning;
  auto sink = [&warning](const std::string& m) { warning += (warning.empty() ? "" : "; ") + m; };
  cache_options co;
  co.budget_bytes = from_mib(o.budget_mib);
  co.guard = o.guard;
  co.on_warning = sink;
  speculation_options so;
  so.enabled = sp.source != speculation_source::none;
  so.cap = sp.cap;
  so.horizon = sp.horizon;
  if (o.drop) {
    drop_options d;
    d.fraction = *o.drop;
    d.on_warning = sink;
    so.drop = d;
  }
  so.scheduler.lanes = 0;  // synchronous: deterministic, reads complete at the end of layer_loaded
  so.scheduler.queue_capacity = std::max<std::size_t>(2 * sp.cap, 2);
  so.demanded_reads = false;  // the cache's lookup already made a demanded miss resident
  std::uint16_t cancelled = 0;
  std::uint64_t admitted = 0;
  read_callback read = [&](layer_id l, expert_id, read_reason why) -> read_status {
    if (why == read_reason::demanded) return read_status::ok;
    const std::uint64_t b = shape.expert_bytes(l);
    if (obs.admit && !obs.admit(l, b)) {
      ++cancelled;
      return read_status::failed;  // a cancelled read never makes its expert resident
    }
    admitted += b;
    return read_status::ok;
  };
  if (sp.source == speculation_source::given && !sp.given)
    throw error(
        "replay: speculation from given rankings without a function to give them; expected "
        "replay_speculation::given");
  if (sp.source == speculation_source::oracle && !sp.oracle_profile.empty() &&
      sp.oracle_profile.size() != shape.n_layers())
    throw error("replay: oracle profile has " + std::to_string(sp.oracle_profile.size()) + " entries; expected " +
                std::to_string(shape.n_layers()) + " (one P per layer)");
  speculation<cache_t> spec(shape, cache_t(shape, std::move(co), std::move(policy)), std::move(read), so);
  prev_token_predictor prev;
  prev.reset(shape);
  frequency_predictor freq;
  freq.reset(shape);
  std::uint64_t rng = sp.seed;
  ranking rank;
  std::vector<std::uint32_t> masks;
  const auto& rs = in.routings();

  auto predict = [&](std::uint32_t token, layer_id target) -> bool {
    switch (sp.source) {
      case speculation_source::prev_token: return prev.predict(target, rank);
      case speculation_source::frequency: return freq.predict(target, rank);
      case speculation_source::oracle: {
        rank.clear();
        const routing* truth = in.decode_routing(token, target);
        if (!truth) return false;
        const double p = sp.oracle_profile.empty() ? sp.oracle_p : sp.oracle_profile[to_index(target)];
        oracle_ranking(*truth, p, shape.n_experts(), rng, rank);
        return !rank.empty();
      }
      case speculation_source::given: return sp.given(token, target, rank);
      case speculation_source::none: break;
    }
    return false;
  };

  auto learn = [&](const routed_replay_input::batch& b) {
    for (std::size_t t = 0; t < b.count; ++t) {
      prev.observe(rs[b.first + t]);
      freq.observe(rs[b.first + t]);
    }
  };

  for (const auto& b : in.batches()) {
    if (b.phase == run_phase::prefill && !o.prefill_cached) {
      learn(b);  // the predictors still learn from the prompt
      continue;
    }
    if (b.phase == run_phase::decode && b.first_of_token) spec.begin_batch(run_phase::decode);
    masks.assign(b.count, 0);
    const cache_stats c0 = spec.cache().stats();
    const speculation_stats s0 = spec.stats();
    spec.routed(span<const routing>(rs.data() + b.first, b.count), span<std::uint32_t>(masks.data(), b.count));
    if (b.phase == run_phase::decode) {
      const cache_stats& c1 = spec.cache().stats();
      const speculation_stats s1 = spec.stats();
      load_event ev;
      ev.token = b.decode_token;
      ev.layer = b.layer;
      for (std::size_t t = 0; t < b.count; ++t) {
        ev.routed = static_cast<std::uint16_t>(ev.routed + rs[b.first + t].size());
        for (std::uint32_t m = masks[t]; m; m &= m - 1) ++ev.dropped;
      }
      ev.hits = static_cast<std::uint16_t>(c1.decode.hits - c0.decode.hits);
      ev.misses = static_cast<std::uint16_t>(c1.decode.misses - c0.decode.misses);
      ev.demanded_bytes = c1.decode.bytes_read - c0.decode.bytes_read;
      ev.evictions = static_cast<std::uint32_t>(c1.all.evictions - c0.all.evictions);
      ev.speculative_hits = static_cast<std::uint16_t>(s1.useful - s0.useful);
      ev.speculative_inserted = static_cast<std::uint16_t>(s1.inserted - s0.inserted);
      ev.expert_bytes = shape.expert_bytes(b.layer);
      ev.speculative_inserted_bytes = ev.speculative_inserted * ev.expert_bytes;
      if (obs.on_load) obs.on_load(ev);
      layer_id target{};
      if (so.enabled && moe_layer_ahead(shape, b.layer, sp.horizon, target)) {
        const bool have = predict(b.decode_token, target);
        cancelled = 0;
        admitted = 0;
        const std::uint64_t issued0 = spec.read_stats().issued;
        spec.layer_loaded(b.layer, have ? &rank : nullptr);
        ev.speculative_issued = static_cast<std::uint16_t>(spec.read_stats().issued - issued0);
        ev.speculative_cancelled = cancelled;
        ev.speculative_bytes = admitted;
      }
      out.decode_loads.push_back(ev);
    }
    learn(b);
  }
  spec.finish();
  // Belady is the optimum only over the lookups its index describes. Dropped
  // experts are never looked up, so with dropping the sequence leaves the
  // index and Belady falls back to "never used again": say so, not an oracle.
  if constexpr (std::is_same<Policy, belady_policy>::value)
    if (spec.cache().policy().diverged())
      sink(
          "belady: the cache's lookups left the sequence its future was computed from (dropped experts are "
          "never looked up), so it is not the optimum here; compare it without --drop");
  out.cache = spec.cache().stats();
  if (const std::string w = over_budget_warning(from_mib(o.budget_mib), out.cache.peak_bytes); !w.empty()) sink(w);
  out.speculation = spec.stats();
  out.reads = spec.read_stats();
  if (spec.drop()) out.drops = spec.drop()->stats();
  out.decode_tokens = in.decode_tokens();
  out.token_cycle_bytes = spec.cache().token_cycle_bytes();
  out.warning = warning;
}

}  // namespace detail

/// Replays a trace through one cache with the drop policy and/or speculative
/// reads, through the library's own `speculation` glue (synchronous
/// scheduler): drops decided after completed speculative reads are applied;
/// a dropped expert is never read and never enters the cache; speculative
/// reads are planned by `speculation_planner` after each decode load for the
/// layer `horizon` ahead and enter the cache at the next load's quiesce.
/// Speculation runs in decode only; prompt batches use the cache unless
/// `prefill_cached` is false. Throws `error` on a bad policy, budget,
/// F, cap, horizon or oracle profile.
inline dynamic_replay_result replay_dynamic(const routed_replay_input& in, const dynamic_replay_options& o,
                                            const replay_observer& obs = {}) {
  check_replay_cell(o.policy, o.budget_mib);
  dynamic_replay_result out;
  out.options = o;
  out.options.policy = detail::parse_replay_policy(o.policy).canonical();
  detail::with_replay_policy(o.policy, in, o,
                             [&](auto policy) { detail::replay_dynamic_run(in, std::move(policy), o, obs, out); });
  return out;
}

}  // namespace moe_residency
