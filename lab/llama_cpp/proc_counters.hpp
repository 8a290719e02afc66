#pragma once
/// What the lab's tools (moe-lab-run, moe-disk-lanes) read of their own process
/// on Linux: CPU clocks, page faults (of the process and of chosen threads), the
/// bytes read from storage (the process's and its block-I/O cgroup's) and how
/// the process's memory is mapped. The memory lab's instruments; not part of the
/// library, never installed.

#include <dirent.h>
#include <sys/resource.h>
#include <time.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace moe_residency::llama_cpp::lab {

/// CPU time of the calling thread, ms (CLOCK_THREAD_CPUTIME_ID: user + system); 0 if unavailable.
inline double thread_cpu_ms() {
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return 1e3 * static_cast<double>(ts.tv_sec) + 1e-6 * static_cast<double>(ts.tv_nsec);
}

/// Bytes this process has read from storage (/proc/self/io read_bytes); 0 if unknown.
inline std::uint64_t proc_read_bytes() {
  std::ifstream in("/proc/self/io");
  std::string key;
  std::uint64_t v = 0;
  while (in >> key >> v)
    if (key == "read_bytes:") return v;
  return 0;
}

/// How much of this process's memory is mapped by 2 MiB pages: /proc/self/smaps_rollup's
/// Rss and FilePmdMapped (a file's page cache held in 2 MiB folios, as a sequential read of
/// the whole file leaves it, is mapped by PMD entries; pages read in pieces are mapped 4 KiB
/// at a time, and the same weights then cost more to compute over: the run history docs/lab-predict.md links, "The
/// weights' page size"). Zeros if unknown.
struct mapping_kib {
  std::uint64_t rss = 0;
  std::uint64_t file_pmd_mapped = 0;
};
inline mapping_kib proc_mapping() {
  std::ifstream in("/proc/self/smaps_rollup");
  mapping_kib m;
  std::string line;
  while (std::getline(in, line)) {  // the first line names the range: "<from>-<to> ---p ... [rollup]"
    unsigned long long v = 0;
    if (std::sscanf(line.c_str(), "Rss: %llu kB", &v) == 1) m.rss = v;
    if (std::sscanf(line.c_str(), "FilePmdMapped: %llu kB", &v) == 1) m.file_pmd_mapped = v;
  }
  return m;
}

/// The threads alive now (/proc/self/task): taken after llama.cpp's first
/// decode and before the residency manager starts its read lanes, they are
/// the engine's — the eval thread and ggml's workers.
inline std::vector<std::string> current_threads() {
  std::vector<std::string> out;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') out.emplace_back(e->d_name);
    closedir(d);
  }
  return out;
}

/// Major faults of these threads (field 12 of /proc/self/task/TID/stat). The
/// process-wide count (getrusage) also holds the faults the manager's lanes
/// take on purpose — MADV_POPULATE_READ and mlock populate pages through the
/// fault path, and the kernel counts those as major faults of the thread —
/// so this is the count of faults the engine itself stalled on.
inline std::uint64_t threads_majflt(const std::vector<std::string>& tids) {
  std::uint64_t sum = 0;
  for (const auto& t : tids) {
    std::ifstream in("/proc/self/task/" + t + "/stat");
    std::string line;
    if (!std::getline(in, line)) continue;  // an exited worker
    const auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream f(line.substr(close + 2));
    std::string field;
    // fields from 3 (state) on; majflt is field 12
    for (int i = 3; i <= 12 && f >> field; ++i)
      if (i == 12) sum += std::strtoull(field.c_str(), nullptr, 10);
  }
  return sum;
}

/// The block-I/O statistics file of this process's cgroup, or "" (none readable).
inline std::string cgroup_io_file() {
  std::ifstream in("/proc/self/cgroup");
  std::string line, v1, v2;
  while (std::getline(in, line)) {
    const auto c1 = line.find(':'), c2 = line.find(':', c1 + 1);
    if (c1 == std::string::npos || c2 == std::string::npos) continue;
    const std::string ctrl = line.substr(c1 + 1, c2 - c1 - 1), path = line.substr(c2 + 1);
    if (ctrl.find("blkio") != std::string::npos) v1 = path;
    if (line.compare(0, 3, "0::") == 0) v2 = path;
  }
  for (const std::string& f : {"/sys/fs/cgroup/blkio" + v1 + "/blkio.throttle.io_service_bytes_recursive",
                               "/sys/fs/cgroup/blkio" + v1 + "/blkio.throttle.io_service_bytes",
                               "/sys/fs/cgroup" + v2 + "/io.stat", "/sys/fs/cgroup/unified" + v2 + "/io.stat"})
    if (std::ifstream(f)) return f;
  return "";
}

/// Bytes read by the cgroup whose statistics are `file` (v1 blkio "Read" lines, v2
/// io.stat rbytes=), every device summed; 0 for "".
inline std::uint64_t cgroup_read_bytes(const std::string& file) {
  if (file.empty()) return 0;
  std::ifstream in(file);
  std::string line;
  std::uint64_t sum = 0;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string dev, word;
    ls >> dev;
    if (file.compare(file.size() - 7, 7, "io.stat") == 0) {
      while (ls >> word)
        if (word.compare(0, 7, "rbytes=") == 0) sum += std::strtoull(word.c_str() + 7, nullptr, 10);
    } else {
      std::uint64_t v = 0;
      if (ls >> word >> v && word == "Read") sum += v;
    }
  }
  return sum;
}

/// The process's counters that say where a token's time went: page faults
/// (getrusage) and bytes read from storage — the process's own read_bytes
/// (/proc/self/io) and its block-I/O cgroup's bytes read (v1
/// blkio.throttle.io_service_bytes_recursive, v2 io.stat rbytes), the latter a
/// fallback where task I/O accounting reads 0; it counts every process of the
/// cgroup (in the root cgroup: the machine).
struct counters {
  std::uint64_t majflt = 0, minflt = 0, read_bytes = 0, cgroup_read_bytes = 0;
  std::uint64_t engine_majflt = 0;  ///< of the engine's threads only (see current_threads)
};

/// The counters now; `cg_file` from cgroup_io_file(), `engine` from current_threads().
inline counters sample_counters(const std::string& cg_file, const std::vector<std::string>& engine) {
  counters c;
  c.engine_majflt = threads_majflt(engine);
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  c.majflt = static_cast<std::uint64_t>(ru.ru_majflt);
  c.minflt = static_cast<std::uint64_t>(ru.ru_minflt);
  c.read_bytes = proc_read_bytes();
  c.cgroup_read_bytes = cgroup_read_bytes(cg_file);
  return c;
}

/// The calling thread's CPU time as getrusage(RUSAGE_THREAD) splits it (Linux),
/// whole microseconds: `sys` is the kernel's part (the page faults it takes,
/// reclaim in its cgroup, readahead it submits), `total` = user + sys.
/// RUSAGE_SELF: every thread of the process.
struct rusage_split {
  std::int64_t total = 0, sys = 0;
};
inline rusage_split thread_rusage(int who = RUSAGE_THREAD) {
  rusage ru{};
  if (getrusage(who, &ru) != 0) return {};
  auto us = [](const timeval& t) { return std::int64_t{t.tv_sec} * 1000000 + std::int64_t{t.tv_usec}; };
  return {us(ru.ru_utime) + us(ru.ru_stime), us(ru.ru_stime)};
}

/// The kernel's share of `cpu_ms` over one call: getrusage's own split of the
/// interval applied to the exact CPU time. The kernel keeps getrusage's user and
/// system times each monotonic and summing to its own runtime, so the share is in
/// [0, 1] (the lab run smoke test checks sys_ms <= cpu_ms on every row). Subtracting
/// getrusage's system time over the CPU clock's interval instead is not bounded by
/// it: getrusage's runtime is not the CPU clock's (on this machine kind its
/// interval ran up to ~130 us longer), and a row's sys_ms came out above cpu_ms.
inline double kernel_share_ms(const rusage_split& a, const rusage_split& b, double cpu_ms) {
  const std::int64_t total = b.total - a.total;
  if (total <= 0) return 0.0;
  // Integers, so that a share of all of it is exactly 1 and sys_ms then equals cpu_ms.
  return cpu_ms * (static_cast<double>(b.sys - a.sys) / static_cast<double>(total));
}

}  // namespace moe_residency::llama_cpp::lab

namespace moe_residency::llama_cpp {
/// The namespace's name before the lab's tools left examples/: moe-run
/// (examples/llama_cpp/run.cpp) still reads proc_read_bytes through it.
namespace examples = lab;
}  // namespace moe_residency::llama_cpp
