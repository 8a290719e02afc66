#pragma once
/// The binary route trace reader's fast pass (`detail::binary_record_scanner`):
/// every check of the row checker made on raw records, in vector lanes or
/// their scalar twin, with a verdict and no message. Part of the reader in
/// trace/binary.hpp.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "moe_residency/detail/trace_binary.hpp"
#include "moe_residency/trace/binary_vector.hpp"
#include "moe_residency/trace/row_values.hpp"
#include "moe_residency/trace/token_layers.hpp"
#include "moe_residency/trace/types.hpp"

namespace moe_residency {
namespace detail {

/// The binary reader's fast pass over raw records: makes trace_row_checker's
/// checks on each record in place (ranges against the header, the bits byte
/// as the reader decodes it, slots in rank order, distinct experts per
/// routing, the row order), with the hot state in registers, one
/// never-taken branch per check, and the row order checked once per routing;
/// it writes nothing but its per-expert stamps, and gives no message: check()
/// says only whether every record passes. The reader decodes the records it
/// accepted (binary_row_iterator) and runs the exact pass
/// (read_binary_rows_exact) for the message of a file it refuses.
/// tests/test_trace_errors.cpp holds it to the exact pass's verdict, byte by
/// byte and on random damage. Allocates only at construction.
class binary_record_scanner {
 public:
  /// `h` must satisfy header_problem(h).empty().
  explicit binary_record_scanner(const trace_header& h)
      : n_layer_(static_cast<std::uint32_t>(h.n_layer)),
        n_expert_(static_cast<std::uint32_t>(h.n_expert)),
        k_(static_cast<std::uint32_t>(h.n_expert_used)),
        has_dropped_(h.has_dropped_column),
        layers_(h),
        stamp_(h.n_expert, 0) {
    // A routable layer has expert bytes (a layer without a "# layer=" line
    // has none: header-consistent files never list bytes for it).
    routable_.assign(h.n_layer, 0);
    all_routable_ = true;
    for (std::size_t l = 0; l < h.n_layer; ++l) {
      routable_[l] = h.expert_bytes[l] != 0;
      all_routable_ = all_routable_ && routable_[l];
    }
    // The accepted (phase, residency, bits) bytes x = phase | residency << 8
    // | bits << 16, in a table indexed by the bits a valid x can have set
    // (phase bit 0, residency bits 8-9, bits 16-18), gathered by one multiply
    // (see combo_index): entry i holds the x it accepts, or a value no x can
    // equal. An x with any other bit set matches no entry. phase 0-1;
    // residency 0-2; the dropped code bits >> 1 is 0 without the column and 1
    // or 2 with it; the read bit (expert_bytes = the layer's bytes) only on a
    // miss. The checker's other expert_bytes and dropped checks cannot fail on
    // a decoded record.
    for (std::uint32_t& e : combo_) e = 0xffffffffu;
    for (std::uint32_t phase = 0; phase < 2; ++phase)
      for (std::uint32_t residency = 0; residency < 3; ++residency)
        for (std::uint32_t bits = 0; bits < 8; ++bits) {
          const std::uint32_t code = bits >> 1;
          const bool dropped_ok = h.has_dropped_column ? (code == 1 || code == 2) : code == 0;
          if (!dropped_ok || ((bits & 1) && residency != 0)) continue;
          const std::uint32_t x = phase | residency << 8 | bits << 16;
          combo_[combo_index(x)] = x;
        }
  }

  /// The table slot of x = phase | residency << 8 | bits << 16: bits 0, 8-9
  /// and 16-18 of x moved to 0-5 (x·(2^13 + 2^6 + 1) puts them at 13-18 with
  /// nothing carried into those bits). Exhaustively tested to be one to one on them.
  static constexpr std::uint32_t combo_index(std::uint32_t x) noexcept {
    return (((x & 0x070301u) * ((1u << 13) + (1u << 6) + 1u)) >> 13) & 63u;
  }

  /// Checks the `n` records at `rp` and returns true when they may follow the
  /// records checked so far. After false, the state is unspecified (the
  /// reader stops there). Two loops over the records (in L1): the checks of
  /// each record against the header, then the routings and their order.
  bool check(const unsigned char* rp, std::size_t n) noexcept {
    if (!check_values(rp, n)) return false;
    if (k_ == 256) return all_routable_ ? check_sequence<true, true>(rp, n) : check_sequence<false, true>(rp, n);
    return all_routable_ ? check_sequence<true>(rp, n) : check_sequence<false>(rp, n);
  }

  /// True when the records checked so far may end the file (trace_row_checker::finish):
  /// some routing, the last with all its rows, the last token with all its layers.
  bool finish() const noexcept {
    if (!has_prev_) return false;
    const std::uint32_t last_slot = static_cast<std::uint32_t>((next_key_ - (std::uint64_t{1} << 32)) >> 32) & 0xffu;
    return last_slot + 1 == k_ && layers_.end(true, prev_layer_) == token_layers::fault::none;
  }

  /// The checks of each record against the header alone: layer, expert and
  /// slot in range, the weight in its domain, the (phase, residency, bits) bytes accepted. Four records
  /// at a time in 16-bit lanes where the compiler has vector extensions on a
  /// little-endian host (check_values_vector), else one by one
  /// (check_values_scalar, the twin; the tests hold them to the same verdict).
  bool check_values(const unsigned char* rp, std::size_t n) const noexcept {
#if MOE_RESIDENCY_BINARY_SCAN_VECTOR
    return check_values_vector(rp, n);
#else
    return check_values_scalar(rp, n);
#endif
  }

  bool check_values_scalar(const unsigned char* rp, std::size_t n) const noexcept {
    const std::uint32_t n_layer = n_layer_, n_expert = n_expert_, k = k_;
    for (const unsigned char* const end = rp + n * binary_trace_record_size; rp != end;
         rp += binary_trace_record_size) {
      const std::uint64_t w = load_le<std::uint64_t>(rp + 12);  // layer | expert << 16 | slot << 32 | phase << 40
                                                                //   | residency << 48 | bits << 56
      const auto layer = static_cast<std::uint32_t>(w & 0xffffu);
      const auto expert = static_cast<std::uint32_t>(w >> 16) & 0xffffu;
      const auto slot = static_cast<std::uint32_t>(w >> 32) & 0xffu;
      const auto x = static_cast<std::uint32_t>(w >> 40);  // phase | residency << 8 | bits << 16
      if (layer >= n_layer || expert >= n_expert || slot >= k || combo_[combo_index(x)] != x ||
          !weight_bits_in_domain(load_le<std::uint32_t>(rp + 8)))
        return false;
    }
    return true;
  }

#if MOE_RESIDENCY_BINARY_SCAN_VECTOR
  /// check_values_scalar's checks as compares of 16-bit lanes, four records
  /// (their bytes 12-19: layer, expert, slot | phase << 8, residency | bits
  /// << 8) per vector of 16 lanes; the rest one by one.
#if defined(__GNUC__) || defined(__clang__)
  __attribute__((noinline))
#endif
  bool
  check_values_vector(const unsigned char* rp, std::size_t n) const noexcept {
    typedef std::uint16_t u16x16 __attribute__((vector_size(32)));
    typedef std::uint32_t u32x4 __attribute__((vector_size(16)));
    typedef std::uint64_t u64x4 __attribute__((vector_size(32)));
    // Per lane of a record: (v & m1) <= l1, ((v - s2) & m2) <= l2, (v & m3) <= l3.
    //   layer <= n_layer - 1; expert <= n_expert - 1; slot <= k - 1 and
    //   phase <= 1; residency <= 2, the bits byte 0-1 without a dropped column
    //   (2-5 with one: minus 2, at most 3), and the read bit only with
    //   residency 0 (residency | read << 8 at most 0x100).
    const bool dropped = has_dropped_;
    const std::uint16_t m1[4] = {0xffff, 0xffff, 0x00ff, 0x00ff},
                        l1[4] = {static_cast<std::uint16_t>(n_layer_ - 1), static_cast<std::uint16_t>(n_expert_ - 1),
                                 static_cast<std::uint16_t>(k_ - 1), 2},
                        s2[4] = {0, 0, 0, static_cast<std::uint16_t>(dropped ? 0x200 : 0)},
                        m2[4] = {0, 0, 0xff00, 0xff00},
                        l2[4] = {0, 0, 0x100, static_cast<std::uint16_t>(dropped ? 0x300 : 0x100)},
                        m3[4] = {0, 0, 0, 0x01ff}, l3[4] = {0, 0, 0, 0x100};
    u16x16 vm1, vl1, vs2, vm2, vl2, vm3, vl3;
    auto splat = [](u16x16& v, const std::uint16_t(&lanes)[4]) {
      std::uint16_t all[16];
      for (int i = 0; i < 16; ++i) all[i] = lanes[i % 4];
      std::memcpy(&v, all, sizeof v);
    };
    splat(vm1, m1);
    splat(vl1, l1);
    splat(vs2, s2);
    splat(vm2, m2);
    splat(vl2, l2);
    splat(vm3, m3);
    splat(vl3, l3);
    u16x16 ok = vm1 | ~vm1;  // all lanes set: a <= b is a saturating subtraction and one compare
    // The four weights (bytes 8-11) in 32-bit lanes: weight_bits_in_domain.
    const u32x4 inf = {0x7f800000u, 0x7f800000u, 0x7f800000u, 0x7f800000u},
                magnitude = {0x7fffffffu, 0x7fffffffu, 0x7fffffffu, 0x7fffffffu},
                negative_zero = {0x80000000u, 0x80000000u, 0x80000000u, 0x80000000u};
    u32x4 weights_ok = ~(inf ^ inf);  // all lanes set
    // One vector of the same bytes of four records (a quarter of the vector
    // each, from `p` on, one record apart).
    auto gather4 = [](auto& vec, const unsigned char* p) {
      constexpr std::size_t size = sizeof(std::remove_reference_t<decltype(vec)>), field = size / 4;
      unsigned char bytes[size];
      for (std::size_t r = 0; r < 4; ++r) std::memcpy(bytes + r * field, p + r * binary_trace_record_size, field);
      std::memcpy(&vec, bytes, size);
    };
    std::size_t i = 0;
    for (; i + 4 <= n; i += 4, rp += 4 * binary_trace_record_size) {
      u16x16 v;  // bytes 12-19: layer, expert, slot | phase << 8, residency | bits << 8
      gather4(v, rp + 12);
      ok &= (u16x16)((v & vm1) <= vl1) & (u16x16)(((v - vs2) & vm2) <= vl2) & (u16x16)((v & vm3) <= vl3);
      u32x4 b;  // bytes 8-11: the weight
      gather4(b, rp + 8);
      weights_ok &= (u32x4)(b < inf) | (u32x4)((b & magnitude) > inf) | (u32x4)(b == negative_zero);
    }
    u64x4 o4;
    std::memcpy(&o4, &ok, sizeof o4);
    std::uint64_t o[4];
    std::memcpy(o, &o4, sizeof o);
    std::uint32_t wo[4];
    std::memcpy(wo, &weights_ok, sizeof wo);
    if ((o[0] & o[1] & o[2] & o[3]) != ~std::uint64_t{0} || (wo[0] & wo[1] & wo[2] & wo[3]) != 0xffffffffu)
      return false;
    return check_values_scalar(rp, n - i);
  }
#endif

 private:
  // AllRoutable: every layer below n_layer has expert bytes (no table look-up).
  // Slot255: k = 256, where a slot of 255 + 1 carries into the phase byte of the
  // routing key, so a continuing row must also have a slot above 0.
  // The records passed check_values: layer, expert and slot are in range.
  template <bool AllRoutable, bool Slot255 = false>
#if defined(__GNUC__) || defined(__clang__)
  // Out of line: inlined into the reader, its loop spilled its state.
  __attribute__((noinline))
#endif
  bool
  check_sequence(const unsigned char* rp, std::size_t n) noexcept {
    // The hot state in locals (the stamp stores may alias members).
    const unsigned char* const routable = routable_.data();
    std::uint64_t* const stamp = stamp_.data();
    std::uint64_t routing = routing_, prev_ts = prev_ts_, next_key = next_key_;
    for (const unsigned char* const end = rp + n * binary_trace_record_size; rp != end;
         rp += binary_trace_record_size) {
      const std::uint64_t ts = load_le<std::uint64_t>(rp);      // turn | step << 32
      const std::uint64_t w = load_le<std::uint64_t>(rp + 12);  // as in check_values_scalar
      // The routing key: layer | slot << 32 | phase << 40; a row continues the
      // routing when its turn, step, layer and phase are the previous row's
      // and its slot is the next one.
      const std::uint64_t key = w & 0x0000ffff0000ffffu;
      if (ts != prev_ts || key != next_key || (Slot255 && ((w >> 32) & 0xffu) == 0)) {
        // A new routing begins here (or the row is out of rank order): slot 0,
        // not the previous routing's (turn, step, layer, phase), in order.
        const std::uint64_t prev_key = next_key - (std::uint64_t{1} << 32);
        if (((w >> 32) & 0xffu) != 0 || (ts == prev_ts && ((key ^ prev_key) & 0x0000ff000000ffffu) == 0)) return false;
        if (!begin_routing(static_cast<std::uint32_t>(ts), static_cast<std::uint32_t>(ts >> 32),
                           static_cast<std::uint32_t>(w >> 40) & 0xffu, static_cast<std::uint32_t>(w & 0xffffu),
                           static_cast<std::uint32_t>(prev_key >> 32) & 0xffu))
          return false;
        ++routing;
        prev_ts = ts;
      }
      next_key = key + (std::uint64_t{1} << 32);
      if (!AllRoutable && !routable[w & 0xffffu]) return false;
      // Its own 16-bit load (one instruction) rather than bits of w (three).
      const std::size_t expert = load_le<std::uint16_t>(rp + 14);
      if (stamp[expert] == routing) return false;  // the expert is already in this routing
      stamp[expert] = routing;
    }
    routing_ = routing;
    prev_ts_ = prev_ts;
    next_key_ = next_key;
    return true;
  }

  // trace_row_checker::order_fault, its routing and token completeness
  // checks, and commit_new_routing: may a routing beginning here follow the
  // previous one (phase 0 prefill, 1 decode), whose last slot was prev_slot?
  // Updates the order state either way (the caller stops at a refusal).
  bool begin_routing(std::uint32_t turn, std::uint32_t step, unsigned phase, unsigned layer,
                     std::uint32_t prev_slot) noexcept {
    bool ok = true;
    if (has_prev_ && turn <= prev_turn_) {  // a new turn starts afresh
      if (turn < prev_turn_) {
        ok = false;
      } else if (phase == 0 && prev_phase_ == 1) {  // prefill after decode
        ok = false;
      } else if (phase == 1) {
        if (prev_phase_ == 1) ok = !(step < prev_step_ || (step == prev_step_ && layer < prev_layer_));
      } else if (layer == prev_layer_ && step < prev_step_) {
        ok = false;
      } else {
        const bool fs = floor_set_ || layer < prev_layer_;
        const std::uint32_t fl = layer < prev_layer_ ? max_step_ : floor_;
        ok = !(fs && step <= fl);
      }
    }
    if (ok)
      ok = (!has_prev_ || prev_slot + 1 == k_) &&
           layers_.next(has_prev_, prev_turn_, prev_phase_, prev_step_, prev_layer_, turn, phase, step, layer) ==
               token_layers::fault::none;
    const bool new_turn = !has_prev_ || turn != prev_turn_;
    if (new_turn) {
      prefill_any_ = false;
      floor_set_ = false;
    }
    if (phase == 0) {
      if (!new_turn && prev_phase_ == 0 && layer < prev_layer_) {
        floor_ = max_step_;
        floor_set_ = true;
      }
      max_step_ = prefill_any_ ? std::max(max_step_, step) : step;
      prefill_any_ = true;
    }
    has_prev_ = true;
    prev_turn_ = turn;
    prev_phase_ = phase;
    prev_step_ = step;
    prev_layer_ = layer;
    return ok;
  }

  std::uint32_t n_layer_, n_expert_, k_;
  [[maybe_unused]] bool has_dropped_;  // read by the vector checks only
  token_layers layers_;
  bool all_routable_ = true;
  std::vector<unsigned char> routable_;  // per layer: 1 when it has expert bytes
  std::uint32_t combo_[64];
  std::vector<std::uint64_t> stamp_;  // per expert: the routing that last routed it (0 = none)
  std::uint64_t routing_ = 0;         // routings started so far
  // The previous row's turn | step << 32, and its routing key with the slot
  // one higher; the key of no row has the bits 48 and above set, so the first
  // row never continues a routing.
  std::uint64_t prev_ts_ = 0, next_key_ = ~std::uint64_t{0};
  // Row order (trace_row_checker's), read and written where a routing begins.
  bool has_prev_ = false, prefill_any_ = false, floor_set_ = false;
  std::uint32_t prev_turn_ = 0, prev_step_ = 0, max_step_ = 0, floor_ = 0;
  unsigned prev_phase_ = 1, prev_layer_ = 0;
};

}  // namespace detail
}  // namespace moe_residency
