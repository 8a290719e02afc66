#pragma once
// Counts heap allocations so a test can assert a hot path allocates nothing.
// Include in exactly one translation unit of a test executable: it replaces
// the global allocation functions. Every throwing, nothrow, array and sized
// form is replaced, all backed by malloc/free: sanitizers supply their own
// versions of the forms left unreplaced, and mixing the two allocators is
// (rightly) reported as an alloc-dealloc mismatch.

#include <atomic>
#include <cstdlib>
#include <new>

namespace moe_residency_test {
inline std::atomic<long> g_allocations{0};
inline long allocations() noexcept { return g_allocations.load(std::memory_order_relaxed); }
inline void* counted_malloc(std::size_t n) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
}  // namespace moe_residency_test

// Kept out of line, like the deletes below: at -O3 (aarch64 release) GCC 12 inlines
// them, sees malloc, and then flags the sized operator delete on that pointer.
[[gnu::noinline]] void* operator new(std::size_t n) {
  if (void* p = moe_residency_test::counted_malloc(n)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void* operator new[](std::size_t n) {
  if (void* p = moe_residency_test::counted_malloc(n)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return moe_residency_test::counted_malloc(n);
}
[[gnu::noinline]] void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return moe_residency_test::counted_malloc(n);
}
// Kept out of line: GCC 12 inlines them at -O1 and then flags free() on memory
// "from operator new" (-Wmismatched-new-delete), which is exactly what a
// malloc-backed replacement does.
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
