// The read scheduler: configuration errors, the synchronous mode (exact,
// deterministic), demanded-before-speculative ordering, quiesce in wait /
// disown / wait-limit modes, shutdown with a stuck-but-finite callback, and a
// stress test whose accounting must balance. Built and run under
// ThreadSanitizer too (docs/speculation.md). Latencies here shake
// interleavings; nothing asserts on wall-clock time.
#include "moe_residency/io.hpp"

#include <doctest/doctest.h>

#include "alloc_counter.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace moe_residency;

using moe_residency_test::g_allocations;

namespace {

layer_id L(unsigned l) { return layer_id(static_cast<std::uint16_t>(l)); }
expert_id E(unsigned e) { return expert_id(static_cast<std::uint16_t>(e)); }
read_request R(unsigned l, unsigned e, std::uint64_t bytes = 100) { return {L(l), E(e), bytes}; }
unsigned key(layer_id l, expert_id e) {
  return static_cast<unsigned>(to_index(l)) * 1000u + static_cast<unsigned>(to_index(e));
}

read_status ok_read(layer_id, expert_id, read_reason) { return read_status::ok; }

// A gate a callback can block on until the test opens it.
struct gate {
  std::atomic<bool> open{false};
  void wait() const {
    while (!open.load(std::memory_order_acquire)) std::this_thread::yield();
  }
  void release() { open.store(true, std::memory_order_release); }
};

// Spins until p() holds; false after 60 s (a broken scheduler must fail the
// test, not hang it).
template <class Pred>
bool spin_until(Pred p) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!p()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

// Records every call, thread-safely.
struct call_log {
  std::mutex mu;
  std::vector<std::pair<unsigned, read_reason>> calls;
  void add(layer_id l, expert_id e, read_reason r) {
    std::lock_guard<std::mutex> lock(mu);
    calls.emplace_back(key(l, e), r);
  }
};

}  // namespace

TEST_CASE("read_scheduler rejects bad configuration with the reason") {
  CHECK_THROWS_WITH_AS(read_scheduler(read_callback{}),
                       "read_scheduler: the read callback is empty; expected a callable", error);
  scheduler_options o;
  o.queue_capacity = 0;
  CHECK_THROWS_WITH_AS(read_scheduler(ok_read, o), "read_scheduler: queue_capacity 0; expected at least 1", error);
  o = {};
  o.lanes = 300;
  CHECK_THROWS_WITH_AS(read_scheduler(ok_read, o),
                       "read_scheduler: 300 lanes; expected at most 256 (storage saturates far earlier)", error);
  o = {};
  o.wait_limit = std::chrono::nanoseconds(-1);
  CHECK_THROWS_WITH_AS(read_scheduler(ok_read, o),
                       "read_scheduler: wait_limit -1 ns is negative; expected >= 0 ns (0 = no "
                       "limit)",
                       error);
  o.wait_limit = std::chrono::microseconds(-20);
  CHECK_THROWS_WITH_AS(read_scheduler(ok_read, o), doctest::Contains("wait_limit -20000 ns is negative"), error);
}

TEST_CASE("synchronous mode: reads run inline at pump(), quiesce cancels the rest") {
  call_log log;
  scheduler_options o;
  o.lanes = 0;
  read_scheduler s(
      [&](layer_id l, expert_id e, read_reason r) {
        log.add(l, e, r);
        return read_status::ok;
      },
      o);
  REQUIRE(s.synchronous());
  CHECK(s.speculate(R(1, 1)));
  CHECK(s.speculate(R(1, 2)));
  CHECK(s.speculate(R(1, 3)));
  CHECK(log.calls.empty());  // nothing runs at issue time
  CHECK(s.pump(2) == 2);
  REQUIRE(log.calls.size() == 2);
  CHECK(log.calls[0] == std::make_pair(1001u, read_reason::speculative));
  CHECK(log.calls[1] == std::make_pair(1002u, read_reason::speculative));

  const span<const completed_read> done = s.quiesce();
  REQUIRE(done.size() == 2);
  CHECK(done[0].request.expert == E(1));
  CHECK(done[0].ticket == 0);
  CHECK(done[1].request.expert == E(2));
  CHECK(done[1].ticket == 1);
  CHECK(done[1].outcome == read_outcome::ok);

  read_outcome out[2];
  const read_request demanded[2] = {R(2, 7, 500), R(2, 8, 500)};
  CHECK(s.demand(demanded, out) == 2);
  CHECK(log.calls.size() == 4);
  CHECK(log.calls[2] == std::make_pair(2007u, read_reason::demanded));
  CHECK(s.quiesce().empty());  // handed back once only

  const scheduler_stats st = s.stats();
  CHECK(st.issued == 3);
  CHECK(st.issued_bytes == 300);
  CHECK(st.completed == 2);
  CHECK(st.completed_bytes == 200);
  CHECK(st.cancelled == 1);
  CHECK(st.failed == 0);
  CHECK(st.delivered == 2);
  CHECK(st.demanded == 2);
  CHECK(st.demanded_bytes == 1000);
  CHECK(st.demand_loads == 1);
  CHECK(st.quiesces == 2);
  CHECK(st.balanced());
}

TEST_CASE("failing, timing-out and throwing callbacks are counted, never escape") {
  for (std::size_t lanes : {0u, 2u}) {
    CAPTURE(lanes);
    scheduler_options o;
    o.lanes = lanes;
    read_scheduler s(
        [](layer_id, expert_id e, read_reason) -> read_status {
          switch (to_index(e) % 5) {
            case 0: return read_status::ok;
            case 1: return read_status::failed;
            case 2: return read_status::timed_out;
            case 3: throw std::runtime_error("flash I/O error");
            default: throw 42;  // not even a std::exception
          }
        },
        o);
    for (unsigned e = 0; e < 10; ++e) REQUIRE(s.speculate(R(0, e)));
    s.pump();
    if (lanes)
      spin_until([&] {
        const auto st = s.stats();
        return st.completed + st.failed == 10;
      });
    const span<const completed_read> done = s.quiesce();
    REQUIRE(done.size() == 10);
    std::map<read_outcome, int> seen;
    for (const completed_read& c : done) {
      const read_outcome want[] = {read_outcome::ok, read_outcome::failed, read_outcome::timed_out, read_outcome::threw,
                                   read_outcome::threw};
      CHECK(c.outcome == want[to_index(c.request.expert) % 5]);
      ++seen[c.outcome];
    }
    CHECK(seen[read_outcome::ok] == 2);
    CHECK(seen[read_outcome::threw] == 4);

    read_outcome out[5];
    const read_request demanded[5] = {R(1, 0), R(1, 1), R(1, 2), R(1, 3), R(1, 4)};
    CHECK(s.demand(demanded, out) == 1);
    CHECK(out[0] == read_outcome::ok);
    CHECK(out[1] == read_outcome::failed);
    CHECK(out[2] == read_outcome::timed_out);
    CHECK(out[3] == read_outcome::threw);
    CHECK(out[4] == read_outcome::threw);

    const scheduler_stats st = s.stats();
    CHECK(st.completed == 2);
    CHECK(st.failed == 8);
    CHECK(st.timed_out == 2);
    CHECK(st.threw == 4);
    CHECK(st.demanded_failed == 4);
    CHECK(st.balanced());
  }
}

TEST_CASE("the queue is bounded: queued + in flight + not yet handed back") {
  scheduler_options o;
  o.lanes = 0;
  o.queue_capacity = 3;
  read_scheduler s(ok_read, o);
  CHECK(s.speculate(R(0, 0)));
  CHECK(s.speculate(R(0, 1)));
  CHECK(s.speculate(R(0, 2)));
  CHECK_FALSE(s.speculate(R(0, 3)));
  CHECK(s.pump() == 3);
  CHECK_FALSE(s.speculate(R(0, 4)));  // completions still await the host
  CHECK(s.quiesce().size() == 3);
  CHECK(s.speculate(R(0, 5)));
  const scheduler_stats st = s.stats();
  CHECK(st.rejected == 2);
  CHECK(st.issued == 4);
  CHECK(st.queued == 1);
  CHECK(st.balanced());
}

TEST_CASE("demanded reads go before queued speculative reads") {
  call_log log;
  gate first_read;
  std::atomic<bool> entered{false};
  scheduler_options o;
  o.lanes = 1;
  read_scheduler s(
      [&](layer_id l, expert_id e, read_reason r) {
        log.add(l, e, r);
        if (r == read_reason::speculative && to_index(e) == 0) {
          entered.store(true);
          first_read.wait();
        }
        return read_status::ok;
      },
      o);
  REQUIRE(s.speculate(R(0, 0)));
  spin_until([&] { return entered.load(); });  // the only lane is busy with expert 0
  REQUIRE(s.speculate(R(0, 1)));
  REQUIRE(s.speculate(R(0, 2)));
  // Release the lane only once the demanded batch is waiting behind it.
  std::thread opener([&] {
    spin_until([&] { return s.stats().demanded_queued == 2; });
    first_read.release();
  });
  read_outcome out[2];
  const read_request demanded[2] = {R(5, 1), R(5, 2)};
  CHECK(s.demand(demanded, out) == 2);
  opener.join();
  {
    std::lock_guard<std::mutex> lock(log.mu);
    REQUIRE(log.calls.size() >= 3);
    CHECK(log.calls[0] == std::make_pair(0u, read_reason::speculative));
    CHECK(log.calls[1] == std::make_pair(5001u, read_reason::demanded));
    CHECK(log.calls[2] == std::make_pair(5002u, read_reason::demanded));
  }
  s.quiesce();
  CHECK(s.stats().balanced());
}

TEST_CASE("begin_demand returns while the lanes read; end_demand waits, accounts and counts the wait") {
  SUBCASE("threaded: the host goes on while the reads are held, then blocks in end_demand") {
    gate reads;
    std::atomic<int> started{0};
    scheduler_options o;
    o.lanes = 2;
    read_scheduler s(
        [&](layer_id, expert_id e, read_reason) {
          started.fetch_add(1);
          reads.wait();
          return to_index(e) == 2 ? read_status::failed : read_status::ok;
        },
        o);
    const read_request demanded[3] = {R(1, 0), R(1, 1), R(1, 2)};
    read_outcome out[3] = {read_outcome::not_run, read_outcome::not_run, read_outcome::not_run};
    s.begin_demand(demanded, out);
    CHECK(s.demand_open());
    // Returned with every read still held in a lane or queued: the host is free.
    REQUIRE(spin_until([&] { return started.load() == 2; }));  // two lanes, two reads started
    CHECK(s.stats().demanded == 0);                            // nothing accounted before end_demand
    // Speculation queued now waits behind the demanded reads.
    REQUIRE(s.speculate(R(2, 7)));
    std::thread opener([&] {  // opens the lanes once the host blocks in end_demand
      spin_until([&] { return s.stats().demand_waits == 1; });
      reads.release();
    });
    CHECK(s.end_demand() == 2);  // blocks until the opener releases the lanes
    opener.join();
    CHECK_FALSE(s.demand_open());
    CHECK(out[0] == read_outcome::ok);
    CHECK(out[1] == read_outcome::ok);
    CHECK(out[2] == read_outcome::failed);
    const scheduler_stats st = s.stats();
    CHECK(st.demanded == 3);
    CHECK(st.demanded_failed == 1);
    CHECK(st.demand_loads == 1);
    CHECK(st.demand_waits == 1);  // the reads were not done when end_demand came
    CHECK(st.demand_open_ns >= st.demand_ns);
    CHECK(s.end_demand() == 0);  // none open: nothing to wait for
    s.quiesce();
  }
  SUBCASE("threaded: reads done before end_demand are not a wait") {
    scheduler_options o;
    o.lanes = 2;
    std::atomic<int> done{0};
    read_scheduler s(
        [&](layer_id, expert_id, read_reason) {
          done.fetch_add(1);
          return read_status::ok;
        },
        o);
    const read_request demanded[2] = {R(1, 0), R(1, 1)};
    read_outcome out[2];
    s.begin_demand(demanded, out);
    REQUIRE(spin_until([&] { return done.load() == 2 && s.stats().demanded_queued == 0; }));
    // The lanes returned; the last may still be publishing its outcome, so
    // the wait is at most a handful of instructions: counted 0 or 1 times,
    // never more for one load, and a second load is accounted on its own.
    CHECK(s.end_demand() == 2);
    CHECK(s.stats().demand_waits <= 1);
    s.begin_demand(demanded, out);
    s.begin_demand(demanded, out);  // a second begin ends the open load first
    CHECK(s.end_demand() == 2);
    CHECK(s.stats().demand_loads == 3);
    CHECK(s.stats().demanded == 6);
  }
  SUBCASE("synchronous: begin_demand runs the reads, their time is the wait") {
    scheduler_options o;
    o.lanes = 0;
    int calls = 0;
    read_scheduler s(
        [&](layer_id, expert_id, read_reason) {
          ++calls;
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
          return read_status::ok;
        },
        o);
    const read_request demanded[2] = {R(1, 0), R(1, 1)};
    read_outcome out[2];
    s.begin_demand(demanded, out);
    CHECK(calls == 2);
    CHECK(s.end_demand() == 2);
    CHECK(s.stats().demand_ns > 0);  // the inline reads are stall, as with demand()
    CHECK(s.stats().demand_waits == 0);
  }
}

TEST_CASE("quiesce in wait mode waits for the read in flight and hands it back") {
  gate g;
  std::atomic<bool> entered{false};
  scheduler_options o;
  o.lanes = 2;
  read_scheduler s(
      [&](layer_id, expert_id, read_reason) {
        entered.store(true);
        g.wait();
        return read_status::ok;
      },
      o);
  REQUIRE(s.speculate(R(3, 9)));
  spin_until([&] { return entered.load(); });
  std::thread opener([&] {
    spin_until([&] { return s.stats().quiesces == 1; });  // the host is inside quiesce
    g.release();
  });
  const span<const completed_read> done = s.quiesce();
  opener.join();
  REQUIRE(done.size() == 1);
  CHECK(done[0].request.layer == L(3));
  CHECK(done[0].outcome == read_outcome::ok);
  const scheduler_stats st = s.stats();
  CHECK(st.disowned == 0);
  CHECK(st.completed == 1);
  CHECK(st.balanced());
}

TEST_CASE("quiesce disowns reads in flight: in disown mode, or past the wait limit") {
  for (int variant = 0; variant < 2; ++variant) {
    CAPTURE(variant);
    gate g;
    std::atomic<int> entered{0};
    scheduler_options o;
    o.lanes = 2;
    o.queue_capacity = 3;
    if (variant == 0) {
      o.mode = quiesce_mode::disown;
    } else {
      o.mode = quiesce_mode::wait;
      o.wait_limit = std::chrono::microseconds(200);  // the gate stays shut past it
    }
    read_scheduler s(
        [&](layer_id, expert_id, read_reason r) {
          if (r == read_reason::speculative) {
            entered.fetch_add(1);
            g.wait();
          }
          return read_status::ok;
        },
        o);
    REQUIRE(s.speculate(R(1, 1)));
    REQUIRE(s.speculate(R(1, 2)));
    spin_until([&] { return entered.load() == 2; });
    REQUIRE(s.speculate(R(1, 3)));      // queued behind them: cancelled
    CHECK_FALSE(s.speculate(R(1, 4)));  // the bound: 2 in flight + 1 queued
    CHECK(s.quiesce().empty());
    scheduler_stats st = s.stats();
    CHECK(st.disowned == 2);
    CHECK(st.cancelled == 1);
    CHECK(st.in_flight == 2);
    CHECK(st.balanced());
    // Disowned reads no longer count against the queue bound.
    CHECK(s.speculate(R(2, 1)));
    g.release();
    st = s.shutdown();
    CHECK(st.in_flight == 0);
    CHECK(st.discarded == 2);  // they completed ok, and were dropped
    CHECK(st.balanced());
    // Never handed back: the host's demanded load may have read the same experts.
    for (const completed_read& c : s.quiesce()) CHECK(c.request.layer != L(1));
  }
}

TEST_CASE("shutdown and destruction with a stuck-but-finite callback") {
  SUBCASE("destructor with reads in flight and queued") {
    std::atomic<int> calls{0};
    {
      scheduler_options o;
      o.lanes = 2;
      read_scheduler s(
          [&](layer_id, expert_id, read_reason) {
            calls.fetch_add(1);
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            return read_status::ok;
          },
          o);
      for (unsigned e = 0; e < 8; ++e) s.speculate(R(0, e));
      spin_until([&] { return calls.load() >= 1; });
    }  // joins: returns once the calls in progress return
    CHECK(calls.load() >= 1);
    CHECK(calls.load() <= 8);
  }
  SUBCASE("destructor with a disowned read still running") {
    gate g;
    std::atomic<bool> entered{false};
    std::thread opener;
    {
      scheduler_options o;
      o.lanes = 1;
      o.mode = quiesce_mode::disown;
      read_scheduler s(
          [&](layer_id, expert_id, read_reason) {
            entered.store(true);
            g.wait();
            return read_status::failed;
          },
          o);
      s.speculate(R(0, 0));
      spin_until([&] { return entered.load(); });
      s.quiesce();
      opener = std::thread([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        g.release();
      });
    }
    opener.join();
    CHECK(entered.load());
  }
  SUBCASE("after shutdown: speculation rejected, demanded reads not run") {
    for (std::size_t lanes : {0u, 2u}) {
      scheduler_options o;
      o.lanes = lanes;
      read_scheduler s(ok_read, o);
      s.speculate(R(0, 0));
      const scheduler_stats st = s.shutdown();
      CHECK(st.balanced());
      CHECK(st.in_flight == 0);
      CHECK_FALSE(s.speculate(R(0, 1)));
      read_outcome out[1];
      const read_request d[1] = {R(0, 2)};
      CHECK(s.demand(d, out) == 0);
      CHECK(out[0] == read_outcome::not_run);
      CHECK(s.shutdown().demanded_failed == 1);  // idempotent
    }
  }
}

TEST_CASE("speculate, quiesce, pump and demand allocate nothing") {
  for (std::size_t lanes : {0u, 2u}) {
    CAPTURE(lanes);
    scheduler_options o;
    o.lanes = lanes;
    o.queue_capacity = 8;
    read_scheduler s(ok_read, o);
    const read_request demanded[3] = {R(9, 1), R(9, 2), R(9, 3)};
    read_outcome out[3];
    const long before = g_allocations.load();
    std::size_t delivered = 0;
    for (unsigned layer = 0; layer < 200; ++layer) {
      delivered += s.quiesce().size();
      s.demand(demanded, out);
      s.speculate(R(layer, 1));
      s.speculate(R(layer, 2));
      s.pump();
    }
    const long after = g_allocations.load();
    CHECK(after - before == 0);
    CHECK(s.stats().demanded == 600);
    if (lanes == 0) CHECK(delivered == 398);
  }
}

// ---- stress ------------------------------------------------------------------

namespace {

enum : int { not_called = 0, rec_ok = 1, rec_failed = 2, rec_timed_out = 3, rec_threw = 4 };

struct stress_config {
  std::size_t lanes;
  quiesce_mode mode;
  std::chrono::nanoseconds wait_limit;
  unsigned seed;
};

void run_stress(const stress_config& cfg, unsigned layers) {
  constexpr unsigned max_spec = 8 * 3000;  // up to 7 speculative reads per layer
  // Speculative read i is (layer i / 1000, expert i % 1000); demanded reads use
  // layers from 60000 on. The callback records what it returned per read.
  std::vector<std::atomic<int>> spec_record(max_spec);
  for (auto& r : spec_record) r.store(not_called);
  std::atomic<unsigned> demanded_calls{0}, spec_calls{0}, wrong_reason{0};
  // While `hold` is set, speculative calls block on `hold_gate` (counted in `held`).
  std::atomic<bool> hold{false};
  std::atomic<unsigned> held{0};
  gate hold_gate;

  auto outcome_of = [](unsigned h) {
    const unsigned x = h % 100;
    if (x < 6) return rec_failed;
    if (x < 9) return rec_threw;
    if (x < 11) return rec_timed_out;
    return rec_ok;
  };
  read_callback cb = [&](layer_id l, expert_id e, read_reason why) -> read_status {
    const unsigned k = key(l, e);
    const bool is_demanded = to_index(l) >= 60000;
    if (is_demanded != (why == read_reason::demanded)) wrong_reason.fetch_add(1);
    if (!is_demanded && hold.load()) {
      held.fetch_add(1);
      hold_gate.wait();
    }
    // Latency: mostly a yield, sometimes a short sleep; decided by the key so
    // that the callback needs no shared random state.
    const unsigned h = k * 2654435761u;
    if (h % 7 == 0) std::this_thread::sleep_for(std::chrono::microseconds((h >> 8) % 60));
    else std::this_thread::yield();
    const int rec = outcome_of(h >> 12);
    if (is_demanded) {
      demanded_calls.fetch_add(1);
    } else {
      spec_calls.fetch_add(1);
      int expected = not_called;
      if (!spec_record[k].compare_exchange_strong(expected, rec)) wrong_reason.fetch_add(1000);
    }
    switch (rec) {
      case rec_failed: return read_status::failed;
      case rec_timed_out: return read_status::timed_out;
      case rec_threw: throw std::runtime_error("injected");
      default: return read_status::ok;
    }
  };

  scheduler_options o;
  o.lanes = cfg.lanes;
  o.mode = cfg.mode;
  o.wait_limit = cfg.wait_limit;
  o.queue_capacity = 6;
  std::mt19937 rng(cfg.seed);
  std::set<unsigned> resident;     // the host's residency: only ok completions, host thread only
  std::set<unsigned> handed_back;  // every completion handed back, once
  unsigned next_spec = 0;
  std::uint64_t delivered = 0;
  std::uint64_t bad_completion = 0, handed_twice = 0, unbalanced_snapshots = 0;
  std::uint64_t demanded_ok = 0, demanded_mismatch = 0;

  read_scheduler s(cb, o);
  // Destroyed before `s`: whatever fails below, held lanes are let go before
  // the scheduler joins them.
  struct release_on_exit {
    std::atomic<bool>& hold;
    gate& g;
    ~release_on_exit() {
      hold.store(false);
      g.release();
    }
  } release_guard{hold, hold_gate};
  auto integrate = [&](span<const completed_read> done) {
    for (const completed_read& c : done) {
      const unsigned k = key(c.request.layer, c.request.expert);
      ++delivered;
      if (!handed_back.insert(k).second) ++handed_twice;
      const int rec = spec_record[k].load();
      const int want = c.outcome == read_outcome::ok          ? rec_ok
                       : c.outcome == read_outcome::failed    ? rec_failed
                       : c.outcome == read_outcome::timed_out ? rec_timed_out
                       : c.outcome == read_outcome::threw     ? rec_threw
                                                              : -1;
      if (rec != want) ++bad_completion;
      if (c.outcome == read_outcome::ok) resident.insert(k);
    }
  };

  std::vector<read_request> demanded;
  std::vector<read_outcome> outcomes(8);
  for (unsigned layer = 0; layer < layers; ++layer) {
    // Start of the demanded load: quiesce, integrate, then the demanded reads.
    integrate(s.quiesce());
    demanded.clear();
    const unsigned nd = rng() % 5;  // 0..4 demanded reads
    for (unsigned i = 0; i < nd; ++i) demanded.push_back(R(60000 + layer % 5000, layer / 5000 * 10 + i, 1000));
    const unsigned before = demanded_calls.load();
    demanded_ok += s.demand({demanded.data(), demanded.size()}, {outcomes.data(), outcomes.size()});
    if (demanded_calls.load() - before != nd) ++demanded_mismatch;
    // After the demanded load: hand the next layer's speculative reads over.
    const unsigned ns = rng() % 8;  // sometimes beyond the queue bound
    for (unsigned i = 0; i < ns && next_spec < max_spec; ++i) {
      const unsigned k = next_spec++;
      s.speculate(R(k / 1000, k % 1000, 100));
    }
    if (cfg.lanes == 0 && rng() % 2) s.pump(rng() % 4);
    // The layer's compute, during which lanes read: random, sometimes none.
    if (const unsigned c = rng() % 4; c == 1) std::this_thread::yield();
    else if (c >= 2) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 40));
    // Extra quiesces at random points, and snapshots that must always balance.
    if (rng() % 5 == 0) integrate(s.quiesce());
    if (rng() % 3 == 0 && !s.stats().balanced()) ++unbalanced_snapshots;
    if (rng() % 17 == 0) std::this_thread::yield();
  }
  integrate(s.quiesce());
  // What the random phase did depends on how the lanes were scheduled (a
  // loaded machine may cancel nothing, or everything): reported, not asserted.
  const scheduler_stats random_phase = s.stats();
  CHECK(random_phase.balanced());
  CHECK(random_phase.queued == 0);

  // Deterministic phase 1 (lanes): every lane blocked in the callback while
  // speculative reads are queued, then a quiesce — which must cancel exactly
  // the queued ones, whatever the scheduling.
  std::uint64_t forced_cancelled = 0;
  if (cfg.lanes > 0) {
    REQUIRE(next_spec + o.queue_capacity < max_spec);
    // Disowned reads finished: every lane idle.
    REQUIRE(spin_until([&] { return s.stats().in_flight == 0; }));
    hold.store(true);
    const scheduler_stats before = s.stats();
    for (std::size_t i = 0; i < cfg.lanes; ++i) {
      const unsigned k = next_spec++;
      REQUIRE(s.speculate(R(k / 1000, k % 1000, 100)));
    }
    REQUIRE(spin_until([&] { return held.load() == cfg.lanes; }));  // each lane took one, blocked
    const std::size_t extra = o.queue_capacity - cfg.lanes;         // fill the bound: all stay queued
    REQUIRE(extra > 0);
    for (std::size_t i = 0; i < extra; ++i) {
      const unsigned k = next_spec++;
      REQUIRE(s.speculate(R(k / 1000, k % 1000, 100)));
    }
    {
      const unsigned k = next_spec++;
      CHECK_FALSE(s.speculate(R(k / 1000, k % 1000, 100)));  // beyond the bound
    }
    CHECK(s.stats().queued == extra);
    CHECK(s.stats().in_flight == cfg.lanes);
    std::thread opener([&] {
      spin_until([&] { return s.stats().quiesces > before.quiesces; });  // the host is in quiesce
      hold_gate.release();
    });
    integrate(s.quiesce());
    opener.join();
    hold.store(false);
    const scheduler_stats after = s.stats();
    forced_cancelled = after.cancelled - before.cancelled;
    CHECK(forced_cancelled == extra);
    CHECK(after.issued - before.issued == cfg.lanes + extra);
    CHECK(after.balanced());
  }

  // Deterministic phase 2 (every mode): reads that are all run before the
  // quiesce, until an ok, a failure and a throw have each been handed back.
  for (int round = 0; round < 200; ++round) {
    const scheduler_stats now = s.stats();
    if (now.completed > random_phase.completed && now.failed > random_phase.failed && now.threw > random_phase.threw)
      break;
    REQUIRE(next_spec + 4 < max_spec);
    for (int i = 0; i < 4; ++i) {
      const unsigned k = next_spec++;
      REQUIRE(s.speculate(R(k / 1000, k % 1000, 100)));
    }
    if (cfg.lanes == 0) CHECK(s.pump() == 4);
    else
      REQUIRE(spin_until([&] {
        const auto x = s.stats();
        return x.queued == 0 && x.in_flight == 0;
      }));
    integrate(s.quiesce());
  }

  const scheduler_stats mid = s.stats();
  const scheduler_stats st = s.shutdown();  // waits for disowned reads too

  CHECK(wrong_reason.load() == 0);
  CHECK(bad_completion == 0);
  CHECK(handed_twice == 0);
  CHECK(unbalanced_snapshots == 0);
  CHECK(demanded_mismatch == 0);
  CHECK(mid.balanced());
  CHECK(mid.queued == 0);
  CHECK(st.balanced());
  CHECK(st.in_flight == 0);
  CHECK(st.issued == st.completed + st.cancelled + st.failed);
  CHECK(st.completed + st.failed == spec_calls.load());
  CHECK(st.delivered == delivered);
  CHECK(st.issued + st.rejected == next_spec);
  CHECK(st.failed == st.timed_out + st.threw +
                         static_cast<std::uint64_t>(
                             std::count_if(spec_record.begin(), spec_record.end(),
                                           [](const std::atomic<int>& r) { return r.load() == rec_failed; })));
  // Every call was either handed back, or disowned (and then never handed back).
  if (cfg.mode == quiesce_mode::wait && cfg.wait_limit.count() == 0) CHECK(st.disowned == 0);
  CHECK(delivered + st.disowned == spec_calls.load());
  // Residency holds only reads the callback really completed.
  for (unsigned k : resident) CHECK(spec_record[k].load() == rec_ok);
  CHECK(st.demanded == demanded_calls.load());
  CHECK(st.demanded - st.demanded_failed == demanded_ok);
  // The run exercised what it claims to — asserted on the deterministic
  // phases only (the random phase's rejections are decided by the seed: a
  // layer issuing 7 reads against a bound of 6, whatever the lanes did).
  CHECK(st.completed > random_phase.completed);
  CHECK(st.failed > random_phase.failed);
  CHECK(st.threw > random_phase.threw);
  CHECK(random_phase.rejected > 0);
  if (cfg.lanes > 0) CHECK(st.cancelled >= forced_cancelled);
  if (cfg.lanes > 0) CHECK(forced_cancelled > 0);
  MESSAGE("lanes " << cfg.lanes << " mode " << std::string(cfg.mode == quiesce_mode::wait ? "wait" : "disown")
                   << " limit " << cfg.wait_limit.count() << "ns, random phase: issued " << random_phase.issued
                   << " completed " << random_phase.completed << " cancelled " << random_phase.cancelled << " failed "
                   << random_phase.failed << " disowned " << random_phase.disowned << " rejected "
                   << random_phase.rejected << "; forced cancellations " << forced_cancelled);
}

}  // namespace

TEST_CASE("stress: thousands of layers, random latency, failures, throws, random quiesce") {
  const unsigned layers = 3000;
  const stress_config configs[] = {
      {1, quiesce_mode::wait, std::chrono::nanoseconds(0), 11},
      {2, quiesce_mode::wait, std::chrono::nanoseconds(0), 12},
      {4, quiesce_mode::wait, std::chrono::nanoseconds(0), 13},
      {2, quiesce_mode::disown, std::chrono::nanoseconds(0), 14},
      {3, quiesce_mode::disown, std::chrono::nanoseconds(0), 15},
      {2, quiesce_mode::wait, std::chrono::microseconds(20), 16},
      {0, quiesce_mode::wait, std::chrono::nanoseconds(0), 17},
  };
  for (const stress_config& c : configs) {
    CAPTURE(c.lanes);
    CAPTURE(c.seed);
    run_stress(c, layers);
  }
}
