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

void run(const drop_args& a) {
  std::vector<double> fractions;
  for (const std::string& f : moe_residency_cli::split_list(a.thresholds, "--thresholds"))
    fractions.push_back(detail::parse_real(f, "--thresholds", detail::real_domain::open_closed(0, 1)));
  std::vector<std::size_t> ks;  // --keep-k's default is no list
  if (!a.keep_k.empty())
    for (const std::string& k : moe_residency_cli::split_list(a.keep_k, "--keep-k"))
      ks.push_back(detail::parse_whole<std::size_t>(k, "--keep-k", 1, 32));
  const route_trace t = moe_residency_cli::read_trace(a.trace);
  moe_residency_cli::require_decode_tokens(
      static_cast<std::size_t>(
          std::count_if(t.rows.begin(), t.rows.end(), [](const trace_row& r) { return r.phase == run_phase::decode; })),
      a.trace);
  const model_shape shape = t.shape();
  const recorded_routings rr = read_recorded_routings(t);
  std::vector<static_drop_row> rows;
  for (double f : fractions) rows.push_back(static_drop_replay(shape, rr, f));
  for (std::size_t k : ks) rows.push_back(static_keep_k_replay(shape, rr, k));
  if (!rows.empty() && !rows.front().warning.empty())
    std::cerr << "moe-residency drop: " << rows.front().warning << "\n";
  if (a.format == "csv") {
    std::cout << static_drop_csv(rows);
  } else {
    std::cout << shape.name() << " (" << a.trace << "), decode, over the recorded residency; drop: a recorded miss "
              << "with weight < F/" << shape.top_k() << ", never the top slot; keep_k: slots >= k skipped\n"
              << static_drop_table(rows);
  }
}

const moe_residency_cli::command_registrar reg{
    "drop", "Static drop replay over the recorded residency (io saved %, router weight lost %)", [](CLI::App& sub) {
      auto a = std::make_shared<drop_args>();
      moe_residency_cli::add_trace_option(sub, a->trace);
      sub.add_option("--thresholds", a->thresholds, "drop fractions F, comma-separated (0 < F <= 1)")
          ->capture_default_str();
      sub.add_option("--keep-k", a->keep_k, "static top-k baselines, comma-separated (e.g. 5,4,3)");
      moe_residency_cli::add_format_option(sub, a->format, {"table", "csv"});
      sub.callback([a] { run(*a); });
    }};

}  // namespace
