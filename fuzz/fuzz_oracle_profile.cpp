// libFuzzer target: the per-layer oracle profile of a dynamic replay
// (parse_oracle_profile: `replay --speculate oracle:P,FILE`). The first byte is
// the shape's layer count (1 to 64), the rest the file. Any input ends in
// moe_residency::error naming the input, or in exactly one P in [0, 1] per
// layer, which both written forms (one P per line; `layer,P` lines in reverse
// order under a header) read back bit for bit.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_check.hpp"
#include "moe_residency/replay/oracle_profile.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace moe_residency;
  using moe_residency_fuzz::check;
  if (size == 0) return 0;
  const std::size_t n_layers = static_cast<std::size_t>(data[0] % 64) + 1;
  const std::string text = moe_residency_fuzz::text_of(data + 1, size - 1);
  std::optional<std::vector<double>> p;
  try {
    p = parse_oracle_profile(text, "fuzz.profile", n_layers);
  } catch (const error& e) {
    moe_residency_fuzz::check_message(e, "fuzz.profile", text.size());
  }
  if (!p) return 0;
  check(p->size() == n_layers, "not one P per layer");
  for (double v : *p) check(v >= 0 && v <= 1, "a P outside [0, 1]", std::to_string(v));

  std::string plain = "# one P per line\n", keyed = "layer,P\n";
  char buf[64];
  for (std::size_t l = 0; l < n_layers; ++l) {
    std::snprintf(buf, sizeof buf, "%.17g\n", (*p)[l]);
    plain += buf;
    const std::size_t r = n_layers - 1 - l;
    std::snprintf(buf, sizeof buf, "%zu, %.17g\r\n", r, (*p)[r]);
    keyed += buf;
  }
  for (const std::string* w : {&plain, &keyed}) {
    try {
      check(moe_residency_fuzz::same_bits(parse_oracle_profile(*w, "roundtrip.profile", n_layers), *p),
            "write -> parse changed a P", *w);
    } catch (const error& e) {
      moe_residency_fuzz::fail("a written profile does not parse back", *w + e.what());
    }
  }
  return 0;
}
