#pragma once
/// The library's exception type and its invariant assertion.

#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>

#ifndef MOE_RESIDENCY_ASSERT
#if !defined(NDEBUG) || defined(MOE_RESIDENCY_ENABLE_ASSERTS)
#include <cstdio>
#include <cstdlib>
/// Checks an internal invariant. Active unless NDEBUG is defined (define
/// MOE_RESIDENCY_ENABLE_ASSERTS to keep it in release builds). Override by
/// defining MOE_RESIDENCY_ASSERT(cond) before including any header.
#define MOE_RESIDENCY_ASSERT(cond)                                                                             \
  ((cond) ? static_cast<void>(0)                                                                               \
          : (std::fprintf(stderr, "moe_residency: %s:%d: assertion '%s' failed\n", __FILE__, __LINE__, #cond), \
             std::abort()))
#else
#define MOE_RESIDENCY_ASSERT(cond) static_cast<void>(0)
#endif
#endif

namespace moe_residency {

/// Thrown for invalid configuration or input found at construction or parse
/// time. The message names the input, the offending value and what was
/// expected, e.g. "route_trace: line 412: expert 131 out of range [0, 128)".
///
/// Two kinds are told apart by type (as nlohmann/json's typed exceptions), so
/// a caller maps them without reading the text (the C ABI: INVALID_ARGUMENT
/// and REFUSED); everything else (a malformed file, a failed read) is `error`.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A configuration the library cannot take, whatever the machine: an option
/// out of range, one that needs another (the pool without the cache).
class configuration_error : public error {
 public:
  using error::error;
};

/// A valid configuration this model, process or machine cannot run: a dense
/// model, no expert in the file's mapping, a locking limit or memory limit
/// too low for the budget. Nothing was changed before it was thrown.
class refusal : public error {
 public:
  using error::error;
};

/// Where the library sends a human-readable warning (one line, no newline).
/// Empty means stderr, as `moe_residency: warning: <text>`. To silence
/// warnings, give a sink that ignores its argument.
using warning_sink = std::function<void(const std::string&)>;

namespace detail {
/// Delivers a warning to `sink`, or to stderr when the sink is empty.
inline void emit_warning(const warning_sink& sink, const std::string& text) {
  if (sink) sink(text);
  else std::fprintf(stderr, "moe_residency: warning: %s\n", text.c_str());
}
}  // namespace detail

}  // namespace moe_residency
