// Route traces: binary read vs CSV parse vs a raw memcpy of the same bytes.
//
// The headline figures are ratios within one run (docs/traces.md):
//   binary read time / memcpy of the binary file's bytes   (the roofline)
//   CSV parse time   / binary read time
// Input: the real qwen trace (44766 rows) from MOE_RESIDENCY_TRACES or
// ../shared/traces; the benchmarks report an error if it is missing.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "moe_residency/trace.hpp"

namespace {

using namespace moe_residency;

struct inputs {
  std::string csv, binary;
  std::size_t rows = 0;
  bool ok = false;
};

const inputs& get_inputs() {
  static const inputs in = [] {
    inputs r;
    std::string dir = MOE_RESIDENCY_DEFAULT_TRACES;
    if (const char* env = std::getenv("MOE_RESIDENCY_TRACES"); env && *env) dir = env;
    std::ifstream f(dir + "/qwen.route.csv", std::ios::binary);
    if (!f) return r;
    std::ostringstream s;
    s << f.rdbuf();
    r.csv = s.str();
    const route_trace t = parse_route_trace_csv(r.csv, "qwen.route.csv");
    std::ostringstream b;
    write_route_trace_binary(t, b);
    r.binary = b.str();
    r.rows = t.rows.size();
    r.ok = true;
    return r;
  }();
  return in;
}

bool ready(benchmark::State& state) {
  if (get_inputs().ok) return true;
  state.SkipWithError("qwen.route.csv not found: set MOE_RESIDENCY_TRACES to the shared/traces folder");
  return false;
}

void finish(benchmark::State& state, std::size_t bytes) {
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes));
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * get_inputs().rows));
  state.counters["input_bytes"] = static_cast<double>(bytes);
}

void bm_csv_parse(benchmark::State& state) {
  if (!ready(state)) return;
  const inputs& in = get_inputs();
  for (auto _ : state) {
    route_trace t = parse_route_trace_csv(in.csv, "qwen.route.csv");
    benchmark::DoNotOptimize(t.rows.data());
  }
  finish(state, in.csv.size());
}
BENCHMARK(bm_csv_parse)->Unit(benchmark::kMicrosecond);

void bm_binary_read(benchmark::State& state) {
  if (!ready(state)) return;
  const inputs& in = get_inputs();
  for (auto _ : state) {
    route_trace t = parse_route_trace_binary(in.binary, "qwen.route.bin");
    benchmark::DoNotOptimize(t.rows.data());
  }
  finish(state, in.binary.size());
}
BENCHMARK(bm_binary_read)->Unit(benchmark::kMicrosecond);

// The reader's reference twin: the exact pass alone (each record decoded into
// its row and run through trace_row_checker), which was the whole reader
// before the scan; the reader still runs it for a refused file's message.
void bm_binary_read_exact(benchmark::State& state) {
  if (!ready(state)) return;
  const inputs& in = get_inputs();
  for (auto _ : state) {
    route_trace t = detail::parse_route_trace_binary_with(in.binary, "qwen.route.bin", detail::binary_rows_pass::exact);
    benchmark::DoNotOptimize(t.rows.data());
  }
  finish(state, in.binary.size());
}
BENCHMARK(bm_binary_read_exact)->Unit(benchmark::kMicrosecond);

// The reader's two passes apart, on the records of the same file (header
// parsed once, outside the loop): the scan alone (every check, no row
// written) and the decode alone (rows constructed in a reserved vector, no
// check), to show where the reader's time goes.
struct records_view {
  route_trace header_only;
  const unsigned char* records = nullptr;
  std::size_t rows = 0;
};
records_view get_records() {
  const inputs& in = get_inputs();
  records_view v;
  v.header_only = parse_route_trace_binary(in.binary, "qwen.route.bin");
  v.rows = v.header_only.rows.size();
  v.header_only.rows = {};
  v.records = reinterpret_cast<const unsigned char*>(in.binary.data()) + in.binary.size() -
              v.rows * detail::binary_trace_record_size - detail::binary_trace_trailer_size(v.rows);
  return v;
}

// The version 2 checksums alone (XXH64 of the header and of each block of
// 4096 records, compared with the stored ones), as the reader runs them
// before the scan: what the integrity check adds to a read.
void bm_binary_checksums_only(benchmark::State& state) {
  if (!ready(state)) return;
  const inputs& in = get_inputs();
  const records_view v = get_records();
  const auto* b = reinterpret_cast<const unsigned char*>(in.binary.data());
  const auto layers_end = static_cast<std::size_t>(v.records - b);
  for (auto _ : state) {
    detail::check_binary_checksums(b, layers_end, v.rows, "qwen.route.bin");
    benchmark::ClobberMemory();
  }
  finish(state, in.binary.size());
}
BENCHMARK(bm_binary_checksums_only)->Unit(benchmark::kMicrosecond);

void bm_binary_scan_only(benchmark::State& state) {
  if (!ready(state)) return;
  const records_view v = get_records();
  for (auto _ : state) {
    detail::binary_record_scanner s(v.header_only.header);
    bool ok = true;
    for (std::size_t i = 0; i < v.rows && ok; i += 256)
      ok = s.check(v.records + i * detail::binary_trace_record_size, std::min<std::size_t>(256, v.rows - i));
    if (!ok) state.SkipWithError("the scan refused the qwen trace");
    benchmark::DoNotOptimize(ok);
  }
  finish(state, get_inputs().binary.size());
}
BENCHMARK(bm_binary_scan_only)->Unit(benchmark::kMicrosecond);

// The scan's first loop alone: each record's values against the header.
void bm_binary_values_only(benchmark::State& state) {
  if (!ready(state)) return;
  const records_view v = get_records();
  for (auto _ : state) {
    const detail::binary_record_scanner s(v.header_only.header);
    bool ok = true;
    for (std::size_t i = 0; i < v.rows && ok; i += 256)
      ok = s.check_values(v.records + i * detail::binary_trace_record_size, std::min<std::size_t>(256, v.rows - i));
    if (!ok) state.SkipWithError("the scan refused the qwen trace");
    benchmark::DoNotOptimize(ok);
  }
  finish(state, get_inputs().binary.size());
}
BENCHMARK(bm_binary_values_only)->Unit(benchmark::kMicrosecond);

void bm_binary_decode_only(benchmark::State& state) {
  if (!ready(state)) return;
  const records_view v = get_records();
  for (auto _ : state) {
    std::vector<trace_row> rows;
    rows.reserve(v.rows);
    for (std::size_t i = 0; i < v.rows; i += 256)
      detail::append_binary_rows(rows, v.records + i * detail::binary_trace_record_size,
                                 std::min<std::size_t>(256, v.rows - i), v.header_only.header.expert_bytes.data());
    benchmark::DoNotOptimize(rows.data());
    benchmark::ClobberMemory();
  }
  finish(state, get_inputs().binary.size());
}
BENCHMARK(bm_binary_decode_only)->Unit(benchmark::kMicrosecond);

// The roofline: copy the binary file's bytes into a buffer allocated per
// iteration, as the reader allocates its rows.
void bm_memcpy_binary_bytes(benchmark::State& state) {
  if (!ready(state)) return;
  const inputs& in = get_inputs();
  for (auto _ : state) {
    std::vector<char> dst(in.binary.size());
    std::memcpy(dst.data(), in.binary.data(), in.binary.size());
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  finish(state, in.binary.size());
}
BENCHMARK(bm_memcpy_binary_bytes)->Unit(benchmark::kMicrosecond);

// A second reference: the bytes of the rows the reader produces
// (sizeof(trace_row) = 32 per row), which any in-memory reader must write.
void bm_memcpy_row_bytes(benchmark::State& state) {
  if (!ready(state)) return;
  const inputs& in = get_inputs();
  const std::vector<trace_row> src(in.rows);
  for (auto _ : state) {
    std::vector<trace_row> dst;
    dst.reserve(src.size());
    dst.insert(dst.end(), src.begin(), src.end());
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  finish(state, in.rows * sizeof(trace_row));
}
BENCHMARK(bm_memcpy_row_bytes)->Unit(benchmark::kMicrosecond);

void bm_csv_write(benchmark::State& state) {
  if (!ready(state)) return;
  const inputs& in = get_inputs();
  const route_trace t = parse_route_trace_csv(in.csv, "qwen.route.csv");
  for (auto _ : state) {
    std::ostringstream out;
    write_route_trace_csv(t, out);
    benchmark::DoNotOptimize(out);
  }
  finish(state, in.csv.size());
}
BENCHMARK(bm_csv_write)->Unit(benchmark::kMicrosecond);

void bm_binary_write(benchmark::State& state) {
  if (!ready(state)) return;
  const inputs& in = get_inputs();
  const route_trace t = parse_route_trace_csv(in.csv, "qwen.route.csv");
  for (auto _ : state) {
    std::ostringstream out;
    write_route_trace_binary(t, out);
    benchmark::DoNotOptimize(out);
  }
  finish(state, in.binary.size());
}
BENCHMARK(bm_binary_write)->Unit(benchmark::kMicrosecond);

// Grouping a validated trace (what a parser returns): no second validation.
void bm_group_load_batches(benchmark::State& state) {
  if (!ready(state)) return;
  const validated_route_trace t = parse_route_trace_csv(get_inputs().csv, "qwen.route.csv");
  for (auto _ : state) {
    load_batches b = group_load_batches(t);
    benchmark::DoNotOptimize(b.batches.data());
  }
  finish(state, t.rows().size() * sizeof(trace_row));
}
BENCHMARK(bm_group_load_batches)->Unit(benchmark::kMicrosecond);

// The same from an open route_trace, which is validated first (the cost the
// validated type saves).
void bm_group_load_batches_open(benchmark::State& state) {
  if (!ready(state)) return;
  const route_trace t = parse_route_trace_csv(get_inputs().csv, "qwen.route.csv");
  for (auto _ : state) {
    load_batches b = group_load_batches(t);
    benchmark::DoNotOptimize(b.batches.data());
  }
  finish(state, t.rows.size() * sizeof(trace_row));
}
BENCHMARK(bm_group_load_batches_open)->Unit(benchmark::kMicrosecond);

// Every row through the checker, no copy (validate_route_trace also moves the
// trace into its result).
void bm_validate(benchmark::State& state) {
  if (!ready(state)) return;
  const route_trace t = parse_route_trace_csv(get_inputs().csv, "qwen.route.csv");
  for (auto _ : state) {
    detail::validate_rows(t, "qwen.route.csv");
    benchmark::ClobberMemory();
  }
  finish(state, t.rows.size() * sizeof(trace_row));
}
BENCHMARK(bm_validate)->Unit(benchmark::kMicrosecond);

}  // namespace
