#pragma once
/// The layers every token routes, in order (`detail::token_layers`): the
/// row-order rule across layers that the row checker (trace/validate.hpp) and
/// the binary reader's fast scan (trace/binary_scan.hpp) both apply.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "moe_residency/trace/types.hpp"

namespace moe_residency {
namespace detail {

/// The layers every token routes, in order: those with expert bytes (the MoE
/// layers). A decode token routes each once, ascending; a prompt batch
/// (prefill, layer-major) routes them in the same order and may stop one
/// short of the last: llama.cpp computes the last layer only for the rows
/// whose logits it needs, and a batch before the prompt's last needs none.
/// Shared by trace_row_checker and the binary reader's scanner, which call
/// next() where a routing begins (after the row-order check) and end() when
/// the rows run out.
class token_layers {
 public:
  enum class fault : std::uint8_t {
    none,
    start,  ///< a token or batch (or the trace) begins at a layer other than the first
    skip,   ///< within a token or batch, a layer other than the next one follows
    cut,    ///< a new token, batch, phase or turn begins before the previous one reached its last layer
    empty   ///< (end) no routing at all
  };
  static constexpr std::uint32_t none_layer = 0xffffffffu;

  explicit token_layers(const trace_header& h) : next_(h.n_layer, none_layer) {
    std::uint32_t prev = none_layer;
    for (std::size_t l = 0; l < h.n_layer; ++l) {
      if (h.expert_bytes[l] == 0) continue;
      const auto layer = static_cast<std::uint32_t>(l);
      if (prev == none_layer) first_ = layer;
      else next_[prev] = layer;
      penult_ = prev;
      last_ = layer;
      prev = layer;
    }
  }

  /// May a routing at (turn, phase, step, layer) begin after one at
  /// (prev_*), the row order being known good? Phase 0 prefill, 1 decode.
  fault next(bool has_prev, std::uint32_t prev_turn, unsigned prev_phase, std::uint32_t prev_step,
             std::uint32_t prev_layer, std::uint32_t turn, unsigned phase, std::uint32_t step,
             std::uint32_t layer) const noexcept {
    if (!has_prev) return layer == first_ ? fault::none : fault::start;
    const bool same = turn == prev_turn && phase == prev_phase;
    // Does it continue the previous token (decode) or prompt batch (prefill:
    // a lower layer starts the next batch)?
    if (same && (phase == 1 ? step == prev_step : layer >= prev_layer)) {
      if (layer == prev_layer) return fault::none;  // prefill: the layer's next token
      return layer == next_[prev_layer] ? fault::none : fault::skip;
    }
    const bool batch_follows = same && phase == 0;
    if (prev_layer != last_ && !(batch_follows && prev_layer == penult_)) return fault::cut;
    return layer == first_ ? fault::none : fault::start;
  }

  /// May the rows end after a routing at prev_layer? (The prompt's last batch
  /// reaches the last layer, as a decode token does.)
  fault end(bool has_prev, std::uint32_t prev_layer) const noexcept {
    if (!has_prev) return fault::empty;
    return prev_layer == last_ ? fault::none : fault::cut;
  }

  std::uint32_t first() const noexcept { return first_; }
  std::uint32_t last() const noexcept { return last_; }
  /// The layer after `l` in a token, or none_layer after the last.
  std::uint32_t after(std::uint32_t l) const noexcept { return next_[l]; }
  /// The layers after `l` up to the last, in words ("layer 7", "layers 5 to 47").
  std::string rest_after(std::uint32_t l) const {
    const std::uint32_t n = next_[l];
    if (n == none_layer) return "none";
    return n == last_ ? "layer " + std::to_string(n) : "layers " + std::to_string(n) + " to " + std::to_string(last_);
  }

 private:
  std::vector<std::uint32_t> next_;
  std::uint32_t first_ = none_layer, penult_ = none_layer, last_ = none_layer;
};

}  // namespace detail
}  // namespace moe_residency
