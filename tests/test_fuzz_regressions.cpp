// One test per failure the fuzzers in fuzz/ found, named after what it found, so
// the fix stays fixed without the fuzzer (docs/reliability.md, "Fuzz targets", links the runs that found them).

#include <doctest/doctest.h>

#include <cmath>
#include <sstream>
#include <string>

#include "moe_residency/replay.hpp"
#include "moe_residency/timing.hpp"
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

// Version 1 (no checksums): in version 2 a damaged header byte is refused by
// the header's checksum first; these header checks are what stands behind it
// (and in front of a version 1 file).
std::string binary_of(const std::string& csv) {
  std::ostringstream s;
  detail::write_binary_rows(parse_route_trace_csv(csv, "t.csv"), s, detail::binary_trace_version_unchecked);
  return s.str();
}

validated_route_trace parse_v1(const std::string& bytes) {
  return parse_route_trace_binary(bytes, "t.bin", [](const std::string&) {});  // the version 1 warning: expected
}

}  // namespace

TEST_CASE("fuzz_trace_binary: non-zero padding after the strings or the layer flags is refused") {
  // Found by fuzz_trace_binary: a file whose padding bytes were not zero parsed,
  // and wrote back as a different file (the padding zeroed), so corruption of the
  // lengths could go unnoticed. The layout says the padding is zero; now it is checked.
  const std::string good = binary_of(one_layer);
  CHECK(parse_v1(good).rows().size() == 2);
  // Fixed header 48 + "m.gguf" 6 + "qwen3moe" 8 = 62: bytes 62 and 63 pad the strings.
  std::string bad = good;
  bad[63] = '\x07';
  CHECK_THROWS_WITH_AS(parse_v1(bad),
                       "t.bin: header: padding byte at offset 63 after the model and arch strings is 7; expected 0",
                       error);
  // Layers at 64: 8 bytes expert_bytes, 8 dense_bytes, 1 listed flag at 80, padding 81..87.
  bad = good;
  bad[85] = '\x01';
  CHECK_THROWS_WITH_AS(parse_v1(bad), "t.bin: header: padding byte at offset 85 after the layer flags is 1; expected 0",
                       error);
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
  CHECK_THROWS_WITH_AS(
      parse_v1(bad), "t.bin: header: model ' arch=' contains ' arch=' or ends in a space; the CSV form cannot hold it",
      error);
  bad = good;
  bad[53] = ' ';  // "m.ggu "
  CHECK_THROWS_AS(parse_v1(bad), error);
  route_trace t = parse_v1(good);
  t.header.model = "a arch=b";
  std::ostringstream out;
  CHECK_THROWS_AS(write_route_trace_csv(t, out), error);
  CHECK(out.str().empty());  // validated before anything is written
}

TEST_CASE("fuzz_storage_curve: a lanes CSV field that is not wholly a number is refused") {
  // Found by fuzz_storage_curve (its strict twin, within 321 executions): parse_csv
  // read each field with strtod and ignored what followed the number, so a list
  // pasted into a CSV ("1:1809.9") or a unit ("2459.8MiB/s") read as a different curve.
  CHECK_THROWS_WITH_AS(storage_curve::parse_csv("lanes,mib_per_s\n1:1809.9,2:2459.8\n", "d.csv"),
                       "d.csv: line 2, column lanes: '1:1809.9' is not a number; expected a finite number", error);
  CHECK_THROWS_WITH_AS(storage_curve::parse_csv("lanes,mib_per_s\n1,1809.9\n2,2459.8MiB/s\n", "d.csv"),
                       "d.csv: line 3, column mib_per_s: '2459.8MiB/s' is not a number; expected a finite number",
                       error);
  CHECK_THROWS_WITH_AS(storage_curve::parse_csv("lanes,mib_per_s,ms\n1,,2\n", "d.csv"),
                       "d.csv: line 2, column mib_per_s: empty; expected a finite number", error);
  // Trailing spaces and CR are still trimmed, as before.
  CHECK(storage_curve::parse_csv("lanes,mib_per_s\r\n1,1809.9 \r\n", "d.csv").mib_per_s(1) == 1809.9);
}

TEST_CASE("fuzz_storage_curve: to_list() reads back as the same curve") {
  // Found by fuzz_storage_curve and fuzz_timing_config: to_list() (and so
  // format_timing_config, what `calibrate --write-config` writes) printed each
  // number with "%g", 6 digits: 1001001 MiB/s came back as 1.001e+06, and two
  // lanes that agree to 6 digits were written alike, which parse_list refuses.
  const storage_curve c({{1, 1001001}, {1.0000001, 2000}, {2, 2459.8}});
  const std::string list = c.to_list();
  CHECK(storage_curve::parse_list(list).points() == c.points());
  CHECK(storage_curve().to_list() == "1:1809.9,2:2459.8,4:2457.9,8:2420,12:2360.1,16:2243.9,24:2308.6,32:2254.8");
  timing_params p;
  p.curve = c;
  CHECK(parse_timing_config(format_timing_config(p), "w.cfg").curve.points() == c.points());
}

TEST_CASE("fuzz_timing_config: a curve longer than 512 bytes is written whole") {
  // Found reading format_timing_config while writing fuzz_timing_config, and
  // confirmed by the target (its round-trip check fails on a 150-point curve):
  // the config was formatted into a 512-byte buffer, so a long curve was cut and
  // the file it wrote read back as another curve (or not at all).
  std::vector<std::pair<double, double>> pts;
  for (int i = 1; i <= 150; ++i) pts.emplace_back(i, 1000 + i);
  timing_params p;
  p.curve = storage_curve(pts);
  const std::string text = format_timing_config(p);
  CHECK(text.size() > 1000);
  const timing_params q = parse_timing_config(text, "w.cfg");
  CHECK(q.curve.points() == pts);
  CHECK(format_timing_config(q) == text);
}

TEST_CASE("fuzz_storage_curve: the bandwidth at a point is that point's, however far apart the points") {
  // Found by fuzz_storage_curve: between two points mib_per_s computed
  // a + (b - a) * t, which at t = 1 cancels to 0 when b is negligible next to a
  // (1807.96 and 2.541e-318 MiB/s): a zero bandwidth, and an infinite read.
  const storage_curve c({{1, 1807.96}, {322, 2.541e-318}});
  CHECK(c.mib_per_s(322) == 2.541e-318);
  CHECK(c.mib_per_s(1) == 1807.96);
  for (double m : {1.5, 100.0, 321.999}) CHECK((c.mib_per_s(m) > 2.541e-318 && c.mib_per_s(m) < 1807.96));
  // Ordinary curves are unchanged: halfway is the mean.
  CHECK(storage_curve({{1, 1000}, {2, 1500}}).mib_per_s(1.5) == 1250.0);
}

TEST_CASE("fuzz_timing_config: a read on a curve whose bandwidth underflows is infinite, not NaN") {
  // Found by fuzz_timing_config ("curve = 1:1809.9,2:2459.8,4:2.4571e-316"): a
  // wave on such a curve takes an infinite time, and read_ms multiplied it by 0
  // full waves, giving NaN, which every comparison of the model then ignores.
  timing_params p;
  p.lanes = 4;
  p.curve = storage_curve({{1, 1809.9}, {2, 2459.8}, {4, 2.4571e-316}});
  CHECK(std::isinf(p.read_ms(4, 4u << 20)));
  CHECK(std::isinf(p.read_io_ms(4, 4u << 20)));
  CHECK(p.read_ms(1, 4u << 20) == p.wave_ms(1, 4u << 20));  // one read on one lane: finite
  CHECK(std::isfinite(p.read_ms(1, 4u << 20)));
}

TEST_CASE("fuzz_token_metrics: an infinite value is refused") {
  // Found by fuzz_token_metrics (with the numbers dictionary, within 6830
  // executions): "inf" is a number >= 0 to strtod, so a metrics file with
  // read_bytes = inf parsed, and calibration fitted to it.
  CHECK_THROWS_WITH_AS(parse_token_metrics("step,wall_ms,read_bytes\n1,10,inf\n", "m.csv"),
                       "m.csv: line 2, column read_bytes: 'inf' is not finite; expected a finite number >= 0", error);
  CHECK_THROWS_WITH_AS(parse_token_metrics("step,wall_ms\n1,1e999\n", "m.csv"),
                       "m.csv: line 2, column wall_ms: '1e999' is not finite; expected a finite number >= 0", error);
  CHECK(parse_token_metrics("step,wall_ms\n1,1e300\n", "m.csv").wall_ms[0] == 1e300);
}

TEST_CASE("fuzz_cli_specs: a subnormal oracle P is named so that the name parses back to itself") {
  // Found by fuzz_cli_specs: `oracle:001000004.9e-324` (P = 1.0000049e-318, a subnormal
  // double) was named "oracle:1e-318" (%g), which parses to the subnormal nearest 1e-318,
  // which %g prints as "9.99998e-319": the name was not a fixed point. A subnormal P is now
  // named with 17 digits, which read back exactly; a normal P keeps %g's short name.
  const replay_speculation s = parse_replay_speculation("oracle:001000004.9e-324");
  REQUIRE(std::fpclassify(s.oracle_p) == FP_SUBNORMAL);
  const std::string n = s.name();
  CHECK(parse_replay_speculation(n).name() == n);
  CHECK(parse_replay_speculation(n).oracle_p == s.oracle_p);
  CHECK(parse_replay_speculation("oracle:0.886").name() == "oracle:0.886");
  CHECK(parse_replay_speculation("oracle:0.1234567").name() == "oracle:0.123457");
}
