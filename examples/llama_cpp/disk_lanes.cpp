// moe-disk-lanes: the disk's cold random-read bandwidth against the number of
// concurrent readers, as the memory lab (scripts/memlab.sh) needs it to size
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
// expert slice of that many KiB by (docs/wall-clock.md, "Against this
// machine"): `manager` (the mapping advised MADV_RANDOM, then MADV_WILLNEED
// and MADV_POPULATE_READ of the slice, as the residency manager's exact reads)
// and `faults` (POSIX_FADV_SEQUENTIAL, as llama.cpp's mmap, then every page of
// the slice touched: each fault reads a read-around window). Random slices, the
// file's pages dropped first (POSIX_FADV_DONTNEED), until --path-read-mib MiB
// were read (/proc/self/io read_bytes). Run it inside the memory limit being
// studied: reclaim in the cgroup is part of the cost. Prints CSV:
// path,slice_kib,requests,read_mib,cpu_ms,cpu_ms_per_mib,wall_ms,off_cpu_ms_per_mib
// (off the CPU: wall − the thread's CPU, the time waiting for the device; its
// inverse is the bandwidth that path got, one request at a time).

#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <sys/mman.h>
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

#include "proc_counters.hpp"

namespace {

using moe_residency::llama_cpp::examples::proc_read_bytes;
using moe_residency::llama_cpp::examples::thread_cpu_ms;

struct fd_guard {
  int fd = -1;
  ~fd_guard() {
    if (fd >= 0) ::close(fd);
  }
};

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1 || v > 256)
      throw std::invalid_argument("--readers: '" + item + "' in '" + s + "'; expected integers in [1, 256]");
    out.push_back(static_cast<int>(v));
  }
  if (out.empty()) throw std::invalid_argument("--readers: empty list");
  return out;
}

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
  struct mapping {
    void* at;
    std::size_t size;
    ~mapping() {
      if (at != MAP_FAILED) ::munmap(at, size);
    }
  } map{::mmap(nullptr, size, PROT_READ, MAP_SHARED, f.fd, 0), size};
  if (map.at == MAP_FAILED) throw std::runtime_error("mmap of '" + file + "' failed: " + std::strerror(errno));
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
      } else if (::madvise(bytes + at, slice, MADV_WILLNEED) != 0 || ::madvise(bytes + at, slice, MADV_POPULATE_READ) != 0) {
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

}  // namespace

int main(int argc, char** argv) {
  std::string file, readers = "1,2,4,8";
  double block_mib = 4;
  int reads = 256;
  std::uint64_t seed = 1;
  std::size_t path_kib = 0;
  double path_read_mib = 1024;
  CLI::App app{"moe-disk-lanes: cold random-read bandwidth (O_DIRECT pread) against concurrent readers"};
  app.add_option("--file", file, "A large file on the disk to measure (read only)")->required();
  app.add_option("--readers", readers, "Comma list of reader counts")->capture_default_str();
  app.add_option("--block-mib", block_mib, "Size of one read in MiB")->capture_default_str();
  app.add_option("--reads", reads, "Reads per reader count (split between the readers)")->capture_default_str();
  app.add_option("--seed", seed, "Seed of the block draws")->capture_default_str();
  app.add_option("--path-cost", path_kib,
                 "Instead: the calling thread's CPU per MiB read, manager path against fault path, for slices of "
                 "this many KiB (run it inside the memory limit studied)");
  app.add_option("--path-read-mib", path_read_mib, "--path-cost: MiB to read from the device on each path")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
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
    if (f.fd < 0)
      throw std::runtime_error("--file: cannot open '" + file + "' with O_DIRECT: " + std::strerror(errno));
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
