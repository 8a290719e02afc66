// moe-residency: one binary, one subcommand per file in this folder.

#include <algorithm>
#include <exception>
#include <iostream>

#include "command.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/version.hpp"

int main(int argc, char** argv) {
  CLI::App app{"moe-residency: predict Mixture-of-Experts routing and decide expert residency"};
  app.set_version_flag("--version", std::to_string(MOE_RESIDENCY_VERSION_MAJOR) + "." +
                                        std::to_string(MOE_RESIDENCY_VERSION_MINOR) + "." +
                                        std::to_string(MOE_RESIDENCY_VERSION_PATCH));
  app.require_subcommand(1);
  auto& cmds = moe_residency_cli::commands();
  std::sort(cmds.begin(), cmds.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (auto& c : cmds) c.setup(*app.add_subcommand(c.name, c.description));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // A refused option exits 2 and is worded as every other refusal.
    std::cerr << "moe-residency: " << e.what() << "\nRun with --help for more information.\n";
    return 2;
  } catch (const moe_residency::error& e) {
    std::cerr << "moe-residency: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "moe-residency: unexpected error: " << e.what() << "\n";
    return 3;
  }
  return 0;
}
