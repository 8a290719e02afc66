#pragma once
// Subcommands of the `moe-residency` tool register themselves here, one file
// each, so adding a command never touches another command's file.

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

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

}  // namespace moe_residency_cli
