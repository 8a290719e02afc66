#pragma once
/// moe_residency_lab/mapping.hpp: the memory lab's configurations (scripts/memlab.sh,
/// docs/memlab.md) and what is known of a run before it runs (lab_setup), and
/// the mapping of each onto the timing model (timing.hpp): which cache, which
/// lanes, which speculation, and whether it reads on lanes or by page faults.
/// docs/lab-predict.md writes each mapping down.
/// moe_residency_lab/lab.hpp predicts a configuration from it. Standard library only.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "moe_residency/error.hpp"
#include "moe_residency/replay/dynamic.hpp"

namespace moe_residency::lab {

/// The lab's configurations (docs/memlab.md, "The configurations"). The last
/// four are the real-routing lab's (lab/memlab/presets.py, TRACE_CONFIGS).
enum class lab_config : std::uint8_t {
  mmap,
  observer,
  dense,
  exact,
  predicted,
  cache,
  all,
  degraded,
  resident,
  mmap_128k,
  exact_cache,
  all_oracle,
  all_oracle_pool
};

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
    case lab_config::mmap_128k: return "mmap-128k";
    case lab_config::exact_cache: return "exact-cache";
    case lab_config::all_oracle: return "all-oracle";
    case lab_config::all_oracle_pool: return "all-oracle-pool";
  }
  return "?";
}

/// Throws `error` naming the text and the configurations expected.
inline lab_config parse_lab_config(const std::string& s) {
  for (lab_config c :
       {lab_config::mmap, lab_config::observer, lab_config::dense, lab_config::exact, lab_config::predicted,
        lab_config::cache, lab_config::all, lab_config::degraded, lab_config::resident, lab_config::mmap_128k,
        lab_config::exact_cache, lab_config::all_oracle, lab_config::all_oracle_pool})
    if (s == to_string(c)) return c;
  throw error("lab configuration '" + s +
              "'; expected mmap, observer, dense, exact, predicted, cache, all, degraded, resident, mmap-128k, "
              "exact-cache, all-oracle or all-oracle-pool");
}

/// What is known of one lab run before it runs.
struct lab_setup {
  double limit_mib = 0;  ///< the cgroup's memory limit; 0: none (resident)
  /// The file's non-expert bytes: the trace header's dense_bytes, or what the
  /// manager locks as dense where a run says it (lab-predict --dense-mib).
  double dense_mib = 0;
  /// The part of dense_mib outside the trace's layers (the token embedding, the
  /// output): not in the fault model's file layout, so taken off a fault cell's
  /// page cache as read every token. An approximation: the embedding is read a
  /// row at a time, so the page cache holds less of it.
  double unlaid_dense_mib = 0;
  double overhead_mib = 64;  ///< the cgroup's other memory: llama.cpp's buffers, the binary's pages (assumed)
  double budget_mib = 0;     ///< the pinned cache's budget (--residency-budget)
  /// The predicted reads' slot accuracy: the stale-gate's, measured by an
  /// observer run; for all-oracle and all-oracle-pool the trace oracle's (88.6).
  double stale_gate_pct = 100;
  double degraded_pct = 88.6;     ///< the `degraded` configuration's target accuracy
  std::size_t lanes = 2;          ///< the manager's read lanes (--lanes)
  std::size_t spec_cap = 2;       ///< predicted reads per layer at most (--spec-cap)
  std::size_t pool_spec_cap = 8;  ///< the same for all-oracle-pool (memlab runs it with --spec-cap 8)
  double readaround_mib = 16;     ///< a fault's read-around window (read_ahead_kb × 2 under FADV_SEQUENTIAL)
  /// mmap-128k's window: the device's read_ahead_kb set to 128 for the run, × 2 under FADV_SEQUENTIAL.
  double readaround_128k_mib = 0.25;
  /// The manager's own cost with every expert resident (memlab's manager-exact
  /// and manager-cache runs against resident-all; measure_manager_cost): ν_q and ν_p of
  /// equation (6), ms of wall per requested expert and per pinned-cache miss,
  /// the part of each in the eval thread's kernel time, and the part in its
  /// user time (for calibrate_lab; moe_residency_lab/manager.hpp measures them). The
  /// rest of each is off the eval thread's CPU (waiting for a lane).
  double request_ms = 0, request_sys_ms = 0, request_user_ms = 0;
  double pin_ms = 0, pin_sys_ms = 0, pin_user_ms = 0;
  /// The fault walk (docs/lab-predict.md, "The walks"): ms off the CPU and in
  /// the kernel per MiB; > 0: a fault cell's reads cost these, not the curve × β_f, λ, κ.
  double fault_walk_off_cpu_ms_per_mib = 0, fault_walk_sys_ms_per_mib = 0;
  /// The inline walk (docs/lab-predict.md, "The walks"): the same for `cache`'s
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
  bool dense_pinned = false;  ///< faults: the dense pages are locked, outside the page cache's lists
  /// faults: the read-around window, MiB (lab_setup::readaround_mib, or
  /// readaround_128k_mib for mmap-128k).
  double readaround_mib = 0;
  /// faults: the cell runs at the device's own read-ahead, the one the fault
  /// walk is measured at (not mmap-128k), so the walk prices its reads.
  bool walk_applies = false;
  std::size_t lanes = 1;           ///< concurrent demanded reads
  replay_speculation speculation;  ///< predicted reads
  /// lanes: the manager requests every routed expert at each load (exact
  /// without the pinned cache), or only the pinned cache's misses.
  bool requests_routed = false;
  double pinned_mib = 0;  ///< lanes: the pinned cache's budget (0: none)
  /// lanes: the prompt's experts are in the cache at the first decode token
  /// (the page cache keeps what the prompt read); false for the pool, which
  /// reads past the page cache and starts empty.
  bool prompt_cached = true;
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
  /// the run history docs/lab-predict.md links, "Pooled runs, the manager's user time, and misses
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

/// The mapping of docs/lab-predict.md. Throws `error`
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
  const auto oracle = [](double pct, std::size_t cap) {
    replay_speculation r;
    r.source = speculation_source::oracle, r.oracle_p = std::min(1.0, pct / 100.0), r.cap = cap, r.horizon = 1;
    return r;
  };
  switch (c) {
    case lab_config::mmap:
    case lab_config::mmap_128k:
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
      m.cache_mib = s.limit_mib - s.overhead_mib - (m.dense_pinned ? s.dense_mib : s.unlaid_dense_mib);
      m.lanes = 1;
      // mmap-128k: stock llama.cpp with the device's read_ahead_kb at 128 for the run.
      m.readaround_mib = c == lab_config::mmap_128k ? s.readaround_128k_mib : s.readaround_mib;
      m.walk_applies = c != lab_config::mmap_128k;
      if (c == lab_config::predicted) m.speculation = oracle(s.stale_gate_pct, s.spec_cap);
      break;
    case lab_config::exact:
    case lab_config::cache:
    case lab_config::all:
    case lab_config::degraded:
    case lab_config::exact_cache:
    case lab_config::all_oracle:
    case lab_config::all_oracle_pool: {
      // The page cache holds the experts besides the dense weights (read every
      // token, so never the LRU's victims) and the overhead; the pinned cache
      // is part of that memory, so the union behaves as one LRU of that size.
      // exact-cache and all-oracle are `all` without, and with the trace
      // oracle's, predicted reads (`all` pins dense too: outside the LRU either way).
      // The expert pool reads past the page cache with O_DIRECT into slots of
      // the budget, so the page cache keeps no expert the cache evicted, and
      // the prompt's pages do not serve it (docs/llama-cpp-residency.md, "The
      // expert pool"): an LRU of the budget alone, empty at the first decode token.
      const bool pool = c == lab_config::all_oracle_pool;
      m.kind = lab_model_kind::lanes;
      m.cache_mib = pool ? s.budget_mib : s.limit_mib - s.dense_mib - s.overhead_mib;
      m.prompt_cached = !pool;
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
        m.speculation = oracle(c == lab_config::all ? s.stale_gate_pct : s.degraded_pct, s.spec_cap);
      // The oracle's first spec_cap of the next layer; the pool places its top 8 ahead.
      if (c == lab_config::all_oracle || pool)
        m.speculation = oracle(s.stale_gate_pct, pool ? s.pool_spec_cap : s.spec_cap);
      if (pool) {
        if (!(s.budget_mib > 0))
          throw error(std::string("lab configuration ") + to_string(c) + ": budget " + std::to_string(s.budget_mib) +
                      " MiB; expected the pool's budget > 0 (the run's residency line says it)");
        if (s.budget_mib > s.limit_mib - s.dense_mib - s.overhead_mib)
          throw error(std::string("lab configuration ") + to_string(c) + ": budget " + std::to_string(s.budget_mib) +
                      " MiB above the " + std::to_string(s.limit_mib - s.dense_mib - s.overhead_mib) +
                      " MiB the limit leaves after the dense weights and the overhead; expected at most that");
      }
      break;
    }
    case lab_config::resident: break;
  }
  if (!(m.cache_mib > 0))
    throw error(std::string("lab configuration ") + to_string(c) + ": limit " + std::to_string(s.limit_mib) +
                " MiB leaves " + std::to_string(m.cache_mib) +
                " MiB for the page cache after the dense weights and the overhead; expected > 0");
  return m;
}

}  // namespace moe_residency::lab
