// expect: disagree on session_hook::layer_loaded
// on_layer_loaded taking the layer as a std::string: used to compile and never run.
#include <string>
#include "moe_residency/session.hpp"
using namespace moe_residency;
struct ext {
  static constexpr session_hook hooks = session_hook::layer_loaded;
  template <class S>
  void on_layer_loaded(S&, const std::string&) {}
};
int main() {
  session<predictor_set<prev_token_predictor>, ext> s(presets::qwen3_30b_a3b(8));
  (void)s;
}
