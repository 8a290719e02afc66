// Writes the fuzz targets' seed corpora into the build tree at run time (never
// into the repository): the unit tests' small valid trace and the first whole
// decode tokens of the real traces (CSV and binary forms; a header alone and a
// head cut inside a token as CSV), and a few event streams for the session;
// for the configuration and calibration files, the cases of the unit tests
// (tests/test_timing*.cpp, tests/test_fuzz_regressions.cpp), the writers' output
// and the heads of the real metrics and lanes files.
//   moe_residency_fuzz_seeds TRACES_DIR OUT_DIR
// OUT_DIR/<target>/ receive the files, one folder per target.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "moe_residency/replay.hpp"
#include "moe_residency/timing.hpp"
#include "moe_residency_lab/lab.hpp"
#include "moe_residency_lab/cells.hpp"
#include "moe_residency/trace.hpp"

namespace fs = std::filesystem;
using namespace moe_residency;
using namespace moe_residency::lab;

namespace {

// The valid trace of tests/test_trace_errors.cpp: 3 layers, 16 experts, top-2,
// a 2-token prompt, then two decode tokens.
const char* const small_trace =
    "# route_trace v1\n"
    "# model=m.gguf arch=qwen3moe n_layer=3 n_expert=16 n_expert_used=2\n"
    "# layer=0 expert_bytes=1000 dense_bytes=50\n"
    "# layer=1 expert_bytes=2000 dense_bytes=50\n"
    "# layer=2 expert_bytes=1000 dense_bytes=50\n"
    "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n"
    "0,0,0,0,0,5,0.6,0,1000\n0,0,0,0,1,9,0.4,0,1000\n0,0,1,0,0,5,0.7,0,0\n0,0,1,0,1,3,0.3,0,1000\n"
    "0,0,0,1,0,2,0.5,0,2000\n0,0,0,1,1,1,0.5,0,2000\n0,0,1,1,0,2,0.9,0,0\n0,0,1,1,1,4,0.1,0,2000\n"
    "0,0,1,2,0,7,0.8,0,1000\n0,0,1,2,1,8,0.2,0,1000\n"
    "0,1,2,0,0,5,0.6,1,0\n0,1,2,0,1,6,0.4,0,1000\n0,1,2,1,0,2,0.5,1,0\n0,1,2,1,1,3,nan,0,2000\n"
    "0,1,2,2,0,7,0.8,1,0\n0,1,2,2,1,8,0.2,1,0\n"
    "0,1,3,0,0,5,0.6,1,0\n0,1,3,0,1,6,0.4,1,0\n0,1,3,1,0,2,0.5,1,0\n0,1,3,1,1,3,0.5,1,0\n"
    "0,1,3,2,0,7,0.8,1,0\n0,1,3,2,1,8,0.2,1,0\n";

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f << bytes;
}

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

/// The header and the first `rows` rows of a CSV trace.
std::string head(const std::string& csv, std::size_t rows) {
  std::size_t pos = 0, seen_rows = 0;
  while (pos < csv.size()) {
    const std::size_t eol = csv.find('\n', pos);
    if (eol == std::string::npos) return csv;
    if (csv[pos] != '#' && csv.compare(pos, 5, "turn,") != 0 && ++seen_rows > rows) return csv.substr(0, pos);
    pos = eol + 1;
  }
  return csv;
}

/// The header and the rows of the first `tokens` decode tokens of a CSV trace
/// (whole tokens: a trace cut inside one is refused). A turn's decode may come
/// without its prefill, so this is a valid trace.
std::string decode_head(const std::string& csv, std::size_t tokens) {
  std::string out;
  std::size_t pos = 0, seen = 0;
  std::string token;  // "turn,1,step," of the token being copied
  while (pos < csv.size()) {
    std::size_t eol = csv.find('\n', pos);
    if (eol == std::string::npos) eol = csv.size() - 1;
    const std::string_view line(csv.data() + pos, eol + 1 - pos);
    pos = eol + 1;
    if (line[0] == '#' || line.compare(0, 5, "turn,") == 0) {
      out += line;
      continue;
    }
    // turn,phase,step,...: decode rows have phase 1.
    const std::size_t c1 = line.find(','), c2 = line.find(',', c1 + 1), c3 = line.find(',', c2 + 1);
    if (line.substr(c1 + 1, c2 - c1 - 1) != "1") continue;
    const std::string key(line.substr(0, c3 + 1));
    if (key != token) {
      if (seen == tokens) break;
      ++seen;
      token = key;
    }
    out += line;
  }
  return out;
}

std::string binary_of(const std::string& csv, std::uint32_t version = detail::binary_trace_version) {
  std::ostringstream s;
  detail::write_binary_rows(parse_route_trace_csv(csv, "seed"), s, version);
  return s.str();
}

/// The first `lines` lines of `text`.
std::string head_lines(const std::string& text, std::size_t lines) {
  std::size_t pos = 0;
  for (std::size_t i = 0; i < lines && pos != std::string::npos; ++i) {
    pos = text.find('\n', pos);
    if (pos != std::string::npos) ++pos;
  }
  return pos == std::string::npos ? text : text.substr(0, pos);
}

/// Seeds of the configuration and calibration files; returns how many.
std::size_t write_config_seeds(const fs::path& traces, const fs::path& out) {
  std::size_t n = 0;
  auto put = [&](const char* target, const std::string& name, const std::string& bytes) {
    const fs::path d = out / target;
    fs::create_directories(d);
    write(d / name, bytes);
    ++n;
  };
  auto real = [&](const char* name) { return fs::exists(traces / name) ? read(traces / name) : std::string(); };

  // fuzz_timing_config: the writer's output (defaults and a tuned device), the
  // unit tests' cases, and a curve_file naming the target's own lanes.csv.
  timing_params tuned;
  tuned.lanes = 4;
  tuned.read_latency_ms = 1.25;
  tuned.overlap = 0.3;
  tuned.curve = storage_curve::parse_list("1:100,8:400");
  put("fuzz_timing_config", "defaults.cfg", format_timing_config(timing_params{}));
  put("fuzz_timing_config", "tuned.cfg", "# a device\n" + format_timing_config(tuned));
  put("fuzz_timing_config", "unknown-key.cfg", "lanes = 2\nspeed = 3\n");
  put("fuzz_timing_config", "overlap.cfg", "overlap = 1.5");
  put("fuzz_timing_config", "lanes-two.cfg", "lanes = two");
  put("fuzz_timing_config", "curve-file.cfg", "lanes = 2 # two\r\ncurve_file = lanes.csv\noverlap = 0.41\n");
  // The encodings and forms of issue 52: a byte-order mark, compressed data, a key given twice
  // (the curve by both keys), an empty value, a hexadecimal real.
  put("fuzz_timing_config", "bom.cfg", "\xef\xbb\xbflanes = 3\noverlap = 0.5\n");
  put("fuzz_timing_config", "gzip.cfg", std::string("\x1f\x8b\x08\x00\x00\x00\x00\x00", 8));
  put("fuzz_timing_config", "twice.cfg", "lanes = 2\noverlap = 0.5\nlanes = 4\n");
  put("fuzz_timing_config", "curve-twice.cfg", "curve = 1:100\ncurve_file = lanes.csv\n");
  put("fuzz_timing_config", "empty-value.cfg", "lanes = 2\ncurve_file =\n");
  put("fuzz_timing_config", "hex.cfg", "compute_ms_per_token = 0x10\n");

  // fuzz_storage_curve: the real lanes file, the unit test's, the default list.
  if (const std::string lanes = real("flash-lanes.csv"); !lanes.empty())
    put("fuzz_storage_curve", "flash-lanes.csv", lanes);
  put("fuzz_storage_curve", "test.csv", "lanes,read_kib,mib_per_s,mean_latency_ms\n1,4096,100,1\n2,4096,150,2\n");
  put("fuzz_storage_curve", "default.list", storage_curve().to_list());
  put("fuzz_storage_curve", "repeat.list", "1:100,1:200");
  put("fuzz_storage_curve", "bom.csv", "\xef\xbb\xbflanes,mib_per_s\n1,100\n2,150\n");
  put("fuzz_storage_curve", "twice.csv", "lanes,mib_per_s,lanes\n1,100,2\n");
  put("fuzz_storage_curve", "unnamed.csv", "lanes,mib_per_s,\n1,100,\n");
  put("fuzz_storage_curve", "utf16.csv", std::string("\xff\xfel\0a\0n\0e\0s\0", 12));

  // fuzz_token_metrics: heads of the recorded metrics, the probe's columns, the tests' cases.
  for (const char* name : {"qwen.metrics.csv", "gptoss.metrics.csv"}) {
    const std::string m = real(name);
    if (m.empty()) continue;
    for (std::size_t lines : {2u, 5u, 33u})
      put("fuzz_token_metrics", std::string(name) + "-" + std::to_string(lines), head_lines(m, lines));
  }
  put("fuzz_token_metrics", "probe.csv",
      "step,steps,wall_ms,compute_ms,read_bytes,cache_hit_pct,stall_ms,majflt,cpu_ms,sys_ms\n"
      "1,2,400.000,100.000,1048576,,300.000,12,100.000,60.000\n2,2,100.000,90.000,0,50.00,10.000,0,90.000,0.000\n");
  put("fuzz_token_metrics", "comment.csv", "step,wall_ms,stall_ms\n1,10.5,2\n# summary\n2,11,3\n");
  put("fuzz_token_metrics", "bad.csv", "step,wall_ms\n1,x\n");
  put("fuzz_token_metrics", "bom.csv", "\xef\xbb\xbfstep,wall_ms\n2,20\n1,10\n");
  put("fuzz_token_metrics", "twice.csv", "step,wall_ms,stall_ms,wall_ms\n1,10,1,11\n");
  put("fuzz_token_metrics", "unnamed.csv", "step,,wall_ms\n1,0,10\n");
  put("fuzz_token_metrics", "zstd.csv", "\x28\xb5\x2f\xfd step,wall_ms\n");

  // fuzz_oracle_profile: the first byte is the layer count - 1.
  put("fuzz_oracle_profile", "plain-4", std::string(1, '\x03') + "0.9\n0.8\n0.7\n0.6\n");
  put("fuzz_oracle_profile", "keyed-4", std::string(1, '\x03') + "layer,P\n3,0.6\n1,0.8\n0,0.9\n2,0.7\n");
  std::string zero = std::string(1, '\x23') + "# P per layer for gpt-oss-120b (36 layers)\n";
  for (int l = 0; l < 36; ++l) zero += std::to_string(l) + ",0\n";
  put("fuzz_oracle_profile", "zero-36", zero);
  put("fuzz_oracle_profile", "bom-2", std::string(1, '\x01') + "\xef\xbb\xbflayer,P\n1,0.8\n0,0.9\n");
  put("fuzz_oracle_profile", "empty-p-2", std::string(1, '\x01') + "0,0.9\n1,\n");

  // fuzz_lab_cells: what lab/memlab.sh predict writes, every configuration at two ratios.
  std::vector<lab_cell> cells;
  for (const char* ratio : {"1.5", "2.5"})
    for (const char* c : {"mmap", "observer", "dense", "exact", "predicted", "cache", "all", "degraded", "resident"}) {
      lab_cell x;
      x.ratio = ratio;
      x.config = parse_lab_config(c);
      x.limit_mib = x.config == lab_config::resident ? 0 : (ratio[0] == '1' ? 939 : 563);
      x.budget_mib = x.limit_mib / 4;
      x.stale_gate_pct = 87.1;
      x.metrics = x.config == lab_config::degraded ? "" : std::string("/runs/r") + ratio + "-" + c + ".metrics.csv";
      cells.push_back(x);
    }
  put("fuzz_lab_cells", "memlab.csv", format_lab_cells(cells));
  put("fuzz_lab_cells", "bom.csv", "\xef\xbb\xbf" + format_lab_cells(cells));
  put("fuzz_lab_cells", "short.csv",
      "ratio,config,limit_mib,budget_mib,stale_gate_pct,metrics\n2.5,exact,563,141,87.1,m.csv\n2.5,mmap,563,141,87."
      "1\n");

  // fuzz_fault_walk: what the lab (lab/memlab.sh) writes, two ratios, dense locked and not.
  const std::string walk_header =
      "limit_mib,pinned_dense_mib,tokens,walked_mib_per_token,read_mib_per_token,wall_ms,cpu_ms,sys_ms,majflt,"
      "off_cpu_ms_per_mib,sys_ms_per_mib,mib_per_fault\n";
  put("fuzz_fault_walk", "memlab.csv",
      walk_header +
          "939,0.0,22,310.1,1100.0,1067.14,521.62,513.76,101.0,0.4959,0.4670,10.89\n"
          "939,110.2,22,310.1,1101.9,1090.27,534.16,528.21,101.0,0.5047,0.4794,10.91\n"
          "563,0.0,22,310.1,1377.1,1408.25,569.83,560.78,83.1,0.6088,0.4072,16.58\n"
          "563,110.2,22,310.1,1245.1,1572.10,607.11,603.54,104.5,0.7750,0.4847,11.91\n");
  put("fuzz_fault_walk", "short.csv", walk_header + "563,0,1,1,1,1,1,1,1,0.6\n");
  // ... and the inline walk's, which the same target parses too.
  const std::string inline_header =
      "limit_mib,budget_mib,tokens,pins_per_token,read_mib_per_token,wall_ms,cpu_ms,sys_ms,off_cpu_ms_per_mib,"
      "sys_ms_per_mib\n";
  put("fuzz_fault_walk", "inline.csv",
      inline_header +
          "939,235.0,22,79.0,36.4,64.18,51.82,33.07,0.3400,0.9097\n"
          "563,141.0,22,89.7,58.4,90.71,80.89,64.80,0.1681,1.1097\n");

  // fuzz_cli_specs: the first byte picks the parser (0 speculation, 1 policy, 2 lab configuration,
  // 3 numbers).
  for (const char* s : {"prev-token", "frequency", "oracle:0.886", "none", "oracle:1.5", "psychic", "", "oracle:0x1"})
    put("fuzz_cli_specs", std::string("speculate-") + s, std::string(1, '\0') + s);
  for (const std::string& p : replay_policy_names())
    for (const char* suffix : {"", "+prev", "+oracle"})
      put("fuzz_cli_specs", "policy-" + p + suffix, "\x01" + p + suffix);
  for (const char* c : {"exact", "resident", "resident-all"})
    put("fuzz_cli_specs", std::string("lab-") + c, std::string("\x02") + c);
  // 3: the checked number parsers, at their boundaries (the byte after 3 picks domain and range).
  int k = 0;
  for (const char* t : {"0",
                        "1",
                        "-1",
                        "0.5",
                        "1e12",
                        "1e400",
                        "nan",
                        "-inf",
                        "0x1p3",
                        "4.9e-324",
                        " 1",
                        "1.5",
                        "",
                        "64",
                        "65",
                        "4294967296",
                        "18446744073709551615",
                        "18446744073709551616",
                        "007",
                        "+3",
                        "0x10",
                        "1e-50"}) {
    const int i = k++;
    put("fuzz_cli_specs", "number-" + std::to_string(i), std::string("\x03") + char('0' + i % 8) + t);
  }
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s TRACES_DIR OUT_DIR\n", argv[0]);
    return 2;
  }
  const fs::path traces = argv[1], out = argv[2];
  const fs::path csv = out / "fuzz_trace_csv", bin = out / "fuzz_trace_binary", ses = out / "fuzz_session";
  for (const fs::path& d : {csv, bin, ses}) fs::create_directories(d);

  std::vector<std::pair<std::string, std::string>> seeds = {{"small", small_trace},
                                                            {"small-bom", std::string("\xef\xbb\xbf") + small_trace}};
  // Refused inputs of the encodings and the declared shape (CSV only): compressed, UTF-16, too wide.
  write(csv / "gzip.csv", std::string("\x1f\x8b\x08\x00", 4) + small_trace);
  write(csv / "xz.csv", std::string("\xfd\x37\x7a\x58\x5a\x00", 6) + small_trace);
  write(csv / "utf16.csv", std::string("\xff\xfe#\0 \0r\0", 8));
  {
    std::string wide = small_trace;
    const std::string from = "n_layer=3 n_expert=16", to = "n_layer=65535 n_expert=65535";
    wide.replace(wide.find(from), from.size(), to);
    write(csv / "wide-shape.csv", wide);
  }
  for (const char* name : {"qwen.route.csv", "gptoss.route.csv"}) {
    const fs::path p = traces / name;
    if (!fs::exists(p)) {
      std::fprintf(stderr, "moe_residency_fuzz_seeds: %s not found; seeding from the small trace only\n",
                   p.string().c_str());
      continue;
    }
    const std::string text = read(p);
    // Short enough for libFuzzer's length limit: the header and one or two
    // whole decode tokens; and, as refused inputs to mutate from (CSV only),
    // the header alone and a head cut inside a token.
    const std::string stem = fs::path(name).stem().string();
    for (std::size_t tokens : {1u, 2u})
      seeds.emplace_back(stem + "-decode-" + std::to_string(tokens), decode_head(text, tokens));
    for (std::size_t rows : {0u, 40u}) write(csv / (stem + "-cut-" + std::to_string(rows) + ".csv"), head(text, rows));
  }
  std::size_t n = 0;
  for (const auto& [name, text] : seeds) {
    write(csv / (name + ".csv"), text);
    try {
      write(bin / (name + ".bin"), binary_of(text));
      // Version 1 (no checksums): mutations of it reach the header and record checks.
      write(bin / (name + "-v1.bin"), binary_of(text, detail::binary_trace_version_unchecked));
    } catch (const error& e) {
      std::fprintf(stderr, "moe_residency_fuzz_seeds: %s: %s\n", name.c_str(), e.what());
      return 1;
    }
    ++n;
  }
  // Event streams are decoded from arbitrary bytes: a few patterns to start from.
  for (int i = 0; i < 8; ++i) {
    std::string bytes;
    for (int j = 0; j < 64 * (i + 1); ++j) bytes.push_back(static_cast<char>((j * 37 + i * 11) & 0xff));
    write(ses / ("pattern-" + std::to_string(i)), bytes);
  }
  std::size_t configs = 0;
  try {
    configs = write_config_seeds(traces, out);
  } catch (const error& e) {
    std::fprintf(stderr, "moe_residency_fuzz_seeds: %s\n", e.what());
    return 1;
  }
  std::printf(
      "moe_residency_fuzz_seeds: %zu trace seeds (CSV and binary), 8 event streams, %zu configuration seeds in %s\n", n,
      configs, out.string().c_str());
  return 0;
}
