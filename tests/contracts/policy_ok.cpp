// expect: ^$
// Control: every policy of the library satisfies the contract.
#include "moe_residency/cache.hpp"
using namespace moe_residency;
static_assert(is_cache_policy_v<lru_policy> && is_cache_policy_v<lfu_policy> && is_cache_policy_v<random_policy> &&
                  is_cache_policy_v<layer_lru_policy> && is_cache_policy_v<layer_lfu_policy> &&
                  is_cache_policy_v<belady_policy> && is_cache_policy_v<arc_policy> &&
                  is_cache_policy_v<s3fifo_policy> && is_cache_policy_v<retention<lru_policy>> &&
                  is_cache_policy_v<sieve_policy> && is_cache_policy_v<cycle_policy>,
              "library policies");
struct not_a_policy {};
static_assert(!is_cache_policy_v<not_a_policy>, "the trait can say no");
int main() {}
