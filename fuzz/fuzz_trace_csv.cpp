// libFuzzer target: route_trace v1 CSV text. Any input ends in moe_residency::error
// naming the input, or in a trace that validates and round-trips through both forms.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace moe_residency;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  route_trace t;
  try {
    t = parse_route_trace_csv(text, "fuzz.csv");
  } catch (const error& e) {
    moe_residency_fuzz::check_message(e, "fuzz.csv");
    return 0;
  }
  moe_residency_fuzz::check_accepted_trace(t, "fuzz.csv", true);
  return 0;
}
