// expect: must declare the hooks it implements
#include "moe_residency/session.hpp"
using namespace moe_residency;
struct ext {
  template <class S>
  void on_routed(S&, layer_id, span<const routing>, span<std::uint32_t>) {}
};
int main() {
  session<predictor_set<prev_token_predictor>, ext> s(presets::qwen3_30b_a3b(8));
  (void)s;
}
