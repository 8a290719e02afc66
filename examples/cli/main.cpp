// moe-residency: one binary, one subcommand per file in this folder.

#include <algorithm>
#include <exception>
#include <iostream>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "command.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/version.hpp"

namespace {

// What each value option takes, for the refusal of an empty value: the
// options share names across subcommands, and one name means one thing.
std::string expected_value(const std::string& option) {
  static const std::pair<const char*, const char*> table[] = {
      {"--trace", "a route trace file, or - for standard input"},
      {"--in", "a route trace file, or - for standard input"},
      {"--out", "a file to write, or - for standard output"},
      {"--config", "a timing config file (key = value lines)"},
      {"--metrics", "a per-token metrics CSV file"},
      {"--write-config", "a file to write the fitted timing config to"},
      {"--plot", "a file to write the SVG to"},
      {"--oracle-profile", "an oracle profile file"},
      {"--cells", "a lab cells CSV file"},
      {"--curve", "a lanes:MiB/s list like 1:1809.9,2:2459.8"},
      {"--fit", "the calibration cell, CONFIG@RATIO (e.g. exact@2.5)"},
      {"--budgets", "cache budgets in MiB, comma-separated"},
      {"--policies", "cache policies, comma-separated"},
      {"--policy", "a cache policy"},
      {"--lanes", "read lanes, comma-separated"},
      {"--drops", "drop fractions F or off, comma-separated"},
      {"--speculate", "none, prev-token, frequency or oracle:P"},
      {"--thresholds", "drop fractions F, comma-separated"},
      {"--keep-k", "static top-k baselines, comma-separated"},
      {"--predictors", "predictors, comma-separated: prev-token, frequency, static-hottest"},
      {"--free", "fitted parameters, comma-separated"},
      {"--manager-runs", "three metrics files BASELINE,EXACT,CACHE"},
      {"--fault-walk", "fault-walk.csv files, FILE or FILE;FILE;..."},
      {"--inline-walk", "inline-walk.csv files, FILE or FILE;FILE;..."},
  };
  for (const auto& [name, what] : table)
    if (option == name) return what;
  return "a value (see --help)";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"moe-residency: predict Mixture-of-Experts routing and decide expert residency"};
  app.set_version_flag("--version", std::to_string(MOE_RESIDENCY_VERSION_MAJOR) + "." +
                                        std::to_string(MOE_RESIDENCY_VERSION_MINOR) + "." +
                                        std::to_string(MOE_RESIDENCY_VERSION_PATCH));
  app.require_subcommand(1);
  auto& cmds = moe_residency_cli::commands();
  std::sort(cmds.begin(), cmds.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (auto& c : cmds) {
    CLI::App& sub = *app.add_subcommand(c.name, c.description);
    c.setup(sub);
    // An empty value is an error in every option, never "not given" (a
    // number's or a choice's own check, added first, words it for that option).
    for (CLI::Option* o : sub.get_options())
      if (o->get_items_expected_min() > 0) o->check(moe_residency_cli::non_empty(expected_value(o->get_name())));
  }
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
  } catch (const std::bad_alloc&) {
    // Bounded inputs should never get here; if one does, say what was being sized.
    std::cerr << "moe-residency: out of memory while " << moe_residency_cli::current_activity()
              << "; expected the machine to hold it (a smaller input, or more memory)\n";
    return 2;
  } catch (const std::length_error& e) {
    std::cerr << "moe-residency: a size beyond this machine's limits while " << moe_residency_cli::current_activity()
              << " (" << e.what() << ")\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "moe-residency: unexpected error: " << e.what() << "\n";
    return 3;
  }
  return 0;
}
