#pragma once
// Subcommands of the `moe-residency` tool register themselves here, one file
// each, so adding a command never touches another command's file.

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "checked_options.hpp"
#include "moe_residency/detail/files.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/trace.hpp"

namespace moe_residency_cli {

struct command {
  std::string name;
  std::string description;
  /// Adds options to `sub` and sets its callback.
  std::function<void(CLI::App& sub)> setup;
};

inline std::vector<command>& commands() {
  static std::vector<command> all;
  return all;
}

/// `static const command_registrar reg{"name", "what it does", setup};` in a .cpp.
struct command_registrar {
  command_registrar(std::string name, std::string description, std::function<void(CLI::App&)> setup) {
    commands().push_back({std::move(name), std::move(description), std::move(setup)});
  }
};

// The options several subcommands share, declared in one place so that each
// has the same name, help and refusal everywhere.

/// --trace: a route trace, CSV or binary (read_trace detects which); - for standard input.
inline CLI::Option* add_trace_option(CLI::App& sub, std::string& path, const std::string& what = "route trace") {
  return sub.add_option("--trace", path, what + ", CSV or binary; - for standard input")->required();
}

/// --format: one of `forms`; the default is the value `format` holds when called.
inline CLI::Option* add_format_option(CLI::App& sub, std::string& format, std::vector<std::string> forms) {
  return sub.add_option("--format", format, "output form: " + either(forms))
      ->check(one_of(std::move(forms)))
      ->capture_default_str();
}

/// --preset: one of the built-in models `names`; the default is the value `preset` holds when called.
inline CLI::Option* add_preset_option(CLI::App& sub, std::string& preset, std::vector<std::string> names) {
  return sub.add_option("--preset", preset, "built-in model: " + either(names))
      ->check(one_of(std::move(names)))
      ->capture_default_str();
}

/// The whole regular file at `path`; throws moe_residency::error naming the
/// option that gave it (`option`, e.g. "--config"), the path and what is
/// wrong: it is a directory, a FIFO or a device, or cannot be opened or read
/// (with the system's reason).
inline std::string read_whole_file(const std::string& path, const char* option) {
  try {
    return moe_residency::detail::read_input_file(path, "a regular file",
                                                  moe_residency::detail::text_head(path, "a text file"));
  } catch (const moe_residency::error& e) {
    throw moe_residency::error(std::string(option) + ": " + e.what());
  }
}

/// The route trace at `path`, or on standard input for "-" (a trace piped
/// from a decompressor or another tool: `zcat t.csv.gz | moe-residency
/// replay --trace -`), named "<stdin>" in messages. A CSV's magic line is
/// checked in the first 64 KiB, before the rest is read.
inline moe_residency::validated_route_trace read_trace(const std::string& path) {
  using namespace moe_residency;
  if (path != "-") return read_route_trace(path);
  const std::string source = "<stdin>";
  std::string bytes;
  auto read_up_to = [&](std::size_t limit) {  // fread: no per-character stream syncing
    char buf[1 << 16];
    while (bytes.size() < limit) {
      const std::size_t n = std::fread(buf, 1, std::min(sizeof buf, limit - bytes.size()), stdin);
      bytes.append(buf, n);
      if (n == 0) break;
    }
    if (std::ferror(stdin))
      throw error(source + ": read failed after " + std::to_string(bytes.size()) + " bytes: " + std::strerror(errno));
  };
  read_up_to(detail::input_head_bytes);
  const bool binary = !bytes.empty() && static_cast<unsigned char>(bytes[0]) == 0x89;
  if (!binary) detail::csv_parser(bytes, source).check_magic();  // a binary frame needs the size: checked whole
  read_up_to(std::numeric_limits<std::size_t>::max());
  if (binary) return parse_route_trace_binary(bytes, source);
  return parse_route_trace_csv(bytes, source);
}

/// Commands whose figures are per decode token (decode hit %, MiB or ms per
/// token) refuse a trace without decode rows: a 0.0 there would read as a
/// measurement. `decode_tokens` counts the trace's decode tokens.
inline void require_decode_tokens(std::size_t decode_tokens, const std::string& path) {
  if (decode_tokens == 0)
    throw moe_residency::error(path +
                               ": no decode tokens (the trace holds only prefill rows); expected decode rows, "
                               "since this command reports figures per decode token");
}

}  // namespace moe_residency_cli
