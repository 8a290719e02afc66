#pragma once
/// replay: the offline simulator. Runs a route trace's load batches through
/// expert_cache<Policy> for every (policy, budget) cell, in parallel, and
/// reports the figures of the engine authors' replay curves: cumulative and
/// decode-only hit %, and MiB read (MiB = 1048576 bytes).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "moe_residency/cache.hpp"
#include "moe_residency/cache/registry.hpp"
#include "moe_residency/core.hpp"
#include "moe_residency/detail/format.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/plan.hpp"
#include "moe_residency/predict/history.hpp"
#include "moe_residency/speculation.hpp"
#include "moe_residency/trace.hpp"

namespace moe_residency {

/// A trace ready to replay: its shape, its load batches, and the next-use
/// index Belady needs (built once, shared by every cell).
class replay_input {
 public:
  replay_input(model_shape shape, load_batches batches)
      : shape_(std::move(shape)), batches_(std::move(batches)) {
    auto idx = std::make_shared<next_use_index>(shape_);
    for (const load_batch& b : batches_.batches) idx->add_batch(b.layer, batches_.experts_of(b));
    idx->finish();
    next_use_ = std::move(idx);
    for (std::size_t l = 0; l < shape_.n_layers(); ++l)
      if (shape_.is_moe(layer_id(static_cast<std::uint16_t>(l)))) ++n_moe_;
  }
  /// Throws like route_trace::shape() and group_load_batches().
  static replay_input from_trace(const route_trace& t) { return replay_input(t.shape(), group_load_batches(t)); }
  /// Reads a CSV or binary trace (detected by read_route_trace).
  static replay_input from_file(const std::string& path) { return from_trace(read_route_trace(path)); }

  const model_shape& shape() const noexcept { return shape_; }
  const load_batches& batches() const noexcept { return batches_; }
  std::shared_ptr<const next_use_index> next_use() const noexcept { return next_use_; }
  std::size_t n_moe_layers() const noexcept { return n_moe_; }

 private:
  model_shape shape_;
  load_batches batches_;
  std::shared_ptr<const next_use_index> next_use_;
  std::size_t n_moe_ = 0;
};

/// Options of a replay.
struct replay_options {
  /// Worker threads for the cells; 0 = std::thread::hardware_concurrency().
  unsigned threads = 0;
  /// Seed of the random policy.
  std::uint64_t seed = 0x5eed;
  /// Tuning of the cycle policy.
  cycle_policy_options cycle{};
  /// Token-cycle guard of each cell's cache. warn (default) runs the cell and
  /// puts the message in replay_result::warning; refuse throws.
  cycle_guard guard = cycle_guard::warn;
  /// Called after each finished cell with (done, total), from worker threads
  /// one at a time.
  std::function<void(std::size_t, std::size_t)> progress;
};

/// One (policy, budget) cell.
struct replay_result {
  std::string policy;
  double budget_mib = 0;
  std::uint64_t budget_bytes = 0;
  std::uint64_t token_cycle_bytes = 0;
  cache_stats stats;
  std::string warning;  ///< the token-cycle guard's message, if any
  double seconds = 0;   ///< wall time of the cell

  double hit_pct_cum() const noexcept { return stats.all.hit_pct(); }
  double hit_pct_decode() const noexcept { return stats.decode.hit_pct(); }
  /// MiB read over the whole run (prefill + decode).
  double read_mib() const noexcept { return to_mib(stats.all.bytes_read); }
};

/// The base policy names replay understands: the registry's canonical names
/// (cache/registry.hpp). Any of them may be decorated as `<base>+prev` or
/// `<base>+oracle`: retention, protecting the next layer's experts as named by
/// the previous token's routing of that layer, or by the actual routing (the
/// ceiling of prediction-aware eviction).
inline const std::vector<std::string>& replay_policy_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& p : cache_policy_registry()) n.emplace_back(p.name);
    return n;
  }();
  return names;
}

/// True for retention_policy<Inner>.
template <class T>
struct is_retention : std::false_type {};
template <class I>
struct is_retention<retention_policy<I>> : std::true_type {};

namespace detail {

enum class replay_predictor { none, prev, oracle };

inline std::string replay_known_names() {
  return cache_policy_names() + " (any of them may take +prev or +oracle)";
}

/// A replay policy name taken apart: the canonical base name and the retention predictor.
struct replay_policy_name {
  std::string base;
  replay_predictor pred = replay_predictor::none;
  std::string canonical() const {
    return base + (pred == replay_predictor::prev ? "+prev" : pred == replay_predictor::oracle ? "+oracle" : "");
  }
};

/// Parses `<base>[+prev|+oracle]`; throws error naming the text and listing the valid names.
inline replay_policy_name parse_replay_policy(const std::string& full) {
  replay_policy_name r;
  const auto plus = full.find('+');
  r.base = find_cache_policy(full.substr(0, plus));
  if (r.base.empty()) throw error("replay: unknown policy '" + full + "'; expected one of " + replay_known_names());
  if (plus != std::string::npos) {
    const std::string p = full.substr(plus + 1);
    if (p == "prev") r.pred = replay_predictor::prev;
    else if (p == "oracle") r.pred = replay_predictor::oracle;
    else throw error("replay: policy '" + full + "': unknown predictor '" + p + "'; expected prev or oracle");
  }
  return r;
}

inline cache_policy_args replay_policy_args(const replay_input& in, std::uint64_t seed,
                                            const cycle_policy_options& cycle) {
  cache_policy_args a;
  a.seed = seed;
  a.cycle = cycle;
  a.next_use = in.next_use();
  return a;
}

/// The batch that routes layer `target` next after batch i, for the retention
/// decorators: batch i+1 (oracle) or the same layer one token earlier (prev).
inline const load_batch* replay_prediction(const replay_input& in, std::size_t i, replay_predictor p) {
  const auto& bs = in.batches().batches;
  if (i + 1 >= bs.size()) return nullptr;
  const load_batch& target = bs[i + 1];
  if (target.phase != run_phase::decode) return nullptr;
  if (p == replay_predictor::oracle) return &target;
  const std::size_t back = in.n_moe_layers();
  if (i + 1 < back) return nullptr;
  const load_batch& prev = bs[i + 1 - back];
  if (prev.layer != target.layer || prev.phase != run_phase::decode) return nullptr;
  return &prev;
}

template <class Policy>
void replay_run(const replay_input& in, Policy policy, replay_result& out, const replay_options& o,
                replay_predictor pred) {
  std::string warning;
  cache_options co;
  co.budget_bytes = out.budget_bytes;
  co.guard = o.guard;
  co.on_warning = [&warning](const std::string& m) { warning = m; };
  expert_cache<Policy> cache(in.shape(), std::move(co), std::move(policy));
  const load_batches& lb = in.batches();
  for (std::size_t i = 0; i < lb.batches.size(); ++i) {
    const load_batch& b = lb.batches[i];
    if (!cache.begin_batch(b.phase, b.layer)) continue;
    for (expert_id e : lb.experts_of(b)) cache.lookup(e);
    if constexpr (is_retention<Policy>::value) {
      if (const load_batch* t = replay_prediction(in, i, pred))
        cache.policy().protect(lb.batches[i + 1].layer, lb.experts_of(*t));
    }
    cache.end_batch();
  }
  out.stats = cache.stats();
  out.token_cycle_bytes = cache.token_cycle_bytes();
  out.warning = warning;
}


template <class Policy>
void replay_dispatch_retention(const replay_input& in, Policy p, replay_result& r, const replay_options& o,
                               replay_predictor pred) {
  if (pred == replay_predictor::none) replay_run(in, std::move(p), r, o, pred);
  else replay_run(in, retention_policy<Policy>(std::move(p)), r, o, pred);
}

inline void replay_dispatch(const replay_input& in, const std::string& full, replay_result& r,
                            const replay_options& o) {
  const replay_policy_name name = parse_replay_policy(full);
  with_cache_policy(name.base, replay_policy_args(in, o.seed, o.cycle),
                    [&](auto policy) { replay_dispatch_retention(in, std::move(policy), r, o, name.pred); });
}

}  // namespace detail

/// Throws error on an unknown policy name, a budget <= 0 (or not finite).
inline void check_replay_cell(const std::string& policy, double budget_mib) {
  detail::parse_replay_policy(policy);
  if (!(budget_mib > 0) || budget_mib > 1e12)
    throw error("replay: budget " + std::to_string(budget_mib) + " MiB; expected a finite budget > 0 MiB");
}

/// Replays one cell. Throws error on a bad policy or budget, or (guard
/// refuse) a budget below the token cycle under a collapsing policy.
inline replay_result replay_cell(const replay_input& in, const std::string& policy, double budget_mib,
                                 const replay_options& o = {}) {
  check_replay_cell(policy, budget_mib);
  replay_result r;
  r.policy = detail::parse_replay_policy(policy).canonical();
  r.budget_mib = budget_mib;
  r.budget_bytes = from_mib(budget_mib);
  const auto t0 = std::chrono::steady_clock::now();
  detail::replay_dispatch(in, policy, r, o);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

namespace detail {

/// How replay_grid starts a worker: the seam a test replaces to make a start fail.
struct replay_thread_starter {
  template <class F>
  void operator()(std::vector<std::thread>& pool, F&& f) const {
    pool.emplace_back(std::forward<F>(f));
  }
};

template <class Start>
std::vector<replay_result> replay_grid_with(const replay_input& in, const std::vector<double>& budgets_mib,
                                            const std::vector<std::string>& policies, const replay_options& o,
                                            const Start& start) {
  if (budgets_mib.empty()) throw error("replay: no budgets; expected at least one (MiB)");
  if (policies.empty()) throw error("replay: no policies; expected at least one of " + replay_known_names());
  for (double b : budgets_mib)
    for (const auto& p : policies) check_replay_cell(p, b);
  const std::size_t n = budgets_mib.size() * policies.size();
  std::vector<replay_result> out(n);
  unsigned threads = o.threads ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<std::size_t>(threads, n));
  std::atomic<std::size_t> next{0}, done{0};
  std::mutex mu;
  std::exception_ptr failure;
  auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < n;) {
      try {
        out[i] = replay_cell(in, policies[i % policies.size()], budgets_mib[i / policies.size()], o);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!failure) failure = std::current_exception();
      }
      const std::size_t d = done.fetch_add(1) + 1;
      if (o.progress) {
        std::lock_guard<std::mutex> lock(mu);
        o.progress(d, n);
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads);
  try {
    for (unsigned t = 1; t < threads; ++t) start(pool, work);
  } catch (const std::exception& e) {
    // A joinable std::thread destroyed is std::terminate: stop handing out
    // cells, let the started workers finish theirs, and join them first.
    next.store(n);
    for (auto& t : pool) t.join();
    throw error("replay: could not start worker thread " + std::to_string(pool.size() + 1) + " of " +
                std::to_string(threads - 1) + ": " + e.what() +
                "; expected fewer threads (replay_options::threads, --threads)");
  }
  work();
  for (auto& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
  return out;
}

}  // namespace detail

/// Replays every (budget, policy) cell on a pool of threads. Results come
/// back budget-major, policies in the order given. Validates every cell
/// before starting; rethrows the first error of a worker. Throws `error`
/// when a worker thread cannot be started (after joining those that were).
inline std::vector<replay_result> replay_grid(const replay_input& in, const std::vector<double>& budgets_mib,
                                              const std::vector<std::string>& policies,
                                              const replay_options& o = {}) {
  return detail::replay_grid_with(in, budgets_mib, policies, o, detail::replay_thread_starter{});
}

/// CSV with exactly the reference curves' columns:
/// budget_mib,policy,hit_pct_cum,hit_pct_decode,read_mib (%.3f, %.3f, %.1f).
inline std::string replay_csv(const std::vector<replay_result>& rs) {
  std::string s = "budget_mib,policy,hit_pct_cum,hit_pct_decode,read_mib\n";
  char buf[256];
  for (const auto& r : rs) {
    std::snprintf(buf, sizeof buf, "%g,%s,%.3f,%.3f,%.1f\n", r.budget_mib, r.policy.c_str(), r.hit_pct_cum(),
                  r.hit_pct_decode(), r.read_mib());
    s += buf;
  }
  return s;
}

/// A table for people: one row per budget, decode-only hit % per policy
/// (cumulative in parentheses), budgets below the token cycle marked '<T'.
inline std::string replay_table(const std::vector<replay_result>& rs) {
  std::vector<std::string> pols;
  std::vector<double> budgets;
  for (const auto& r : rs) {
    if (std::find(pols.begin(), pols.end(), r.policy) == pols.end()) pols.push_back(r.policy);
    if (std::find(budgets.begin(), budgets.end(), r.budget_mib) == budgets.end()) budgets.push_back(r.budget_mib);
  }
  std::ostringstream os;
  char buf[128];
  os << "decode-only hit % (cumulative hit %) per budget and policy\n";
  std::snprintf(buf, sizeof buf, "%-12s", "budget MiB");
  os << buf;
  for (const auto& p : pols) {
    std::snprintf(buf, sizeof buf, " %15s", p.c_str());
    os << buf;
  }
  os << "\n";
  for (double b : budgets) {
    bool below = false;
    std::string row;
    for (const auto& p : pols) {
      auto it = std::find_if(rs.begin(), rs.end(), [&](const replay_result& r) {
        return r.budget_mib == b && r.policy == p;
      });
      if (it == rs.end()) {
        std::snprintf(buf, sizeof buf, " %15s", "-");
      } else {
        below = below || it->budget_bytes < it->token_cycle_bytes;
        std::snprintf(buf, sizeof buf, " %6.1f (%6.1f)", it->hit_pct_decode(), it->hit_pct_cum());
      }
      row += buf;
    }
    std::snprintf(buf, sizeof buf, "%-9g%-3s", b, below ? " <T" : "");
    os << buf << row << "\n";
  }
  if (!rs.empty()) {
    std::snprintf(buf, sizeof buf, "token cycle T = %.1f MiB; '<T' marks budgets below it\n",
                  to_mib(rs.front().token_cycle_bytes));
    os << buf;
  }
  return os.str();
}


// ===========================================================================
// Dropping and speculation in the replay (issue 10).

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
  std::string policy;    ///< "drop" (parameter = F) or "keep_k" (parameter = k)
  double parameter = 0;
  drop_stats stats;      ///< misses, miss bytes, bytes avoided, weights (decode routings)
  std::string warning;   ///< drop_policy's k <= 4 warning, if any

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
    throw error("keep_k: k = " + std::to_string(k) + " out of range; expected [1, " +
                std::to_string(shape.top_k()) + "] (the trace's top-k)");
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
                  static_cast<unsigned long long>(rows.front().stats.routings),
                  to_mib(rows.front().stats.miss_bytes));
    s += buf;
  }
  return s;
}

// ---- dynamic replay: drop and speculation ------------------------------------

/// A trace ready for the dynamic replay: its routings grouped into the
/// engine's load batches (the same grouping as group_load_batches), decode
/// tokens numbered from 0, and the next-use index Belady needs.
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
};

/// Where the speculative reads' predictions come from.
enum class speculation_source : std::uint8_t {
  none,        ///< no speculation
  prev_token,  ///< the same layer's routing one token earlier (prev_token_predictor)
  frequency,   ///< running counts of the layer (frequency_predictor)
  oracle,      ///< the true routing of the target layer, each slot kept with probability P
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

  /// "prev-token", "frequency", "oracle:0.886", "none" for people.
  std::string name() const {
    switch (source) {
      case speculation_source::none: return "none";
      case speculation_source::prev_token: return "prev-token";
      case speculation_source::frequency: return "frequency";
      case speculation_source::oracle: return oracle_profile.empty() ? "oracle:" + detail::format_number(oracle_p)
                                                                   : "oracle:profile";
    }
    return "?";
  }
};

/// Parses `prev-token`, `frequency`, `oracle:P` (0 <= P <= 1) or `none`.
/// Throws `error` naming the text otherwise.
inline replay_speculation parse_replay_speculation(const std::string& text) {
  replay_speculation s;
  if (text == "none" || text.empty()) return s;
  if (text == "prev-token" || text == "prev") {
    s.source = speculation_source::prev_token;
  } else if (text == "frequency") {
    s.source = speculation_source::frequency;
  } else if (text.rfind("oracle:", 0) == 0) {
    s.source = speculation_source::oracle;
    const std::string v = text.substr(7);
    char* end = nullptr;
    const double p = std::strtod(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size() || !(p >= 0.0 && p <= 1.0))
      throw error("--speculate: '" + text + "': P = '" + v + "'; expected oracle:P with 0 <= P <= 1");
    s.oracle_p = p;
  } else {
    throw error("--speculate: '" + text + "'; expected prev-token, frequency or oracle:P (0 <= P <= 1)");
  }
  return s;
}

/// One decode load of a dynamic replay: what the cache and speculation did.
struct load_event {
  std::uint32_t token = 0;  ///< decode token index, from 0
  layer_id layer{};
  std::uint16_t routed = 0;                 ///< routed experts (slots)
  std::uint16_t dropped = 0;                ///< of those, skipped by the drop policy
  std::uint16_t hits = 0;                   ///< unique lookups that hit
  std::uint16_t misses = 0;                 ///< unique lookups that missed: demanded reads
  std::uint16_t speculative_hits = 0;       ///< of the hits, thanks to a speculative read (useful)
  std::uint16_t speculative_inserted = 0;   ///< speculative reads made resident at this load's quiesce
  std::uint32_t evictions = 0;              ///< evictions in this load (its batch and the integration)
  std::uint64_t demanded_bytes = 0;         ///< bytes of the demanded reads
  std::uint16_t speculative_issued = 0;     ///< reads planned after this load (for a later layer)
  std::uint16_t speculative_cancelled = 0;  ///< of those, cancelled by the observer's admit()
  std::uint64_t speculative_bytes = 0;      ///< bytes of the issued reads that were not cancelled
  std::uint64_t expert_bytes = 0;           ///< bytes of one expert of this layer
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
template <class F>
void with_replay_policy(const std::string& name, const replay_input& in, const dynamic_replay_options& o, F&& f) {
  if (name.find('+') != std::string::npos)
    throw error("replay: policy '" + name + "' with --drop/--speculate; expected a base policy: " +
                cache_policy_names() + " (retention decorators are not combined with speculation)");
  with_cache_policy(name, replay_policy_args(in, o.seed, o.cycle), std::forward<F>(f));
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
  so.scheduler.lanes = 0;  // synchronous: deterministic, reads complete at the end of end_load
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
      case speculation_source::none: break;
    }
    return false;
  };

  for (const auto& b : in.batches()) {
    if (b.phase == run_phase::decode && b.first_of_token) spec.begin_token(run_phase::decode);
    masks.assign(b.count, 0);
    const cache_stats c0 = spec.cache().stats();
    const speculation_stats s0 = spec.stats();
    spec.begin_load(span<const routing>(rs.data() + b.first, b.count), span<std::uint32_t>(masks.data(), b.count));
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
      if (obs.on_load) obs.on_load(ev);
      layer_id target{};
      if (so.enabled && moe_layer_ahead(shape, b.layer, sp.horizon, target)) {
        const bool have = predict(b.decode_token, target);
        cancelled = 0;
        admitted = 0;
        const std::uint64_t issued0 = spec.read_stats().issued;
        spec.end_load(b.layer, have ? &rank : nullptr);
        ev.speculative_issued = static_cast<std::uint16_t>(spec.read_stats().issued - issued0);
        ev.speculative_cancelled = cancelled;
        ev.speculative_bytes = admitted;
      }
      out.decode_loads.push_back(ev);
    }
    for (std::size_t t = 0; t < b.count; ++t) {
      prev.observe(rs[b.first + t]);
      freq.observe(rs[b.first + t]);
    }
  }
  spec.finish();
  out.cache = spec.cache().stats();
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
/// Speculation runs in decode only. Throws `error` on a bad policy, budget,
/// F, cap, horizon or oracle profile.
inline dynamic_replay_result replay_dynamic(const routed_replay_input& in, const dynamic_replay_options& o,
                                            const replay_observer& obs = {}) {
  check_replay_cell(o.policy, o.budget_mib);
  dynamic_replay_result out;
  out.options = o;
  out.options.policy = detail::parse_replay_policy(o.policy).canonical();
  detail::with_replay_policy(o.policy, in.base(), o,
                             [&](auto policy) { detail::replay_dynamic_run(in, std::move(policy), o, obs, out); });
  return out;
}

}  // namespace moe_residency
