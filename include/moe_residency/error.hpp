#pragma once
/// The library's exception type and its invariant assertion.

#include <stdexcept>
#include <string>

#ifndef MOE_RESIDENCY_ASSERT
#if !defined(NDEBUG) || defined(MOE_RESIDENCY_ENABLE_ASSERTS)
#include <cstdio>
#include <cstdlib>
/// Checks an internal invariant. Active unless NDEBUG is defined (define
/// MOE_RESIDENCY_ENABLE_ASSERTS to keep it in release builds). Override by
/// defining MOE_RESIDENCY_ASSERT(cond) before including any header.
#define MOE_RESIDENCY_ASSERT(cond)                                             \
  ((cond) ? static_cast<void>(0)                                               \
          : (std::fprintf(stderr, "moe_residency: %s:%d: assertion '%s' failed\n", \
                          __FILE__, __LINE__, #cond),                          \
             std::abort()))
#else
#define MOE_RESIDENCY_ASSERT(cond) static_cast<void>(0)
#endif
#endif

namespace moe_residency {

/// Thrown for invalid configuration or input found at construction or parse
/// time. The message names the input, the offending value and what was
/// expected, e.g. "route_trace: line 412: expert 131 out of range [0, 128)".
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace moe_residency
