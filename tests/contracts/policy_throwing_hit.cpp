// expect: the policy needs on_hit\(std::uint32_t slot\) noexcept
// on_hit may throw: the cache calls it from noexcept lookup().
#include "moe_residency/cache/expert_cache.hpp"
using namespace moe_residency;
struct my_policy : policy_base {
  static constexpr const char* name = "mine";
  static constexpr bool collapses_below_cycle = false;
  void init(const model_shape&, std::uint64_t) {}
  void on_hit(std::uint32_t) {}
  void on_insert(std::uint32_t) noexcept {}
  void on_evict(std::uint32_t) noexcept {}
  std::uint32_t victim(const cache_view&, std::size_t) noexcept { return no_slot; }
};
int main() {
  expert_cache<my_policy> c(presets::qwen3_30b_a3b(8), {from_mib(4000), cycle_guard::off, {}});
  (void)c;
}
