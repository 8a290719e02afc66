#pragma once
/// `session_hook`: the names of the hooks a session extension may implement,
/// which every extension declares. A core header of its own so an extension
/// (e.g. `speculation`) can declare its hooks without including the session.
/// The event hooks are the engine's events (events.hpp), `on_` + the event.

#include "moe_residency/events.hpp"

namespace moe_residency {

namespace detail {
constexpr unsigned event_bit(engine_event e) noexcept { return 1u << static_cast<unsigned>(e); }
}  // namespace detail

/// The hooks a session extension implements. Every extension declares them,
/// `static constexpr session_hook hooks = session_hook::routed | session_hook::layer_loaded;`
/// (`session_hook::none` for none), and the session refuses to compile when a
/// declared hook is not callable with its exact arguments (misspelt or
/// mistyped) or a hook it would call is not declared.
enum class session_hook : unsigned {
  none = 0,
  begin_batch = detail::event_bit(
      engine_event::
          begin_batch),  ///< on_begin_batch(Session&, run_phase, std::uint32_t first_token, std::size_t n_tokens)
  gate_input =
      detail::event_bit(engine_event::gate_input),  ///< on_gate_input(Session&, layer_id, const gate_input_view&)
  routed = detail::event_bit(
      engine_event::routed),  ///< on_routed(Session&, layer_id, span<const routing>, span<std::uint32_t> drop_masks)
  layer_loaded = detail::event_bit(engine_event::layer_loaded),  ///< on_layer_loaded(Session&, layer_id)
  end_batch = detail::event_bit(engine_event::end_batch),        ///< on_end_batch(Session&)
  append_notes = 32,  ///< append_notes(std::vector<std::string>& report_lines) const
  /// on_attach(const Session&): called once from the session's constructor, after
  /// the predictors are set up; throws `error` to refuse a configuration that
  /// cannot work with the session's predictors (e.g. a speculation horizon the
  /// chosen predictor cannot rank).
  attach = 64,
};
constexpr session_hook operator|(session_hook a, session_hook b) noexcept {
  return static_cast<session_hook>(static_cast<unsigned>(a) | static_cast<unsigned>(b));
}
/// True when `set` includes `hook`.
constexpr bool declares_hook(session_hook set, session_hook hook) noexcept {
  return (static_cast<unsigned>(set) & static_cast<unsigned>(hook)) != 0;
}

}  // namespace moe_residency
