#pragma once
/// One replay cell: a route trace's load batches through expert_cache<Policy>
/// at one (policy, budget), with the figures of the engine authors' replay
/// curves (cumulative and decode-only hit %, MiB read; MiB = 1048576 bytes),
/// the grid of many cells one after another (replay_cells), and their CSV and
/// table. No threads: replay.hpp's replay_grid runs the same grid in parallel.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "moe_residency/cache.hpp"
#include "moe_residency/cache/registry.hpp"
#include "moe_residency/core.hpp"
#include "moe_residency/detail/format.hpp"
#include "moe_residency/detail/numbers.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/predict/history.hpp"
#include "moe_residency/trace.hpp"

namespace moe_residency {

/// A trace ready to replay: its shape, its load batches, and the next-use
/// index Belady needs (built once, shared by every cell).
class replay_input {
 public:
  replay_input(model_shape shape, load_batches batches) : shape_(std::move(shape)), batches_(std::move(batches)) {
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
  /// Tuning of the adaptive policy (its cycle rule takes `cycle`).
  adaptive_policy_options adaptive{};
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
  /// The token-cycle guard's message, and over_budget_warning's when the
  /// cell held more than its budget (stats.peak_bytes), "; " between them.
  std::string warning;
  bool below_cycle_warned = false;  ///< the token-cycle guard warned (a recency policy below the cycle)
  double seconds = 0;               ///< wall time of the cell

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

inline std::string replay_known_names() { return cache_policy_names() + " (any of them may take +prev or +oracle)"; }

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

/// The warning of a cell whose cache held more than its budget after a
/// batch (`peak_bytes`, cache_stats::peak_bytes): its hit rate is that
/// memory's, not the budget's. A batch's own experts are never evicted (a
/// prompt batch can need more than the budget), the per-layer policies evict
/// only inside the layer being loaded (after a prompt every layer still holds
/// its prompt batch's experts: Qwen's trace, layer at 4000 MiB, holds 7275
/// MiB) and keep top-k experts a layer whatever the budget, and a policy may
/// decline to evict (victim() gives no slot). "" when it held no more than
/// its budget.
inline std::string over_budget_warning(std::uint64_t budget_bytes, std::uint64_t peak_bytes) {
  if (peak_bytes <= budget_bytes) return {};
  return "held " + format_fixed(to_mib(peak_bytes), 1) + " MiB at its peak, above its budget of " +
         format_fixed(to_mib(budget_bytes), 1) +
         " MiB (a batch's own experts are never evicted, the per-layer policies evict only inside the layer being "
         "loaded and keep top-k experts a layer, and a policy may decline to evict): its hit rate is for that "
         "memory, not the budget";
}

inline cache_policy_args replay_policy_args(const replay_input& in, std::uint64_t seed,
                                            const cycle_policy_options& cycle,
                                            const adaptive_policy_options& adaptive) {
  cache_policy_args a;
  a.seed = seed;
  a.cycle = cycle;
  a.adaptive = adaptive;
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
  bool warned = false;
  co.on_warning = [&warning, &warned](const std::string& m) {
    warning = m;
    warned = true;
  };
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
  out.below_cycle_warned = warned;
  if (const std::string w = over_budget_warning(out.budget_bytes, out.stats.peak_bytes); !w.empty())
    warning += (warning.empty() ? "" : "; ") + w;
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
  with_cache_policy(name.base, replay_policy_args(in, o.seed, o.cycle, o.adaptive),
                    [&](auto policy) { replay_dispatch_retention(in, std::move(policy), r, o, name.pred); });
}

}  // namespace detail

/// The largest cache budget a replay takes, MiB (about an exbibyte: far
/// above any model, and its bytes still fit a 64-bit count).
constexpr double max_budget_mib = 1e12;

/// The budgets a replay takes: (0, max_budget_mib] MiB.
inline detail::real_domain budget_mib_domain() { return detail::real_domain::open_closed(0, max_budget_mib); }

/// "" when `budget_mib` is a budget a replay takes: in budget_mib_domain(),
/// and at least one byte once rounded to whole bytes (from_mib); else what is
/// wrong, e.g. "1e-07 MiB is 0 bytes once rounded; expected at least one byte
/// (>= 4.8e-07 MiB)".
inline std::string budget_mib_problem(double budget_mib) {
  if (!budget_mib_domain().contains(budget_mib))
    return detail::show_number(budget_mib) + " MiB; expected " + budget_mib_domain().describe() + " (MiB)";
  if (from_mib(budget_mib) == 0)
    return detail::show_number(budget_mib) +
           " MiB is 0 bytes once rounded to whole bytes; expected at least one byte "
           "(>= 4.8e-07 MiB)";
  return {};
}

/// Throws error on an unknown policy name, or a budget budget_mib_problem
/// refuses (<= 0, not finite, beyond max_budget_mib, or 0 bytes).
inline void check_replay_cell(const std::string& policy, double budget_mib) {
  detail::parse_replay_policy(policy);
  if (const std::string p = budget_mib_problem(budget_mib); !p.empty()) throw error("replay: budget " + p);
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

/// Throws error unless every (budget, policy) cell of a grid is one a replay
/// takes, before any is run; an empty list of either is refused too.
inline void check_replay_grid(const std::vector<double>& budgets_mib, const std::vector<std::string>& policies) {
  if (budgets_mib.empty()) throw error("replay: no budgets; expected at least one (MiB)");
  if (policies.empty()) throw error("replay: no policies; expected at least one of " + detail::replay_known_names());
  for (double b : budgets_mib)
    for (const auto& p : policies) check_replay_cell(p, b);
}

/// Replays every (budget, policy) cell on the calling thread, budget-major,
/// policies in the order given: the same results as replay.hpp's replay_grid
/// without its threads (`o.threads` is not used; `o.progress` is called after
/// each cell). Validates every cell before running any.
inline std::vector<replay_result> replay_cells(const replay_input& in, const std::vector<double>& budgets_mib,
                                               const std::vector<std::string>& policies, const replay_options& o = {}) {
  check_replay_grid(budgets_mib, policies);
  const std::size_t n = budgets_mib.size() * policies.size();
  std::vector<replay_result> out;
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    out.push_back(replay_cell(in, policies[i % policies.size()], budgets_mib[i / policies.size()], o));
    if (o.progress) o.progress(i + 1, n);
  }
  return out;
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
      auto it = std::find_if(rs.begin(), rs.end(),
                             [&](const replay_result& r) { return r.budget_mib == b && r.policy == p; });
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

}  // namespace moe_residency
