// `moe-residency convert`: route trace CSV <-> binary.
// `moe-residency trace-info`: what a route trace holds (shape, rows, batches, token cycle).

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "command.hpp"
#include "moe_residency/trace.hpp"
#include "output.hpp"

namespace {

using namespace moe_residency;
using moe_residency_cli::check_output_path;
using moe_residency_cli::write_output_file;

void convert(const std::string& in, const std::string& out, std::string to) {
  const bool to_stdout = out == "-";
  if (!to_stdout) check_output_path(out, "--out", {{"--in", in}});  // before the input is read
  // Validated once, written without a second pass; no shape needed (a top-k above 32 converts).
  const validated_route_trace t = moe_residency_cli::read_trace_file(in);
  if (to.empty()) to = t.binary_version() != 0 ? "csv" : "binary";
  if (t.noncanonical_weights())
    std::fprintf(stderr,
                 "moe-residency: warning: %zu weights in %s are not in the engine's %%g form; they are written as "
                 "the nearest float in %%g (6 significant digits), not as their original text\n",
                 t.noncanonical_weights(), in.c_str());
  auto write = [&](std::ostream& f) {
    if (to == "csv") write_route_trace_csv(t, f);
    else write_route_trace_binary(t, f);
  };
  if (to_stdout) {  // the trace is the output: the summary goes to stderr
    write(std::cout);
    std::cout.flush();
    if (!std::cout) throw error("--out -: writing to standard output failed");
  } else {
    write_output_file(out, "--out", {{"--in", in}}, write);
  }
  std::fprintf(to_stdout ? stderr : stdout, "%s -> %s (%s): %zu rows\n", in.c_str(), out.c_str(), to.c_str(),
               t.rows().size());
}

void trace_info(const std::string& path) {
  const validated_route_trace t = moe_residency_cli::read_trace(path);
  const trace_header& h = t.header();
  const std::vector<trace_row>& rows = t.rows();
  std::printf("%s: %s (%s)\n", path.c_str(), h.arch.c_str(), h.model.c_str());
  const model_shape s = t.shape();
  std::printf("shape: %zu layers (%zu MoE), %zu experts per layer, top-%zu\n", s.n_layers(), s.n_moe_layers(),
              s.n_experts(), s.top_k());
  std::uint64_t lo = UINT64_MAX, hi = 0;
  for (std::size_t l = 0; l < s.n_layers(); ++l) {
    const auto b = s.expert_bytes(layer_id(static_cast<std::uint16_t>(l)));
    if (!b) continue;
    lo = std::min(lo, b);
    hi = std::max(hi, b);
  }
  std::printf("expert bytes: %.2f to %.2f MiB per expert\n", to_mib(lo), to_mib(hi));
  std::printf("token cycle: %.1f MiB (all MoE layers x top-%zu x expert bytes)\n", to_mib(token_cycle_bytes(s)),
              s.top_k());

  std::size_t rows_by_phase[2] = {0, 0}, by_residency[3] = {0, 0, 0}, dropped = 0, turns = 0;
  std::uint64_t read_bytes[2] = {0, 0};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const trace_row& r = rows[i];
    const int p = static_cast<int>(r.phase);
    ++rows_by_phase[p];
    ++by_residency[r.residency];
    read_bytes[p] += r.expert_bytes;
    dropped += r.dropped == 1;
    if (i == 0 || r.turn != rows[i - 1].turn) ++turns;
  }
  std::printf("rows: %zu (prefill %zu, decode %zu) in %zu turn(s)%s\n", rows.size(), rows_by_phase[0], rows_by_phase[1],
              turns, h.has_dropped_column ? "" : "; no dropped column");
  if (h.has_dropped_column) std::printf("dropped: %zu\n", dropped);

  const load_batches lb = group_load_batches(t);
  std::size_t batches[2] = {0, 0}, decode_tokens = 0;
  std::uint32_t last_step = 0;
  bool any_decode = false;
  for (const load_batch& b : lb.batches) {
    ++batches[static_cast<int>(b.phase)];
    if (b.phase == run_phase::decode && (!any_decode || b.step != last_step)) {
      ++decode_tokens;
      last_step = b.step;
      any_decode = true;
    }
  }
  std::printf("load batches: %zu prefill (one per layer per prompt batch), %zu decode (one per token and layer)\n",
              batches[0], batches[1]);
  std::printf("decode tokens: %zu\n", decode_tokens);
  const trace_routings tr = collect_routings(t);
  std::printf("routings: %zu (%zu declined, wider than 32)\n", tr.routings.size(), tr.declined);
  std::printf("recorded residency (rows): %zu miss, %zu hit, %zu speculative hit\n", by_residency[0], by_residency[1],
              by_residency[2]);
  std::printf("recorded expert reads: prefill %.1f MiB, decode %.1f MiB (%.2f MiB per decode token)\n",
              to_mib(read_bytes[0]), to_mib(read_bytes[1]),
              decode_tokens ? to_mib(read_bytes[1]) / static_cast<double>(decode_tokens) : 0.0);
  if (t.noncanonical_weights())
    std::printf("note: %zu weights are not in the engine's %%g form (a CSV write will not reproduce their text)\n",
                t.noncanonical_weights());
}

const moe_residency_cli::command_registrar convert_reg{
    "convert", "Convert a route trace between CSV (route_trace v1) and the compact binary form", [](CLI::App& sub) {
      auto in = std::make_shared<std::string>();
      auto out = std::make_shared<std::string>();
      auto to = std::make_shared<std::string>();
      sub.add_option("--in", *in, "input trace (CSV or binary, detected by content); - for standard input")->required();
      sub.add_option("--out", *out, "output file; - for standard output")->required();
      sub.add_option("--to", *to, "csv or binary (default: the other form than the input)")
          ->check(moe_residency_cli::one_of({"csv", "binary"}));
      sub.callback([in, out, to] { convert(*in, *out, *to); });
    }};

const moe_residency_cli::command_registrar info_reg{
    "trace-info", "Print a route trace's shape, rows, load batches and token cycle", [](CLI::App& sub) {
      auto path = std::make_shared<std::string>();
      moe_residency_cli::add_trace_option(sub, *path);
      sub.callback([path] { trace_info(*path); });
    }};

}  // namespace
