// Uses the library through the umbrella header and checks one known number:
// the Qwen3-30B-A3B trace shape's token cycle at k=6 is 785 MiB.
#include <moe_residency/moe_residency.hpp>

#include <cmath>
#include <cstdio>

int main() {
  const auto shape = moe_residency::presets::qwen3_30b_a3b(6);
  const long mib = std::lround(moe_residency::to_mib(moe_residency::token_cycle_bytes(shape)));
  std::printf("consumer: moe-residency %d, %s token cycle %ld MiB\n", MOE_RESIDENCY_VERSION, shape.name().c_str(), mib);
  return mib == 785 ? 0 : 1;
}
