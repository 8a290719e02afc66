#pragma once
/// The cache-policy contract, checked as the predictor contract is
/// (predict/contract.hpp): `expert_cache<Policy>` refuses to compile, naming
/// the member, when Policy lacks one of these or has it with other arguments.
/// ```
///   static constexpr const char* name = "lru";        // messages, reports
///   static constexpr bool collapses_below_cycle = true;  // the token-cycle guard applies
///   void init(const model_shape&, std::uint64_t budget_bytes);   // may allocate and throw
///   void on_batch_begin(run_phase, std::size_t layer) noexcept;
///   void on_hit(std::uint32_t slot) noexcept;      // a resident entry was looked up
///   void on_repeat(std::uint32_t slot) noexcept;   // looked up again in the same batch
///   void on_insert(std::uint32_t slot) noexcept;   // a miss made resident
///   void on_evict(std::uint32_t slot) noexcept;
///   bool over_budget(const cache_view&, std::size_t layer) const noexcept;
///   std::uint32_t victim(const cache_view&, std::size_t layer) noexcept;  // no_slot: none
///   void end_eviction() noexcept;
///   void on_batch_end(std::size_t layer) noexcept;
///   void on_admit(std::uint32_t slot) noexcept;    // optional: resident without a lookup
/// ```
/// `policy_base` supplies over_budget (the global budget), on_batch_begin,
/// on_repeat, end_eviction and on_batch_end. The hot-path hooks must be
/// noexcept: the cache calls them from noexcept functions.

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "moe_residency/core.hpp"

namespace moe_residency {

class cache_view;

namespace detail {

#define MOE_RESIDENCY_POLICY_TRAIT(trait, expr) \
  template <class P, class = void>              \
  struct trait : std::false_type {};            \
  template <class P>                            \
  struct trait<P, std::enable_if_t<noexcept(expr)>> : std::true_type {};

template <class P, class = void>
struct policy_has_name : std::false_type {};
template <class P>
struct policy_has_name<P, std::void_t<decltype(P::name), decltype(P::collapses_below_cycle)>>
    : std::integral_constant<bool, std::is_convertible<decltype(P::name), const char*>::value &&
                                       std::is_convertible<decltype(P::collapses_below_cycle), bool>::value> {};
template <class P, class = void>
struct policy_has_init : std::false_type {};
template <class P>
struct policy_has_init<
    P, std::void_t<decltype(std::declval<P&>().init(std::declval<const model_shape&>(), std::uint64_t{}))>>
    : std::true_type {};
// The hot-path hooks: callable with the cache's arguments, and noexcept.
MOE_RESIDENCY_POLICY_TRAIT(policy_has_batch_begin, std::declval<P&>().on_batch_begin(run_phase{}, std::size_t{}))
MOE_RESIDENCY_POLICY_TRAIT(policy_has_hit, std::declval<P&>().on_hit(std::uint32_t{}))
MOE_RESIDENCY_POLICY_TRAIT(policy_has_repeat, std::declval<P&>().on_repeat(std::uint32_t{}))
MOE_RESIDENCY_POLICY_TRAIT(policy_has_insert, std::declval<P&>().on_insert(std::uint32_t{}))
MOE_RESIDENCY_POLICY_TRAIT(policy_has_evict, std::declval<P&>().on_evict(std::uint32_t{}))
MOE_RESIDENCY_POLICY_TRAIT(policy_has_end_eviction, std::declval<P&>().end_eviction())
MOE_RESIDENCY_POLICY_TRAIT(policy_has_batch_end, std::declval<P&>().on_batch_end(std::size_t{}))
MOE_RESIDENCY_POLICY_TRAIT(policy_has_over_budget,
                           static_cast<bool>(std::declval<P&>().over_budget(std::declval<const cache_view&>(),
                                                                            std::size_t{})))
MOE_RESIDENCY_POLICY_TRAIT(policy_has_victim,
                           static_cast<std::uint32_t>(std::declval<P&>().victim(std::declval<const cache_view&>(),
                                                                                std::size_t{})))
#undef MOE_RESIDENCY_POLICY_TRAIT

/// One static_assert per member, so the error names what is missing.
template <class P>
constexpr bool check_cache_policy() {
  static_assert(policy_has_name<P>::value,
                "expert_cache: the policy needs `static constexpr const char* name` and "
                "`static constexpr bool collapses_below_cycle` (cache/policy_contract.hpp)");
  static_assert(policy_has_init<P>::value,
                "expert_cache: the policy needs init(const model_shape&, std::uint64_t budget_bytes)");
  static_assert(policy_has_batch_begin<P>::value,
                "expert_cache: the policy needs on_batch_begin(run_phase, std::size_t) noexcept "
                "(policy_base has one)");
  static_assert(policy_has_hit<P>::value, "expert_cache: the policy needs on_hit(std::uint32_t slot) noexcept");
  static_assert(policy_has_repeat<P>::value,
                "expert_cache: the policy needs on_repeat(std::uint32_t slot) noexcept (policy_base has one)");
  static_assert(policy_has_insert<P>::value, "expert_cache: the policy needs on_insert(std::uint32_t slot) noexcept");
  static_assert(policy_has_evict<P>::value, "expert_cache: the policy needs on_evict(std::uint32_t slot) noexcept");
  static_assert(policy_has_over_budget<P>::value,
                "expert_cache: the policy needs bool over_budget(const cache_view&, std::size_t) noexcept "
                "(policy_base has one)");
  static_assert(policy_has_victim<P>::value,
                "expert_cache: the policy needs std::uint32_t victim(const cache_view&, std::size_t) noexcept");
  static_assert(policy_has_end_eviction<P>::value,
                "expert_cache: the policy needs end_eviction() noexcept (policy_base has one)");
  static_assert(policy_has_batch_end<P>::value,
                "expert_cache: the policy needs on_batch_end(std::size_t) noexcept (policy_base has one)");
  return true;
}

}  // namespace detail

/// True when P satisfies the cache-policy contract (above).
template <class P>
inline constexpr bool is_cache_policy_v =
    detail::policy_has_name<P>::value&& detail::policy_has_init<P>::value&& detail::policy_has_batch_begin<P>::value&&
        detail::policy_has_hit<P>::value&& detail::policy_has_repeat<P>::value&& detail::policy_has_insert<P>::value&&
            detail::policy_has_evict<P>::value&& detail::policy_has_over_budget<P>::value&& detail::policy_has_victim<
                P>::value&& detail::policy_has_end_eviction<P>::value&& detail::policy_has_batch_end<P>::value;

}  // namespace moe_residency
