#pragma once
/// The speculative read scheduler: lanes (worker threads) that only call the
/// host's read callback, a bounded queue, demanded reads before speculative
/// ones, quiesce/cancel at every demanded load, and honest accounting.
///
/// Threading model. Every member function is called from ONE host thread
/// (the engine's eval thread, or whoever drives the session), except
/// `stats()`, which any thread may call; lanes only run the callback. It never
/// touches a cache: quiesce() hands completed speculative reads back for the
/// caller to apply on the host thread (see speculation.hpp).

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/detail/io_ring.hpp"
#include "moe_residency/error.hpp"

namespace moe_residency {

/// Why the host is asked to read an expert.
enum class read_reason : std::uint8_t { demanded = 0, speculative = 1 };

/// What the host's read callback returns.
enum class read_status : std::uint8_t {
  ok = 0,         ///< the expert is resident in the host's memory
  failed = 1,     ///< the read did not happen or is incomplete
  timed_out = 2,  ///< the host gave up on its own deadline
};

/// How a read ended, as the scheduler accounts it.
enum class read_outcome : std::uint8_t {
  ok = 0,
  failed = 1,     ///< the callback returned read_status::failed (or an unknown value)
  timed_out = 2,  ///< the callback returned read_status::timed_out
  threw = 3,      ///< the callback threw; the exception was caught in the lane
  not_run = 4,    ///< never called: a demanded read on a scheduler that was shut down
};

inline const char* to_string(read_reason r) noexcept { return r == read_reason::demanded ? "demanded" : "speculative"; }
inline const char* to_string(read_outcome o) noexcept {
  switch (o) {
    case read_outcome::ok: return "ok";
    case read_outcome::failed: return "failed";
    case read_outcome::timed_out: return "timed_out";
    case read_outcome::threw: return "threw";
    case read_outcome::not_run: return "not_run";
  }
  return "?";
}

/// One expert to read; `bytes` is for accounting only (what the read costs).
struct read_request {
  layer_id layer{};
  expert_id expert{};
  std::uint64_t bytes = 0;
};

/// A speculative read the lanes finished, handed back by `quiesce()`.
struct completed_read {
  read_request request;
  read_outcome outcome = read_outcome::ok;
  std::uint64_t ticket = 0;  ///< issue order, from 0
};

/// `read(layer, expert, reason) -> status`: makes one expert resident in the
/// host's memory. Called from lanes (or, in synchronous mode, inline at
/// `pump()`/`demand()`), possibly from several lanes at once for different
/// experts. It may fail, time out or throw; each is counted, none is fatal.
using read_callback = std::function<read_status(layer_id, expert_id, read_reason)>;

/// What `quiesce()` does with speculative reads already in a lane.
enum class quiesce_mode : std::uint8_t {
  /// Wait for them (up to `wait_limit`), then integrate what completed. The
  /// wait is stall the demanded load sees; a read that finished is usable.
  wait = 0,
  /// Do not wait: they are disowned. Their lane still finishes the call (a
  /// callback cannot be interrupted), so demanded reads may queue behind them;
  /// their result is counted but discarded, never integrated, because the
  /// host's demanded load may already be reading the same expert.
  disown = 1,
};

struct scheduler_options {
  /// Worker threads calling the callback. 0 = synchronous mode: no threads;
  /// speculative reads run inline at `pump()`, demanded ones inside `demand()`
  /// (begin_demand()). Phone flash saturates at ~2 lanes (docs/speculation.md).
  std::size_t lanes = 2;
  /// Bound on speculative reads owned by the scheduler at once: queued + in a
  /// lane + completed but not yet handed back. `speculate()` rejects beyond it.
  std::size_t queue_capacity = 16;
  quiesce_mode mode = quiesce_mode::wait;
  /// wait mode: the longest one quiesce waits for in-flight speculative reads
  /// before disowning the rest (counted in `disowned`). 0 = no limit.
  std::chrono::nanoseconds wait_limit{0};
};

/// Counters since construction. Speculative reads balance:
/// issued == completed + cancelled + failed + in_flight + queued.
struct scheduler_stats {
  // speculative
  std::uint64_t issued = 0, issued_bytes = 0;        ///< accepted by speculate()
  std::uint64_t rejected = 0;                        ///< refused by speculate(): queue full or shut down (not issued)
  std::uint64_t cancelled = 0;                       ///< dequeued by quiesce()/shutdown before a lane called the host
  std::uint64_t completed = 0, completed_bytes = 0;  ///< callback returned ok (disowned ones included)
  std::uint64_t failed = 0;                          ///< callback failed, timed out or threw
  std::uint64_t timed_out = 0, threw = 0;            ///< of failed: returned read_status::timed_out; threw
  std::uint64_t in_flight = 0;                       ///< in a lane right now (disowned ones included)
  std::uint64_t queued = 0;                          ///< waiting for a lane right now
  std::uint64_t disowned = 0;                        ///< in flight when a quiesce stopped waiting for them
  std::uint64_t discarded = 0, discarded_bytes = 0;  ///< disowned reads that completed ok; never handed back
  std::uint64_t delivered = 0;                       ///< completed reads handed back by quiesce (ok or not)
  // demanded
  std::uint64_t demanded = 0, demanded_bytes = 0;  ///< demanded reads run
  std::uint64_t demanded_failed = 0;               ///< of demanded: failed, timed out, threw or not run
  std::uint64_t demanded_queued = 0;               ///< demanded reads waiting for a lane right now
  std::uint64_t demand_loads = 0, quiesces = 0;    ///< demand() / begin_demand() and quiesce() calls
  // stall seen by the host, nanoseconds
  std::uint64_t quiesce_wait_ns = 0;  ///< inside quiesce(): waiting for in-flight speculation
  std::uint64_t demand_ns = 0;        ///< the host waiting for demanded reads (demand(), end_demand())
  std::uint64_t demand_open_ns = 0;   ///< begin_demand() to end_demand(), the host working meanwhile
  std::uint64_t demand_waits = 0;     ///< end_demand() calls that found reads running and blocked

  std::uint64_t stall_ns() const noexcept { return quiesce_wait_ns + demand_ns; }
  bool balanced() const noexcept { return issued == completed + cancelled + failed + in_flight + queued; }
};

/// N lanes calling the host's read callback; demanded before speculative.
/// Not copyable or movable (lanes hold `this`). The destructor cancels what
/// is queued and joins the lanes: it returns once every callback in progress
/// has returned, so a stuck-but-finite callback delays it and never deadlocks it.
class read_scheduler {
 public:
  /// Throws `error` on an empty callback, queue_capacity 0, more than 256
  /// lanes, or when a lane thread cannot be started.
  explicit read_scheduler(read_callback read, scheduler_options options = {})
      : read_(std::move(read)),
        options_(options),
        queue_(options.queue_capacity),
        completions_(options.queue_capacity),
        handed_(options.queue_capacity) {
    if (!read_) throw error("read_scheduler: the read callback is empty; expected a callable");
    if (options_.queue_capacity == 0) throw error("read_scheduler: queue_capacity 0; expected at least 1");
    if (options_.lanes > 256)
      throw error("read_scheduler: " + std::to_string(options_.lanes) +
                  " lanes; expected at most 256 (storage saturates far earlier)");
    if (options_.wait_limit.count() < 0)
      throw error("read_scheduler: wait_limit " + std::to_string(options_.wait_limit.count()) +
                  " ns is negative; expected >= 0 ns (0 = no limit)");
    lanes_.resize(options_.lanes);
    threads_.reserve(options_.lanes);
    try {
      for (std::size_t i = 0; i < options_.lanes; ++i) threads_.emplace_back([this, i] { lane_main(i); });
    } catch (const std::exception& e) {
      const std::size_t started = threads_.size();
      stop_and_join();
      throw error("read_scheduler: could not start lane thread " + std::to_string(started + 1) + " of " +
                  std::to_string(options_.lanes) + ": " + e.what() +
                  " (fewer lanes, or lanes = 0 for synchronous reads)");
    }
  }

  read_scheduler(const read_scheduler&) = delete;
  read_scheduler& operator=(const read_scheduler&) = delete;

  ~read_scheduler() { stop_and_join(); }

  bool synchronous() const noexcept { return options_.lanes == 0; }
  const scheduler_options& options() const noexcept { return options_; }

  /// Host thread. Queues one speculative read. Call it after the current
  /// layer's demanded load, never when the prediction is made (the next
  /// quiesce would cancel it before a lane picks it up). False when the
  /// scheduler already owns `queue_capacity` speculative reads or was shut
  /// down (counted in `rejected`).
  bool speculate(const read_request& r) noexcept {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_ || queue_.size() + owned_in_flight_ + completions_.size() >= queue_.capacity()) {
        ++stats_.rejected;
        return false;
      }
      queue_.push_back(queued_read{r, next_ticket_++});
      ++stats_.issued;
      stats_.issued_bytes += r.bytes;
    }
    if (!synchronous()) work_cv_.notify_one();
    return true;
  }

  /// Synchronous mode only: runs up to `max_reads` queued speculative reads
  /// inline on the calling thread — the deterministic point tests and replays
  /// use to stand for "the lanes ran during this layer's compute". Returns the
  /// number run; 0 in threaded mode.
  std::size_t pump(std::size_t max_reads = std::numeric_limits<std::size_t>::max()) noexcept {
    if (!synchronous()) return 0;
    std::size_t n = 0;
    while (n < max_reads) {
      queued_read q;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (queue_.empty()) break;
        q = queue_.pop_front();
        ++owned_in_flight_;
        ++stats_.in_flight;
      }
      const read_outcome o = invoke(q.request, read_reason::speculative);
      {
        std::lock_guard<std::mutex> lock(mu_);
        --stats_.in_flight;
        --owned_in_flight_;
        count_speculative(q.request, o);
        completions_.push_back(completed_read{q.request, o, q.ticket});
      }
      ++n;
    }
    return n;
  }

  /// Host thread, at the start of every demanded load. Cancels every queued
  /// speculative read; in wait mode waits (up to `wait_limit`) for those in a
  /// lane, in disown mode disowns them; then hands back every speculative read
  /// that completed since the previous quiesce (ok or not, in completion
  /// order) for the caller to apply to its cache on this thread. The span is
  /// valid until the next call on this scheduler. Time spent here is stall.
  span<const completed_read> quiesce() noexcept {
    const auto t0 = clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    ++stats_.quiesces;
    stats_.cancelled += queue_.size();
    queue_.clear();
    if (!synchronous()) {
      if (options_.mode == quiesce_mode::wait && owned_in_flight_ > 0) {
        auto none_owned = [this] { return owned_in_flight_ == 0; };
        if (options_.wait_limit.count() == 0) done_cv_.wait(lock, none_owned);
        else done_cv_.wait_for(lock, options_.wait_limit, none_owned);
      }
      if (owned_in_flight_ > 0) {
        for (lane_state& s : lanes_) {
          if (s.busy && !s.disowned) {
            s.disowned = true;
            ++stats_.disowned;
          }
        }
        owned_in_flight_ = 0;
      }
    }
    handed_size_ = 0;
    while (!completions_.empty()) handed_[handed_size_++] = completions_.pop_front();
    stats_.delivered += handed_size_;
    stats_.quiesce_wait_ns += elapsed_ns(t0);
    return {handed_.data(), handed_size_};
  }

  /// Host thread, after quiesce(): begin_demand() then end_demand(): a demanded
  /// load's reads on the lanes, blocking until all returned (stall); outcomes[i]
  /// is reads[i]'s (outcomes.size() >= reads.size()). Returns how many were ok.
  std::size_t demand(span<const read_request> reads, span<read_outcome> outcomes) noexcept {
    begin_demand(reads, outcomes);
    return end_demand();
  }

  /// Host thread: demand() in two halves, so that the host can go on (compute
  /// the layer these experts are for) while the lanes read: hands the reads
  /// to the lanes, ahead of any speculative read, in order, and returns;
  /// `reads` and `outcomes` must live until end_demand(). Synchronous mode
  /// runs them here. A second begin_demand() first ends the open load.
  void begin_demand(span<const read_request> reads, span<read_outcome> outcomes) noexcept {
    MOE_RESIDENCY_ASSERT(outcomes.size() >= reads.size());
    if (open_) end_demand();
    const std::size_t n = std::min(reads.size(), outcomes.size());
    open_ = true;
    open_reads_ = {reads.data(), n};
    open_outcomes_ = {outcomes.data(), n};
    open_t0_ = clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    const bool stopped = stopped_;
    open_inline_ = stopped || synchronous() || n == 0;
    if (open_inline_) {
      lock.unlock();
      for (std::size_t i = 0; i < n; ++i)
        outcomes[i] = stopped ? read_outcome::not_run : invoke(reads[i], read_reason::demanded);
      return;
    }
    demand_size_ = demand_remaining_ = stats_.demanded_queued = n;
    demand_next_ = 0;
    work_cv_.notify_all();
  }

  /// Host thread: waits for every read of the open load, accounts them and
  /// returns how many were ok (0 when none is open). The wait is stall
  /// (demand_ns); one not over at once is counted in demand_waits.
  std::size_t end_demand() noexcept {
    if (!open_) return 0;
    const auto t_wait = open_inline_ ? open_t0_ : clock::now();  // inline reads were the host's wait
    std::unique_lock<std::mutex> lock(mu_);
    if (demand_size_ != 0) {
      if (demand_remaining_ != 0) ++stats_.demand_waits;
      done_cv_.wait(lock, [this] { return demand_remaining_ == 0; });
      demand_size_ = demand_next_ = 0;
    }
    open_ = false;
    stats_.demand_open_ns += elapsed_ns(open_t0_);
    return finish_demand(open_reads_, open_outcomes_, open_reads_.size(), t_wait);
  }

  /// True between begin_demand() and end_demand().
  bool demand_open() const noexcept { return open_; }

  /// A snapshot of the counters, consistent (taken under the lock; it always
  /// balances). Safe to call from any thread.
  scheduler_stats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    scheduler_stats s = stats_;
    s.queued = queue_.size();
    return s;
  }

  /// Host thread. Cancels what is queued, waits for every callback in
  /// progress (disowned ones too) and joins the lanes; afterwards
  /// `speculate()` rejects and `demand()` reports `not_run`. Returns the final
  /// counters (in_flight and queued are then 0). Idempotent.
  scheduler_stats shutdown() {
    stop_and_join();
    return stats();
  }

 private:
  using clock = std::chrono::steady_clock;

  struct queued_read {
    read_request request;
    std::uint64_t ticket = 0;
  };
  struct lane_state {
    bool busy = false;      // running a speculative read
    bool disowned = false;  // a quiesce stopped waiting for it
  };

  static std::uint64_t elapsed_ns(clock::time_point t0) noexcept {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - t0).count());
  }

  read_outcome invoke(const read_request& r, read_reason why) const noexcept {
    try {
      switch (read_(r.layer, r.expert, why)) {
        case read_status::ok: return read_outcome::ok;
        case read_status::timed_out: return read_outcome::timed_out;
        case read_status::failed: break;
      }
      return read_outcome::failed;
    } catch (...) {
      return read_outcome::threw;
    }
  }

  // Under mu_.
  void count_speculative(const read_request& r, read_outcome o) noexcept {
    if (o == read_outcome::ok) {
      ++stats_.completed;
      stats_.completed_bytes += r.bytes;
      return;
    }
    ++stats_.failed;
    if (o == read_outcome::timed_out) ++stats_.timed_out;
    if (o == read_outcome::threw) ++stats_.threw;
  }

  // Under mu_.
  std::size_t finish_demand(span<const read_request> reads, span<read_outcome> outcomes, std::size_t n,
                            clock::time_point t0) noexcept {
    std::size_t ok = 0;
    for (std::size_t i = 0; i < n; ++i) {
      ++stats_.demanded;
      stats_.demanded_bytes += reads[i].bytes;
      if (outcomes[i] == read_outcome::ok) ++ok;
      else ++stats_.demanded_failed;
    }
    ++stats_.demand_loads;
    stats_.demanded_queued = 0;
    stats_.demand_ns += elapsed_ns(t0);
    return ok;
  }

  void lane_main(std::size_t lane) noexcept {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [this] { return stopping_ || demand_next_ < demand_size_ || !queue_.empty(); });
      if (demand_next_ < demand_size_) {  // demanded work always first
        const std::size_t i = demand_next_++;
        const read_request r = open_reads_[i];
        --stats_.demanded_queued;
        lock.unlock();
        const read_outcome o = invoke(r, read_reason::demanded);
        lock.lock();
        open_outcomes_[i] = o;
        if (--demand_remaining_ == 0) done_cv_.notify_all();
        continue;
      }
      if (!queue_.empty()) {
        const queued_read q = queue_.pop_front();
        lane_state& s = lanes_[lane];
        s.busy = true;
        s.disowned = false;
        ++owned_in_flight_;
        ++stats_.in_flight;
        lock.unlock();
        const read_outcome o = invoke(q.request, read_reason::speculative);
        lock.lock();
        --stats_.in_flight;
        count_speculative(q.request, o);
        if (s.disowned) {
          if (o == read_outcome::ok) {
            ++stats_.discarded;
            stats_.discarded_bytes += q.request.bytes;
          }
        } else {
          --owned_in_flight_;
          const bool stored = completions_.push_back(completed_read{q.request, o, q.ticket});
          MOE_RESIDENCY_ASSERT(stored);  // speculate() bounds queued + owned + completed
          static_cast<void>(stored);
          if (owned_in_flight_ == 0) done_cv_.notify_all();
        }
        s.busy = false;
        s.disowned = false;
        continue;
      }
      if (stopping_) return;
    }
  }

  void stop_and_join() noexcept {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_ && threads_.empty()) return;
      stopped_ = true;  // speculate() now rejects
      stopping_ = true;
      stats_.cancelled += queue_.size();
      queue_.clear();
    }
    work_cv_.notify_all();
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }

  read_callback read_;
  scheduler_options options_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // lanes wait for work
  std::condition_variable done_cv_;  // the host waits for demanded reads / owned speculation
  detail::io_ring<queued_read> queue_;
  detail::io_ring<completed_read> completions_;
  std::vector<completed_read> handed_;  // host-thread copy returned by quiesce()
  std::size_t handed_size_ = 0;
  std::vector<lane_state> lanes_;
  std::size_t owned_in_flight_ = 0;  // in flight and not disowned
  std::uint64_t next_ticket_ = 0;
  bool stopping_ = false;
  bool stopped_ = false;
  // The demanded load being served (open_reads_ below, between begin_ and end_demand).
  std::size_t demand_size_ = 0;
  std::size_t demand_next_ = 0;
  std::size_t demand_remaining_ = 0;
  scheduler_stats stats_;

  // The host's open demanded load (set by the host; lanes index it under mu_).
  bool open_ = false, open_inline_ = false;
  span<const read_request> open_reads_{};
  span<read_outcome> open_outcomes_{};
  clock::time_point open_t0_{};

  std::vector<std::thread> threads_;  // last: started after everything above exists
};

}  // namespace moe_residency
