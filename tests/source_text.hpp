#pragma once
// Reading the repository's own text from a test: a whole file, and the lines
// of a block between two markers. The docs tests use them to hold a docs
// page's code block to the code a test runs (the test reads its own source,
// so the code is written once). Standard library only: the llama.cpp suites
// include it too.

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace moe_residency_test {

/// The whole file ("" when it cannot be read; callers REQUIRE it non-empty).
inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

/// The lines between the first line starting with `begin` and the next one
/// starting with `end` (both exclusive), each with its leading and trailing
/// blanks removed; empty when either marker is not found.
inline std::vector<std::string> block_lines(const std::string& text, const std::string& begin, const std::string& end) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    const auto first = line.find_first_not_of(" \t\r");
    const auto last = line.find_last_not_of(" \t\r");
    const std::string t = first == std::string::npos ? "" : line.substr(first, last - first + 1);
    if (!inside) {
      if (t.rfind(begin, 0) == 0) inside = true;
      continue;
    }
    if (t.rfind(end, 0) == 0) return out;
    out.push_back(t);
  }
  return {};  // no end marker: not a block
}

}  // namespace moe_residency_test
