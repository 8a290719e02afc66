#pragma once
/// The memory lab's configurations (scripts/memlab.sh, docs/memlab.md) as
/// inputs of the timing model (timing.hpp): which cache, which lanes, which
/// speculation each one is, and — for the configurations that leave reading
/// to page faults — a page cache with read-around that turns a route trace
/// into the faults a run takes. Everything here is known *before* the
/// configuration runs: the route trace (routing is the same in every lab run:
/// same file, prompt, seed, bit-identical logits), the memory limit, the
/// cache budget, the configuration's levers, and the device's parameters.
/// Nothing of the target run's own measurement goes in.
/// docs/wall-clock.md ("Against this machine") writes each mapping down.
///
/// Standard library only.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/cache.hpp"
#include "moe_residency/plan.hpp"
#include "moe_residency/replay.hpp"
#include "moe_residency/timing.hpp"
#include "moe_residency/timing/lab_page_cache.hpp"
#include "moe_residency/trace/batches.hpp"

namespace moe_residency {

/// The lab's configurations (docs/memlab.md, "The configurations").
enum class lab_config : std::uint8_t { mmap, observer, dense, exact, predicted, cache, all, degraded, resident };

inline const char* to_string(lab_config c) noexcept {
  switch (c) {
    case lab_config::mmap: return "mmap";
    case lab_config::observer: return "observer";
    case lab_config::dense: return "dense";
    case lab_config::exact: return "exact";
    case lab_config::predicted: return "predicted";
    case lab_config::cache: return "cache";
    case lab_config::all: return "all";
    case lab_config::degraded: return "degraded";
    case lab_config::resident: return "resident";
  }
  return "?";
}

/// Throws `error` naming the text and the configurations expected.
inline lab_config parse_lab_config(const std::string& s) {
  for (lab_config c :
       {lab_config::mmap, lab_config::observer, lab_config::dense, lab_config::exact, lab_config::predicted,
        lab_config::cache, lab_config::all, lab_config::degraded, lab_config::resident})
    if (s == to_string(c)) return c;
  throw error("lab configuration '" + s +
              "'; expected mmap, observer, dense, exact, predicted, cache, all, degraded or resident");
}

/// What is known of one lab run before it runs.
struct lab_setup {
  double limit_mib = 0;         ///< the cgroup's memory limit; 0: none (resident)
  double dense_mib = 0;         ///< the file's non-expert bytes (the trace header's dense_bytes)
  double overhead_mib = 64;     ///< the cgroup's other memory: llama.cpp's buffers, the binary's pages (assumed)
  double budget_mib = 0;        ///< the pinned cache's budget (--residency-budget)
  double stale_gate_pct = 100;  ///< the stale-gate's slot accuracy (measured by an observer run)
  double degraded_pct = 88.6;   ///< the `degraded` configuration's target accuracy
  std::size_t lanes = 2;        ///< the manager's read lanes (--lanes)
  std::size_t spec_cap = 2;     ///< predicted reads per layer at most (--spec-cap)
  double readaround_mib = 16;   ///< a fault's read-around window (read_ahead_kb × 2 under FADV_SEQUENTIAL)
  /// The manager's own cost with every expert resident (memlab's manager-exact
  /// and manager-cache runs against resident-all; measure_manager_cost): ν_q and ν_p of
  /// equation (6), ms of wall per requested expert and per pinned-cache miss,
  /// the part of each in the eval thread's kernel time, and the part in its
  /// user time (for calibrate_lab; timing/lab_manager.hpp measures them). The
  /// rest of each is off the eval thread's CPU (waiting for a lane).
  double request_ms = 0, request_sys_ms = 0, request_user_ms = 0;
  double pin_ms = 0, pin_sys_ms = 0, pin_user_ms = 0;
  /// The fault walk (docs/wall-clock.md, "The fault path, measured"): ms off the CPU and in
  /// the kernel per MiB; > 0: a fault cell's reads cost these, not the curve × β_f, λ, κ.
  double fault_walk_off_cpu_ms_per_mib = 0, fault_walk_sys_ms_per_mib = 0;
  /// The inline walk (docs/wall-clock.md, "The inline path, measured"): the same for `cache`'s
  /// reads, locked by the eval thread; > 0: they cost these, not the curve × β, κ, ψ and ν_p's kernel part.
  double inline_walk_off_cpu_ms_per_mib = 0, inline_walk_sys_ms_per_mib = 0;
};

/// How a configuration is modelled.
enum class lab_model_kind : std::uint8_t {
  resident,  ///< the file in the page cache: no reads, compute only
  lanes,     ///< the manager reads every miss of an expert-granular LRU on lanes before the layer's matmuls
  faults,    ///< page faults with read-around through a page-granular two-list page cache, one at a time
};

inline const char* to_string(lab_model_kind k) noexcept {
  return k == lab_model_kind::resident ? "resident" : k == lab_model_kind::lanes ? "lanes" : "faults";
}

struct lab_mapping {
  lab_model_kind kind = lab_model_kind::lanes;
  /// lanes: expert bytes the page cache (and the pinned cache inside it) holds;
  /// faults: the page cache's bytes for the file (dense included unless pinned).
  double cache_mib = 0;
  bool dense_pinned = false;       ///< faults: the dense pages are locked, outside the page cache's lists
  std::size_t lanes = 1;           ///< concurrent demanded reads
  replay_speculation speculation;  ///< predicted reads
  /// lanes: the manager requests every routed expert at each load (exact
  /// without the pinned cache), or only the pinned cache's misses.
  bool requests_routed = false;
  double pinned_mib = 0;  ///< lanes: the pinned cache's budget (0: none)
  /// lanes: the pinned cache's misses are locked on the manager's lanes
  /// (with exact reads: `all`, `degraded`), not inline on the eval thread
  /// (`cache` alone); the pins' cost ν_p is then shared by `lanes` in parallel.
  bool pins_on_lanes = false;
  /// ν_p as the eval thread waits for it: the measured per-pin cost (inline,
  /// memlab's manager-cache), divided by the lanes that share it.
  double pin_ms(const lab_setup& s) const noexcept {
    return pins_on_lanes ? s.pin_ms / static_cast<double>(lanes) : s.pin_ms;
  }
  /// lanes: the eval thread reads and locks the misses itself (`cache` alone,
  /// one lane): the device time of those reads overlaps its own kernel work
  /// for them, which the model says with ψ = 1 (timing_params::kernel_overlap;
  /// docs/wall-clock.md, "Pooled runs, the manager's user time, and misses
  /// locked inline"). On the lanes, the eval thread only waits for another
  /// thread's reads (ψ = 0).
  bool reads_inline = false;
  /// The part of pin_ms off the eval thread's CPU: all of it on lanes.
  double pin_off_cpu_ms(const lab_setup& s) const noexcept {
    return pins_on_lanes ? pin_ms(s) : std::max(0.0, s.pin_ms - s.pin_sys_ms - s.pin_user_ms);
  }
  /// The part of pin_ms in the eval thread's user time: none on lanes.
  double pin_user_ms(const lab_setup& s) const noexcept { return pins_on_lanes ? 0.0 : s.pin_user_ms; }
};

/// The mapping of docs/wall-clock.md ("Against this machine"). Throws `error`
/// when a limited configuration's memory is not larger than what it must hold.
inline lab_mapping map_lab_config(lab_config c, const lab_setup& s) {
  lab_mapping m;
  if (c == lab_config::resident) {
    m.kind = lab_model_kind::resident;
    return m;
  }
  if (!(s.limit_mib > 0))
    throw error(std::string("lab configuration ") + to_string(c) + ": limit " + std::to_string(s.limit_mib) +
                " MiB; expected a memory limit > 0 (only resident runs without one)");
  // The stale-gate's reads, as a predictor of that slot accuracy (%): its first spec_cap, one layer ahead.
  const auto oracle = [&s](double pct) {
    replay_speculation r;
    r.source = speculation_source::oracle, r.oracle_p = std::min(1.0, pct / 100.0), r.cap = s.spec_cap, r.horizon = 1;
    return r;
  };
  switch (c) {
    case lab_config::mmap:
    case lab_config::observer:
    case lab_config::predicted:
    case lab_config::dense:
      // No exact reads: the expert ranges are not advised MADV_RANDOM, so every
      // miss is a fault that reads a read-around window. `predicted` also reads
      // the stale-gate's first `spec_cap` experts of the next layer on its lanes
      // (WILLNEED and POPULATE_READ of their slices: no read-around); with no
      // pinned cache to plan around, it plans them whatever the page cache holds.
      m.kind = lab_model_kind::faults;
      m.dense_pinned = c == lab_config::dense;
      m.cache_mib = s.limit_mib - s.overhead_mib - (m.dense_pinned ? s.dense_mib : 0.0);
      m.lanes = 1;
      if (c == lab_config::predicted) m.speculation = oracle(s.stale_gate_pct);
      break;
    case lab_config::exact:
    case lab_config::cache:
    case lab_config::all:
    case lab_config::degraded:
      // The page cache holds the experts besides the dense weights (read every
      // token, so never the LRU's victims) and the overhead; the pinned cache
      // is part of that memory, so the union behaves as one LRU of that size.
      m.kind = lab_model_kind::lanes;
      m.cache_mib = s.limit_mib - s.dense_mib - s.overhead_mib;
      // cache alone reads its misses inline on the eval thread: one lane.
      m.lanes = c == lab_config::cache ? 1 : s.lanes;
      // exact alone requests every routed expert (WILLNEED, then POPULATE_READ
      // on a lane); with the pinned cache, only the cache's misses (locked).
      m.requests_routed = c == lab_config::exact;
      m.pinned_mib = c == lab_config::exact ? 0.0 : s.budget_mib;
      // With exact reads the cache's misses are read and locked on the lanes
      // (mmap_residency::read_on_lanes); the cache alone locks them inline.
      m.pins_on_lanes = m.pinned_mib > 0 && c != lab_config::cache;
      m.reads_inline = c == lab_config::cache;
      if (c == lab_config::all || c == lab_config::degraded)
        m.speculation = oracle(c == lab_config::all ? s.stale_gate_pct : s.degraded_pct);
      break;
    case lab_config::resident: break;
  }
  if (!(m.cache_mib > 0))
    throw error(std::string("lab configuration ") + to_string(c) + ": limit " + std::to_string(s.limit_mib) +
                " MiB leaves " + std::to_string(m.cache_mib) +
                " MiB for the page cache after the dense weights and the overhead; expected > 0");
  return m;
}

/// The decode loads of a fault-driven run: every batch of the trace (prompt
/// and decode, in order) touches its layer's dense pages, then each routed
/// expert's slices; one load_event per decode (token, layer) whose `misses`
/// are the faults taken and `expert_bytes` the mean bytes a fault read (so
/// timing_simulator's reads are the faults, one after another on one lane).
/// `hits` counts routed experts that took no fault.
///
/// With the mapping's speculation (`predicted`): after each decode load, the
/// oracle's ranking (oracle_ranking, seeded by the speculation's seed) of the
/// MoE layer `horizon` ahead, planned by speculation_planner with nothing
/// counted resident (the manager plans around its pinned cache, which
/// `predicted` alone has not); each planned expert's missing slice pages are
/// one speculative read, offered to `obs.admit` (the timing model's
/// equation 7) and, when admitted, read into the page cache without
/// read-around. The target load counts them in `speculative_inserted` and
/// `speculative_inserted_bytes`, its experts they spared a fault in
/// `speculative_hits`. `obs.on_load` sees every decode load before its reads
/// are planned, as in replay_dynamic.
inline std::vector<load_event> readaround_loads(const route_trace& trace, const lab_mapping& m, double readaround_mib,
                                                std::size_t tensors = 3, page_reclaim reclaim = page_reclaim::two_list,
                                                const replay_observer& obs = {}) {
  if (m.kind != lab_model_kind::faults) throw error("readaround_loads: the mapping is not a fault-driven one");
  const lab_file_layout f = make_lab_file_layout(trace.header, tensors);
  const auto pages = [&](double mib) {
    return static_cast<std::uint64_t>(mib * 1048576.0 / static_cast<double>(f.page));
  };
  std::uint64_t capacity = pages(m.cache_mib);
  readaround_page_cache pc(f.pages, std::max<std::uint64_t>(1, capacity), pages(readaround_mib), reclaim);
  if (m.dense_pinned)
    for (const auto& b : f.layers) pc.pin(b.dense_first, b.dense_first + b.dense_pages);
  const replay_speculation& sp = m.speculation;
  const bool speculate = sp.source != speculation_source::none;
  if (speculate && sp.source != speculation_source::oracle)
    throw error(std::string("readaround_loads: speculation '") + sp.name() +
                "'; the fault model knows the oracle's predictions only");
  if (speculate && !sp.oracle_profile.empty() && sp.oracle_profile.size() != trace.header.n_layer)
    throw error("readaround_loads: oracle profile has " + std::to_string(sp.oracle_profile.size()) +
                " entries; expected " + std::to_string(trace.header.n_layer) + " (one P per layer)");
  std::optional<routed_replay_input> in;
  if (speculate) in.emplace(routed_replay_input::from_trace(trace));
  const speculation_planner planner(speculate ? sp.cap : 0);
  std::uint64_t rng = sp.seed;
  ranking rank;
  struct spec_read {
    layer_id layer;
    expert_id expert;
    std::uint64_t bytes;
  };
  std::vector<spec_read> pending;  // made resident, for a later load of this token

  const load_batches lb = group_load_batches(trace);
  std::vector<load_event> out;
  std::uint32_t token = 0;
  std::uint32_t last_step = 0;
  bool any_decode = false;
  std::vector<std::uint8_t> seen(trace.header.n_expert, 0);
  for (const load_batch& b : lb.batches) {
    const std::size_t l = to_index(b.layer);
    if (l >= f.layers.size()) continue;
    const bool decode = b.phase == run_phase::decode;
    if (decode) {
      if (any_decode && b.step != last_step) ++token, pending.clear();
      any_decode = true;
      last_step = b.step;
    }
    std::uint64_t read = 0;
    std::uint32_t faults = pc.touch(f.layers[l].dense_first, f.layers[l].dense_first + f.layers[l].dense_pages, read);
    std::uint16_t routed = 0, clean = 0, spared = 0;
    std::vector<expert_id> uniq;
    for (expert_id e : lb.experts_of(b)) {
      if (to_index(e) >= seen.size() || seen[to_index(e)]) continue;
      seen[to_index(e)] = 1;
      uniq.push_back(e);
    }
    const auto is_pending = [&](expert_id e) {
      for (const spec_read& r : pending)
        if (r.layer == b.layer && r.expert == e) return true;
      return false;
    };
    for (expert_id e : uniq) {
      seen[to_index(e)] = 0;
      std::uint32_t ef = 0;
      for (std::size_t t = 0; t < tensors; ++t) {
        const auto r = f.slice_pages(l, t, to_index(e));
        ef += pc.touch(r.first, r.second, read);
      }
      faults += ef;
      ++routed;
      clean += ef == 0;
      if (ef == 0 && decode && is_pending(e)) ++spared;
    }
    if (!decode) continue;
    load_event ev;
    ev.token = token;
    ev.layer = b.layer;
    ev.routed = routed;
    ev.hits = clean;
    ev.misses = static_cast<std::uint16_t>(std::min<std::uint32_t>(faults, 65535));
    ev.demanded_bytes = read * f.page;
    ev.expert_bytes = faults ? read * f.page / faults : 0;
    ev.speculative_hits = spared;
    std::size_t keep = 0;
    for (const spec_read& r : pending) {
      if (r.layer != b.layer) {
        pending[keep++] = r;
        continue;
      }
      ++ev.speculative_inserted;
      ev.speculative_inserted_bytes += r.bytes;
    }
    pending.resize(keep);
    if (obs.on_load) obs.on_load(ev);
    layer_id target{};
    if (speculate && moe_layer_ahead(in->shape(), b.layer, sp.horizon, target)) {
      const routing* truth = in->decode_routing(token, target);
      if (truth) {
        const double p = sp.oracle_profile.empty() ? sp.oracle_p : sp.oracle_profile[to_index(target)];
        detail::oracle_ranking(*truth, p, in->shape().n_experts(), rng, rank);
        const speculation_plan plan =
            planner.plan(target, rank, in->shape().top_k(), [](layer_id, expert_id) noexcept { return false; });
        for (std::size_t i = 0; i < plan.size(); ++i) {
          const std::size_t tl = to_index(target), e = to_index(plan.id(i));
          std::uint64_t missing = 0;
          for (std::size_t t = 0; t < tensors; ++t) {
            const auto r = f.slice_pages(tl, t, e);
            missing += pc.missing(r.first, r.second);
          }
          ++ev.speculative_issued;
          if (obs.admit && !obs.admit(target, missing * f.page)) {
            ++ev.speculative_cancelled;
            continue;
          }
          for (std::size_t t = 0; t < tensors; ++t) {
            const auto r = f.slice_pages(tl, t, e);
            pc.read(r.first, r.second);
          }
          ev.speculative_bytes += missing * f.page;
          pending.push_back(spec_read{target, plan.id(i), missing * f.page});
        }
      }
    }
    out.push_back(ev);
  }
  return out;
}

/// The pinned cache's misses at each decode load, as the manager's cache sees
/// them: an LRU of `budget_mib` over the decode batches only (the manager
/// neither pins nor looks up a prompt batch), unique routed experts in
/// routing order; keyed (decode token, layer) like load_event. Every miss is
/// a lock (and, the cache being full, an eviction's unlock).
class pinned_misses {
 public:
  pinned_misses(const route_trace& trace, double budget_mib) {
    cache_options o;
    o.budget_bytes = static_cast<std::uint64_t>(budget_mib * 1048576.0);
    o.guard = cycle_guard::off;
    expert_cache<lru_policy> cache(trace.shape(), std::move(o));
    const load_batches lb = group_load_batches(trace);
    std::uint32_t token = 0, last_step = 0;
    bool any = false;
    for (const load_batch& b : lb.batches) {
      if (b.phase != run_phase::decode) continue;
      if (any && b.step != last_step) ++token;
      any = true;
      last_step = b.step;
      if (!cache.begin_batch(run_phase::decode, b.layer)) continue;
      std::uint16_t misses = 0;
      for (expert_id e : lb.experts_of(b)) misses += cache.lookup(e) == lookup_result::miss;
      cache.end_batch();
      by_load_.push_back({{token, static_cast<std::uint16_t>(to_index(b.layer))}, misses});
      total_ += misses;
    }
  }
  /// The misses at load `e` (0 for a load the trace's decode batches do not have).
  std::uint16_t at(const load_event& e) const noexcept {
    const key k{e.token, static_cast<std::uint16_t>(to_index(e.layer))};
    // Execution order is token by token, layer by layer: sorted by key.
    const auto it =
        std::lower_bound(by_load_.begin(), by_load_.end(), k, [](const entry& x, const key& y) { return x.first < y; });
    return it != by_load_.end() && it->first == k ? it->second : std::uint16_t{0};
  }
  std::uint64_t total() const noexcept { return total_; }

 private:
  using key = std::pair<std::uint32_t, std::uint16_t>;
  using entry = std::pair<key, std::uint16_t>;
  std::vector<entry> by_load_;
  std::uint64_t total_ = 0;
};

/// The manager's counts of equation (6) on a lanes cell's loads: `requested`
/// (every routed expert with `exact` alone, plus each speculative read made
/// resident) and `pinned` (the pinned cache's misses).
inline void set_manager_counts(load_event& e, const lab_mapping& m, std::uint16_t pins) noexcept {
  e.requested = static_cast<std::uint16_t>((m.requests_routed ? e.hits + e.misses : 0) + e.speculative_inserted);
  e.pinned = m.pinned_mib > 0 ? pins : 0;
}

/// One lab cell's predicted decode timing (and the replay's figures).
struct lab_prediction {
  lab_mapping mapping;
  timing_summary summary;
  std::vector<token_timing> tokens;
  std::vector<load_event> loads;  ///< decode loads (for calibration)
};

/// Predicts one configuration. `p` holds the device (curve) and the fitted parameters; its `lanes` and
/// ψ (kernel_overlap) are the mapping's; for faults, its curve is the curve's top and β is β_f
/// (timing_params::fault_scale). A walk in `s` (the fault walk; for `cache`, the inline walk) replaces
/// the curve, β, λ and κ; the inline walk also ψ and ν_p's kernel part, which its own wall and kernel time hold.
inline lab_prediction predict_lab(const route_trace& trace, lab_config c, const lab_setup& s, timing_params p) {
  lab_prediction out;
  out.mapping = map_lab_config(c, s);
  p.lanes = out.mapping.lanes;
  p.mgmt_ms_per_request = s.request_ms;  // measured with every expert resident (lab_setup)
  p.mgmt_ms_per_pin = out.mapping.pin_ms(s);
  p.kernel_overlap = out.mapping.reads_inline ? 1.0 : 0.0;  // ψ
  // A walk of this shape (lab_setup): a MiB read costs what it cost the walk, off the CPU and in the kernel.
  const auto walked = [&p](double off_cpu_ms_per_mib, double sys_ms_per_mib) {
    p.curve = storage_curve({{1.0, 1000.0 / off_cpu_ms_per_mib}});
    p.bandwidth_scale = 1, p.read_latency_ms = 0, p.read_cpu_ms_per_mib = sys_ms_per_mib;
  };
  if (out.mapping.reads_inline && s.inline_walk_off_cpu_ms_per_mib > 0) {
    walked(s.inline_walk_off_cpu_ms_per_mib, s.inline_walk_sys_ms_per_mib);
    // The walk's wall holds what overlap there is, its kernel time the pins' own.
    p.kernel_overlap = 0, p.mgmt_ms_per_pin = out.mapping.pin_user_ms(s);
  }
  if (out.mapping.kind == lab_model_kind::faults) {
    // A read-around window is one large request that the block layer splits
    // into many in flight: the device's bandwidth at its deepest measured
    // concurrency (the curve's top), one window after another.
    double top = 0;
    for (const auto& q : p.curve.points()) top = std::max(top, q.second);
    p.curve = storage_curve({{1.0, top}});
    // What the device delivers to read-around need not be what it delivers to
    // the manager's lanes (docs/wall-clock.md, "The fault path's own bandwidth").
    p.bandwidth_scale = p.fault_scale();
    if (s.fault_walk_off_cpu_ms_per_mib > 0) walked(s.fault_walk_off_cpu_ms_per_mib, s.fault_walk_sys_ms_per_mib);
    // predicted: its reads share the device with the faults (equation 7);
    // each one made resident is a request of the manager (WILLNEED, POPULATE_READ).
    timing_simulator sim(trace.shape(), p);
    replay_observer obs = sim.observer();
    const auto forward = obs.on_load;
    obs.on_load = [&](const load_event& e) {
      load_event x = e;
      set_manager_counts(x, out.mapping, 0);
      forward(x);
    };
    out.loads = readaround_loads(trace, out.mapping, s.readaround_mib, 3, page_reclaim::two_list, obs);
    for (load_event& e : out.loads) set_manager_counts(e, out.mapping, 0);
    out.tokens = sim.tokens();
  } else {
    const routed_replay_input in = routed_replay_input::from_trace(trace);
    dynamic_replay_options o;
    o.policy = "lru";
    o.guard = cycle_guard::off;
    if (out.mapping.kind == lab_model_kind::resident) {
      // Every expert resident: the loads without any read.
      o.budget_mib = 0;
      for (std::size_t l = 0; l < in.shape().n_layers(); ++l)
        o.budget_mib +=
            to_mib(in.shape().expert_bytes(layer_id(static_cast<std::uint16_t>(l))) * in.shape().n_experts());
      o.budget_mib += 1;
      out.loads = replay_dynamic(in, o).decode_loads;
      for (load_event& e : out.loads) {
        e.hits = static_cast<std::uint16_t>(e.hits + e.misses);
        e.misses = 0;
        e.demanded_bytes = 0;
        e.evictions = 0;
      }
      out.tokens = simulate_timing(in.shape(), p, out.loads);
    } else {
      o.budget_mib = out.mapping.cache_mib;
      o.speculation = out.mapping.speculation;
      // The pinned cache's misses at each load (none without the cache).
      const std::optional<pinned_misses> pins =
          out.mapping.pinned_mib > 0 ? std::optional<pinned_misses>(std::in_place, trace, out.mapping.pinned_mib)
                                     : std::nullopt;
      const auto count = [&](load_event& e) { set_manager_counts(e, out.mapping, pins ? pins->at(e) : 0); };
      if (out.mapping.speculation.source == speculation_source::none) {
        out.loads = replay_dynamic(in, o).decode_loads;
        for (load_event& e : out.loads) count(e);
        out.tokens = simulate_timing(in.shape(), p, out.loads);
      } else {
        timing_simulator sim(in.shape(), p);
        replay_observer obs = sim.observer();
        const auto forward = obs.on_load;
        obs.on_load = [&](const load_event& e) {
          load_event x = e;
          count(x);
          forward(x);
        };
        out.loads = replay_dynamic(in, o, obs).decode_loads;
        for (load_event& e : out.loads) count(e);
        out.tokens = sim.tokens();
      }
    }
  }
  out.summary = summarize_timing(out.tokens);
  return out;
}

}  // namespace moe_residency
