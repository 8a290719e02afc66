// expect: disagree on session_hook::routed
// on_routings: the hook's name before the events had one vocabulary (events.hpp);
// an extension written against it must not compile and silently never run.
#include "moe_residency/session.hpp"
using namespace moe_residency;
struct ext {
  static constexpr session_hook hooks = session_hook::routed;
  template <class S>
  void on_routings(S&, layer_id, span<const routing>, span<std::uint32_t>) {}
};
int main() {
  session<predictor_set<prev_token_predictor>, ext> s(presets::qwen3_30b_a3b(8));
  (void)s;
}
