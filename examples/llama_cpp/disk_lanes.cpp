// moe-disk-lanes: the disk's cold random-read bandwidth against the number of
// concurrent readers, as the memory lab (scripts/memlab.sh) needs it to size
// read lanes: N threads each pread()ing random block-aligned blocks of one
// file with O_DIRECT (no page cache, so every read reaches the device).
//
//   moe-disk-lanes --file model.gguf --readers 1,2,4,8 --block-mib 4 --reads 256
//
// Prints CSV: readers,reads,mib,seconds,mib_per_s. Each reader count reads its
// own seeded random blocks (the same file, distinct draws), `--reads` in all.

#include <CLI/CLI.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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

namespace {

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

}  // namespace

int main(int argc, char** argv) {
  std::string file, readers = "1,2,4,8";
  double block_mib = 4;
  int reads = 256;
  std::uint64_t seed = 1;
  CLI::App app{"moe-disk-lanes: cold random-read bandwidth (O_DIRECT pread) against concurrent readers"};
  app.add_option("--file", file, "A large file on the disk to measure (read only)")->required();
  app.add_option("--readers", readers, "Comma list of reader counts")->capture_default_str();
  app.add_option("--block-mib", block_mib, "Size of one read in MiB")->capture_default_str();
  app.add_option("--reads", reads, "Reads per reader count (split between the readers)")->capture_default_str();
  app.add_option("--seed", seed, "Seed of the block draws")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
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
