// `moe-residency drop`: the static drop replay over the recorded residency,
// decode only — the engine authors' published figures (cache-aware drop at
// fraction F, and the static keep-top-k baseline).

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "command.hpp"
#include "moe_residency/replay.hpp"

namespace {

using namespace moe_residency;

struct drop_args {
  std::string trace;
  std::string thresholds = "0.5,0.75,1.0";
  std::string keep_k;
  std::string format = "table";
};

// An empty value is no list (--keep-k's default); an empty item is an error.
std::vector<double> parse_list(const std::string& s, const std::string& option) {
  std::vector<double> out;
  if (s.empty()) return out;
  for (const std::string& item : moe_residency_cli::split_list(s, option)) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (end == item.c_str() || *end != '\0')
      throw error(option + ": '" + item + "' is not a number; expected a comma-separated list like 0.5,0.75,1.0");
    out.push_back(v);
  }
  return out;
}

void run(const drop_args& a) {
  if (a.format != "table" && a.format != "csv")
    throw error("--format: '" + a.format + "'; expected table or csv");
  const auto fractions = parse_list(a.thresholds, "--thresholds");
  const auto ks = parse_list(a.keep_k, "--keep-k");
  for (double k : ks)
    if (k != static_cast<double>(static_cast<std::size_t>(k)))
      throw error("--keep-k: " + std::to_string(k) + "; expected whole numbers like 5,4,3");
  const route_trace t = read_route_trace(a.trace);
  moe_residency_cli::require_decode_tokens(
      static_cast<std::size_t>(std::count_if(t.rows.begin(), t.rows.end(),
                                             [](const trace_row& r) { return r.phase == run_phase::decode; })),
      a.trace);
  const model_shape shape = t.shape();
  const recorded_routings rr = read_recorded_routings(t);
  std::vector<static_drop_row> rows;
  for (double f : fractions) rows.push_back(static_drop_replay(shape, rr, f));
  for (double k : ks) rows.push_back(static_keep_k_replay(shape, rr, static_cast<std::size_t>(k)));
  if (!rows.empty() && !rows.front().warning.empty()) std::cerr << "moe-residency drop: " << rows.front().warning << "\n";
  if (a.format == "csv") {
    std::cout << static_drop_csv(rows);
  } else {
    std::cout << shape.name() << " (" << a.trace << "), decode, over the recorded residency; drop: a recorded miss "
              << "with weight < F/" << shape.top_k() << ", never the top slot; keep_k: slots >= k skipped\n"
              << static_drop_table(rows);
  }
}

const moe_residency_cli::command_registrar reg{
    "drop", "Static drop replay over the recorded residency (io saved %, router weight lost %)",
    [](CLI::App& sub) {
      auto a = std::make_shared<drop_args>();
      sub.add_option("--trace", a->trace, "route trace, CSV or binary")->required();
      sub.add_option("--thresholds", a->thresholds, "drop fractions F, comma-separated (0 < F <= 1)")
          ->capture_default_str();
      sub.add_option("--keep-k", a->keep_k, "static top-k baselines, comma-separated (e.g. 5,4,3)");
      sub.add_option("--format", a->format, "table | csv")->capture_default_str();
      sub.callback([a] { run(*a); });
    }};

}  // namespace
