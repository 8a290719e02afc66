#pragma once
/// The residency manager's options and counters (residency/manager.hpp): which
/// parts are on, how they are sized, and what each part did; and the one
/// parser of the parts' names every program shares ("all", "off", or a list).

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "moe_residency/adapters/llama_cpp/residency/advice.hpp"
#include "moe_residency/error.hpp"

namespace moe_residency::llama_cpp {

/// What the manager does when the whole model fits in the memory limit.
enum class when_fits : std::uint8_t {
  stand_down,  ///< act on nothing and ask nothing of the graph: plain mmap's speed, safe to leave on
  act,         ///< act anyway (tests; a limit the manager cannot see)
};

/// Which parts are on, and how they are sized. The defaults are what moe-run
/// and the C ABI run, the memory lab's fastest on real routing: dense, exact
/// and the cache on, predicted reads off (at a real model's 88.6% slot
/// accuracy their wasted reads cost more than the hits they bring:
/// docs/llama-cpp-residency.md, "Real routing"), the budget sized from the
/// memory limit, standing down when the model fits (so safe to leave on).
/// `none()` for a manager that switches parts on one by one.
struct residency_options {
  bool pin_dense = true;   ///< lock the non-expert tensors once
  bool exact = true;       ///< read each layer's routed experts on the lanes before its matmuls
  bool predicted = false;  ///< speculative reads of the next MoE layer (residency/predictor.hpp)
  bool cache = true;       ///< a budgeted, pinned expert cache
  /// Pinned cache budget, bytes. 0: sized from the memory limit (see auto_budget).
  std::uint64_t cache_budget_bytes = 0;
  /// Auto budget: at most this many bytes (0: no ceiling).
  std::uint64_t cache_ceiling_bytes = 0;
  /// Auto budget: bytes kept free besides the dense weights and llama.cpp's
  /// own buffers (0: max(256 MiB, limit / 8), plus two reads in flight per
  /// lane and per speculative slot, plus one layer's routed experts).
  std::uint64_t margin_bytes = 0;
  /// With exact or cache (the manager then reads every routed expert itself):
  /// advise the expert ranges MADV_RANDOM (no read-around on faults).
  bool random_faults = true;
  /// What an evicted expert's pages are advised: cold or pageout.
  advice release = advice::cold;
  /// Exact: let the layer's matmuls start while its reads are on the lanes
  /// (a page still in flight is waited for by the fault itself); the reads
  /// are settled at the next routing. false: the eval thread waits for every
  /// read of the layer before its matmuls (the serial order).
  bool overlap = true;
  /// Lanes read with owned reads (advice::read: exactly the slice's file
  /// pages into the page cache, not mapped, nothing copied) instead of the
  /// eval thread's willneed of every miss, queued at the device at once, and
  /// populate_read on the lanes. Off by default: in the memory lab the
  /// matmuls, released early, overtook lanes that read one slice at a time
  /// and faulted the rest page by page (docs/llama-cpp-residency.md); on for
  /// a device whose read-ahead window cuts willneed short of an expert slice.
  /// Falls back to willneed where the advice has no owned reads.
  bool owned_reads = false;
  /// The cache's experts live in an expert pool the manager owns (memory
  /// allocated once, at activation: budget + one layer's routed experts)
  /// instead of locked page cache: an admitted expert's file bytes are read
  /// past the page cache (O_DIRECT) into a free slot of the pool, which is
  /// mapped over the expert's pages in llama.cpp's mapping; an evicted one's
  /// file pages are mapped back. No page-cache allocation, memory-cgroup
  /// charge or reclaim per expert read. Needs the cache. The pages an expert
  /// shares with a neighbour (its slices' first and last, when they are not
  /// page-aligned) are locked as without the pool. A layer's placements are
  /// waited for before its matmuls (a matmul that overtook them would fault
  /// the file's pages in page by page, to be replaced): overlap is off for
  /// them. Where the advice has no pool (not Linux), activation refuses.
  bool pool = false;
  /// Read lanes: they wait for (populate) or lock the reads the eval thread
  /// queued, or read themselves (owned_reads: then they are the device's queue
  /// depth). Random reads on phone flash saturate at ~2 readers (docs/speculation.md).
  std::size_t lanes = 2;
  std::size_t spec_cap = 2;  ///< predicted reads per layer at most
  std::size_t horizon = 1;   ///< 1: stale-gate (l -> l+1); 2: l -> l+2
  /// mincore every routed expert before acting: the page cache's own hit rate.
  bool measure = false;
  /// The default stands down when the mapped model, llama.cpp's anonymous
  /// memory and the auto margin all fit in the memory limit (auto_budget's).
  when_fits fits = when_fits::stand_down;

  /// Every part off (the rest as the defaults).
  static residency_options none() {
    residency_options o;
    o.pin_dense = o.exact = o.predicted = o.cache = false;
    return o;
  }
  bool any_part() const noexcept { return pin_dense || exact || predicted || cache; }
  /// The cache's experts in the expert pool, the next layer's whole
  /// predicted top-k placed ahead (spec_cap 32: the planner takes no more
  /// than the top-k): what moe-run --pool, the C ABI's pool and the lab's
  /// all-pool run.
  void use_pool() noexcept {
    pool = true;
    spec_cap = 32;
  }

  /// Throws `configuration_error` naming the option, the value and what was expected.
  void validate() const {
    auto bad = [](const std::string& what) { throw configuration_error("residency_options: " + what); };
    if (lanes > 64) bad("lanes " + std::to_string(lanes) + "; expected [0, 64]");
    if (spec_cap > 32) bad("spec_cap " + std::to_string(spec_cap) + "; expected [0, 32]");
    if (horizon != 1 && horizon != 2) bad("horizon " + std::to_string(horizon) + "; expected 1 or 2");
    if (release != advice::cold && release != advice::pageout)
      bad(std::string("release ") + to_string(release) + "; expected cold or pageout");
    if (predicted && lanes == 0) bad("predicted reads need lanes; lanes is 0");
    if (pool && !cache) bad("pool holds the cache's experts; expected cache = true with pool");
  }
};

/// The parts' names: "all", "off", or a comma list of dense, exact,
/// predicted and cache (each once). Sets `o`'s four parts (the rest of `o` is
/// kept) and returns whether any is on. Throws `configuration_error` naming
/// `option`, the text and the item otherwise. Every program parses its
/// residency option with this (moe-run --residency, the probe, the lab).
inline bool parse_residency_parts(const std::string& text, residency_options& o,
                                  const std::string& option = "--residency") {
  const std::string expected = "; expected all, off, or a comma list of dense, exact, predicted, cache";
  if (text == "off") {
    o.pin_dense = o.exact = o.predicted = o.cache = false;
    return false;
  }
  if (text == "all") {
    o.pin_dense = o.exact = o.predicted = o.cache = true;
    return true;
  }
  residency_options parts = residency_options::none();
  std::size_t at = 0;
  while (true) {
    const std::size_t comma = text.find(',', at);
    const std::string part = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    bool* flag = part == "dense"       ? &parts.pin_dense
                 : part == "exact"     ? &parts.exact
                 : part == "predicted" ? &parts.predicted
                 : part == "cache"     ? &parts.cache
                                       : nullptr;
    if (flag == nullptr)
      throw configuration_error(option + ": '" + part + "' in '" + text + "'" +
                                (part.empty() ? " (an empty item)" : "") + expected);
    if (*flag) throw configuration_error(option + ": '" + part + "' twice in '" + text + "'" + expected);
    *flag = true;
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  o.pin_dense = parts.pin_dense;
  o.exact = parts.exact;
  o.predicted = parts.predicted;
  o.cache = parts.cache;
  return true;
}

/// The parts' name parse_residency_parts reads back: "all", "off", or the list.
inline std::string residency_parts_name(const residency_options& o) {
  if (o.pin_dense && o.exact && o.predicted && o.cache) return "all";
  std::string s;
  auto add = [&s](bool on, const char* n) {
    if (on) s += (s.empty() ? "" : ",") + std::string(n);
  };
  add(o.pin_dense, "dense");
  add(o.exact, "exact");
  add(o.predicted, "predicted");
  add(o.cache, "cache");
  return s.empty() ? "off" : s;
}

/// Counters since construction (host thread; read between llama_decode calls).
struct residency_stats {
  std::uint64_t routed_layers = 0;    ///< on_routed events managed
  std::uint64_t manage_ns = 0;        ///< the eval thread's time in them (the manager's own cost on the critical path)
  std::uint64_t inactive_layers = 0;  ///< events before activation (the first graph)
  // exact
  std::uint64_t exact_reads = 0, exact_bytes = 0, exact_failed = 0;
  /// The eval thread waiting for demanded reads (ns), and how often it had to
  /// (with overlap: only when a layer's reads outlast its matmuls).
  std::uint64_t read_wait_ns = 0, read_waits = 0;
  /// The lanes' reads now: queued, and running (a snapshot; safe from any thread).
  std::uint64_t reads_queued = 0, reads_in_flight = 0;
  // predicted
  std::uint64_t predictions = 0;         ///< layers a prediction was made for
  std::uint64_t predicted_issued = 0;    ///< speculative reads queued
  std::uint64_t predicted_rejected = 0;  ///< refused by a full scheduler queue
  std::uint64_t predicted_useful = 0;    ///< completed before the layer, and demanded by it
  std::uint64_t predicted_late = 0;      ///< demanded, but not complete when the layer's routing came
  std::uint64_t predicted_wasted = 0;    ///< not demanded by the layer
  std::uint64_t predicted_bytes = 0;
  // cache
  std::uint64_t cache_hits = 0, cache_misses = 0, evictions = 0;
  /// The misses' bytes (decode): what the replay counts as read (its
  /// cache_stats::bytes_read); the demanded reads of the cache.
  std::uint64_t cache_miss_bytes = 0;
  /// Expert bytes locked now, and the most after any layer. Within a layer,
  /// what the cache evicted is released before its misses are locked, so
  /// they stay within the budget; the auto budget's margin still keeps one
  /// layer's routed experts for the reads in flight.
  std::uint64_t pinned_bytes = 0, pinned_peak_bytes = 0;
  std::uint64_t lock_failed = 0;  ///< admitted experts whose lock (or placement) failed (invalidated)
  /// The expert pool (options.pool): its bytes, and admissions that found no
  /// free slot and were locked in the page cache instead.
  std::uint64_t pool_bytes = 0, pool_fallbacks = 0;
  std::uint64_t unlock_failed_bytes = 0;  ///< bytes a failed munlock left locked
  // dense
  std::uint64_t dense_bytes = 0;  ///< non-expert bytes locked
  // measure
  std::uint64_t routed_experts = 0, routed_resident = 0;  ///< decode; fully resident at routing
  // every call through memory_advice, and its failures, by advice kind
  std::array<std::uint64_t, advice_kinds> calls{}, errors{};
  std::uint64_t advice_errors() const noexcept {
    std::uint64_t n = 0;
    for (auto e : errors) n += e;
    return n;
  }
  double cache_hit_pct() const noexcept {
    const std::uint64_t n = cache_hits + cache_misses;
    return n ? 100.0 * static_cast<double>(cache_hits) / static_cast<double>(n) : 0.0;
  }
  double resident_pct() const noexcept {
    return routed_experts ? 100.0 * static_cast<double>(routed_resident) / static_cast<double>(routed_experts) : 0.0;
  }
};

}  // namespace moe_residency::llama_cpp
