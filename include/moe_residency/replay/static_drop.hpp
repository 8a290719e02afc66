#pragma once
/// The static drop replay: a trace's routings with the residency the engine
/// recorded for each slot, and the engine authors' static cache-aware drop
/// (and top-k baseline) over that recorded residency, decode phase.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/detail/format.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/plan.hpp"
#include "moe_residency/trace.hpp"

namespace moe_residency {
// ===========================================================================
// Dropping and speculation in the replay.

/// A trace's routings with the residency the engine recorded for each slot.
/// `routings[i]` and `recorded_miss[i]` are the i-th routing of the file
/// (rank order; `token` = the row's step); bit s of `recorded_miss[i]` is set
/// when slot s was a miss (residency 0) when the engine ran. Residency 2 (a
/// hit thanks to a speculative read) counts as resident.
struct recorded_routings {
  std::vector<routing> routings;
  std::vector<std::uint32_t> recorded_miss;
  std::vector<std::uint32_t> turns;
};

/// Reads the routings of a validated trace. Throws `error` on a routing wider
/// than 32 slots (no replay can represent it). This is the only function of
/// the replay that reads trace rows.
inline recorded_routings read_recorded_routings(const route_trace& trace) {
  validate_route_trace(trace, "route_trace");
  recorded_routings out;
  const auto& rows = trace.rows;
  for (std::size_t i = 0; i < rows.size();) {
    std::size_t j = i + 1;  // validation: a routing is a run of rows with slots 0, 1, ...
    while (j < rows.size() && rows[j].slot != 0) ++j;
    if (j - i > routing::capacity)
      throw error("route_trace: routing of layer " + std::to_string(to_index(rows[i].layer)) + " at step " +
                  std::to_string(rows[i].step) + " has " + std::to_string(j - i) +
                  " slots; the replay represents at most 32");
    routing r;
    r.layer = rows[i].layer;
    r.phase = rows[i].phase;
    r.token = rows[i].step;
    std::uint32_t miss = 0;
    for (std::size_t s = i; s < j; ++s) {
      r.push_back(rows[s].expert, rows[s].weight);
      if (rows[s].residency == 0) miss |= 1u << (s - i);
    }
    out.routings.push_back(r);
    out.recorded_miss.push_back(miss);
    out.turns.push_back(rows[i].turn);
    i = j;
  }
  return out;
}

// ---- static drop replay ------------------------------------------------------

/// One row of the static drop replay: over the recorded residency, decode
/// only, what a rule would have avoided reading and what router weight it
/// would have discarded. The engine authors' published replay.
struct static_drop_row {
  std::string policy;  ///< "drop" (parameter = F) or "keep_k" (parameter = k)
  double parameter = 0;
  drop_stats stats;     ///< misses, miss bytes, bytes avoided, weights (decode routings)
  std::string warning;  ///< drop_policy's k <= 4 warning, if any

  /// Recorded miss bytes the rule avoids, % of all recorded decode miss bytes.
  double io_saved_pct() const noexcept { return 100.0 * stats.miss_bytes_avoided_fraction(); }
  /// Router weight the rule discards, % of all decode router weight (finite weights).
  double mass_lost_pct() const noexcept { return 100.0 * stats.weight_discarded_fraction(); }
};

/// Static cache-aware drop at fraction F over the recorded residency: the
/// library's drop_policy, asked with the engine's recorded hit/miss instead of
/// a live cache (a dropped expert is a recorded miss with weight < F/k, never
/// the top-weighted slot). Throws like drop_policy on a bad F.
inline static_drop_row static_drop_replay(const model_shape& shape, const recorded_routings& rr, double fraction) {
  static_drop_row row;
  row.policy = "drop";
  row.parameter = fraction;
  drop_options o;
  o.fraction = fraction;
  o.on_warning = [&row](const std::string& m) { row.warning = m; };
  drop_policy policy(shape, o);
  for (std::size_t i = 0; i < rr.routings.size(); ++i) {
    const routing& r = rr.routings[i];
    const std::uint32_t miss = rr.recorded_miss[i];
    policy.decide(r, [&r, miss](layer_id, expert_id e) noexcept {
      for (std::size_t s = 0; s < r.size(); ++s)
        if (r.id(s) == e) return ((miss >> s) & 1u) == 0;
      return false;
    });
  }
  row.stats = policy.stats();
  return row;
}

/// Static top-k baseline: every decode routing keeps its first k slots; the
/// rest are skipped whether hit or miss. Throws `error` unless 1 <= k <= top-k.
inline static_drop_row static_keep_k_replay(const model_shape& shape, const recorded_routings& rr, std::size_t k) {
  if (k < 1 || k > shape.top_k())
    throw error("keep_k: k = " + std::to_string(k) + " out of range; expected [1, " + std::to_string(shape.top_k()) +
                "] (the trace's top-k)");
  static_drop_row row;
  row.policy = "keep_k";
  row.parameter = static_cast<double>(k);
  drop_stats& d = row.stats;
  for (std::size_t i = 0; i < rr.routings.size(); ++i) {
    const routing& r = rr.routings[i];
    const std::uint64_t bytes = shape.expert_bytes(r.layer);
    if (r.phase != run_phase::decode || bytes == 0) {
      ++d.ineligible;
      continue;
    }
    ++d.routings;
    d.experts += r.size();
    bool any = false;
    for (std::size_t s = 0; s < r.size(); ++s) {
      const float w = r.weight(s);
      const bool finite = std::isfinite(w);
      if (std::isnan(w)) ++d.nan_weights;
      if (finite) d.weight_total += static_cast<double>(w);
      const bool miss = ((rr.recorded_miss[i] >> s) & 1u) != 0;
      if (miss) {
        ++d.misses;
        d.miss_bytes += bytes;
      }
      if (s < k) continue;
      any = true;
      ++d.experts_dropped;
      if (finite) d.weight_discarded += static_cast<double>(w);
      if (miss) d.miss_bytes_avoided += bytes;
    }
    d.routings_with_drop += any;
  }
  return row;
}

/// CSV `policy,parameter,io_saved_pct,mass_lost_pct` (%g, %.3f, %.3f).
inline std::string static_drop_csv(const std::vector<static_drop_row>& rows) {
  std::string s = "policy,parameter,io_saved_pct,mass_lost_pct\n";
  char buf[160];
  for (const auto& r : rows) {
    std::snprintf(buf, sizeof buf, "%s,%g,%.3f,%.3f\n", r.policy.c_str(), r.parameter, r.io_saved_pct(),
                  r.mass_lost_pct());
    s += buf;
  }
  return s;
}

/// The same rows for people, with the counts behind each percentage.
inline std::string static_drop_table(const std::vector<static_drop_row>& rows) {
  std::string s = "policy   parameter  io_saved_pct  mass_lost_pct  experts_skipped  miss_MiB_avoided\n";
  char buf[200];
  for (const auto& r : rows) {
    std::snprintf(buf, sizeof buf, "%-8s %9g  %12.1f  %13.2f  %15llu  %16.1f\n", r.policy.c_str(), r.parameter,
                  r.io_saved_pct(), r.mass_lost_pct(), static_cast<unsigned long long>(r.stats.experts_dropped),
                  to_mib(r.stats.miss_bytes_avoided));
    s += buf;
  }
  if (!rows.empty()) {
    std::snprintf(buf, sizeof buf, "over %llu decode routings, %.1f MiB of recorded miss bytes\n",
                  static_cast<unsigned long long>(rows.front().stats.routings), to_mib(rows.front().stats.miss_bytes));
    s += buf;
  }
  return s;
}

}  // namespace moe_residency
