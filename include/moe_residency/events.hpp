#pragma once
/// The events an engine raises while it evaluates a batch, and the one name
/// each has everywhere in this library. No third-party dependency.
///
/// Per batch (one graph evaluation: a decode token, or a chunk of a prompt),
/// in this order:
///
/// | event          | the engine's moment                                              |
/// |----------------|------------------------------------------------------------------|
/// | `begin_batch`  | the evaluation begins: its phase, first position, token count    |
/// | `gate_input`   | a MoE layer's router input is computed                           |
/// | `routed`       | the layer's top-k is chosen; its expert matmuls have not run     |
/// | `layer_loaded` | the layer's routed experts are in memory; its matmuls run now    |
/// | `end_batch`    | the evaluation is done (the next `begin_batch` implies it)       |
///
/// `gate_input`, `routed` and `layer_loaded` repeat for every MoE layer, in
/// layer order. Every listener is named after the event it receives:
///
/// | listener                                  | how it receives event `e`                 |
/// |-------------------------------------------|-------------------------------------------|
/// | `session` (session.hpp)                   | the member `e(...)`, called by the host   |
/// | a session extension (session_hook.hpp)    | `on_e(Session&, ...)`, from the session   |
/// | `speculation` (speculation.hpp)           | `e(...)` without a session, or its hooks  |
/// | `llama_cpp::observer_sink` (structure.hpp)| `on_e(...)`, from the graph callback      |
/// | the residency manager (an observer_sink)  | `on_routed` issues reads; `on_layer_loaded` forwards |
///
/// The manager raises its own `speculation`'s `layer_loaded` at the layer's
/// routing, as soon as the layer's reads are handed to the lanes: its eval
/// thread does not wait for them, the layer's matmuls do.
///
/// A "batch" is always this evaluation. What one MoE layer demands of the
/// cache at once (one layer of one batch) is a "load batch" (trace/batches.hpp,
/// the caches' `begin_batch(phase, layer)`).

#include <cstddef>
#include <cstdint>

#include "moe_residency/core.hpp"

namespace moe_residency {

/// The events of a batch, in the order an engine raises them (table above).
enum class engine_event : std::uint8_t {
  begin_batch = 0,
  gate_input = 1,
  routed = 2,
  layer_loaded = 3,
  end_batch = 4,
};

/// The event's name as the listeners spell it ("layer_loaded").
inline const char* to_string(engine_event e) noexcept {
  switch (e) {
    case engine_event::begin_batch: return "begin_batch";
    case engine_event::gate_input: return "gate_input";
    case engine_event::routed: return "routed";
    case engine_event::layer_loaded: return "layer_loaded";
    case engine_event::end_batch: return "end_batch";
  }
  return "event";
}

/// What `begin_batch` carries: the batch's phase, the position of its first
/// token and its token count (decode: 1).
struct batch_info {
  run_phase phase = run_phase::decode;
  std::uint32_t first_position = 0;
  std::size_t n_tokens = 0;
};

}  // namespace moe_residency
