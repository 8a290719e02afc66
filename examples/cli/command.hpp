#pragma once
// Subcommands of the `moe-residency` tool register themselves here, one file
// each, so adding a command never touches another command's file.

#include <CLI/CLI.hpp>

#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "checked_options.hpp"
#include "moe_residency/detail/files.hpp"
#include "moe_residency/error.hpp"

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
  command_registrar(std::string name, std::string description,
                    std::function<void(CLI::App&)> setup) {
    commands().push_back({std::move(name), std::move(description), std::move(setup)});
  }
};

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

/// Commands whose figures are per decode token (decode hit %, MiB or ms per
/// token) refuse a trace without decode rows: a 0.0 there would read as a
/// measurement. `decode_tokens` counts the trace's decode tokens.
inline void require_decode_tokens(std::size_t decode_tokens, const std::string& path) {
  if (decode_tokens == 0)
    throw moe_residency::error(path + ": no decode tokens (the trace holds only prefill rows); expected decode rows, "
                               "since this command reports figures per decode token");
}

}  // namespace moe_residency_cli
