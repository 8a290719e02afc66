// What it costs the CPU to make an expert's bytes visible at the address the
// engine reads them from, per MiB, on the residency manager's two paths,
// against touching the same bytes already mapped (measured in the same
// process, before each benchmark's loop: counters `x_touch`, the wall time's
// ratio, and `extra_cpu_us_per_MiB`, the thread's user + system time above the
// touch's). No device reads are timed: the bytes are in memory throughout, so
// what is left is the mapping itself, the part an unmodified llama.cpp cannot
// avoid paying for every MiB a token brings in (docs/llama-cpp-residency.md,
// "What bounds a token here").
//
//   cmake --preset benchmarks && cmake --build --preset benchmarks --target bench_mapping
//   build/benchmarks/benchmarks/bench_mapping
//
// The model file is a stand-in: 256 MiB written once under
// ${MOE_RESIDENCY_CACHE:-~/.cache/moe-residency}/bench/, mapped read-only and
// shared as llama.cpp maps a GGUF, cut into ranges of 864 KiB (one q4_K
// expert slice of Qwen3-30B-A3B: 768 x 2048 weights at 144 bytes per 256).
//
// - BM_touch_mapped: the reference alone (pages cached and mapped).
// - BM_pool_map_touch_restore: the expert pool's path without its read:
//   pool memory (a memfd holding the file's bytes) mapped over each range
//   with MAP_FIXED | MAP_POPULATE, as system_memory_advice::place maps it,
//   touched, then the file mapped back, as its restore does.
// - BM_pagecache_unmap_touch: the page-cache path without its read: the
//   range's page-table entries dropped (MADV_DONTNEED; the pages stay cached,
//   as after the manager's own read, which maps nothing), then touched, so
//   the faults map the cached pages.
// - BM_pool_phases: that path's phases timed apart (below).
// - BM_pool_lane_maps_engine_touches: who pays (below).
// Arg `sibling`: 1 runs a second thread in the process reading its own
// resident buffer the whole time, as llama.cpp's other compute thread does,
// so that every mapping change must also flush that core's TLB.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

namespace {

#if defined(__linux__)

constexpr std::size_t file_bytes = std::size_t{256} << 20;
constexpr std::size_t range_bytes = 864 << 10;
constexpr std::size_t ranges = file_bytes / range_bytes;
constexpr double mib_per_pass = static_cast<double>(ranges * range_bytes) / (1 << 20);
using clock_type = std::chrono::steady_clock;

// Reads every byte of [p, p + n), 8 at a time, as a matmul streams its weights.
std::uint64_t touch(const unsigned char* p, std::size_t n) noexcept {
  const auto* w = reinterpret_cast<const std::uint64_t*>(p);
  std::uint64_t a = 0, b = 0, c = 0, d = 0;
  for (std::size_t i = 0; i + 4 <= n / 8; i += 4) {
    a += w[i];
    b += w[i + 1];
    c += w[i + 2];
    d += w[i + 3];
  }
  return (a + b) + (c + d);
}

// This thread's user and system time, in microseconds.
struct thread_times {
  double user_us = 0, sys_us = 0;
  static thread_times now() {
    rusage r{};
    ::getrusage(RUSAGE_THREAD, &r);
    return {static_cast<double>(r.ru_utime.tv_sec) * 1e6 + static_cast<double>(r.ru_utime.tv_usec),
            static_cast<double>(r.ru_stime.tv_sec) * 1e6 + static_cast<double>(r.ru_stime.tv_usec)};
  }
};

// The stand-in model file, mapped as llama.cpp maps a GGUF, and a memfd pool
// holding the same bytes at the same offsets.
struct fixture {
  std::string error;
  int fd = -1, pool_fd = -1;
  unsigned char* map = nullptr;
  unsigned char* pool = nullptr;

  fixture() {
    const char* cache = std::getenv("MOE_RESIDENCY_CACHE");
    const char* home = std::getenv("HOME");
    const std::string dir = cache ? std::string(cache) : std::string(home ? home : "/tmp") + "/.cache/moe-residency";
    const std::string bench_dir = dir + "/bench";
    ::mkdir(dir.c_str(), 0755);
    ::mkdir(bench_dir.c_str(), 0755);
    const std::string path = bench_dir + "/mapping-256MiB.bin";
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || static_cast<std::size_t>(st.st_size) != file_bytes) {
      const std::string tmp = path + ".part";
      const int w = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (w < 0) {
        error = "cannot create " + tmp;
        return;
      }
      std::vector<std::uint64_t> chunk((1 << 20) / 8);
      std::uint64_t x = 0x9e3779b97f4a7c15ull;
      bool ok = true;
      for (std::size_t done = 0; ok && done < file_bytes; done += 1 << 20) {
        for (auto& v : chunk) v = (x = x * 6364136223846793005ull + 1442695040888963407ull);
        ok = ::write(w, chunk.data(), 1 << 20) == (1 << 20);
      }
      ok = ::close(w) == 0 && ok && ::rename(tmp.c_str(), path.c_str()) == 0;
      if (!ok) {
        error = "cannot write " + path;
        return;
      }
    }
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    pool_fd = ::memfd_create("moe-residency-bench-pool", MFD_CLOEXEC);
    if (fd < 0 || pool_fd < 0 || ::ftruncate(pool_fd, static_cast<off_t>(file_bytes)) != 0) {
      error = "cannot open " + path + " or make the pool";
      return;
    }
    void* m = ::mmap(nullptr, file_bytes, PROT_READ, MAP_SHARED, fd, 0);
    void* p = ::mmap(nullptr, file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, pool_fd, 0);
    if (m == MAP_FAILED || p == MAP_FAILED) {
      error = "cannot map " + path + " or the pool";
      return;
    }
    map = static_cast<unsigned char*>(m);
    pool = static_cast<unsigned char*>(p);
    if (::pread(fd, pool, file_bytes, 0) != static_cast<ssize_t>(file_bytes)) error = "cannot read " + path;
    benchmark::DoNotOptimize(touch(map, file_bytes));  // cached and mapped
  }
  ~fixture() {
    if (map) ::munmap(map, file_bytes);
    if (pool) ::munmap(pool, file_bytes);
    if (fd >= 0) ::close(fd);
    if (pool_fd >= 0) ::close(pool_fd);
  }
};

// The fixture, or null with the benchmark skipped, saying why.
const fixture* ready(benchmark::State& state) {
  static const fixture f;
  if (f.error.empty()) return &f;
  state.SkipWithError(f.error.c_str());
  return nullptr;
}

// A second thread reading its own resident 64 MiB, until stopped.
class sibling {
 public:
  explicit sibling(bool on) {
    if (!on) return;
    buf_.assign((std::size_t{64} << 20) / 8, 1);
    t_ = std::thread([this] {
      while (!stop_.load(std::memory_order_relaxed))
        benchmark::DoNotOptimize(touch(reinterpret_cast<const unsigned char*>(buf_.data()), buf_.size() * 8));
    });
  }
  ~sibling() {
    stop_.store(true);
    if (t_.joinable()) t_.join();
  }

 private:
  std::vector<std::uint64_t> buf_;
  std::atomic<bool> stop_{false};
  std::thread t_;
};

// Per MiB of one pass over every range: wall µs, and this thread's user and system µs.
struct per_mib {
  double wall_us = 0, user_us = 0, sys_us = 0;
};

template <class Pass>
per_mib time_passes(int passes, Pass pass) {
  const thread_times t0 = thread_times::now();
  const auto w0 = clock_type::now();
  for (int i = 0; i < passes; ++i) pass();
  const double wall = std::chrono::duration<double, std::micro>(clock_type::now() - w0).count();
  const thread_times t1 = thread_times::now();
  const double mib = mib_per_pass * passes;
  return {wall / mib, (t1.user_us - t0.user_us) / mib, (t1.sys_us - t0.sys_us) / mib};
}

void touch_pass(const fixture& f) {
  for (std::size_t r = 0; r < ranges; ++r) benchmark::DoNotOptimize(touch(f.map + r * range_bytes, range_bytes));
}

// The reference, in the same process and with the same sibling: the touch of
// cached, mapped bytes, the median of 5 timings of 4 passes each.
per_mib reference(const fixture& f) {
  std::vector<per_mib> runs;
  for (int i = 0; i < 5; ++i) runs.push_back(time_passes(4, [&] { touch_pass(f); }));
  std::sort(runs.begin(), runs.end(), [](const per_mib& a, const per_mib& b) { return a.wall_us < b.wall_us; });
  return runs[2];
}

// Runs `pass` as the benchmark's loop and reports it per MiB against the reference.
template <class Pass>
void run(benchmark::State& state, Pass pass) {
  const fixture* fp = ready(state);
  if (fp == nullptr) return;
  const fixture& f = *fp;
  const sibling s(state.range(0) != 0);
  const per_mib ref = reference(f);
  per_mib sum;
  std::int64_t passes = 0;
  for (auto _ : state) {
    const per_mib one = time_passes(1, [&] { pass(f); });
    sum.wall_us += one.wall_us;
    sum.user_us += one.user_us;
    sum.sys_us += one.sys_us;
    ++passes;
  }
  if (passes == 0) return;
  const double n = static_cast<double>(passes);
  state.SetBytesProcessed(passes * static_cast<std::int64_t>(ranges * range_bytes));
  state.counters["wall_us_per_MiB"] = sum.wall_us / n;
  state.counters["user_us_per_MiB"] = sum.user_us / n;
  state.counters["sys_us_per_MiB"] = sum.sys_us / n;
  state.counters["touch_wall_us_per_MiB"] = ref.wall_us;
  state.counters["x_touch"] = sum.wall_us / n / ref.wall_us;
  state.counters["extra_cpu_us_per_MiB"] = (sum.user_us + sum.sys_us) / n - (ref.user_us + ref.sys_us);
}

void BM_touch_mapped(benchmark::State& state) {
  run(state, [](const fixture& f) { touch_pass(f); });
}

void BM_pool_map_touch_restore(benchmark::State& state) {
  run(state, [&state](const fixture& f) {
    for (std::size_t r = 0; r < ranges; ++r) {
      unsigned char* addr = f.map + r * range_bytes;
      const auto off = static_cast<off_t>(r * range_bytes);
      if (::mmap(addr, range_bytes, PROT_READ, MAP_SHARED | MAP_FIXED | MAP_POPULATE, f.pool_fd, off) == MAP_FAILED) {
        state.SkipWithError("mmap of the pool over the file's range failed");
        return;
      }
      benchmark::DoNotOptimize(touch(addr, range_bytes));
      if (::mmap(addr, range_bytes, PROT_READ, MAP_SHARED | MAP_FIXED, f.fd, off) == MAP_FAILED) {
        state.SkipWithError("mmap of the file back over its range failed");
        return;
      }
    }
  });
}

void BM_pagecache_unmap_touch(benchmark::State& state) {
  run(state, [&state](const fixture& f) {
    for (std::size_t r = 0; r < ranges; ++r) {
      unsigned char* addr = f.map + r * range_bytes;
      if (::madvise(addr, range_bytes, MADV_DONTNEED) != 0) {
        state.SkipWithError("madvise(MADV_DONTNEED) failed");
        return;
      }
      benchmark::DoNotOptimize(touch(addr, range_bytes));
    }
  });
}

// The pool's path in its phases, each timed alone per MiB: the pool mapped
// over the range (with MAP_POPULATE when `populate`), the first touch, a
// second touch, the file mapped back.
void BM_pool_phases(benchmark::State& state) {
  const fixture* fp = ready(state);
  if (fp == nullptr) return;
  const fixture& f = *fp;
  const int flags = MAP_SHARED | MAP_FIXED | (state.range(0) != 0 ? MAP_POPULATE : 0);
  const per_mib ref = reference(f);
  double us[4] = {0, 0, 0, 0};  // map, first touch, second touch, restore
  std::int64_t passes = 0;
  for (auto _ : state) {
    for (std::size_t r = 0; r < ranges; ++r) {
      unsigned char* addr = f.map + r * range_bytes;
      const auto off = static_cast<off_t>(r * range_bytes);
      const auto t0 = clock_type::now();
      const bool mapped = ::mmap(addr, range_bytes, PROT_READ, flags, f.pool_fd, off) != MAP_FAILED;
      const auto t1 = clock_type::now();
      benchmark::DoNotOptimize(touch(addr, range_bytes));
      const auto t2 = clock_type::now();
      benchmark::DoNotOptimize(touch(addr, range_bytes));
      const auto t3 = clock_type::now();
      const bool restored = ::mmap(addr, range_bytes, PROT_READ, MAP_SHARED | MAP_FIXED, f.fd, off) != MAP_FAILED;
      const auto t4 = clock_type::now();
      if (!mapped || !restored) {
        state.SkipWithError("mmap of the pool or the file over a range failed");
        return;
      }
      const clock_type::time_point t[5] = {t0, t1, t2, t3, t4};
      for (int i = 0; i < 4; ++i) us[i] += std::chrono::duration<double, std::micro>(t[i + 1] - t[i]).count();
    }
    ++passes;
  }
  if (passes == 0) return;
  const double mib = mib_per_pass * static_cast<double>(passes);
  state.SetBytesProcessed(passes * static_cast<std::int64_t>(ranges * range_bytes));
  state.counters["map_us_per_MiB"] = us[0] / mib;
  state.counters["first_touch_us_per_MiB"] = us[1] / mib;
  state.counters["second_touch_us_per_MiB"] = us[2] / mib;
  state.counters["restore_us_per_MiB"] = us[3] / mib;
  state.counters["touch_wall_us_per_MiB"] = ref.wall_us;
}

// Who pays: a second thread (a read lane) maps the pool over every range, and
// with `pretouch` reads one byte of each page; then this thread (the engine)
// touches every byte, and the file is mapped back. Reports each side per MiB:
// the first access's cost falls on whichever thread touches a page first.
void BM_pool_lane_maps_engine_touches(benchmark::State& state) {
  const fixture* fp = ready(state);
  if (fp == nullptr) return;
  const fixture& f = *fp;
  const bool pretouch = state.range(0) != 0;
  const per_mib ref = reference(f);
  double lane_us = 0, engine_us = 0;
  std::int64_t passes = 0;
  bool failed = false;
  for (auto _ : state) {
    const auto t0 = clock_type::now();
    std::thread lane([&f, pretouch, &failed] {
      for (std::size_t r = 0; r < ranges; ++r) {
        unsigned char* addr = f.map + r * range_bytes;
        if (::mmap(addr, range_bytes, PROT_READ, MAP_SHARED | MAP_FIXED | MAP_POPULATE, f.pool_fd,
                   static_cast<off_t>(r * range_bytes)) == MAP_FAILED)
          failed = true;
        if (!pretouch) continue;
        std::uint64_t sum = 0;
        for (std::size_t i = 0; i < range_bytes; i += 4096) sum += addr[i];
        benchmark::DoNotOptimize(sum);
      }
    });
    lane.join();
    const auto t1 = clock_type::now();
    touch_pass(f);
    const auto t2 = clock_type::now();
    for (std::size_t r = 0; r < ranges; ++r)
      failed = ::mmap(f.map + r * range_bytes, range_bytes, PROT_READ, MAP_SHARED | MAP_FIXED, f.fd,
                      static_cast<off_t>(r * range_bytes)) == MAP_FAILED ||
               failed;
    if (failed) {
      state.SkipWithError("mmap of the pool or the file over a range failed");
      return;
    }
    lane_us += std::chrono::duration<double, std::micro>(t1 - t0).count();
    engine_us += std::chrono::duration<double, std::micro>(t2 - t1).count();
    ++passes;
  }
  if (passes == 0) return;
  const double mib = mib_per_pass * static_cast<double>(passes);
  state.SetBytesProcessed(passes * static_cast<std::int64_t>(ranges * range_bytes));
  state.counters["lane_wall_us_per_MiB"] = lane_us / mib;
  state.counters["engine_touch_us_per_MiB"] = engine_us / mib;
  state.counters["touch_wall_us_per_MiB"] = ref.wall_us;
  state.counters["engine_x_touch"] = engine_us / mib / ref.wall_us;
}

void args(benchmark::internal::Benchmark* b) {
  b->ArgName("sibling")->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
}

BENCHMARK(BM_touch_mapped)->Apply(args);
BENCHMARK(BM_pool_map_touch_restore)->Apply(args);
BENCHMARK(BM_pagecache_unmap_touch)->Apply(args);
BENCHMARK(BM_pool_phases)
    ->ArgName("populate")
    ->Arg(0)
    ->Arg(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.5);
BENCHMARK(BM_pool_lane_maps_engine_touches)
    ->ArgName("pretouch")
    ->Arg(0)
    ->Arg(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(0.5);

#else

void BM_mapping_linux_only(benchmark::State& state) { state.SkipWithError("the mapping paths are Linux's"); }
BENCHMARK(BM_mapping_linux_only);

#endif

}  // namespace
