#pragma once
// Subcommands of the `moe-residency` tool register themselves here, one file
// each, so adding a command never touches another command's file.

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "checked_options.hpp"
#include "moe_residency/detail/files.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/replay/cells.hpp"
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

/// What the command is doing, for the message of an out-of-memory error
/// (main.cpp): "reading the route trace t.csv". Set by `activity`.
inline std::string& current_activity() {
  static std::string what = "running the command";
  return what;
}

/// Names what the command does while it lives (nested: the innermost wins).
/// Left in place when an exception unwinds it: main() catches the error after
/// the unwinding, and must still see what was being done.
class activity {
 public:
  explicit activity(std::string what) : outer_(current_activity()), unwinding_(std::uncaught_exceptions()) {
    current_activity() = std::move(what);
  }
  ~activity() {
    if (std::uncaught_exceptions() == unwinding_) current_activity() = std::move(outer_);
  }
  activity(const activity&) = delete;
  activity& operator=(const activity&) = delete;

 private:
  std::string outer_;
  int unwinding_;
};

// The options several subcommands share, declared in one place so that each
// has the same name, help and refusal everywhere.

/// --trace: a route trace, CSV or binary (read_trace detects which); - for standard input.
inline CLI::Option* add_trace_option(CLI::App& sub, std::string& path, const std::string& what = "route trace") {
  return sub.add_option("--trace", path, what + ", CSV or binary; - for standard input")
      ->required()
      ->check(non_empty("a route trace file, or - for standard input"));
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

/// A cache budget in MiB: a decimal number in budget_mib_domain() that is at
/// least one byte once rounded to bytes. Throws naming `what` (the option):
///   --budgets (MiB): '1e-7' is 0 bytes once rounded to whole bytes; expected ...
inline double parse_budget_mib(const std::string& text, const std::string& what) {
  const double v = moe_residency::detail::parse_real(text, what, moe_residency::budget_mib_domain());
  if (moe_residency::from_mib(v) == 0)
    throw moe_residency::error(what + ": '" + text +
                               "' is 0 bytes once rounded to whole bytes; expected at least one byte (>= 4.8e-07 MiB)");
  return v;
}

/// parse_budget_mib as a CLI11 validator (an option of one budget).
inline CLI::Validator budget_mib() {
  return CLI::Validator(
      [](std::string& s) {
        try {
          parse_budget_mib(s, "x");
        } catch (const moe_residency::error& e) {
          return std::string(e.what()).substr(3);  // CLI11 prefixes the option's name
        }
        return std::string();
      },
      "REAL: MiB > 0");
}

/// The whole regular file at `path`; throws moe_residency::error naming the
/// option that gave it (`option`, e.g. "--config"), the path and what is
/// wrong: it is a directory, a FIFO or a device, or cannot be opened or read
/// (with the system's reason).
inline std::string read_whole_file(const std::string& path, const char* option) {
  const activity doing(std::string("reading ") + option + " " + path);
  try {
    return moe_residency::detail::read_input_file(path, "a regular file",
                                                  moe_residency::detail::text_head(path, "a text file"));
  } catch (const moe_residency::error& e) {
    throw moe_residency::error(std::string(option) + ": " + e.what());
  }
}

/// The route trace at `path` as read_trace_file reads it, and its model shape
/// checked (a top-k the library cannot replay, a routed layer without bytes),
/// the message naming the file, for every command that builds the shape.
inline moe_residency::validated_route_trace read_trace_file(const std::string& path);
inline moe_residency::validated_route_trace read_trace(const std::string& path) {
  moe_residency::validated_route_trace t = read_trace_file(path);
  try {
    (void)t.shape();
  } catch (const moe_residency::error& e) {
    throw moe_residency::error((path == "-" ? std::string("<stdin>") : path) + ": " + e.what());
  }
  return t;
}

/// The route trace at `path`, or on standard input for "-" (a trace piped
/// from a decompressor or another tool: `zcat t.csv.gz | moe-residency
/// replay --trace -`), named "<stdin>" in messages. A CSV's magic line is
/// checked in the first 64 KiB, before the rest is read.
inline moe_residency::validated_route_trace read_trace_file(const std::string& path) {
  using namespace moe_residency;
  const activity doing("reading the route trace " + path);
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
  // Compressed data and UTF-16 are named (csv_parser's magic check), as from a file.
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
