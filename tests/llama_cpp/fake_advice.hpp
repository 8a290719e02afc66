#pragma once
// The kernel's memory advice replaced by a fake that records every call (with
// a global sequence number shared with the tests' own events), keeps the set
// of locked and placed pages, can fail a kind of call every n-th time, and can
// make device calls slow: what the residency manager's tests run on.

#include <doctest/doctest.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "moe_residency/adapters/llama_cpp/residency/advice.hpp"

namespace moe_residency_test {

namespace mrl = moe_residency::llama_cpp;

// A global order of events: advice calls and the ask phase of expert matmuls.
inline std::uint64_t g_seq = 0;
inline std::mutex g_seq_mu;
inline std::uint64_t next_seq() {
  std::lock_guard<std::mutex> lock(g_seq_mu);
  return ++g_seq;
}

/// Records every call; keeps the set of locked pages; can fail a kind.
class fake_advice final : public mrl::memory_advice {
 public:
  struct call_record {
    mrl::advice kind;
    std::uintptr_t addr;
    std::size_t len;
    std::uint64_t seq;
    int rc;
  };
  std::size_t fail_every = 0;  // fail every n-th call of `fail_kind` (0: never)
  mrl::advice fail_kind = mrl::advice::lock;
  std::uint64_t limit = UINT64_MAX;
  bool slow_reads = false;  // populate_read, lock and read take 2 ms, as a device read would
  bool owned = false;       // attach_file succeeds: the manager may read with advice::read
  bool pool = false;        // attach_pool succeeds: the manager may place experts in it

  int attach_file(const std::string& path, const void* base, std::uint64_t size) noexcept override {
    if (!owned && !pool) return ENOSYS;
    attached_path = path;
    attached_base = base;
    attached_size = size;
    return 0;
  }
  std::string attached_path;
  const void* attached_base = nullptr;
  std::uint64_t attached_size = 0;

  int attach_pool(std::uint64_t bytes) noexcept override {
    if (!pool) return ENOSYS;
    std::lock_guard<std::mutex> lock(mu_);
    pool_bytes = bytes;
    return 0;
  }
  std::uint64_t pool_bytes = 0;

  // A placement: whole pages, inside the pool, in a part of it no placed
  // range holds, over pages nothing is placed on; the fake then says the
  // pages are placed until a restore covers them.
  int place(void* addr, std::size_t len, std::uint64_t pool_offset) noexcept override {
    if (slow_reads) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::lock_guard<std::mutex> lock(mu_);
    const auto p = reinterpret_cast<std::uintptr_t>(addr);
    int rc = 0;
    if (fail_every != 0 && fail_kind == mrl::advice::place && ++kind_calls_ % fail_every == 0) rc = EIO;
    calls_.push_back({mrl::advice::place, p, len, next_seq(), rc});
    if (rc != 0) return rc;
    bad_places +=
        p % 4096 != 0 || len % 4096 != 0 || len == 0 || pool_offset % 4096 != 0 || pool_offset + len > pool_bytes;
    for (std::uintptr_t q = p; q < p + len; q += 4096) bad_places += placed_.count(q);
    for (const auto& r : pool_used_)  // [offset, offset + len) of every placed range
      bad_places += pool_offset < r.second.first + r.second.second && r.second.first < pool_offset + len;
    for (std::uintptr_t q = p; q < p + len; q += 4096) placed_.insert(q);
    pool_used_[p] = {pool_offset, len};
    max_pool_used = std::max(max_pool_used, pool_in_use());
    return 0;
  }
  std::size_t bad_places = 0;       // placements that broke a rule above
  std::uint64_t max_pool_used = 0;  // the most pool bytes placed at once

  int apply(mrl::advice a, void* addr, std::size_t len) noexcept override {
    const bool device = a == mrl::advice::populate_read || a == mrl::advice::lock || a == mrl::advice::read;
    if (device) {
      std::lock_guard<std::mutex> lock(mu_);
      max_reading_ = std::max(max_reading_, ++reading_);
    }
    if (slow_reads && device) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::lock_guard<std::mutex> lock(mu_);
    if (device) --reading_;
    const auto p = reinterpret_cast<std::uintptr_t>(addr);
    int rc = 0;
    if (fail_every != 0 && a == fail_kind && ++kind_calls_ % fail_every == 0) rc = ENOMEM;
    if (rc == 0 && a == mrl::advice::lock)
      for (std::uintptr_t q = p; q < p + len; q += 4096) locked_.insert(q);
    if (rc == 0 && a == mrl::advice::unlock)
      for (std::uintptr_t q = p; q < p + len; q += 4096) locked_.erase(q);
    if (rc == 0 && a == mrl::advice::restore) {
      for (std::uintptr_t q = p; q < p + len; q += 4096) placed_.erase(q);
      for (auto it = pool_used_.begin(); it != pool_used_.end();)
        it = it->first >= p && it->first < p + len ? pool_used_.erase(it) : std::next(it);
    }
    calls_.push_back({a, p, len, next_seq(), rc});
    return rc;
  }
  long resident_pages(void*, std::size_t len) noexcept override { return static_cast<long>(len / 4096); }
  std::size_t page_size() const noexcept override { return 4096; }
  std::uint64_t lock_limit() const noexcept override { return limit; }

  std::vector<call_record> calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  std::size_t calls_since(std::size_t from, std::vector<call_record>& out) const {
    std::lock_guard<std::mutex> lock(mu_);
    out.assign(calls_.begin() + static_cast<std::ptrdiff_t>(std::min(from, calls_.size())), calls_.end());
    return calls_.size();
  }
  bool locked(std::uintptr_t page) const {
    std::lock_guard<std::mutex> lock(mu_);
    return locked_.count(page) != 0;
  }
  std::size_t locked_pages() const {
    std::lock_guard<std::mutex> lock(mu_);
    return locked_.size();
  }
  bool placed(std::uintptr_t page) const {
    std::lock_guard<std::mutex> lock(mu_);
    return placed_.count(page) != 0;
  }
  std::size_t placed_pages() const {
    std::lock_guard<std::mutex> lock(mu_);
    return placed_.size();
  }
  /// The most device calls (populate_read, lock, read) running at once.
  std::size_t max_reading() const {
    std::lock_guard<std::mutex> lock(mu_);
    return max_reading_;
  }

 private:
  std::size_t reading_ = 0, max_reading_ = 0;
  mutable std::mutex mu_;
  std::vector<call_record> calls_;
  std::set<std::uintptr_t> locked_, placed_;
  std::map<std::uintptr_t, std::pair<std::uint64_t, std::uint64_t>> pool_used_;  // address -> (pool offset, bytes)
  std::size_t kind_calls_ = 0;
  std::uint64_t pool_in_use() const {
    std::uint64_t n = 0;
    for (const auto& r : pool_used_) n += r.second.second;
    return n;
  }
};

}  // namespace moe_residency_test
