#pragma once
// Shared test support: where the real traces are, and how a suite that needs
// them skips (loudly) on a user's machine but fails under CI=true.

#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace moe_residency_test {

/// MOE_RESIDENCY_TRACES, else ../shared/traces next to the source tree.
inline std::string traces_dir() {
  if (const char* env = std::getenv("MOE_RESIDENCY_TRACES"); env && *env) return env;
  return MOE_RESIDENCY_DEFAULT_TRACES;
}

inline bool file_exists(const std::string& path) {
  std::ifstream f(path);
  return f.good();
}

inline bool running_in_ci() {
  const char* ci = std::getenv("CI");
  return ci && std::string(ci) == "true";
}

/// Path of a real trace file, or "" when the folder is absent. Absent under
/// CI=true is a failure; elsewhere the caller skips with a loud message.
inline std::string real_trace(const std::string& name) {
  const std::string path = traces_dir() + "/" + name;
  if (file_exists(path)) return path;
  if (running_in_ci()) {
    FAIL("real trace " << path << " is missing and CI=true; set MOE_RESIDENCY_TRACES");
  }
  MESSAGE("SKIPPED: real trace " << path
          << " not found (set MOE_RESIDENCY_TRACES to the shared/traces folder)");
  return {};
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace moe_residency_test
