#pragma once
/// What the lab's tools (moe-llama-probe, moe-disk-lanes) read of their own
/// process on Linux: the calling thread's CPU clock and the bytes the process
/// has read from storage. Examples only; not part of the library.

#include <time.h>

#include <cstdint>
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

}  // namespace moe_residency::llama_cpp::examples
