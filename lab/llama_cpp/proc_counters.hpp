#pragma once
/// What the lab's tools (moe-llama-probe, moe-disk-lanes) read of their own
/// process on Linux: the calling thread's CPU clock and the bytes the process
/// has read from storage. Examples only; not part of the library.

#include <time.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

namespace moe_residency::llama_cpp::examples {

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
/// at a time, and the same weights then cost more to compute over: docs/results/2026-12-03-memlab-predict-runs.md, "The
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

}  // namespace moe_residency::llama_cpp::examples
