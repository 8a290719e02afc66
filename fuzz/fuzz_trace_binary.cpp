// libFuzzer target: the binary route trace. Any input ends in moe_residency::error
// naming the input, or in a trace that validates, round-trips through both forms,
// and writes back to exactly the bytes it was read from, in the version it was
// read from (the layout has no slack). The seeds hold version 1 files as well as
// version 2: a mutation of a version 2 file almost always stops at a checksum,
// while version 1 files carry mutations on to the header and record checks.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>

#include "fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace moe_residency;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  route_trace t;
  try {
    t = parse_route_trace_binary(bytes, "fuzz.bin", [](const std::string&) {});  // version 1's warning
  } catch (const error& e) {
    moe_residency_fuzz::check_message(e, "fuzz.bin");
    return 0;
  }
  moe_residency_fuzz::check_accepted_trace(t, "fuzz.bin", false);
  std::ostringstream out;
  detail::write_binary_rows(t, out, t.binary_version);
  moe_residency_fuzz::check(out.str() == bytes, "an accepted binary trace does not write back to its own bytes");
  return 0;
}
