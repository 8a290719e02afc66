#pragma once
/// The compile-time contract of a session's extensions (session.hpp): which
/// hooks an extension implements, detected by their exact arguments, and the
/// check that the hooks it declares in `hooks` (session_hook.hpp) are exactly
/// those. Internal: the session runs the check from its constructor and asks
/// these traits which hooks to call.

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/session_hook.hpp"
#include "moe_residency/session_types.hpp"

namespace moe_residency {
namespace detail {

// Extension hook detection: T's hook is callable with the exact arguments the
// session S passes (S is the session type, which hooks take by reference).
template <class T, class S, class = void>
struct session_has_on_begin_batch : std::false_type {};
template <class T, class S>
struct session_has_on_begin_batch<T, S,
                                  std::void_t<decltype(std::declval<T>().on_begin_batch(
                                      std::declval<S&>(), run_phase{}, std::uint32_t{}, std::size_t{}))>>
    : std::true_type {};
template <class T, class S, class = void>
struct session_has_on_gate_input : std::false_type {};
template <class T, class S>
struct session_has_on_gate_input<T, S,
                                 std::void_t<decltype(std::declval<T>().on_gate_input(
                                     std::declval<S&>(), layer_id{}, std::declval<const gate_input_view&>()))>>
    : std::true_type {};
template <class T, class S, class = void>
struct session_has_on_routed : std::false_type {};
template <class T, class S>
struct session_has_on_routed<T, S,
                             std::void_t<decltype(std::declval<T>().on_routed(
                                 std::declval<S&>(), layer_id{}, span<const routing>{}, span<std::uint32_t>{}))>>
    : std::true_type {};
template <class T, class S, class = void>
struct session_has_on_layer_loaded : std::false_type {};
template <class T, class S>
struct session_has_on_layer_loaded<
    T, S, std::void_t<decltype(std::declval<T>().on_layer_loaded(std::declval<S&>(), layer_id{}))>> : std::true_type {};
template <class T, class S, class = void>
struct session_has_on_end_batch : std::false_type {};
template <class T, class S>
struct session_has_on_end_batch<T, S, std::void_t<decltype(std::declval<T>().on_end_batch(std::declval<S&>()))>>
    : std::true_type {};
template <class T, class S, class = void>
struct session_has_on_attach : std::false_type {};
template <class T, class S>
struct session_has_on_attach<T, S, std::void_t<decltype(std::declval<T>().on_attach(std::declval<const S&>()))>>
    : std::true_type {};
template <class T, class = void>
struct session_has_append_notes : std::false_type {};
template <class T>
struct session_has_append_notes<
    T, std::void_t<decltype(std::declval<T>().append_notes(std::declval<std::vector<std::string>&>()))>>
    : std::true_type {};

template <class T, class = void>
struct session_declares_hooks : std::false_type {};
template <class T>
struct session_declares_hooks<T, std::void_t<decltype(T::hooks)>>
    : std::is_same<std::remove_cv_t<decltype(T::hooks)>, session_hook> {};

// One static_assert per hook: declared <=> callable with the exact arguments
// session S passes.
template <class Ext, class S>
constexpr bool check_session_extension() {
  static_assert(session_declares_hooks<Ext>::value,
                "session: an extension must declare the hooks it implements, e.g. "
                "`static constexpr session_hook hooks = session_hook::routed | session_hook::layer_loaded;` "
                "(session_hook::none for none), so that a misspelt or mistyped hook does not compile");
  if constexpr (session_declares_hooks<Ext>::value) {
    constexpr session_hook h = Ext::hooks;
    static_assert(declares_hook(h, session_hook::begin_batch) == session_has_on_begin_batch<Ext&, S>::value,
                  "session: an extension's hooks and its members disagree on session_hook::begin_batch: "
                  "expected on_begin_batch(Session&, run_phase, std::uint32_t, std::size_t) exactly when "
                  "declared (misspelt or mistyped hook?)");
    static_assert(declares_hook(h, session_hook::gate_input) == session_has_on_gate_input<Ext&, S>::value,
                  "session: an extension's hooks and its members disagree on session_hook::gate_input: "
                  "expected on_gate_input(Session&, layer_id, const gate_input_view&) exactly when "
                  "declared (misspelt or mistyped hook?)");
    static_assert(declares_hook(h, session_hook::routed) == session_has_on_routed<Ext&, S>::value,
                  "session: an extension's hooks and its members disagree on session_hook::routed: "
                  "expected on_routed(Session&, layer_id, span<const routing>, span<std::uint32_t>) "
                  "exactly when declared (misspelt or mistyped hook?)");
    static_assert(declares_hook(h, session_hook::layer_loaded) == session_has_on_layer_loaded<Ext&, S>::value,
                  "session: an extension's hooks and its members disagree on session_hook::layer_loaded: "
                  "expected on_layer_loaded(Session&, layer_id) exactly when declared (misspelt or "
                  "mistyped hook?)");
    static_assert(declares_hook(h, session_hook::end_batch) == session_has_on_end_batch<Ext&, S>::value,
                  "session: an extension's hooks and its members disagree on session_hook::end_batch: "
                  "expected on_end_batch(Session&) exactly when declared (misspelt or mistyped hook?)");
    static_assert(declares_hook(h, session_hook::attach) == session_has_on_attach<const Ext&, S>::value,
                  "session: an extension's hooks and its members disagree on session_hook::attach: "
                  "expected on_attach(const Session&) const exactly when declared (misspelt or "
                  "mistyped hook?)");
    static_assert(declares_hook(h, session_hook::append_notes) == session_has_append_notes<const Ext&>::value,
                  "session: an extension's hooks and its members disagree on session_hook::append_notes: "
                  "expected append_notes(std::vector<std::string>&) const exactly when declared "
                  "(misspelt or mistyped hook?)");
  }
  return true;
}

}  // namespace detail
}  // namespace moe_residency
