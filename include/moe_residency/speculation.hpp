#pragma once
/// Speculation at run time: the glue between a cache, the drop policy, the
/// planner and the read scheduler, usable directly by an engine or as an
/// extension a `session` owns (it implements the session's optional
/// `on_begin_batch / on_routed / on_layer_loaded` hooks).
///
/// Its calls are the engine's events (events.hpp), in their order (host thread):
///  0. `begin_batch`, once per batch before its first layer: counts decode
///     tokens, the denominator of every "per token" figure in the lines; an
///     engine without a session calls it itself, once per decode token.
///  1. `routed`, a layer's load: quiesce the scheduler, apply the speculative
///     reads that completed to the cache (in issue order, however the lanes
///     finished them), decide drops (after the integration, so a speculative
///     read that landed un-drops its expert), run the cache's load batch for
///     the kept experts, read the misses through the scheduler (demanded
///     before any speculation).
///  2. `layer_loaded`: plan the reads for the MoE layer `horizon` ahead from
///     its predicted ranking and hand them to the scheduler — only now, never
///     when the prediction was made.
/// With dropping off, the experts demanded and the routings executed are the
/// same with and without speculation; only residency and timing change.
/// docs/speculation.md has the rules, the accounting and the measured lesson.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/cache/expert_cache.hpp"
#include "moe_residency/core.hpp"
#include "moe_residency/detail/format.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/io.hpp"
#include "moe_residency/plan.hpp"
#include "moe_residency/predict/contract.hpp"
#include "moe_residency/session_hook.hpp"

namespace moe_residency {

/// How a `speculation` is configured.
struct speculation_options {
  /// false: the control arm — same cache, drops and demanded reads, no
  /// speculative read ever issued (for matched pairs).
  bool enabled = true;
  /// The planner's cap: speculative reads per layer (2 measured best on phone flash).
  std::size_t cap = speculation_planner::default_cap;
  /// Read for the MoE layer `horizon` MoE layers after the one just loaded
  /// (1 or 2; the predictor must rank that layer by then).
  std::size_t horizon = 1;
  /// Cache-aware dropping, armed when set.
  std::optional<drop_options> drop;
  /// Lanes, queue bound, quiesce mode. lanes = 0: synchronous — speculative
  /// reads run inline right after they are issued (end of `layer_loaded`), which
  /// makes a run deterministic for tests and replays.
  scheduler_options scheduler;
  /// Read the demanded misses through the scheduler's lanes (a host that
  /// loads its own demanded experts sets false; quiesce still runs).
  bool demanded_reads = true;
};

/// What speculation did to residency, per run. Reads themselves (issued,
/// completed, cancelled, failed, stall) are in `read_scheduler::stats()`.
struct speculation_stats {
  std::uint64_t loads = 0;                    ///< demanded loads (layer × batch)
  std::uint64_t decode_tokens = 0;            ///< counted by begin_batch (a session calls it)
  std::uint64_t no_prediction = 0;            ///< layer_loaded without a ranking for the target layer
  std::uint64_t planned = 0;                  ///< reads the planner proposed
  std::uint64_t skipped_resident = 0;         ///< predictions already resident
  std::uint64_t skipped_below_threshold = 0;  ///< predicted misses the armed drop would skip
  std::uint64_t inserted = 0;                 ///< completed reads made resident in the cache
  std::uint64_t inserted_bytes = 0;
  std::uint64_t redundant = 0;  ///< completed, but already resident when applied
  std::uint64_t redundant_bytes = 0;
  std::uint64_t useful = 0;  ///< inserted, then demanded before eviction
  std::uint64_t useful_bytes = 0;
  std::uint64_t evicted_unused = 0;  ///< inserted, evicted before any demand
  std::uint64_t evicted_unused_bytes = 0;
  std::uint64_t pending = 0;          ///< inserted, still resident, not demanded yet
  std::uint64_t undropped = 0;        ///< experts kept only because speculation made them resident
  std::uint64_t demanded_reads = 0;   ///< misses read by the demanded loads
  std::uint64_t demanded_failed = 0;  ///< of those, failed (the host must handle them)
  std::uint64_t decode_stall_ns = 0;  ///< decode loads' time in quiesce + demanded reads, ns
};

namespace detail {
// "'tiny' (4 layers, 16 experts, top-4, 400 expert bytes in all)": enough to
// tell two shapes apart even when their names are equal.
inline std::string plan_describe_shape(const model_shape& s) {
  std::uint64_t bytes = 0;
  for (std::size_t l = 0; l < s.n_layers(); ++l) bytes += s.expert_bytes(layer_id(static_cast<std::uint16_t>(l)));
  return "'" + s.name() + "' (" + std::to_string(s.n_layers()) + " layers, " + std::to_string(s.n_experts()) +
         " experts, top-" + std::to_string(s.top_k()) + ", " + std::to_string(bytes) + " expert bytes in all)";
}
}  // namespace detail

/// Speculative reads for a cache, with drop policy, planner and scheduler.
/// `Cache` is an `expert_cache<Policy>` (or anything with its engine API:
/// is_resident, insert(layer, expert, phase), invalidate, begin_batch, lookup,
/// end_batch, stats, budget_bytes).
/// `Predictor` is the index of the session predictor whose ranking is used
/// (0 = the first; stale-gate in `standard_session`). Movable, not copyable;
/// every member is called from the host thread.
template <class Cache, std::size_t Predictor = 0>
class speculation {
 public:
  /// Throws `error` on a horizon outside [1, 2], a cap above 32, a bad drop
  /// fraction, a bad scheduler configuration, or a cache of another shape.
  speculation(const model_shape& shape, Cache cache, read_callback read, speculation_options options = {})
      : shape_(shape), options_(std::move(options)), cache_(std::move(cache)), planner_(options_.cap) {
    if (options_.horizon < 1 || options_.horizon > 2)
      throw error("speculation: horizon " + std::to_string(options_.horizon) +
                  " out of range; expected 1 (next MoE layer) or 2");
    if (!(cache_.shape() == shape_))
      throw error("speculation: the cache's model shape " + detail::plan_describe_shape(cache_.shape()) +
                  " differs from " + detail::plan_describe_shape(shape_) + "; expected the same shape");
    if (options_.drop) drop_.emplace(shape_, *options_.drop);
    scheduler_ = std::make_unique<read_scheduler>(std::move(read), options_.scheduler);
    const std::size_t slots = shape_.n_layers() * shape_.n_experts();
    pending_flag_.assign(slots, 0);
    pending_list_.reserve(slots);
    demanded_.reserve(shape_.n_experts());
    outcomes_.resize(shape_.n_experts());
    issued_.reserve(max_top_k);
    completed_.reserve(options_.scheduler.queue_capacity + options_.scheduler.lanes + max_top_k);
  }

  // ---- the calls of a token and of a layer's load (engine API) -------------

  /// Start of a batch of `n_tokens` tokens in `phase`, before its first
  /// layer's `routed`: counts decode tokens (`stats().decode_tokens`), the
  /// denominator of the lines' "per token" figures. A session calls it from
  /// its `begin_batch`; an engine without a session calls it once per decode
  /// token (without it the "per token" figures are totals). Prefill batches
  /// count nothing. Allocation-free.
  void begin_batch(run_phase phase, std::size_t n_tokens = 1) noexcept {
    if (phase == run_phase::decode) stats_.decode_tokens += n_tokens;
  }

  /// Start of layer l's demanded load. `routings`: the layer's routing per
  /// token of the batch (token-major, all of one layer and phase);
  /// `drop_masks[t]` receives the slots of routing t to skip (0 when dropping
  /// is off). Returns the number of demanded misses.
  std::size_t routed(span<const routing> routings, span<std::uint32_t> drop_masks) noexcept {
    if (routings.empty()) return 0;
    const layer_id l = routings[0].layer;
    const run_phase phase = routings[0].phase;
    const std::uint64_t bytes = shape_.expert_bytes(l);
    ++stats_.loads;
    last_phase_ = phase;

    // 1. Quiesce, and apply what completed — on this (the host's) thread.
    const auto t0 = std::chrono::steady_clock::now();
    collect(scheduler_->quiesce());
    const auto t1 = std::chrono::steady_clock::now();
    integrate(phase);
    sweep();

    // 2. Drop decisions, on the residency speculation just updated.
    for (std::size_t t = 0; t < routings.size(); ++t) {
      std::uint32_t mask = 0;
      if (drop_) {
        const routing& r = routings[t];
        const drop_decision d = drop_->decide(r, resident_query());
        mask = d.dropped_mask;
        if (d.eligible) count_undropped(r, mask);
      }
      if (t < drop_masks.size()) drop_masks[t] = mask;
    }

    // 3. The cache's load batch: the kept experts, token-major.
    demanded_.clear();
    if (cache_.begin_batch(phase, l)) {
      for (std::size_t t = 0; t < routings.size(); ++t) {
        const routing& r = routings[t];
        const std::uint32_t mask = t < drop_masks.size() ? drop_masks[t] : 0u;
        for (std::size_t s = 0; s < r.size(); ++s) {
          if ((mask >> s) & 1u) continue;
          const expert_id e = r.id(s);
          const std::size_t slot = slot_of(l, e);
          const lookup_result res = cache_.lookup(e);
          if (res == lookup_result::hit && slot < pending_flag_.size() && pending_flag_[slot]) {
            pending_flag_[slot] = 0;  // a hit thanks to speculation
            ++stats_.useful;
            stats_.useful_bytes += bytes;
          } else if (res == lookup_result::miss) {
            demanded_.push_back(read_request{l, e, bytes});
          }
        }
      }
      cache_.end_batch();
    }

    // 4. The demanded reads, ahead of any speculative one.
    stats_.demanded_reads += demanded_.size();
    auto t2 = std::chrono::steady_clock::now(), t3 = t2;
    if (options_.demanded_reads && !demanded_.empty()) {
      const std::size_t ok = scheduler_->demand(span<const read_request>(demanded_.data(), demanded_.size()),
                                                span<read_outcome>(outcomes_.data(), demanded_.size()));
      stats_.demanded_failed += demanded_.size() - ok;
      t3 = std::chrono::steady_clock::now();
      // The lookup recorded each miss resident before its read: a failed one is not.
      if (ok != demanded_.size())
        for (std::size_t i = 0; i < demanded_.size(); ++i)
          if (outcomes_[i] != read_outcome::ok) cache_.invalidate(demanded_[i].layer, demanded_[i].expert);
    }
    if (phase == run_phase::decode)
      stats_.decode_stall_ns += static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>((t1 - t0) + (t3 - t2)).count());
    sweep();  // the batch may have evicted speculated entries
    return demanded_.size();
  }

  /// End of layer l's demanded load: plans reads for the MoE layer `horizon`
  /// ahead from `predicted` (its ranking with predicted weights; null when the
  /// predictor had none) and hands them to the scheduler. Returns the number
  /// issued. In synchronous mode they run here, before returning.
  std::size_t layer_loaded(layer_id l, const ranking* predicted) noexcept {
    issued_.clear();
    if (!options_.enabled) return 0;
    layer_id target{};
    if (!moe_layer_ahead(shape_, l, options_.horizon, target)) return 0;
    if (!predicted) {
      ++stats_.no_prediction;
      return 0;
    }
    // The threshold applies only when the drop policy will decide the target's
    // load: the next load is in the phase of the last one.
    std::optional<double> threshold;
    if (drop_ && (last_phase_ == run_phase::decode || options_.drop->include_prefill)) threshold = drop_->threshold();
    const speculation_plan p = planner_.plan(target, *predicted, shape_.top_k(), resident_query(), threshold);
    stats_.planned += p.size();
    stats_.skipped_resident += p.skipped_resident;
    stats_.skipped_below_threshold += p.skipped_below_threshold;
    const std::uint64_t bytes = shape_.expert_bytes(target);
    for (std::size_t i = 0; i < p.size(); ++i) {
      const read_request r{target, p.id(i), bytes};
      if (scheduler_->speculate(r)) issued_.push_back(r);
    }
    if (scheduler_->synchronous()) scheduler_->pump();
    return issued_.size();
  }

  /// End of the run: applies what completed (waiting as configured) so the
  /// counters are final, without issuing anything.
  void finish() noexcept {
    collect(scheduler_->quiesce());
    integrate(last_phase_);
    sweep();
  }

  // ---- what the last calls did (for a host that keeps storage of its own) --

  /// The misses of the last `routed`, token-major: the reads it demanded
  /// (and made, unless `demanded_reads` is off: then they are the host's).
  span<const read_request> demanded() const noexcept { return {demanded_.data(), demanded_.size()}; }
  /// The speculative reads the last `routed` (or finish) collected from the
  /// scheduler, in issue order, whatever became of them: ok ones were made
  /// resident unless already resident or refused by the cache.
  span<const completed_read> completed() const noexcept { return {completed_.data(), completed_.size()}; }
  /// The speculative reads the last `layer_loaded` handed to the scheduler, in plan order.
  span<const read_request> issued() const noexcept { return {issued_.data(), issued_.size()}; }

  // ---- session extension hooks ---------------------------------------------

  static constexpr session_hook hooks =
      session_hook::attach | session_hook::begin_batch | session_hook::routed | session_hook::layer_loaded;

  /// Refuses (throws `error`) a session whose predictor `Predictor` cannot rank
  /// the layer `horizon` MoE layers ahead when layer_loaded needs it: a gate
  /// predictor of horizon H ranks layer l + H from layer l's gate input, so at
  /// layer l's end it has ranked only up to l + H. Without this check every
  /// layer_loaded found no prediction and no speculative read was ever issued.
  template <class Session>
  void on_attach(const Session&) const {
    static_assert(Predictor < Session::n_predictors,
                  "speculation<Cache, Predictor>: Predictor is not an index of the session's predictors");
    using P = typename Session::template predictor_type<Predictor>;
    if constexpr (P::timing == prediction_timing::gate) {
      if (options_.enabled && options_.horizon > P::horizon)
        throw error("speculation: horizon " + std::to_string(options_.horizon) + " needs predictor " +
                    std::to_string(Predictor) + " to rank the MoE layer " + std::to_string(options_.horizon) +
                    " ahead when a layer is loaded, but predictor " + std::to_string(Predictor) + " ('" +
                    P::label().name + "') is a gate predictor of horizon " + std::to_string(P::horizon) +
                    "; expected horizon <= " + std::to_string(P::horizon) +
                    ", or a predictor that ranks further ahead (stale_gate_l2_predictor for horizon 2, or a "
                    "history predictor)");
    }
  }

  template <class Session>
  void on_begin_batch(Session&, run_phase phase, std::uint32_t, std::size_t n_tokens) noexcept {
    begin_batch(phase, n_tokens);
  }
  template <class Session>
  void on_routed(Session&, layer_id, span<const routing> routings, span<std::uint32_t> drop_masks) noexcept {
    routed(routings, drop_masks);
  }
  template <class Session>
  void on_layer_loaded(Session& s, layer_id l) noexcept {
    if (!options_.enabled) return;
    layer_id target{};
    if (!moe_layer_ahead(shape_, l, options_.horizon, target)) return;
    layer_loaded(l, s.template prediction<Predictor>(target));
  }
  /// The cache line, the drop line (when dropping is armed) and the prefetch
  /// line, to print after the prediction report. (Deliberately not the
  /// session's `append_notes` hook: the report prefixes notes with
  /// "moe-predict: ", and these are lines of their own.)
  std::vector<std::string> lines() const {
    std::vector<std::string> out{cache_line()};
    if (drop_) out.push_back(drop_line());
    out.push_back(prefetch_line());
    return out;
  }

  // ---- results --------------------------------------------------------------

  /// Counters, with `pending` current.
  speculation_stats stats() const noexcept {
    speculation_stats s = stats_;
    s.pending = pending_list_.size();
    return s;
  }
  scheduler_stats read_stats() const { return scheduler_->stats(); }

  /// `moe-prefetch: issued N / useful U (P% of completed) / cancelled C, X MiB speculated per token; ...`
  /// (with `no prediction N` when loads found no ranking of their target).
  std::string prefetch_line() const {
    const scheduler_stats r = scheduler_->stats();
    const speculation_stats s = stats();
    if (!options_.enabled)
      return "moe-prefetch: off (control arm); " + std::to_string(s.demanded_reads) + " demanded reads, decode stall " +
             per_token_ms(s.decode_stall_ns) + " ms per token";
    const double tokens = static_cast<double>(std::max<std::uint64_t>(s.decode_tokens, 1));
    const double useful_pct =
        r.completed ? 100.0 * static_cast<double>(s.useful) / static_cast<double>(r.completed) : 0.0;
    const std::uint64_t wasted = s.redundant_bytes + s.evicted_unused_bytes + r.discarded_bytes;
    return "moe-prefetch: issued " + std::to_string(r.issued) + " / useful " + std::to_string(s.useful) + " (" +
           detail::format_fixed(useful_pct, 1) + "% of completed) / cancelled " + std::to_string(r.cancelled) + ", " +
           detail::format_fixed(to_mib(r.completed_bytes) / tokens, 1) + " MiB speculated per token; completed " +
           std::to_string(r.completed) + ", failed " + std::to_string(r.failed) + ", rejected " +
           std::to_string(r.rejected) + ", wasted " + detail::format_fixed(to_mib(wasted), 1) + " MiB, pending " +
           std::to_string(s.pending) +
           // Loads whose target the predictor had not ranked: shown when any, since
           // they are reads that could not be planned at all.
           (s.no_prediction ? ", no prediction " + std::to_string(s.no_prediction) : std::string()) +
           ", decode stall " + per_token_ms(s.decode_stall_ns) + " ms per token";
  }
  /// `moe-drop: F = 1 (threshold 0.125): dropped D of N routed experts in R of M routings, ...`
  std::string drop_line() const {
    if (!drop_) return "moe-drop: off";
    const drop_stats& d = drop_->stats();
    return "moe-drop: F = " + detail::format_number(drop_->fraction()) + " (threshold " +
           detail::format_number(drop_->threshold()) + "): dropped " + std::to_string(d.experts_dropped) + " of " +
           std::to_string(d.experts) + " routed experts in " + std::to_string(d.routings_with_drop) + " of " +
           std::to_string(d.routings) + " routings; " +
           detail::format_fixed(100.0 * d.miss_bytes_avoided_fraction(), 1) + "% of miss bytes avoided (" +
           detail::format_fixed(to_mib(d.miss_bytes_avoided), 1) + " MiB), " +
           detail::format_fixed(100.0 * d.weight_discarded_fraction(), 1) + "% of router weight discarded; " +
           std::to_string(stats_.undropped) + " un-dropped by speculation";
  }
  /// `moe-cache: decode hit H% (cumulative C%), X MiB read per decode token, budget B MiB`
  std::string cache_line() const {
    const auto& c = cache_.stats();
    const double tokens = static_cast<double>(std::max<std::uint64_t>(stats_.decode_tokens, 1));
    return "moe-cache: decode hit " + detail::format_fixed(c.decode.hit_pct(), 1) + "% (cumulative " +
           detail::format_fixed(c.all.hit_pct(), 1) + "%), " +
           detail::format_fixed(to_mib(c.decode.bytes_read) / tokens, 1) + " MiB demanded per decode token, budget " +
           detail::format_fixed(to_mib(cache_.budget_bytes()), 0) + " MiB";
  }

  const Cache& cache() const noexcept { return cache_; }
  Cache& cache() noexcept { return cache_; }
  /// The drop policy, or null when dropping is off.
  const drop_policy* drop() const noexcept { return drop_ ? &*drop_ : nullptr; }
  const speculation_planner& planner() const noexcept { return planner_; }
  read_scheduler& scheduler() noexcept { return *scheduler_; }
  const speculation_options& options() const noexcept { return options_; }
  const model_shape& shape() const noexcept { return shape_; }

 private:
  auto resident_query() const noexcept {
    return [this](layer_id l, expert_id e) noexcept { return cache_.is_resident(l, e); };
  }
  // layer × n_experts + expert, or pending_flag_.size() (no slot) for an id
  // outside the shape: an expert id past the end must not alias the next layer.
  std::size_t slot_of(layer_id l, expert_id e) const noexcept {
    if (to_index(l) >= shape_.n_layers() || to_index(e) >= shape_.n_experts()) return pending_flag_.size();
    return to_index(l) * shape_.n_experts() + to_index(e);
  }
  std::string per_token_ms(std::uint64_t ns) const {
    const double tokens = static_cast<double>(std::max<std::uint64_t>(stats_.decode_tokens, 1));
    return detail::format_fixed(static_cast<double>(ns) / 1e6 / tokens, 2);
  }

  // The scheduler's completions, in issue order (its tickets): the lanes
  // finish them in any order, and the cache's decisions must depend on which
  // reads completed, not on which lane finished first.
  void collect(span<const completed_read> done) noexcept {
    completed_.assign(done.begin(), done.end());  // within the capacity reserved for it
    std::sort(completed_.begin(), completed_.end(),
              [](const completed_read& a, const completed_read& b) { return a.ticket < b.ticket; });
  }

  // Applies the collected speculative reads to the cache (host thread), in
  // issue order. Evictions they cause count in `phase` (the load's).
  void integrate(run_phase phase) noexcept {
    for (const completed_read& c : completed_) {
      if (c.outcome != read_outcome::ok) continue;  // counted by the scheduler; residency untouched
      const std::size_t slot = slot_of(c.request.layer, c.request.expert);
      if (slot >= pending_flag_.size()) continue;
      if (cache_.is_resident(c.request.layer, c.request.expert)) {
        ++stats_.redundant;
        stats_.redundant_bytes += c.request.bytes;
        continue;
      }
      if (!cache_.insert(c.request.layer, c.request.expert, phase)) continue;
      ++stats_.inserted;
      stats_.inserted_bytes += c.request.bytes;
      if (!pending_flag_[slot]) pending_list_.push_back(static_cast<std::uint32_t>(slot));
      pending_flag_[slot] = 1;
    }
  }

  // Settles speculated entries: demanded (flag cleared) or evicted unused.
  void sweep() noexcept {
    std::size_t w = 0;
    const std::size_t E = shape_.n_experts();
    for (std::size_t i = 0; i < pending_list_.size(); ++i) {
      const std::uint32_t slot = pending_list_[i];
      if (!pending_flag_[slot]) continue;  // demanded: counted as useful already
      const layer_id l = layer_id(static_cast<std::uint16_t>(slot / E));
      const expert_id e = expert_id(static_cast<std::uint16_t>(slot % E));
      if (!cache_.is_resident(l, e)) {
        pending_flag_[slot] = 0;
        ++stats_.evicted_unused;
        stats_.evicted_unused_bytes += shape_.expert_bytes(l);
        continue;
      }
      pending_list_[w++] = slot;
    }
    pending_list_.resize(w);
  }

  // Slots the drop policy would have skipped had speculation not made them resident.
  void count_undropped(const routing& r, std::uint32_t mask) noexcept {
    const std::size_t top = drop_policy::top_weighted_slot(r);
    for (std::size_t s = 0; s < r.size(); ++s) {
      if (s == top || ((mask >> s) & 1u)) continue;
      if (!(static_cast<double>(r.weight(s)) < drop_->threshold())) continue;
      const std::size_t slot = slot_of(r.layer, r.id(s));
      if (slot < pending_flag_.size() && pending_flag_[slot]) ++stats_.undropped;
    }
  }

  model_shape shape_;
  speculation_options options_;
  Cache cache_;
  speculation_planner planner_;
  std::optional<drop_policy> drop_;
  std::unique_ptr<read_scheduler> scheduler_;
  std::vector<std::uint8_t> pending_flag_;   // per slot: resident through speculation, not yet demanded
  std::vector<std::uint32_t> pending_list_;  // the slots with the flag set (or just cleared)
  std::vector<read_request> demanded_;
  std::vector<read_outcome> outcomes_;
  std::vector<read_request> issued_;       // the last layer_loaded's speculative reads
  std::vector<completed_read> completed_;  // the last quiesce's completions
  speculation_stats stats_;
  run_phase last_phase_ = run_phase::prefill;  // phase of the last `routed`
};

}  // namespace moe_residency
