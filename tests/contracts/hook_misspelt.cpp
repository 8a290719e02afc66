// expect: disagree on session_hook::routings
// on_routing (no s): used to compile and never run.
#include "moe_residency/session.hpp"
using namespace moe_residency;
struct ext {
  static constexpr session_hook hooks = session_hook::routings;
  template <class S>
  void on_routing(S&, layer_id, span<const routing>, span<std::uint32_t>) {}
};
int main() {
  session<predictor_set<prev_token_predictor>, ext> s(presets::qwen3_30b_a3b(8));
  (void)s;
}
