#pragma once
/// Reads experts from a GGUF file (pread or fadvise) for a warm-up or as the
/// read scheduler's callback.

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "moe_residency/adapters/llama_cpp/gguf.hpp"
#include "moe_residency/io.hpp"

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#define MOE_RESIDENCY_LLAMA_CPP_POSIX 1
#else
#define MOE_RESIDENCY_LLAMA_CPP_POSIX 0
#endif

namespace moe_residency::llama_cpp {

/// Makes one expert resident by reading its slices from the GGUF file:
/// `pread` into a buffer, or `fadvise` (POSIX_FADV_WILLNEED: the kernel reads
/// ahead into the page cache that llama.cpp's mmap then hits). `read` uses
/// the reader's own buffer (one reader per thread); `read_into` and
/// `callback()` are safe to call from several threads at once (pread on one
/// descriptor). Every read is noexcept and reports failure by its result.
class gguf_expert_reader {
 public:
  enum class mode : std::uint8_t { pread, fadvise };

  /// Opens the map's files (every split). Throws `error` when one cannot be opened.
  explicit gguf_expert_reader(const gguf_expert_map& map, mode m = mode::pread) : map_(&map), mode_(m) {
#if MOE_RESIDENCY_LLAMA_CPP_POSIX
    for (const std::string& path : map.paths()) {
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        const std::string why = std::strerror(errno);
        close_all();
        throw error("gguf_expert_reader: " + path + ": cannot open (" + why + ")");
      }
      fds_.push_back(fd);
    }
#else
    throw error("gguf_expert_reader: needs POSIX pread");
#endif
    for (std::size_t l = 0; l < map.n_layer(); ++l)
      widest_ = std::max(widest_, map.expert_bytes(layer_id(static_cast<std::uint16_t>(l))));
    if (m == mode::pread) buffer_.resize(static_cast<std::size_t>(widest_));
  }
  ~gguf_expert_reader() { close_all(); }
  // callback() captures `this`: never copied or moved.
  gguf_expert_reader(const gguf_expert_reader&) = delete;
  gguf_expert_reader& operator=(const gguf_expert_reader&) = delete;
  gguf_expert_reader(gguf_expert_reader&&) = delete;
  gguf_expert_reader& operator=(gguf_expert_reader&&) = delete;

  /// Reads (or advises) every slice of expert e of layer l into the reader's
  /// buffer (see data()). False on an unknown layer or expert, an I/O error
  /// or a short read. Not for concurrent use: see read_into.
  bool read(layer_id l, expert_id e) noexcept {
    const bool ok = read_into(l, e, buffer_.data());
    if (ok) {
      ++reads_;
      bytes_ += map_->expert_bytes(l);
    }
    return ok;
  }

  /// Reads expert e of layer l into `dst` (at least widest_expert_bytes()
  /// bytes; ignored in fadvise mode): its slices back to back, in the order
  /// of gguf_expert_map::ranges. Thread-safe.
  bool read_into(layer_id l, expert_id e, unsigned char* dst) const noexcept {
    if (to_index(l) >= map_->n_layer()) return false;
    const std::vector<expert_file_range>& ranges = map_->ranges(l);
    if (ranges.empty()) return false;
    std::size_t at = 0;
    for (const expert_file_range& r : ranges) {
      if (to_index(e) >= r.n_expert) return false;
      const std::uint64_t off = r.offset + to_index(e) * r.bytes_per_expert;
#if MOE_RESIDENCY_LLAMA_CPP_POSIX
      if (r.split >= fds_.size()) return false;
      const int fd = fds_[r.split];
      if (mode_ == mode::fadvise) {
#if defined(POSIX_FADV_WILLNEED)
        if (::posix_fadvise(fd, static_cast<off_t>(off), static_cast<off_t>(r.bytes_per_expert), POSIX_FADV_WILLNEED) !=
            0)
          return false;
#endif
        continue;
      }
      std::uint64_t done = 0;
      while (done < r.bytes_per_expert) {
        const ssize_t n = ::pread(fd, dst + at + done, static_cast<std::size_t>(r.bytes_per_expert - done),
                                  static_cast<off_t>(off + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        done += static_cast<std::uint64_t>(n);
      }
      at += static_cast<std::size_t>(r.bytes_per_expert);
#else
      (void)off;
      (void)dst;
      (void)at;
      return false;
#endif
    }
    return true;
  }

  /// A read callback for the speculative read scheduler (io.hpp's
  /// `read(layer, expert, reason) -> read_status`), callable from several
  /// lanes: each lane thread reads into its own thread-local buffer. The
  /// reader must outlive it.
  read_callback callback() const {
    return [this](layer_id l, expert_id e, read_reason) noexcept {
      thread_local std::vector<unsigned char> buf;
      if (mode_ == mode::pread && buf.size() < widest_) {
        try {
          buf.resize(static_cast<std::size_t>(widest_));
        } catch (...) {
          return read_status::failed;
        }
      }
      return read_into(l, e, buf.data()) ? read_status::ok : read_status::failed;
    };
  }

  /// The bytes of the last expert `read` (pread mode).
  const unsigned char* data() const noexcept { return buffer_.data(); }
  std::uint64_t widest_expert_bytes() const noexcept { return widest_; }
  std::uint64_t bytes_read() const noexcept { return bytes_; }
  std::uint64_t reads() const noexcept { return reads_; }

 private:
  void close_all() noexcept {
#if MOE_RESIDENCY_LLAMA_CPP_POSIX
    for (const int fd : fds_) ::close(fd);
#endif
    fds_.clear();
  }

  const gguf_expert_map* map_;
  mode mode_;
  std::vector<int> fds_;  // one per file of the model, as map.paths()
  std::uint64_t widest_ = 0;
  std::vector<unsigned char> buffer_;
  std::uint64_t bytes_ = 0, reads_ = 0;
};

}  // namespace moe_residency::llama_cpp
