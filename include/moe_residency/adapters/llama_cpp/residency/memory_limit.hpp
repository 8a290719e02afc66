#pragma once
/// What the mmap residency manager (residency.hpp) reads about the process
/// before it acts: the memory limit over the cgroup hierarchy (v1 and v2,
/// else MemAvailable), whether llama.cpp already locked the mapping, whether
/// the kernel lets this process inspect and page out the file's pages, and
/// llama.cpp's own anonymous memory. Linux files; elsewhere "unknown".

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "moe_residency/adapters/llama_cpp/residency/advice.hpp"

#if MOE_RESIDENCY_ADVICE_POSIX
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/sysmacros.h>  // major, minor (glibc moved them here)
#endif
#endif

namespace moe_residency::llama_cpp {

/// The memory the process may use, as the auto budget sees it.
struct memory_limit {
  std::uint64_t bytes = 0;  ///< 0: unknown
  std::string source;       ///< "cgroup v2 /sys/fs/cgroup/.../memory.max", "MemAvailable", ...
};

namespace detail {

inline std::uint64_t read_u64_file(const std::string& path, bool& ok) {
  std::ifstream f(path);
  std::string v;
  ok = static_cast<bool>(f >> v) && !v.empty() && v != "max" && v.find_first_not_of("0123456789") == std::string::npos;
  return ok ? std::stoull(v) : 0;
}

/// The tightest memory limit over the process's cgroup and its ancestors
/// (v2 `memory.max` of each level; v1 `hierarchical_memory_limit` of
/// `memory.stat`, which already includes the ancestors, else
/// `memory.limit_in_bytes`), else MemAvailable. `root` prefixes /proc and
/// /sys (tests point it at a fake tree).
inline memory_limit process_memory_limit(const std::string& root = "") {
  memory_limit out;
  auto consider = [&](std::uint64_t v, const std::string& source) {
    if (v < (std::uint64_t{1} << 60) && (out.bytes == 0 || v < out.bytes)) {
      out.bytes = v;
      out.source = source;
    }
  };
  std::ifstream cg(root + "/proc/self/cgroup");
  std::string line;
  while (std::getline(cg, line)) {
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    if (controllers.empty()) {
      // v2: every level from the process's group up to the root (a scope
      // under a limited slice reads "max" itself).
      for (;;) {
        const std::string file = root + "/sys/fs/cgroup" + (path == "/" ? "" : path) + "/memory.max";
        bool ok = false;
        const std::uint64_t v = read_u64_file(file, ok);
        if (ok) consider(v, "cgroup v2 " + file);
        if (path.empty() || path == "/") break;
        const auto slash = path.rfind('/');
        path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
      }
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      const std::string dir = root + "/sys/fs/cgroup/memory" + (path == "/" ? "" : path);
      std::ifstream stat(dir + "/memory.stat");
      std::string key;
      std::uint64_t v = 0;
      bool hierarchical = false;
      while (stat >> key >> v)
        if (key == "hierarchical_memory_limit") {
          consider(v, "cgroup v1 " + dir + "/memory.stat hierarchical_memory_limit");
          hierarchical = true;
        }
      bool ok = false;
      const std::uint64_t own = read_u64_file(dir + "/memory.limit_in_bytes", ok);
      if (ok && !hierarchical) consider(own, "cgroup v1 " + dir + "/memory.limit_in_bytes");
    }
  }
  if (out.bytes != 0) return out;
  std::ifstream mi(root + "/proc/meminfo");
  while (std::getline(mi, line))
    if (line.rfind("MemAvailable:", 0) == 0) {
      out.bytes = std::stoull(line.substr(13)) * 1024;
      out.source = "MemAvailable in /proc/meminfo";
    }
  return out;
}

/// Mappings of this process now (lines of /proc/self/maps); 0 when it cannot tell.
inline std::uint64_t process_map_count() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  std::uint64_t n = 0;
  while (std::getline(maps, line)) ++n;
  return n;
}

/// One mapping of a file in this process: [begin, end) maps the file from `offset`.
struct file_region {
  std::uintptr_t begin = 0, end = 0;
  std::uint64_t offset = 0;
};

/// The mappings of `path` in this process (lines of `maps`, /proc/self/maps,
/// whose device and inode are the file's, or whose name is its real path:
/// an overlay filesystem reports the underlying device there), neighbours
/// that continue each other joined. False when the list cannot be read (not
/// Linux): the caller must decide another way.
inline bool file_regions(const std::string& path, std::vector<file_region>& out,
                         const std::string& maps_path = "/proc/self/maps") {
  out.clear();
  std::ifstream maps(maps_path);
  if (!maps) return false;
  unsigned long long dev_major = ~0ull, dev_minor = ~0ull, ino = ~0ull;
  std::string real;
#if MOE_RESIDENCY_ADVICE_POSIX
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    dev_major = major(st.st_dev);
    dev_minor = minor(st.st_dev);
    ino = static_cast<unsigned long long>(st.st_ino);
  }
  if (char* r = ::realpath(path.c_str(), nullptr)) {
    real = r;
    std::free(r);
  }
#endif
  std::string line;
  bool any = false;
  while (std::getline(maps, line)) {
    any = true;
    unsigned long long b = 0, e = 0, off = 0, maj = 0, min = 0, node = 0;
    char perms[8] = {};
    int name_at = -1;
    if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %llx:%llx %llu %n", &b, &e, perms, &off, &maj, &min, &node,
                    &name_at) < 7)
      continue;
    const std::size_t at = static_cast<std::size_t>(name_at);
    const std::string name = name_at >= 0 && at <= line.size() ? line.substr(at) : std::string();
    const bool same_file =
        (node != 0 && node == ino && maj == dev_major && min == dev_minor) || (!real.empty() && name == real);
    if (same_file) out.push_back({static_cast<std::uintptr_t>(b), static_cast<std::uintptr_t>(e), off});
  }
  // One mapping split into several (advice, locks and placements split it;
  // the list is in address order): contiguous in address and offset, joined.
  std::vector<file_region> joined;
  for (const file_region& r : out)
    if (!joined.empty() && joined.back().end == r.begin &&
        joined.back().offset + (r.begin - joined.back().begin) == r.offset)
      joined.back().end = r.end;
    else joined.push_back(r);
  out.swap(joined);
  return any;
}

/// The kernel's vm.max_map_count (mappings a process may have); 0 when it cannot tell.
inline std::uint64_t max_map_count() {
  std::ifstream f("/proc/sys/vm/max_map_count");
  std::uint64_t n = 0;
  return (f >> n) ? n : 0;
}

/// True when the mapping at `addr` already carries locked pages' flag
/// (`lo` in /proc/self/smaps: llama.cpp's mlock load mode): the manager's
/// munlock would undo those locks. False when it cannot tell.
inline bool mapping_locked(const void* addr) {
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  bool inside = false;
  while (std::getline(smaps, line)) {
    const auto dash = line.find('-');
    const auto space = line.find(' ');
    if (dash != std::string::npos && space != std::string::npos && dash < space &&
        line.find_first_not_of("0123456789abcdef") == dash) {
      const std::uintptr_t lo = std::stoull(line.substr(0, dash), nullptr, 16);
      const std::uintptr_t hi = std::stoull(line.substr(dash + 1, space - dash - 1), nullptr, 16);
      inside = a >= lo && a < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return (line + " ").find(" lo ") != std::string::npos;
    }
  }
  return false;
}

/// True when this process may page out (MADV_PAGEOUT) and see the residency
/// (mincore) of the file's pages: the kernel allows both only to the file's
/// owner (or CAP_FOWNER) or a process that could write it.
inline bool may_inspect_file(const std::string& path) {
#if MOE_RESIDENCY_ADVICE_POSIX
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return false;
  return st.st_uid == ::geteuid() || ::geteuid() == 0 || ::access(path.c_str(), W_OK) == 0;
#else
  (void)path;
  return false;
#endif
}

/// Resident anonymous memory of the process (llama.cpp's KV cache and compute
/// buffers among it), bytes; 0 when unknown.
inline std::uint64_t process_anon_bytes() {
  std::ifstream st("/proc/self/status");
  std::string line;
  while (std::getline(st, line))
    if (line.rfind("RssAnon:", 0) == 0) return std::stoull(line.substr(8)) * 1024;
  return 0;
}

inline std::string mib(std::uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / 1048576.0);
  return buf;
}

}  // namespace detail

}  // namespace moe_residency::llama_cpp
