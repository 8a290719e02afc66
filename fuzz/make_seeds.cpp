// Writes the fuzz targets' seed corpora into the build tree at run time (never
// into the repository): the unit tests' small valid trace and the heads of the
// real traces (CSV and binary forms), and a few event streams for the session.
//   moe_residency_fuzz_seeds TRACES_DIR OUT_DIR
// OUT_DIR/{fuzz_trace_csv,fuzz_trace_binary,fuzz_session}/ receive the files.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "moe_residency/trace.hpp"

namespace fs = std::filesystem;
using namespace moe_residency;

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

std::string binary_of(const std::string& csv) {
  std::ostringstream s;
  write_route_trace_binary(parse_route_trace_csv(csv, "seed"), s);
  return s.str();
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

  std::vector<std::pair<std::string, std::string>> seeds = {{"small", small_trace}};
  for (const char* name : {"qwen.route.csv", "gptoss.route.csv"}) {
    const fs::path p = traces / name;
    if (!fs::exists(p)) {
      std::fprintf(stderr, "moe_residency_fuzz_seeds: %s not found; seeding from the small trace only\n",
                   p.string().c_str());
      continue;
    }
    const std::string text = read(p);
    // Heads short enough for libFuzzer's length limit: the header and a few tokens.
    for (std::size_t rows : {0u, 6u, 40u, 200u}) seeds.emplace_back(fs::path(name).stem().string() + "-" + std::to_string(rows), head(text, rows));
  }
  std::size_t n = 0;
  for (const auto& [name, text] : seeds) {
    write(csv / (name + ".csv"), text);
    try {
      write(bin / (name + ".bin"), binary_of(text));
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
  std::printf("moe_residency_fuzz_seeds: %zu trace seeds (CSV and binary), 8 event streams in %s\n", n,
              out.string().c_str());
  return 0;
}
