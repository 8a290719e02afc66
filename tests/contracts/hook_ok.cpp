// expect: ^$
// Control: a correct extension compiles, so the failures below are the contract's.
#include "moe_residency/session.hpp"
using namespace moe_residency;
struct ext {
  static constexpr session_hook hooks = session_hook::routed | session_hook::layer_loaded;
  template <class S>
  void on_routed(S&, layer_id, span<const routing>, span<std::uint32_t>) {}
  template <class S>
  void on_layer_loaded(S&, layer_id) {}
};
int main() {
  session<predictor_set<prev_token_predictor>, ext> s(presets::qwen3_30b_a3b(8));
  (void)s;
}
