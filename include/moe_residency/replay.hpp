#pragma once
/// replay: the offline simulator. Runs a route trace's load batches through
/// expert_cache<Policy> for every (policy, budget) cell, in parallel, and
/// reports the figures of the engine authors' replay curves: cumulative and
/// decode-only hit %, and MiB read (MiB = 1048576 bytes).
///
/// Its parts: replay/cells.hpp (one cell, the reports; no threads),
/// replay/static_drop.hpp (the static drop replay over recorded residency),
/// replay/dynamic.hpp (drop and speculation through the speculation glue).
/// This header adds replay_grid, which runs the grid of cells on a pool of
/// threads (the threads component); replay/cells.hpp's replay_cells runs the
/// same grid on the calling thread (the core).

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "moe_residency/error.hpp"
#include "moe_residency/replay/cells.hpp"
#include "moe_residency/replay/dynamic.hpp"
#include "moe_residency/replay/oracle_profile.hpp"
#include "moe_residency/replay/static_drop.hpp"

namespace moe_residency {

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
  check_replay_grid(budgets_mib, policies);
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
                                              const std::vector<std::string>& policies, const replay_options& o = {}) {
  return detail::replay_grid_with(in, budgets_mib, policies, o, detail::replay_thread_starter{});
}

}  // namespace moe_residency
