// One test per failure the fuzzers in fuzz/ found, named after what it found, so
// the fix stays fixed without the fuzzer (docs/reliability.md lists them).

#include <doctest/doctest.h>

#include <sstream>
#include <string>

#include "moe_residency/trace.hpp"

using namespace moe_residency;

namespace {

// 1 layer (so the layer flags take 1 byte of an 8-byte padded block), top-2;
// model "m.gguf" (6 bytes) and arch "qwen3moe" (8): the strings end at 62 of 64.
const char* const one_layer =
    "# route_trace v1\n"
    "# model=m.gguf arch=qwen3moe n_layer=1 n_expert=4 n_expert_used=2\n"
    "# layer=0 expert_bytes=1000 dense_bytes=50\n"
    "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n"
    "0,1,0,0,0,3,0.75,0,1000\n"
    "0,1,0,0,1,1,0.25,0,1000\n";

std::string binary_of(const std::string& csv) {
  std::ostringstream s;
  write_route_trace_binary(parse_route_trace_csv(csv, "t.csv"), s);
  return s.str();
}

}  // namespace

TEST_CASE("fuzz_trace_binary: non-zero padding after the strings or the layer flags is refused") {
  // Found by fuzz_trace_binary: a file whose padding bytes were not zero parsed,
  // and wrote back as a different file (the padding zeroed), so corruption of the
  // lengths could go unnoticed. The layout says the padding is zero; now it is checked.
  const std::string good = binary_of(one_layer);
  CHECK(parse_route_trace_binary(good, "t.bin").rows().size() == 2);
  // Fixed header 48 + "m.gguf" 6 + "qwen3moe" 8 = 62: bytes 62 and 63 pad the strings.
  std::string bad = good;
  bad[63] = '\x07';
  CHECK_THROWS_WITH_AS(parse_route_trace_binary(bad, "t.bin"),
                       "t.bin: header: padding byte at offset 63 after the model and arch strings is 7; expected 0",
                       error);
  // Layers at 64: 8 bytes expert_bytes, 8 dense_bytes, 1 listed flag at 80, padding 81..87.
  bad = good;
  bad[85] = '\x01';
  CHECK_THROWS_WITH_AS(parse_route_trace_binary(bad, "t.bin"),
                       "t.bin: header: padding byte at offset 85 after the layer flags is 1; expected 0", error);
}

TEST_CASE("fuzz_trace_binary: a model name the CSV header cannot hold is refused") {
  // Found by fuzz_trace_binary: a binary trace whose model string contained
  // " arch=" parsed, but its CSV form could not be read back (the CSV header runs
  // the model up to its " arch=" field); a trailing space was silently dropped.
  // Both are refused now, by the binary reader and by the writers' validation.
  const std::string good = binary_of(one_layer);
  std::string bad = good;
  // "m.gguf" is at offset 48: make it "m arch" followed by '=' ... keep the length (6).
  bad.replace(48, 6, std::string(" arch=", 6));
  CHECK_THROWS_WITH_AS(parse_route_trace_binary(bad, "t.bin"),
                       "t.bin: header: model ' arch=' contains ' arch=' or ends in a space; the CSV form cannot hold it",
                       error);
  bad = good;
  bad[53] = ' ';  // "m.ggu "
  CHECK_THROWS_AS(parse_route_trace_binary(bad, "t.bin"), error);
  route_trace t = parse_route_trace_binary(good, "t.bin");
  t.header.model = "a arch=b";
  std::ostringstream out;
  CHECK_THROWS_AS(write_route_trace_csv(t, out), error);
  CHECK(out.str().empty());  // validated before anything is written
}
