// expect: disagree on session_hook::end_batch
// A correct hook the extension forgot to declare.
#include "moe_residency/session.hpp"
using namespace moe_residency;
struct ext {
  static constexpr session_hook hooks = session_hook::none;
  template <class S>
  void on_end_batch(S&) {}
};
int main() {
  session<predictor_set<prev_token_predictor>, ext> s(presets::qwen3_30b_a3b(8));
  (void)s;
}
