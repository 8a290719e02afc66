#pragma once
/// Memory advice on a mapping: the small interface through which the mmap
/// residency manager (residency.hpp) acts on the kernel, so tests can replace
/// the kernel with a fake that records every call.
///
/// | advice         | Linux call                      | what it does to a file-backed shared mapping |
/// |----------------|---------------------------------|----------------------------------------------|
/// | willneed       | madvise(MADV_WILLNEED)          | starts asynchronous reads of the range into the page cache, in large requests |
/// | populate_read  | madvise(MADV_POPULATE_READ)     | faults the range in and waits for it (Linux >= 5.14) |
/// | lock           | mlock                           | faults the range in and keeps it out of reclaim |
/// | unlock         | munlock                         | lets reclaim take the range again |
/// | cold           | madvise(MADV_COLD)              | moves the pages to the inactive list: reclaimed first (Linux >= 5.4) |
/// | pageout        | madvise(MADV_PAGEOUT)           | reclaims the pages now (Linux >= 5.4) |
/// | random         | madvise(MADV_RANDOM)            | faults read one page, no read-around |
/// | normal         | madvise(MADV_NORMAL)            | the default read-around on faults |
/// | read           | sendfile(/dev/null, file, range)| an owned read: the range's file pages read into the page cache in large requests, waited for, copied nowhere and not mapped (needs attach_file) |
/// | place          | pread(O_DIRECT) + mmap(MAP_FIXED)| the expert pool: the range's file bytes read past the page cache into pool memory, which is then mapped over the range in place of the file's pages (same bytes, read-only, shared); needs attach_file and attach_pool |
/// | restore        | mmap(MAP_FIXED) of the file     | the file's pages mapped over the range again, as llama.cpp mapped them (undoes place) |
///
/// `read` is the manager's own read: unlike willneed it is not cut to the
/// device's read-ahead window, allocates the page cache's large folios (the
/// kernel's buffered-read path, not its forced read-ahead: about a third of
/// willneed's kernel time per MiB in the memory lab), and unlike
/// populate_read it neither faults page by page nor maps what it reads, so a
/// lane's cost per MiB is the device's.
///
/// `place` is the expert pool's (residency_options::pool): the pool is memory
/// the advice allocates once (a memfd, populated and charged at attach), so
/// an admitted expert costs no page-cache allocation, no memory-cgroup charge
/// and no reclaim of the page it replaces: a direct read into memory that is
/// already there, and one mapping change. The mapping's contents never change
/// (the pool holds the file's own bytes), so what the engine computes does not.
/// Other POSIX systems get what they have (posix_madvise WILLNEED/RANDOM/
/// NORMAL, mlock/munlock) and `unsupported` (ENOSYS) for the rest; Windows
/// gets `unsupported` for everything. Android is Linux: every call exists
/// there (mlock is bounded by RLIMIT_MEMLOCK, often 64 KiB for apps).

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/sendfile.h>
#endif
#define MOE_RESIDENCY_ADVICE_POSIX 1
#else
#define MOE_RESIDENCY_ADVICE_POSIX 0
#endif

namespace moe_residency::llama_cpp {

/// One kind of memory advice (see the table above).
enum class advice : std::uint8_t {
  willneed,
  populate_read,
  lock,
  unlock,
  cold,
  pageout,
  random,
  normal,
  read,
  place,
  restore
};
inline constexpr std::size_t advice_kinds = 11;

inline const char* to_string(advice a) noexcept {
  switch (a) {
    case advice::willneed: return "willneed";
    case advice::populate_read: return "populate_read";
    case advice::lock: return "lock";
    case advice::unlock: return "unlock";
    case advice::cold: return "cold";
    case advice::pageout: return "pageout";
    case advice::random: return "random";
    case advice::normal: return "normal";
    case advice::read: return "read";
    case advice::place: return "place";
    case advice::restore: return "restore";
  }
  return "?";
}

/// The interface. Every member is noexcept and thread-safe (the manager calls
/// `apply` from its read lanes as well as from the eval thread).
class memory_advice {
 public:
  virtual ~memory_advice() = default;
  /// Applies `a` to [addr, addr + len) (addr page-aligned, len > 0).
  /// Returns 0, or the errno of the failure; ENOSYS when the system has no
  /// such call.
  virtual int apply(advice a, void* addr, std::size_t len) noexcept = 0;
  /// Pages of [addr, addr + len) resident in memory right now (mincore); -1
  /// when the system cannot say. addr page-aligned.
  virtual long resident_pages(void* addr, std::size_t len) noexcept = 0;
  /// The page size every range is aligned to.
  virtual std::size_t page_size() const noexcept = 0;
  /// advice::read needs the mapped file: `path`, and where its offset 0 is
  /// mapped (`base`; `size` bytes of file); called once per file of a split
  /// model. Returns 0, or the errno (ENOSYS: this advice has no owned reads,
  /// and the manager populates instead; EBUSY: the range overlaps a file
  /// attached before).
  virtual int attach_file(const std::string& path, const void* base, std::uint64_t size) noexcept {
    (void)path;
    (void)base;
    (void)size;
    return ENOSYS;
  }
  /// The expert pool: `bytes` of memory owned by the advice, allocated (and
  /// charged to the memory cgroup) now, for place. Called once, after
  /// attach_file. Returns 0, or the errno (ENOSYS: this advice has no pool;
  /// ENOMEM: the memory could not be had). A failure leaves nothing allocated.
  virtual int attach_pool(std::uint64_t bytes) noexcept {
    (void)bytes;
    return ENOSYS;
  }
  /// Reads the file bytes behind [addr, addr + len) (page-aligned, inside an
  /// attached file's mapping) into the pool at `pool_offset` (page-aligned,
  /// inside the pool) and maps that pool memory over [addr, addr + len) in
  /// place of the file's pages. Returns 0, or the errno; on failure the
  /// range is left mapped to the file. undo with apply(advice::restore, …).
  virtual int place(void* addr, std::size_t len, std::uint64_t pool_offset) noexcept {
    (void)addr;
    (void)len;
    (void)pool_offset;
    return ENOSYS;
  }
  /// Bytes the process may lock (RLIMIT_MEMLOCK); UINT64_MAX when unlimited
  /// or when the process holds CAP_IPC_LOCK (the kernel's implementation reads
  /// CapEff; root in a container may lack it).
  virtual std::uint64_t lock_limit() const noexcept = 0;
};

/// The kernel's advice (see the table in this header).
class system_memory_advice final : public memory_advice {
 public:
  system_memory_advice() = default;
  system_memory_advice(const system_memory_advice&) = delete;
  system_memory_advice& operator=(const system_memory_advice&) = delete;
  ~system_memory_advice() override {
#if MOE_RESIDENCY_ADVICE_POSIX
    for (const attached& f : files_) {
      ::close(f.fd);
      if (f.direct_fd >= 0) ::close(f.direct_fd);
    }
    if (null_fd_ >= 0) ::close(null_fd_);
    if (pool_ != nullptr) ::munmap(pool_, static_cast<std::size_t>(pool_bytes_));
    if (pool_fd_ >= 0) ::close(pool_fd_);
#endif
  }

  int attach_file(const std::string& path, const void* base, std::uint64_t size) noexcept override {
#if MOE_RESIDENCY_ADVICE_POSIX
    const auto* b = static_cast<const unsigned char*>(base);
    for (const attached& f : files_)
      if (b < f.base + f.size && f.base < b + size) return EBUSY;
    try {
      files_.reserve(files_.size() + 1);  // the only allocation: nothing leaks past it
    } catch (...) {
      return ENOMEM;
    }
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno;
#if defined(__linux__)
    if (null_fd_ < 0) {
      null_fd_ = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
      if (null_fd_ < 0) {
        const int e = errno;
        ::close(fd);
        return e;
      }
    }
    // Exactly the range asked for: the kernel's read-ahead would widen every
    // read to its window (2x an expert slice at an 8 MiB read-ahead) and
    // follow it with an asynchronous read of the next one, which the cache
    // never asked for and which pushes out what it did.
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
#endif
    // A second descriptor past the page cache for place (O_DIRECT); where the
    // file system refuses it, place reads through the first one.
#if defined(__linux__) && defined(O_DIRECT)
    const int direct_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
#else
    const int direct_fd = -1;
#endif
    files_.push_back(attached{fd, direct_fd, b, size});
    return 0;
#else
    (void)path;
    (void)base;
    (void)size;
    return ENOSYS;
#endif
  }

  int attach_pool(std::uint64_t bytes) noexcept override {
#if defined(__linux__) && defined(MFD_CLOEXEC)
    if (pool_ != nullptr) return EBUSY;
    if (bytes == 0 || bytes > SIZE_MAX / 2) return EINVAL;
    const int fd = ::memfd_create("moe-residency-expert-pool", MFD_CLOEXEC);
    if (fd < 0) return errno;
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const int e = errno;
      ::close(fd);
      return e;
    }
    // Populated now: the pool's memory is allocated and charged once, here,
    // not page by page under the engine's matmuls; a limit that cannot hold
    // it fails this call (or the cgroup's OOM killer ends the process here,
    // before the first token, which the auto budget is sized to avoid).
    void* p =
        ::mmap(nullptr, static_cast<std::size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      return e;
    }
    pool_fd_ = fd;
    pool_ = static_cast<unsigned char*>(p);
    pool_bytes_ = bytes;
    return 0;
#else
    (void)bytes;
    return ENOSYS;
#endif
  }

  int place(void* addr, std::size_t len, std::uint64_t pool_offset) noexcept override {
#if defined(__linux__)
    const attached* f = file_at(addr);
    const std::size_t page = page_size();
    if (pool_ == nullptr || f == nullptr) return ENOSYS;
    const auto* p = static_cast<const unsigned char*>(addr);
    const std::uint64_t off = static_cast<std::uint64_t>(p - f->base);
    if (len == 0 || off % page != 0 || len % page != 0 || pool_offset % page != 0 || pool_offset > pool_bytes_ ||
        len > pool_bytes_ - pool_offset || off + len > f->size + page)
      return EINVAL;
    unsigned char* dst = pool_ + pool_offset;
    std::uint64_t done = 0;
    bool direct = f->direct_fd >= 0;
    while (done < len) {
      const ssize_t n = ::pread(direct ? f->direct_fd : f->fd, dst + done, static_cast<std::size_t>(len - done),
                                static_cast<off_t>(off + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EINVAL && direct) {  // the file system takes no direct reads here
        direct = false;
        continue;
      }
      if (n < 0) return errno;
      if (n == 0) {  // the file's end: the last page's tail is zeros, as the mapping shows it
        std::memset(dst + done, 0, static_cast<std::size_t>(len - done));
        break;
      }
      done += static_cast<std::uint64_t>(n);
    }
    if (::mmap(addr, len, PROT_READ, MAP_SHARED | MAP_FIXED | MAP_POPULATE, pool_fd_,
               static_cast<off_t>(pool_offset)) == MAP_FAILED) {
      const int e = errno;
      // A failed MAP_FIXED may have unmapped the range: map the file back.
      (void)::mmap(addr, len, PROT_READ, MAP_SHARED | MAP_FIXED, f->fd, static_cast<off_t>(off));
      return e;
    }
    return 0;
#else
    (void)addr;
    (void)len;
    (void)pool_offset;
    return ENOSYS;
#endif
  }

  int apply(advice a, void* addr, std::size_t len) noexcept override {
#if MOE_RESIDENCY_ADVICE_POSIX
    if (a == advice::read) return read_range(addr, len);
    if (a == advice::place) return EINVAL;  // place() takes the pool's offset
    if (a == advice::restore) return restore_range(addr, len);
    int rc = 0;
    switch (a) {
      case advice::lock: rc = ::mlock(addr, len); break;
      case advice::unlock: rc = ::munlock(addr, len); break;
#if defined(__linux__)
      case advice::willneed: rc = ::madvise(addr, len, MADV_WILLNEED); break;
      case advice::random: rc = ::madvise(addr, len, MADV_RANDOM); break;
      case advice::normal: rc = ::madvise(addr, len, MADV_NORMAL); break;
      case advice::populate_read: rc = ::madvise(addr, len, linux_populate_read); break;
      case advice::cold: rc = ::madvise(addr, len, linux_cold); break;
      case advice::pageout: rc = ::madvise(addr, len, linux_pageout); break;
#else
      case advice::willneed: return ::posix_madvise(addr, len, POSIX_MADV_WILLNEED);
      case advice::random: return ::posix_madvise(addr, len, POSIX_MADV_RANDOM);
      case advice::normal: return ::posix_madvise(addr, len, POSIX_MADV_NORMAL);
      default: return ENOSYS;
#endif
      case advice::read:
      case advice::place:
      case advice::restore: break;  // above
    }
    return rc == 0 ? 0 : errno;
#else
    (void)a;
    (void)addr;
    (void)len;
    return ENOSYS;
#endif
  }

  long resident_pages(void* addr, std::size_t len) noexcept override {
#if MOE_RESIDENCY_ADVICE_POSIX
    constexpr std::size_t chunk = 1024;
#if defined(__linux__)
    unsigned char vec[chunk];
#else
    char vec[chunk];
#endif
    const std::size_t page = page_size();
    long resident = 0;
    auto* p = static_cast<unsigned char*>(addr);
    std::size_t pages = (len + page - 1) / page;
    while (pages > 0) {
      const std::size_t n = pages < chunk ? pages : chunk;
      if (::mincore(p, n * page, vec) != 0) return -1;
      for (std::size_t i = 0; i < n; ++i) resident += vec[i] & 1;
      p += n * page;
      pages -= n;
    }
    return resident;
#else
    (void)addr;
    (void)len;
    return -1;
#endif
  }

  std::size_t page_size() const noexcept override {
#if MOE_RESIDENCY_ADVICE_POSIX
    const long p = ::sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<std::size_t>(p) : 4096;
#else
    return 4096;
#endif
  }

  std::uint64_t lock_limit() const noexcept override {
#if MOE_RESIDENCY_ADVICE_POSIX
    rlimit r{};
    if (::getrlimit(RLIMIT_MEMLOCK, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return UINT64_MAX;
    if (has_ipc_lock()) return UINT64_MAX;  // CAP_IPC_LOCK bypasses the limit (root in a container may lack it)
    return static_cast<std::uint64_t>(r.rlim_cur);
#else
    return 0;
#endif
  }

 private:
  struct attached {
    int fd;
    int direct_fd;              // O_DIRECT, for place (-1: none)
    const unsigned char* base;  // where its offset 0 is mapped
    std::uint64_t size;
  };

#if MOE_RESIDENCY_ADVICE_POSIX
  // The attached file whose mapping holds addr (null: none).
  const attached* file_at(const void* addr) const noexcept {
    const auto* p = static_cast<const unsigned char*>(addr);
    for (const attached& f : files_)
      if (p >= f.base && static_cast<std::uint64_t>(p - f.base) < f.size) return &f;
    return nullptr;
  }

  // advice::restore: the file's pages mapped over [addr, addr + len) again,
  // read-only and shared as llama.cpp maps the model (llama-mmap.cpp).
  int restore_range(void* addr, std::size_t len) const noexcept {
    const attached* f = file_at(addr);
    if (f == nullptr) return files_.empty() ? ENOSYS : EFAULT;
    const auto off = static_cast<off_t>(static_cast<const unsigned char*>(addr) - f->base);
    return ::mmap(addr, len, PROT_READ, MAP_SHARED | MAP_FIXED, f->fd, off) == MAP_FAILED ? errno : 0;
  }

  // advice::read of [addr, addr + len) of the attached file's mapping, clipped to the file.
  int read_range(const void* addr, std::size_t len) const noexcept {
    const auto* p = static_cast<const unsigned char*>(addr);
    const attached* file = file_at(addr);
    if (file == nullptr) return files_.empty() ? ENOSYS : EFAULT;
    const int fd = file->fd;
    off_t off = static_cast<off_t>(p - file->base);
    std::uint64_t left = std::min<std::uint64_t>(len, file->size - static_cast<std::uint64_t>(off));
#if defined(__linux__)
    // sendfile to /dev/null: the buffered read path into the page cache, and
    // nothing copied out of it (the pages pass through a pipe by reference).
    while (left > 0) {
      const ssize_t n =
          ::sendfile(null_fd_, fd, &off, static_cast<std::size_t>(std::min<std::uint64_t>(left, 1u << 30)));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return errno;
      if (n == 0) return EIO;  // the file is shorter than it was
      left -= static_cast<std::uint64_t>(n);
    }
#else
    // Elsewhere a pread into a scratch buffer: the same pages cached, one copy.
    thread_local std::vector<unsigned char> buf(1u << 20);
    while (left > 0) {
      const ssize_t n =
          ::pread(fd, buf.data(), static_cast<std::size_t>(std::min<std::uint64_t>(left, buf.size())), off);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return errno;
      if (n == 0) return EIO;
      off += n;
      left -= static_cast<std::uint64_t>(n);
    }
#endif
    return 0;
  }
#endif

  std::vector<attached> files_;  // attach_file's, one per file of the model
  int null_fd_ = -1;
  int pool_fd_ = -1;               // attach_pool's memfd
  unsigned char* pool_ = nullptr;  // its read-write mapping (place's reads land here)
  std::uint64_t pool_bytes_ = 0;

  // CAP_IPC_LOCK (bit 14) in the effective set, from /proc/self/status.
  static bool has_ipc_lock() noexcept {
#if defined(__linux__)
    std::FILE* f = std::fopen("/proc/self/status", "r");
    if (f == nullptr) return false;
    char line[256];
    unsigned long long caps = 0;
    bool found = false;
    while (!found && std::fgets(line, sizeof line, f) != nullptr) found = std::sscanf(line, "CapEff: %llx", &caps) == 1;
    std::fclose(f);
    return found && ((caps >> 14) & 1u) != 0;
#else
    return false;
#endif
  }

#if defined(__linux__)
  // The values of <asm-generic/mman-common.h>, for C libraries that predate them.
#ifdef MADV_POPULATE_READ
  static constexpr int linux_populate_read = MADV_POPULATE_READ;
#else
  static constexpr int linux_populate_read = 22;
#endif
#ifdef MADV_COLD
  static constexpr int linux_cold = MADV_COLD;
#else
  static constexpr int linux_cold = 20;
#endif
#ifdef MADV_PAGEOUT
  static constexpr int linux_pageout = MADV_PAGEOUT;
#else
  static constexpr int linux_pageout = 21;
#endif
#endif
};

}  // namespace moe_residency::llama_cpp
