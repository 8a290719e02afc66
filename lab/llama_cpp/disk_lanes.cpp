// moe-disk-lanes: the disk's cold random-read bandwidth against the number of
// concurrent readers, as the memory lab (lab/memlab.sh) needs it to size
// read lanes: N threads each pread()ing random block-aligned blocks of one
// file with O_DIRECT (no page cache, so every read reaches the device).
//
//   moe-disk-lanes --file model.gguf --readers 1,2,4,8 --block-mib 4 --reads 256
//
// Prints CSV: readers,reads,mib,seconds,mib_per_s. Each reader count reads its
// own seeded random blocks (the same file, distinct draws), `--reads` in all.
//
//   moe-disk-lanes --file model.gguf --path-cost 864 [--path-read-mib 1024]
//
// instead measures what reading costs the calling thread's CPU, per MiB read
// from the device, on the two paths the memory lab's configurations read an
// expert slice of that many KiB by (docs/lab-predict.md): `manager` (the mapping advised MADV_RANDOM, then MADV_WILLNEED
// and MADV_POPULATE_READ of the slice, as the residency manager's exact reads)
// and `faults` (POSIX_FADV_SEQUENTIAL, as llama.cpp's mmap, then every page of
// the slice touched: each fault reads a read-around window). Random slices, the
// file's pages dropped first (POSIX_FADV_DONTNEED), until --path-read-mib MiB
// were read (/proc/self/io read_bytes). Run it inside the memory limit being
// studied: reclaim in the cgroup is part of the cost. Prints CSV:
// path,slice_kib,requests,read_mib,cpu_ms,cpu_ms_per_mib,wall_ms,off_cpu_ms_per_mib
// (off the CPU: wall − the thread's CPU, the time waiting for the device; its
// inverse is the bandwidth that path got, one request at a time).
//
//   moe-disk-lanes --file model.gguf --fault-walk [--walk-tokens 16] [--walk-gap-us 440]
//                  [--walk-pin-dense]
//
// instead walks the file the way llama.cpp's decode faults it in through mmap,
// with no llama.cpp: POSIX_FADV_SEQUENTIAL on the file; each token, layer by
// layer in the file's order, every page of the layer's non-expert tensors, then
// for each expert tensor of the layer (gate, up, down as the GGUF lists them)
// every page of the layer's top-k distinct experts, drawn at random once a
// layer (seeded; ascending, as ggml's MUL_MAT_ID visits them), each tensor
// followed by --walk-gap-us of this thread's CPU (a stand-in for the matmul;
// the lab's models compute for ~0.4 ms a tensor), and after the last layer the
// non-layer tensors but the token embedding (one row a token). The layout (tensor offsets, experts, the
// top-k: <arch>.expert_used_count) is the GGUF's. --walk-pin-dense first
// locks the non-expert tensors' pages (mlock), as the lab's `dense`
// configuration does. Run it inside the memory limit studied, page cache
// dropped (the file's own pages are dropped first: POSIX_FADV_DONTNEED).
// Prints CSV, the first --walk-skip tokens left out (they fill the cache):
// pinned_dense_mib,tokens,walked_mib_per_token,read_mib_per_token,wall_ms,
// cpu_ms,sys_ms,majflt,off_cpu_ms_per_mib,sys_ms_per_mib,mib_per_fault, per
// token but the last three (walked: the pages touched; read: /proc/self/io) —
// what the fault path costs a MiB read in that memory shape
// (docs/lab-predict.md, "The walks").
//
//   moe-disk-lanes --file model.gguf --inline-walk --walk-budget-mib 141 [--walk-tokens 16]
//                  [--walk-gap-us 440]
//
// instead walks the residency manager's `cache` path, where the eval thread
// reads and locks the pinned cache's misses itself: llama.cpp's
// POSIX_FADV_SEQUENTIAL on the file and the manager's MADV_RANDOM on the expert
// ranges; each token, layer by layer, every page of the layer's non-expert
// tensors, then the layer's top-k distinct experts (drawn as --fault-walk draws
// them) looked up in an LRU pinned cache of --walk-budget-mib (an expert is its
// slice of every expert tensor of the layer); MADV_WILLNEED on every slice of
// the layer's misses, then mlock on each, then the evicted unlocked and advised
// MADV_COLD (the manager's release), then --walk-gap-us of CPU for each expert
// tensor. Run it inside the memory limit studied, page cache dropped. Prints
// CSV, the first --walk-skip tokens left out: budget_mib,tokens,
// pins_per_token,read_mib_per_token,wall_ms,cpu_ms,sys_ms,off_cpu_ms_per_mib,
// sys_ms_per_mib, per token but the last two — what the inline path costs a
// MiB read, device and kernel, pins included (docs/lab-predict.md, "The
// walks").

#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gguf.h"
#include "moe_residency/adapters/llama_cpp/gguf.hpp"
#include "checked_options.hpp"
#include "proc_counters.hpp"

namespace {

using moe_residency::llama_cpp::lab::proc_read_bytes;
using moe_residency::llama_cpp::lab::thread_cpu_ms;

struct fd_guard {
  int fd = -1;
  ~fd_guard() {
    if (fd >= 0) ::close(fd);
  }
};

/// The whole file mapped read-only and shared; unmapped on scope exit.
struct file_mapping {
  void* at;
  std::size_t size;
  file_mapping(int fd, std::size_t n, const std::string& file)
      : at(::mmap(nullptr, n, PROT_READ, MAP_SHARED, fd, 0)), size(n) {
    if (at == MAP_FAILED) throw std::runtime_error("mmap of '" + file + "' failed: " + std::strerror(errno));
  }
  file_mapping(const file_mapping&) = delete;
  file_mapping& operator=(const file_mapping&) = delete;
  ~file_mapping() { ::munmap(at, size); }
};

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  for (const std::string& item : moe_residency_cli::split_list(s, "--readers"))
    out.push_back(moe_residency::detail::parse_whole<int>(item, "--readers", 1, 256));
  return out;
}

#ifndef MADV_COLD
#define MADV_COLD 20  // Linux >= 5.4
#endif
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux >= 5.14
#endif

/// --path-cost: the calling thread's CPU per MiB read on the manager's path and
/// on the fault path (see the top of the file).
void path_cost(const std::string& file, std::size_t slice_kib, double read_mib, std::uint64_t seed) {
  fd_guard f;
  f.fd = ::open(file.c_str(), O_RDONLY);
  if (f.fd < 0) throw std::runtime_error("--file: cannot open '" + file + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw std::runtime_error("--file: fstat failed: " + std::string(std::strerror(errno)));
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t slice = slice_kib * 1024;
  const auto size = static_cast<std::size_t>(st.st_size);
  if (slice == 0 || slice % page != 0 || size < 2 * slice)
    throw std::invalid_argument("--path-cost: " + std::to_string(slice_kib) + " KiB; expected a multiple of the " +
                                std::to_string(page / 1024) + " KiB page, at most half of '" + file + "'");
  if (!(read_mib > 0)) throw std::invalid_argument("--path-read-mib: " + std::to_string(read_mib) + "; expected > 0");
  if (::access("/proc/self/io", R_OK) != 0)
    throw std::runtime_error("--path-cost needs /proc/self/io to count the bytes read");
  const file_mapping map(f.fd, size, file);
  auto* bytes = static_cast<unsigned char*>(map.at);
  const auto* touch = static_cast<const volatile unsigned char*>(map.at);
  std::printf("path,slice_kib,requests,read_mib,cpu_ms,cpu_ms_per_mib,wall_ms,off_cpu_ms_per_mib\n");
  for (const bool faults : {false, true}) {
    // posix_fadvise returns its error; madvise sets errno.
    int rc = ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED);
    if (rc == 0) rc = ::posix_fadvise(f.fd, 0, 0, faults ? POSIX_FADV_SEQUENTIAL : POSIX_FADV_NORMAL);
    if (rc == 0 && ::madvise(map.at, size, faults ? MADV_NORMAL : MADV_RANDOM) != 0) rc = errno;
    if (rc != 0) throw std::runtime_error("advice on '" + file + "' failed: " + std::strerror(rc));
    std::mt19937_64 gen(seed);
    std::uniform_int_distribution<std::size_t> pick(0, (size - slice) / page);
    const std::uint64_t r0 = proc_read_bytes();
    const double c0 = thread_cpu_ms();
    const auto w0 = std::chrono::steady_clock::now();
    const auto target = static_cast<std::uint64_t>(read_mib * 1048576.0);
    std::size_t requests = 0;
    std::uint64_t read = 0;
    // At most as many requests as would read the file 4 times over: a limit
    // that holds the whole file stops reading, and the loop must still end.
    for (const std::size_t cap = 4 * size / slice + 16; read < target && requests < cap; ++requests) {
      const std::size_t at = pick(gen) * page;
      if (faults) {
        for (std::size_t o = 0; o < slice; o += page) (void)touch[at + o];  // a volatile read: one touch
      } else if (::madvise(bytes + at, slice, MADV_WILLNEED) != 0 ||
                 ::madvise(bytes + at, slice, MADV_POPULATE_READ) != 0) {
        throw std::runtime_error(std::string("madvise (WILLNEED, POPULATE_READ) failed: ") + std::strerror(errno));
      }
      // The counter costs ~11 us a read here: ~0.7 us a request, 1% of a 16 KiB slice's.
      if (requests % 16 == 15) read = proc_read_bytes() - r0;
    }
    const double cpu = thread_cpu_ms() - c0;
    const double wall = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - w0).count();
    read = proc_read_bytes() - r0;
    const double mib = static_cast<double>(read) / 1048576.0;
    std::printf("%s,%zu,%zu,%.1f,%.1f,%.4f,%.1f,%.4f\n", faults ? "faults" : "manager", slice_kib, requests, mib, cpu,
                mib > 0 ? cpu / mib : 0.0, wall, mib > 0 ? std::max(0.0, wall - cpu) / mib : 0.0);
    std::fflush(stdout);
  }
}

/// --fault-walk: llama.cpp's fault path through mmap, without llama.cpp (see
/// the top of the file).
struct walk_layout {
  struct range {
    std::uint64_t offset = 0, bytes = 0;
  };
  std::vector<std::vector<range>> dense;                                          ///< per layer: its non-expert tensors
  std::vector<std::vector<moe_residency::llama_cpp::expert_file_range>> experts;  ///< per layer
  std::vector<range> tail;  ///< non-layer tensors but the token embedding
  std::size_t top_k = 0;
  std::uint64_t dense_bytes = 0;  ///< every non-expert tensor of a layer, and the tail
};

walk_layout read_walk_layout(const std::string& file, const std::string& flag) {
  namespace lc = moe_residency::llama_cpp;
  const lc::gguf_expert_map map = lc::gguf_expert_map::by_name(file);
  if (map.paths().size() > 1)
    throw std::runtime_error(flag + ": '" + file + "' is the first of " + std::to_string(map.paths().size()) +
                             " splits; the walks read one file: give a single-file model");
  const lc::detail::gguf_ptr holder = lc::detail::open_gguf(file, flag.c_str());
  const gguf_context* ctx = holder.get();
  walk_layout w;
  w.experts.resize(map.n_layer());
  w.dense.resize(map.n_layer());
  for (std::size_t l = 0; l < map.n_layer(); ++l) {
    w.experts[l] = map.ranges(moe_residency::layer_id(static_cast<std::uint16_t>(l)));
    std::sort(w.experts[l].begin(), w.experts[l].end(),
              [](const auto& a, const auto& b) { return a.offset < b.offset; });
  }
  const std::uint64_t data = gguf_get_data_offset(ctx);
  for (std::int64_t i = 0; i < gguf_get_n_tensors(ctx); ++i) {
    const char* name = gguf_get_tensor_name(ctx, i);
    const walk_layout::range r{data + gguf_get_tensor_offset(ctx, i), gguf_get_tensor_size(ctx, i)};
    const int il = lc::detail::parse_blk_layer(name);
    if (il < 0) {
      if (std::strcmp(name, "token_embd.weight") != 0) w.tail.push_back(r);
      continue;
    }
    const auto l = static_cast<std::size_t>(il);
    bool expert = false;
    if (l < w.experts.size())
      for (const auto& e : w.experts[l]) expert = expert || e.tensor == name;
    if (expert) continue;
    if (l >= w.dense.size()) w.dense.resize(l + 1);
    w.dense[l].push_back(r);
    w.dense_bytes += r.bytes;
  }
  for (const auto& r : w.tail) w.dense_bytes += r.bytes;
  for (auto& d : w.dense)
    std::sort(d.begin(), d.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  std::sort(w.tail.begin(), w.tail.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  const std::int64_t arch = gguf_find_key(ctx, "general.architecture");
  if (arch >= 0 && gguf_get_kv_type(ctx, arch) == GGUF_TYPE_STRING) {
    const std::string key = std::string(gguf_get_val_str(ctx, arch)) + ".expert_used_count";
    const std::int64_t k = gguf_find_key(ctx, key.c_str());
    if (k >= 0 && gguf_get_kv_type(ctx, k) == GGUF_TYPE_UINT32) w.top_k = gguf_get_val_u32(ctx, k);
  }
  std::size_t n_expert = 0;
  for (const auto& l : w.experts)
    for (const auto& e : l) n_expert = std::max(n_expert, e.n_expert);
  if (n_expert == 0) throw std::invalid_argument(flag + ": '" + file + "' has no expert tensors (blk.N.*_exps.*)");
  if (w.top_k == 0 || w.top_k > n_expert)
    throw std::invalid_argument(flag + ": '" + file + "': expert_used_count " + std::to_string(w.top_k) +
                                "; expected 1 … " + std::to_string(n_expert) + " (the number of experts)");
  return w;
}

double thread_sys_ms() {
  rusage u{};
  if (::getrusage(RUSAGE_THREAD, &u) != 0) return 0;
  return 1e3 * static_cast<double>(u.ru_stime.tv_sec) + 1e-3 * static_cast<double>(u.ru_stime.tv_usec);
}
long thread_majflt() {
  rusage u{};
  return ::getrusage(RUSAGE_THREAD, &u) == 0 ? u.ru_majflt : 0;
}

/// What both walks share: their checked arguments, the file's layout, the
/// whole file mapped with its clean pages dropped first (what a cell's
/// drop_caches does for it) and llama.cpp's advice, and one routing a layer.
struct walk_frame {
  const walk_layout w;
  const fd_guard f;
  const std::size_t size;
  const file_mapping map;
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));

  walk_frame(const std::string& file, int tokens, int skip, double gap_us, const std::string& flag)
      : w(checked_layout(file, tokens, skip, gap_us, flag)),
        f{open_file(file)},
        size(file_size(f.fd)),
        map(f.fd, size, file) {
    int rc = ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED);
    if (rc == 0) rc = ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    if (rc != 0)
      throw std::runtime_error("posix_fadvise (DONTNEED, SEQUENTIAL) on '" + file + "' failed: " + std::strerror(rc));
  }

  /// One volatile read of every page of [offset, offset + bytes) inside the
  /// file; returns the pages read.
  std::uint64_t touch(std::uint64_t offset, std::uint64_t bytes) const {
    const auto* at = static_cast<const volatile unsigned char*>(map.at);
    const std::uint64_t end = std::min<std::uint64_t>(offset + bytes, size);
    std::uint64_t n = 0;
    for (std::uint64_t o = offset - offset % page; o < end; o += page, ++n) (void)at[o];
    return n;
  }
  /// touch() over layer l's non-expert tensors.
  std::uint64_t touch_dense(std::size_t l) const { return l < w.dense.size() ? touch_all(w.dense[l]) : 0; }
  /// touch() over the non-layer tensors but the token embedding (after the last layer).
  std::uint64_t touch_tail() const { return touch_all(w.tail); }

  /// Layer l's routing into `chosen`: top-k distinct experts drawn uniformly, sorted.
  void draw(std::size_t l, std::mt19937_64& gen, std::vector<std::size_t>& chosen) const {
    const std::size_t n = w.experts[l].front().n_expert;
    std::uniform_int_distribution<std::size_t> pick(0, n - 1);
    chosen.clear();
    while (chosen.size() < std::min(w.top_k, n)) {
      const std::size_t x = pick(gen);
      if (std::find(chosen.begin(), chosen.end(), x) == chosen.end()) chosen.push_back(x);
    }
    std::sort(chosen.begin(), chosen.end());
  }

 private:
  std::uint64_t touch_all(const std::vector<walk_layout::range>& rs) const {
    std::uint64_t n = 0;
    for (const auto& r : rs) n += touch(r.offset, r.bytes);
    return n;
  }
  static walk_layout checked_layout(const std::string& file, int tokens, int skip, double gap_us,
                                    const std::string& flag) {
    if (tokens < 1) throw std::invalid_argument("--walk-tokens: " + std::to_string(tokens) + "; expected >= 1");
    if (skip < 0 || skip >= tokens)
      throw std::invalid_argument("--walk-skip: " + std::to_string(skip) + "; expected 0 … --walk-tokens − 1 (" +
                                  std::to_string(tokens - 1) + ")");
    if (!(gap_us >= 0)) throw std::invalid_argument("--walk-gap-us: " + std::to_string(gap_us) + "; expected >= 0");
    if (::access("/proc/self/io", R_OK) != 0)
      throw std::runtime_error(flag + " needs /proc/self/io to count the bytes read");
    return read_walk_layout(file, flag);
  }
  static int open_file(const std::string& file) {
    const int fd = ::open(file.c_str(), O_RDONLY);
    if (fd < 0) throw std::runtime_error("--file: cannot open '" + file + "': " + std::strerror(errno));
    return fd;
  }
  static std::size_t file_size(int fd) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) throw std::runtime_error("--file: fstat failed: " + std::string(std::strerror(errno)));
    return static_cast<std::size_t>(st.st_size);
  }
};

/// A walk's clocks and counters, summed over the tokens counted.
struct walk_totals {
  struct mark {
    std::uint64_t read;
    double cpu, sys;
    long faults;
    std::chrono::steady_clock::time_point wall;
  };
  double wall = 0, cpu = 0, sys = 0;
  std::uint64_t read = 0;
  long faults = 0;

  static mark start() {
    return {proc_read_bytes(), thread_cpu_ms(), thread_sys_ms(), thread_majflt(), std::chrono::steady_clock::now()};
  }
  void add(const mark& m) {
    wall += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - m.wall).count();
    cpu += thread_cpu_ms() - m.cpu;
    sys += thread_sys_ms() - m.sys;
    faults += thread_majflt() - m.faults;
    read += proc_read_bytes() - m.read;
  }
};

void fault_walk(const std::string& file, int tokens, int skip, double gap_us, bool pin_dense, std::uint64_t seed) {
  const walk_frame fr(file, tokens, skip, gap_us, "--fault-walk");
  const walk_layout& w = fr.w;
  const std::size_t page = fr.page;
  std::uint64_t touched = 0;  // pages, over the tokens counted
  if (pin_dense) {
    const auto lock = [&](const walk_layout::range& r) {
      const std::uint64_t from = r.offset - r.offset % page;
      if (::mlock(static_cast<const unsigned char*>(fr.map.at) + from, r.offset + r.bytes - from) != 0)
        throw std::runtime_error("--walk-pin-dense: mlock of " + std::to_string(r.bytes) + " bytes at " +
                                 std::to_string(r.offset) + " failed: " + std::strerror(errno) +
                                 " (run as root, or raise RLIMIT_MEMLOCK)");
    };
    for (const auto& d : w.dense)
      for (const auto& r : d) lock(r);
    for (const auto& r : w.tail) lock(r);
  }
  const auto spin = [&] {
    const double until = thread_cpu_ms() + gap_us / 1000.0;
    while (thread_cpu_ms() < until) {
    }
  };
  std::mt19937_64 gen(seed);
  walk_totals sum;
  std::vector<std::size_t> chosen;
  for (int t = 0; t < tokens; ++t) {
    const walk_totals::mark m0 = walk_totals::start();
    std::uint64_t pages = 0;
    for (std::size_t l = 0; l < w.experts.size(); ++l) {
      pages += fr.touch_dense(l);
      if (w.experts[l].empty()) continue;
      // One routing a layer, for all of its expert tensors (gate, up and down use the same experts).
      fr.draw(l, gen, chosen);
      for (const auto& e : w.experts[l]) {
        for (const std::size_t x : chosen)
          if (x < e.n_expert) pages += fr.touch(e.offset + x * e.bytes_per_expert, e.bytes_per_expert);
        spin();
      }
    }
    pages += fr.touch_tail();
    if (t < skip) continue;
    sum.add(m0);
    touched += pages;
  }
  const double wall = sum.wall, cpu = sum.cpu, sys = sum.sys;
  const std::uint64_t read = sum.read;
  const long faults = sum.faults;
  const double n = tokens - skip, mib = static_cast<double>(read) / 1048576.0;
  std::printf(
      "pinned_dense_mib,tokens,walked_mib_per_token,read_mib_per_token,wall_ms,cpu_ms,sys_ms,majflt,"
      "off_cpu_ms_per_mib,sys_ms_per_mib,mib_per_fault\n");
  std::printf("%.1f,%d,%.1f,%.1f,%.2f,%.2f,%.2f,%.1f,%.4f,%.4f,%.2f\n",
              pin_dense ? static_cast<double>(w.dense_bytes) / 1048576.0 : 0.0, tokens - skip,
              static_cast<double>(touched * page) / 1048576.0 / n, mib / n, wall / n, cpu / n, sys / n,
              static_cast<double>(faults) / n, mib > 0 ? std::max(0.0, wall - cpu) / mib : 0.0,
              mib > 0 ? sys / mib : 0.0, faults > 0 ? mib / static_cast<double>(faults) : 0.0);
  std::fflush(stdout);
}

/// --inline-walk: the residency manager's `cache` path, read inline by the
/// eval thread, without llama.cpp (see the top of the file).
void inline_walk(const std::string& file, int tokens, int skip, double gap_us, double budget_mib, std::uint64_t seed) {
  const walk_frame fr(file, tokens, skip, gap_us, "--inline-walk");
  const walk_layout& w = fr.w;
  const std::size_t size = fr.size, page = fr.page;
  // One expert of a layer: its slice of every expert tensor (gate, up, down), as the cache pins it.
  std::uint64_t most = 0;
  std::vector<std::uint64_t> expert_bytes(w.experts.size(), 0);
  std::size_t n_expert = 0;
  for (std::size_t l = 0; l < w.experts.size(); ++l)
    for (const auto& e : w.experts[l]) {
      expert_bytes[l] += e.bytes_per_expert;
      most = std::max(most, expert_bytes[l]);
      n_expert = std::max(n_expert, e.n_expert);
    }
  const auto budget = static_cast<std::uint64_t>(budget_mib * 1048576.0);
  if (!(budget_mib > 0) || budget < most)
    throw std::invalid_argument("--walk-budget-mib: " + std::to_string(budget_mib) + "; expected at least one " +
                                "expert's slices, " + std::to_string(static_cast<double>(most) / 1048576.0) + " MiB");
  auto* base = static_cast<unsigned char*>(fr.map.at);
  // [offset, offset + bytes) widened to whole pages, inside the file.
  const auto pages = [&](std::uint64_t offset, std::uint64_t bytes) {
    const std::uint64_t from = offset - offset % page, end = std::min<std::uint64_t>(offset + bytes, size);
    return std::make_pair(base + from, static_cast<std::size_t>(end > from ? end - from : 0));
  };
  // After llama.cpp's advice for the file (walk_frame), the manager's for the
  // expert ranges (MADV_RANDOM: a stray fault reads a page).
  for (const auto& l : w.experts)
    for (const auto& e : l) {
      const auto r = pages(e.offset, e.bytes_per_expert * e.n_expert);
      if (::madvise(r.first, r.second, MADV_RANDOM) != 0)
        throw std::runtime_error("madvise(MADV_RANDOM) on " + e.tensor + " failed: " + std::strerror(errno));
    }
  // The stand-in for the matmul spins on the monotonic clock, read in user
  // space (vDSO): the thread's CPU clock is a system call, whose kernel time
  // would count as the path's (about a fifth of it, at these few MiB a token).
  const auto spin = [&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double, std::micro>(gap_us);
    while (std::chrono::steady_clock::now() < until) {
    }
  };
  // The pinned cache: LRU over (layer, expert), byte-budgeted, as the manager's default policy.
  std::vector<std::uint64_t> last(w.experts.size() * n_expert, 0);  // 0: not pinned
  std::uint64_t clock = 0, pinned = 0, pins = 0;
  const auto slot = [&](std::size_t l, std::size_t x) { return l * n_expert + x; };
  std::mt19937_64 gen(seed);
  walk_totals sum;
  std::vector<std::size_t> chosen, misses, evicted;
  for (int t = 0; t < tokens; ++t) {
    const bool counting = t >= skip;
    const walk_totals::mark m0 = walk_totals::start();
    for (std::size_t l = 0; l < w.experts.size(); ++l) {
      fr.touch_dense(l);
      if (w.experts[l].empty()) continue;
      fr.draw(l, gen, chosen);
      // The cache's lookups: hits refreshed, misses admitted, the least recently used evicted.
      misses.clear();
      evicted.clear();
      for (const std::size_t x : chosen) {
        if (last[slot(l, x)] != 0) {
          last[slot(l, x)] = ++clock;
          continue;
        }
        while (pinned + expert_bytes[l] > budget) {
          std::size_t victim = last.size();
          for (std::size_t s = 0; s < last.size(); ++s)
            if (last[s] != 0 && (victim == last.size() || last[s] < last[victim])) victim = s;
          last[victim] = 0;
          pinned -= expert_bytes[victim / n_expert];
          evicted.push_back(victim);
        }
        last[slot(l, x)] = ++clock;
        pinned += expert_bytes[l];
        misses.push_back(x);
      }
      // The manager's inline path: WILLNEED on every slice of the layer's misses, then each locked.
      for (const std::size_t x : misses)
        for (const auto& e : w.experts[l]) {
          const auto r = pages(e.offset + x * e.bytes_per_expert, e.bytes_per_expert);
          (void)::madvise(r.first, r.second, MADV_WILLNEED);
        }
      for (const std::size_t x : misses)
        for (const auto& e : w.experts[l]) {
          const auto r = pages(e.offset + x * e.bytes_per_expert, e.bytes_per_expert);
          if (::mlock(r.first, r.second) != 0)
            throw std::runtime_error("--inline-walk: mlock of " + e.tensor + " expert " + std::to_string(x) +
                                     " failed: " + std::strerror(errno) + " (run as root, or raise RLIMIT_MEMLOCK)");
        }
      pins += counting ? misses.size() : 0;
      // The batch closed: the evicted unlocked and advised cold (release = cold).
      for (const std::size_t v : evicted)
        for (const auto& e : w.experts[v / n_expert]) {
          const auto r = pages(e.offset + (v % n_expert) * e.bytes_per_expert, e.bytes_per_expert);
          (void)::munlock(r.first, r.second);
          (void)::madvise(r.first, r.second, MADV_COLD);
        }
      for (std::size_t k = 0; k < w.experts[l].size(); ++k) spin();
    }
    fr.touch_tail();
    if (counting) sum.add(m0);
  }
  const double wall = sum.wall, cpu = sum.cpu, sys = sum.sys;
  const std::uint64_t read = sum.read;
  const double n = tokens - skip, mib = static_cast<double>(read) / 1048576.0;
  std::printf(
      "budget_mib,tokens,pins_per_token,read_mib_per_token,wall_ms,cpu_ms,sys_ms,off_cpu_ms_per_mib,"
      "sys_ms_per_mib\n");
  std::printf("%.1f,%d,%.1f,%.1f,%.2f,%.2f,%.2f,%.4f,%.4f\n", budget_mib, tokens - skip, static_cast<double>(pins) / n,
              mib / n, wall / n, cpu / n, sys / n, mib > 0 ? std::max(0.0, wall - cpu) / mib : 0.0,
              mib > 0 ? sys / mib : 0.0);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  namespace opt = moe_residency_cli;  // checked_options.hpp: the numbers every option takes
  using moe_residency::detail::real_domain;
  std::string file, readers = "1,2,4,8";
  double block_mib = 4;
  int reads = 256;
  std::uint64_t seed = 1;
  std::size_t path_kib = 0;
  double path_read_mib = 1024;
  CLI::App app{"moe-disk-lanes: cold random-read bandwidth (O_DIRECT pread) against concurrent readers"};
  app.add_option("--file", file, "A large file on the disk to measure (read only)")->required();
  app.add_option("--readers", readers, "Comma list of reader counts")->capture_default_str();
  app.add_option("--block-mib", block_mib, "Size of one read in MiB")
      ->check(opt::real(real_domain::open_closed(0, 1024)))
      ->capture_default_str();
  app.add_option("--reads", reads, "Reads per reader count (split between the readers)")
      ->check(opt::whole(1, 1 << 24))
      ->capture_default_str();
  app.add_option("--seed", seed, "Seed of the block draws")->check(opt::whole())->capture_default_str();
  app.add_option("--path-cost", path_kib,
                 "Instead: the calling thread's CPU per MiB read, manager path against fault path, for slices of "
                 "this many KiB (run it inside the memory limit studied)")
      ->check(opt::whole(1, 1 << 20));
  app.add_option("--path-read-mib", path_read_mib, "--path-cost: MiB to read from the device on each path")
      ->check(opt::positive())
      ->capture_default_str();
  bool walk = false, walk_pin = false;
  int walk_tokens = 16, walk_skip = 2;
  double walk_gap_us = 440;
  app.add_flag("--fault-walk", walk,
               "Instead: llama.cpp's decode fault path through mmap, without llama.cpp (run it inside the "
               "memory limit studied, page cache dropped)");
  app.add_option("--walk-tokens", walk_tokens, "--fault-walk: tokens walked")
      ->check(opt::whole(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--walk-skip", walk_skip, "--fault-walk: first tokens left out of the figures")
      ->check(opt::whole(0, 1 << 16))
      ->capture_default_str();
  app.add_option("--walk-gap-us", walk_gap_us, "--fault-walk: CPU spent after each expert tensor, us")
      ->check(opt::non_negative())
      ->capture_default_str();
  app.add_flag("--walk-pin-dense", walk_pin, "--fault-walk: mlock the non-expert tensors first");
  bool inline_on = false;
  double walk_budget = 0;
  app.add_flag("--inline-walk", inline_on,
               "Instead: the residency manager's inline `cache` path (WILLNEED a layer's misses, then mlock each; "
               "an LRU pinned cache of --walk-budget-mib), without llama.cpp (run it inside the memory limit "
               "studied, page cache dropped)");
  app.add_option("--walk-budget-mib", walk_budget, "--inline-walk: the pinned cache's budget, MiB")
      ->check(opt::positive());
  CLI11_PARSE(app, argc, argv);
  try {
    if (walk && inline_on) throw std::invalid_argument("--fault-walk and --inline-walk: expected one of them");
    if (walk_budget != 0 && !inline_on)  // the option refuses 0, so non-zero means given
      throw std::invalid_argument("--walk-budget-mib has no effect without --inline-walk");
    if (inline_on) {
      inline_walk(file, walk_tokens, walk_skip, walk_gap_us, walk_budget, seed);
      return 0;
    }
    if (walk) {
      fault_walk(file, walk_tokens, walk_skip, walk_gap_us, walk_pin, seed);
      return 0;
    }
    if (path_kib) {
      path_cost(file, path_kib, path_read_mib, seed);
      return 0;
    }
    const std::vector<int> counts = parse_list(readers);
    if (reads < 1) throw std::invalid_argument("--reads: " + std::to_string(reads) + "; expected >= 1");
    const auto block = static_cast<std::size_t>(block_mib * 1024 * 1024);
    if (block < 4096 || block % 4096 != 0)
      throw std::invalid_argument("--block-mib: " + std::to_string(block_mib) +
                                  " MiB; expected a multiple of 4 KiB, at least 4 KiB");
    fd_guard f;
    f.fd = ::open(file.c_str(), O_RDONLY | O_DIRECT);
    if (f.fd < 0) throw std::runtime_error("--file: cannot open '" + file + "' with O_DIRECT: " + std::strerror(errno));
    struct stat st {};
    if (::fstat(f.fd, &st) != 0) throw std::runtime_error("--file: fstat failed: " + std::string(std::strerror(errno)));
    const std::uint64_t n_blocks = static_cast<std::uint64_t>(st.st_size) / block;
    if (n_blocks < 2)
      throw std::invalid_argument("--file: '" + file + "' holds " + std::to_string(n_blocks) +
                                  " blocks of the read size; expected at least 2");
    std::printf("readers,reads,mib,seconds,mib_per_s\n");
    for (const int n : counts) {
      std::mt19937_64 gen(seed * 1000003u + static_cast<std::uint64_t>(n));
      std::uniform_int_distribution<std::uint64_t> pick(0, n_blocks - 1);
      std::vector<std::uint64_t> offsets(static_cast<std::size_t>(reads));
      for (auto& o : offsets) o = pick(gen) * block;
      std::atomic<std::size_t> next{0};
      std::atomic<std::uint64_t> bytes{0};
      std::atomic<int> failed_errno{0};
      auto reader = [&] {
        void* raw = nullptr;
        if (posix_memalign(&raw, 4096, block) != 0) {
          failed_errno = ENOMEM;
          return;
        }
        std::unique_ptr<void, void (*)(void*)> buf(raw, std::free);
        for (std::size_t i; (i = next.fetch_add(1)) < offsets.size();) {
          const ssize_t got = ::pread(f.fd, buf.get(), block, static_cast<off_t>(offsets[i]));
          if (got < 0) {
            failed_errno = errno;
            return;
          }
          bytes += static_cast<std::uint64_t>(got);
        }
      };
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<std::thread> threads;
      for (int t = 0; t < n; ++t) threads.emplace_back(reader);
      for (auto& t : threads) t.join();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (failed_errno)
        throw std::runtime_error("pread of '" + file + "' failed: " + std::strerror(failed_errno.load()));
      const double mib = static_cast<double>(bytes.load()) / (1024.0 * 1024.0);
      std::printf("%d,%d,%.1f,%.3f,%.1f\n", n, reads, mib, s, mib / s);
      std::fflush(stdout);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-disk-lanes: %s\n", e.what());
    return 1;
  }
}
