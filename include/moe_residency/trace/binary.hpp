#pragma once
/// The compact binary route trace (20 bytes per row; layout in
/// detail/trace_binary.hpp): a reader that validates every row as the CSV
/// parser does, and a writer. See docs/traces.md.
///
/// Why this header is long: the reader is three passes that must agree —
/// the fast scan (vector lanes and their scalar twin), the decoders (vector
/// tail, 64-bit words, member by member) and the exact pass whose messages
/// the reader throws — and the tests hold each to the others. Kept together
/// so a change to a check is made, and reviewed, in every pass at once.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/detail/trace_binary.hpp"
#include "moe_residency/detail/trace_text.hpp"
#include "moe_residency/detail/xxhash64.hpp"
#include "moe_residency/error.hpp"
#include "moe_residency/trace/types.hpp"
#include "moe_residency/trace/validate.hpp"

// The scanner's value checks in vector lanes: GCC or Clang vector extensions
// (SSE2/AVX2, NEON, or scalar code where the target has none) on a
// little-endian host; the scalar twin elsewhere. Define it 0 to build the
// scalar path only.
#ifndef MOE_RESIDENCY_BINARY_SCAN_VECTOR
#if (defined(__GNUC__) || defined(__clang__)) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define MOE_RESIDENCY_BINARY_SCAN_VECTOR 1
#else
#define MOE_RESIDENCY_BINARY_SCAN_VECTOR 0
#endif
#endif

namespace moe_residency {

/// Parses the binary form. `source_name` prefixes error messages ("record i,
/// column c: ..."). A version 1 file (no checksums) is read, and a warning
/// sent to `on_warning` (stderr when empty) says so.
validated_route_trace parse_route_trace_binary(std::string_view bytes, const std::string& source_name,
                                               const warning_sink& on_warning = {});
/// Writes the binary form, version 2 (20 bytes per row, a checksum per 4096 rows).
void write_route_trace_binary(const validated_route_trace& trace, std::ostream& out);
/// Validates the whole trace first and throws `error` before writing anything.
void write_route_trace_binary(const route_trace& trace, std::ostream& out);

namespace detail {

inline std::string binary_header_bytes(const trace_header& h, std::uint64_t n_rows,
                                       std::uint32_t version = binary_trace_version) {
  std::string out(binary_trace_fixed_header, '\0');
  auto* p = reinterpret_cast<unsigned char*>(&out[0]);
  std::memcpy(p, binary_trace_magic, 8);
  store_le<std::uint32_t>(p + 8, version);
  store_le<std::uint32_t>(p + 12, static_cast<std::uint32_t>(binary_trace_record_size));
  store_le<std::uint32_t>(p + 16, h.has_dropped_column ? 1u : 0u);
  store_le<std::uint32_t>(p + 20, static_cast<std::uint32_t>(h.n_layer));
  store_le<std::uint32_t>(p + 24, static_cast<std::uint32_t>(h.n_expert));
  store_le<std::uint32_t>(p + 28, static_cast<std::uint32_t>(h.n_expert_used));
  store_le<std::uint64_t>(p + 32, n_rows);
  store_le<std::uint32_t>(p + 40, static_cast<std::uint32_t>(h.model.size()));
  store_le<std::uint32_t>(p + 44, static_cast<std::uint32_t>(h.arch.size()));
  out += h.model;
  out += h.arch;
  out.resize(pad8(out.size()), '\0');
  const std::size_t at = out.size();
  out.resize(at + 16 * h.n_layer + pad8(h.n_layer), '\0');
  p = reinterpret_cast<unsigned char*>(&out[0]) + at;
  for (std::size_t l = 0; l < h.n_layer; ++l) {
    store_le<std::uint64_t>(p + 8 * l, h.expert_bytes[l]);
    store_le<std::uint64_t>(p + 8 * (h.n_layer + l), h.dense_bytes[l]);
    p[16 * h.n_layer + l] = h.layer_listed.empty() || h.layer_listed[l] ? 1 : 0;
  }
  return out;
}

/// True when a trace_row's bytes are a record's first 19 bytes followed by
/// the dropped byte, zero padding and expert_bytes (little-endian host, the
/// member order of trace/types.hpp): the decoder then writes a row as a
/// 16-byte copy of the record and two composed 64-bit words instead of ten
/// narrow stores.
inline bool trace_row_mirrors_record() noexcept {
  const std::uint32_t one = 1;
  unsigned char first = 0;
  std::memcpy(&first, &one, 1);
  return first == 1 && sizeof(trace_row) == 32 && offsetof(trace_row, turn) == 0 && offsetof(trace_row, step) == 4 &&
         offsetof(trace_row, weight) == 8 && offsetof(trace_row, layer) == 12 && offsetof(trace_row, expert) == 14 &&
         offsetof(trace_row, slot) == 16 && offsetof(trace_row, phase) == 17 && offsetof(trace_row, residency) == 18 &&
         offsetof(trace_row, dropped) == 19 && offsetof(trace_row, expert_bytes) == 24 && sizeof(run_phase) == 1 &&
         sizeof(layer_id) == 2 && sizeof(expert_id) == 2;
}

/// How the decoder writes a row: the record's first 16 bytes and a tail
/// composed in one 16-byte vector (`lanes`, with vector extensions), or in
/// two 64-bit words (`words`), where the layout allows either; or member by
/// member (anywhere). The tests hold every one built here to the others.
enum class row_store : std::uint8_t { lanes, words, members };
inline constexpr row_store default_row_store = MOE_RESIDENCY_BINARY_SCAN_VECTOR ? row_store::lanes : row_store::words;

/// Per value of a record's bits byte (0-7 once the scanner accepted it): the
/// dropped byte (bits >> 1, minus 1) at bit 24 of the row's tail word, and the
/// mask that keeps the layer's expert bytes when bit 0 (read) is set.
inline constexpr std::uint64_t binary_dropped_word[8] = {0xffu << 24, 0xffu << 24, 0,        0,
                                                         1u << 24,    1u << 24,    2u << 24, 2u << 24};
inline constexpr std::uint64_t binary_read_mask[8] = {0, ~std::uint64_t{0}, 0, ~std::uint64_t{0},
                                                      0, ~std::uint64_t{0}, 0, ~std::uint64_t{0}};

/// Decodes one record the scanner accepted (its layer is below n_layer) into
/// a row. `layer_bytes` is the header's expert_bytes.
#if MOE_RESIDENCY_BINARY_SCAN_VECTOR
/// Per value of the bits byte: the row's tail (bytes 16-31) is
/// ({spr, layer's expert bytes} & binary_tail_mask[bits]) | binary_tail_bits[bits].
typedef std::uint64_t binary_u64x2 __attribute__((vector_size(16)));
inline constexpr binary_u64x2 binary_tail_mask[8] = {
    {0x00ffffffu, 0}, {0x00ffffffu, ~std::uint64_t{0}}, {0x00ffffffu, 0}, {0x00ffffffu, ~std::uint64_t{0}},
    {0x00ffffffu, 0}, {0x00ffffffu, ~std::uint64_t{0}}, {0x00ffffffu, 0}, {0x00ffffffu, ~std::uint64_t{0}}};
inline constexpr binary_u64x2 binary_tail_bits[8] = {{0xffu << 24, 0}, {0xffu << 24, 0}, {0, 0},        {0, 0},
                                                     {1u << 24, 0},    {1u << 24, 0},    {2u << 24, 0}, {2u << 24, 0}};
#endif

template <row_store Store = default_row_store>
inline trace_row decode_binary_record(const unsigned char* rp, const std::uint64_t* layer_bytes) noexcept {
  if (Store != row_store::members && !trace_row_mirrors_record())
    return decode_binary_record<row_store::members>(rp, layer_bytes);
  const std::uint32_t spr = load_le<std::uint32_t>(rp + 16);  // slot | phase << 8 | residency << 16 | bits << 24
  const std::size_t layer = load_le<std::uint16_t>(rp + 12);
  trace_row r;
#if MOE_RESIDENCY_BINARY_SCAN_VECTOR
  if (Store == row_store::lanes) {
    const std::uint32_t bits = rp[19] & 7u;  // a byte load: spr itself goes straight into the vector
    const binary_u64x2 v = {spr, layer_bytes[layer]};
    const binary_u64x2 tail = (v & binary_tail_mask[bits]) | binary_tail_bits[bits];
    // Straight into the row, half by half: composed in a 32-byte buffer
    // first, GCC wrote the halves to the stack and read them back as one
    // 32-byte load, which no store forwards (AVX-512 Zen 4: 4.9 ns per row).
    auto* const out = reinterpret_cast<unsigned char*>(&r);
    std::memcpy(out, rp, 16);  // turn, step, weight, layer, expert: the record's own bytes
    std::memcpy(out + 16, &tail, 16);
    return r;
  }
#endif
  if (Store != row_store::members) {
    // Two table look-ups instead of arithmetic on the bits byte.
    const std::uint32_t bits = (spr >> 24) & 7u;
    const std::uint64_t tail = (spr & 0x00ffffffu) | binary_dropped_word[bits];  // slot, phase, residency, dropped
    const std::uint64_t read_bytes = layer_bytes[layer] & binary_read_mask[bits];
    auto* const out = reinterpret_cast<unsigned char*>(&r);  // as above: no 32-byte buffer
    std::memcpy(out, rp, 16);  // turn, step, weight, layer, expert: the record's own bytes
    std::memcpy(out + 16, &tail, 8);
    std::memcpy(out + 24, &read_bytes, 8);
  } else {
    // The plain decoding: each field from its bytes.
    const std::uint32_t bits = spr >> 24;
    r.turn = load_le<std::uint32_t>(rp);
    r.step = load_le<std::uint32_t>(rp + 4);
    r.weight = bits_float(load_le<std::uint32_t>(rp + 8));
    r.layer = static_cast<layer_id>(layer);
    r.expert = static_cast<expert_id>(load_le<std::uint16_t>(rp + 14));
    r.slot = static_cast<std::uint8_t>(spr & 0xffu);
    r.phase = static_cast<run_phase>((spr >> 8) & 0xffu);
    r.residency = static_cast<std::uint8_t>((spr >> 16) & 0xffu);
    r.dropped = static_cast<std::int8_t>(static_cast<int>(bits >> 1) - 1);
    r.expert_bytes = (bits & 1u) ? layer_bytes[layer] : 0;
  }
  return r;
}

/// A random-access view of accepted records as rows, decoded on dereference:
/// `rows.insert(rows.end(), first, last)` then constructs each row in place
/// in the vector's storage (one write of the rows; no buffer, no
/// value-initialising pass). Its reference is the row itself (a prvalue), as
/// std::vector's range insert needs nothing more.
template <row_store Store = default_row_store>
class binary_row_iterator {
 public:
  using iterator_category = std::random_access_iterator_tag;
  using value_type = trace_row;
  using difference_type = std::ptrdiff_t;
  using pointer = const trace_row*;
  using reference = trace_row;

  binary_row_iterator() = default;
  binary_row_iterator(const unsigned char* rp, const std::uint64_t* layer_bytes) noexcept
      : rp_(rp), layer_bytes_(layer_bytes) {}

  trace_row operator*() const noexcept { return decode_binary_record<Store>(rp_, layer_bytes_); }
  trace_row operator[](difference_type i) const noexcept { return *(*this + i); }
  binary_row_iterator& operator++() noexcept {
    rp_ += binary_trace_record_size;
    return *this;
  }
  binary_row_iterator operator++(int) noexcept {
    binary_row_iterator o = *this;
    ++*this;
    return o;
  }
  binary_row_iterator& operator--() noexcept {
    rp_ -= binary_trace_record_size;
    return *this;
  }
  binary_row_iterator operator--(int) noexcept {
    binary_row_iterator o = *this;
    --*this;
    return o;
  }
  binary_row_iterator& operator+=(difference_type n) noexcept {
    rp_ += n * static_cast<difference_type>(binary_trace_record_size);
    return *this;
  }
  binary_row_iterator& operator-=(difference_type n) noexcept { return *this += -n; }
  friend binary_row_iterator operator+(binary_row_iterator a, difference_type n) noexcept { return a += n; }
  friend binary_row_iterator operator+(difference_type n, binary_row_iterator a) noexcept { return a += n; }
  friend binary_row_iterator operator-(binary_row_iterator a, difference_type n) noexcept { return a -= n; }
  friend difference_type operator-(const binary_row_iterator& a, const binary_row_iterator& b) noexcept {
    return (a.rp_ - b.rp_) / static_cast<difference_type>(binary_trace_record_size);
  }
  friend bool operator==(const binary_row_iterator& a, const binary_row_iterator& b) noexcept { return a.rp_ == b.rp_; }
  friend bool operator!=(const binary_row_iterator& a, const binary_row_iterator& b) noexcept { return a.rp_ != b.rp_; }
  friend bool operator<(const binary_row_iterator& a, const binary_row_iterator& b) noexcept { return a.rp_ < b.rp_; }
  friend bool operator>(const binary_row_iterator& a, const binary_row_iterator& b) noexcept { return b < a; }
  friend bool operator<=(const binary_row_iterator& a, const binary_row_iterator& b) noexcept { return !(b < a); }
  friend bool operator>=(const binary_row_iterator& a, const binary_row_iterator& b) noexcept { return !(a < b); }

 private:
  const unsigned char* rp_ = nullptr;
  const std::uint64_t* layer_bytes_ = nullptr;
};

/// Appends the `n` accepted records at `rp` to `rows` (whose capacity holds
/// them), each row constructed in place from its record.
#if defined(__GNUC__) || defined(__clang__)
// Out of line: inlined into the reader, its loop spilled its pointers.
__attribute__((noinline))
#endif
inline void
append_binary_rows(std::vector<trace_row>& rows, const unsigned char* rp, std::size_t n,
                   const std::uint64_t* layer_bytes) {
  const binary_row_iterator<> first(rp, layer_bytes);
  rows.insert(rows.end(), first, first + static_cast<std::ptrdiff_t>(n));
}

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
  bool has_dropped_;
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

/// The exact pass: each record decoded straight into a new row of `rows`,
/// field by field, and run through trace_row_checker; throws the checker's
/// message ("<source>: record i, column c: ...") at the first row it refuses.
/// The reader runs it only for a file the scanner refused; the benchmark
/// times it as the reader's reference twin (it was the whole reader).
inline void read_binary_rows_exact(const unsigned char* rp, std::uint64_t n_rows, const trace_header& h,
                                   std::vector<trace_row>& rows, const std::string& source_name) {
  rows.reserve(static_cast<std::size_t>(n_rows));
  const std::size_t n_layer = h.n_layer;
  const std::uint64_t* layer_bytes = h.expert_bytes.data();
  const unsigned dropped_code = h.has_dropped_column ? 1u : 0u;  // (bits >> 1) != 0 must equal this
  trace_row_checker checker(h);
  trace_issue issue;
  for (std::uint64_t i = 0; i < n_rows; ++i, rp += binary_trace_record_size) {
    trace_row& r = rows.emplace_back();
    r.turn = load_le<std::uint32_t>(rp);
    r.step = load_le<std::uint32_t>(rp + 4);
    r.weight = bits_float(load_le<std::uint32_t>(rp + 8));
    r.layer = static_cast<layer_id>(load_le<std::uint16_t>(rp + 12));
    r.expert = static_cast<expert_id>(load_le<std::uint16_t>(rp + 14));
    r.slot = rp[16];
    r.phase = static_cast<run_phase>(rp[17]);
    r.residency = rp[18];
    const unsigned bits = rp[19];
    if (bits > 7 || (bits >> 1) == 3 || static_cast<unsigned>((bits >> 1) != 0) != dropped_code)
      throw error(source_name + ": record " + std::to_string(i) + ", column dropped: bits " + std::to_string(bits) +
                  (h.has_dropped_column ? "; expected dropped 0 or 1" : "; expected no dropped value (no column)"));
    r.dropped = static_cast<std::int8_t>(static_cast<int>(bits >> 1) - 1);
    const std::size_t layer = to_index(r.layer);
    r.expert_bytes = (bits & 1) && layer < n_layer ? layer_bytes[layer] : 0;
    if (!checker.check(r, issue))
      throw error(source_name + ": record " + std::to_string(i) + ", column " + column_name(issue.column) + ": " +
                  issue.message);
  }
  if (!checker.finish(issue))
    throw error(source_name + ": end of records (" + std::to_string(n_rows) + " records): " + issue.message);
}

/// Version 2's checksums, the file's size already checked: the header's, then
/// each block's, against the ones stored after the records. Throws `error`
/// naming the part whose bytes (or stored checksum) are damaged.
inline void check_binary_checksums(const unsigned char* b, std::size_t layers_end, std::uint64_t n_rows,
                                   const std::string& source_name) {
  auto hex = [](std::uint64_t v) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
    return std::string(buf);
  };
  const unsigned char* const records = b + layers_end;
  const unsigned char* const sums = records + static_cast<std::size_t>(n_rows) * binary_trace_record_size;
  const std::uint64_t header = xxh64(b, layers_end), header_stored = load_le<std::uint64_t>(sums);
  if (header != header_stored)
    throw error(source_name + ": header checksum (XXH64) " + hex(header) + ", stored " + hex(header_stored) +
                ": the header (bytes 0 to " + std::to_string(layers_end - 1) + ") or its checksum is damaged");
  const std::uint64_t blocks = (n_rows + binary_trace_block_records - 1) / binary_trace_block_records;
  for (std::uint64_t k = 0; k < blocks; ++k) {
    const std::uint64_t first = k * binary_trace_block_records;
    const std::uint64_t count = std::min(binary_trace_block_records, n_rows - first);
    const std::uint64_t sum = xxh64(records + static_cast<std::size_t>(first) * binary_trace_record_size,
                                    static_cast<std::size_t>(count) * binary_trace_record_size);
    const std::uint64_t stored = load_le<std::uint64_t>(sums + 8 + 8 * static_cast<std::size_t>(k));
    if (sum != stored)
      throw error(source_name + ": records " + std::to_string(first) + " to " + std::to_string(first + count - 1) +
                  " (block " + std::to_string(k) + " of " + std::to_string(blocks) + "): checksum (XXH64) " + hex(sum) +
                  ", stored " + hex(stored) + ": a byte in them or their checksum is damaged");
  }
}

/// Which pass reads the records: the reader's (scan, then decode; the exact
/// pass only for a refused file's message) or the exact pass alone (the
/// benchmark's and the tests' reference).
enum class binary_rows_pass : std::uint8_t { scan_then_decode, exact };

/// What a binary trace's fixed header says about the file: its version, the
/// lengths of its parts, and where its records begin.
struct binary_trace_frame {
  std::uint32_t version = 0;
  bool checked = false;  ///< version 2: checksums after the records
  std::uint32_t flags = 0;
  std::uint32_t n_layer = 0, n_expert = 0, n_expert_used = 0;
  std::uint64_t n_rows = 0;
  std::uint32_t model_len = 0, arch_len = 0;
  binary_trace_extent extent{};
};

/// Reads and checks the fixed header (the first binary_trace_fixed_header
/// bytes of `head`) against the file's total `size`: magic, version, record
/// size, flags, layer count, and that the header, the records and their
/// checksums fill the file exactly. Needs only the file's first bytes, so a
/// reader can refuse a large file that is not a trace before reading it
/// whole. Throws `error` prefixed with `source_name`.
inline binary_trace_frame read_binary_trace_frame(std::string_view head, std::uint64_t size,
                                                  const std::string& source_name) {
  const auto* b = reinterpret_cast<const unsigned char*>(head.data());
  auto fail = [&](const std::string& m) -> error { return error(source_name + ": " + m); };
  if (size < 8 || head.size() < 8 || std::memcmp(b, binary_trace_magic, 8) != 0)
    throw fail("not a binary route trace: bad magic " + quote_field(head.substr(0, 8)) + "; expected '\\x89MRTRACE'");
  if (size < binary_trace_fixed_header || head.size() < binary_trace_fixed_header)
    throw fail("truncated: " + std::to_string(size) + " bytes; the fixed header alone is " +
               std::to_string(binary_trace_fixed_header));
  binary_trace_frame f;
  f.version = load_le<std::uint32_t>(b + 8);
  if (f.version != binary_trace_version && f.version != binary_trace_version_unchecked)
    throw fail("unsupported binary version " + std::to_string(f.version) + "; this reader supports " +
               std::to_string(binary_trace_version_unchecked) + " and " + std::to_string(binary_trace_version));
  f.checked = f.version == binary_trace_version;
  const std::uint32_t record_size = load_le<std::uint32_t>(b + 12);
  if (record_size != binary_trace_record_size)
    throw fail("record size " + std::to_string(record_size) + "; expected " + std::to_string(binary_trace_record_size) +
               " for version " + std::to_string(f.version));
  f.flags = load_le<std::uint32_t>(b + 16);
  if (f.flags > 1) throw fail("header flags " + std::to_string(f.flags) + " have unknown bits; expected 0 or 1");
  f.n_layer = load_le<std::uint32_t>(b + 20);
  f.n_expert = load_le<std::uint32_t>(b + 24);
  f.n_expert_used = load_le<std::uint32_t>(b + 28);
  f.n_rows = load_le<std::uint64_t>(b + 32);
  f.model_len = load_le<std::uint32_t>(b + 40);
  f.arch_len = load_le<std::uint32_t>(b + 44);
  if (f.n_layer < 1 || f.n_layer > 65535)
    throw fail("header: n_layer " + std::to_string(f.n_layer) + " out of range [1, 65535]");
  // In 64 bits, and compared with the size before any offset becomes a size_t.
  f.extent = binary_trace_header_extent(f.model_len, f.arch_len, f.n_layer);
  if (size < f.extent.layers_end)
    throw fail("truncated: " + std::to_string(size) + " bytes; the header needs " +
               std::to_string(f.extent.layers_end));
  const std::uint64_t body = size - f.extent.layers_end;
  if (body / binary_trace_record_size < f.n_rows)
    throw fail("truncated: " + std::to_string(body) + " bytes of records for " + std::to_string(f.n_rows) +
               " rows; expected " + std::to_string(f.n_rows * binary_trace_record_size) +
               (f.checked ? " and their checksums" : ""));
  // n_rows <= body / 20 from here: nothing below wraps.
  const std::uint64_t expected_body =
      f.n_rows * binary_trace_record_size + (f.checked ? binary_trace_trailer_size(f.n_rows) : 0);
  if (body < expected_body)
    throw fail("truncated: " + std::to_string(body) + " bytes of records and checksums for " +
               std::to_string(f.n_rows) + " rows; expected " + std::to_string(expected_body));
  if (body != expected_body)
    throw fail(std::to_string(body - expected_body) + " bytes after the last " + (f.checked ? "checksum of " : "of ") +
               std::to_string(f.n_rows) + " records; expected the file to end there");
  return f;
}

inline validated_route_trace parse_route_trace_binary_with(std::string_view bytes, const std::string& source_name,
                                                           binary_rows_pass pass) {
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  auto fail = [&](const std::string& m) -> error { return error(source_name + ": " + m); };
  const binary_trace_frame f = read_binary_trace_frame(bytes, bytes.size(), source_name);
  route_trace t;
  t.binary_version = f.version;
  trace_header& h = t.header;
  h.has_dropped_column = f.flags & 1;
  h.n_layer = f.n_layer;
  h.n_expert = f.n_expert;
  h.n_expert_used = f.n_expert_used;
  const std::uint64_t n_rows = f.n_rows;
  const std::uint32_t model_len = f.model_len, arch_len = f.arch_len;
  const bool checked = f.checked;
  const std::size_t strings_end = static_cast<std::size_t>(f.extent.strings_end);
  const std::size_t layers_end = static_cast<std::size_t>(f.extent.layers_end);
  if (checked) check_binary_checksums(b, layers_end, n_rows, source_name);
  // The layout's padding is zero; anything else means the lengths do not describe the file.
  auto check_padding = [&](std::uint64_t from, std::uint64_t to, const char* after) {
    for (std::uint64_t i = from; i < to; ++i)
      if (b[i] != 0)
        throw fail("header: padding byte at offset " + std::to_string(i) + " after the " + after + " is " +
                   std::to_string(b[i]) + "; expected 0");
  };
  check_padding(binary_trace_fixed_header + std::uint64_t{model_len} + arch_len, strings_end, "model and arch strings");
  check_padding(strings_end + 17 * static_cast<std::uint64_t>(h.n_layer), layers_end, "layer flags");
  h.model.assign(reinterpret_cast<const char*>(b) + binary_trace_fixed_header, std::size_t{model_len});
  h.arch.assign(reinterpret_cast<const char*>(b) + binary_trace_fixed_header + std::size_t{model_len},
                std::size_t{arch_len});
  h.expert_bytes.resize(h.n_layer);
  h.dense_bytes.resize(h.n_layer);
  h.layer_listed.resize(h.n_layer);
  const unsigned char* lp = b + strings_end;
  for (std::size_t l = 0; l < h.n_layer; ++l) {
    h.expert_bytes[l] = load_le<std::uint64_t>(lp + 8 * l);
    h.dense_bytes[l] = load_le<std::uint64_t>(lp + 8 * (h.n_layer + l));
    const unsigned char listed = lp[16 * h.n_layer + l];
    if (listed > 1)
      throw fail("header: layer " + std::to_string(l) + " listed flag " + std::to_string(listed) + "; expected 0 or 1");
    h.layer_listed[l] = listed != 0;
    if (!listed && (h.expert_bytes[l] || h.dense_bytes[l]))
      throw fail("header: layer " + std::to_string(l) + " has bytes but no '# layer=' line flag");
  }
  if (const std::string p = header_problem(h); !p.empty()) throw fail("header: " + p);

  const unsigned char* const records = b + layers_end;
  if (pass == binary_rows_pass::scan_then_decode) {
    // The fast pass over a chunk of records (in L1), then the chunk decoded
    // straight into the rows' storage (reserved once: no per-row capacity
    // check, no value-initialising pass). Only a refused file goes through
    // the exact pass below, from the start, for its message.
    t.rows.reserve(static_cast<std::size_t>(n_rows));
    binary_record_scanner scanner(h);
    const std::uint64_t* const layer_bytes = h.expert_bytes.data();
    constexpr std::uint64_t chunk = 512;
    bool ok = true;
    for (std::uint64_t i = 0; i < n_rows && ok; i += chunk) {
      const std::size_t n = static_cast<std::size_t>(std::min(chunk, n_rows - i));
      const unsigned char* const rp = records + i * binary_trace_record_size;
      ok = scanner.check(rp, n);
      if (ok) append_binary_rows(t.rows, rp, n, layer_bytes);
    }
    ok = ok && scanner.finish();
    if (ok) return trace_access::make(std::move(t));
    t.rows.clear();
  }
  // Throws for a file the scanner refused (the scanner is never looser than
  // this pass, and tests/test_trace_errors.cpp holds them to the same verdict).
  read_binary_rows_exact(records, n_rows, h, t.rows, source_name);
  return trace_access::make(std::move(t));
}

}  // namespace detail

inline validated_route_trace parse_route_trace_binary(std::string_view bytes, const std::string& source_name,
                                                      const warning_sink& on_warning) {
  validated_route_trace t =
      detail::parse_route_trace_binary_with(bytes, source_name, detail::binary_rows_pass::scan_then_decode);
  if (t.binary_version() == detail::binary_trace_version_unchecked)
    detail::emit_warning(on_warning,
                         source_name +
                             ": binary trace version 1 has no checksums, so a damaged byte that still parses goes "
                             "unnoticed; rewrite it as version 2 (moe-residency convert --to binary)");
  return t;
}

namespace detail {
// The writer proper: `trace` is known valid. Records go out in chunks of 4096
// (80 KiB) from the heap: a stack buffer that size overflowed small thread stacks.
// Version 2 (the default) follows the records with the header's checksum
// and one per chunk (a chunk is a checksummed block); version 1, the same
// records without them, is written only for the tests of the reader's
// compatibility path.
inline void write_binary_rows(const route_trace& trace, std::ostream& out,
                              std::uint32_t version = binary_trace_version) {
  const bool checked = version == binary_trace_version;
  const std::string head = binary_header_bytes(trace.header, trace.rows.size(), version);
  out.write(head.data(), static_cast<std::streamsize>(head.size()));
  std::string sums(8, '\0');
  store_le<std::uint64_t>(reinterpret_cast<unsigned char*>(&sums[0]),
                          xxh64(reinterpret_cast<const unsigned char*>(head.data()), head.size()));
  auto flush = [&](const unsigned char* buf, std::size_t n) {
    if (n == 0) return;
    out.write(reinterpret_cast<const char*>(buf), static_cast<std::streamsize>(n * binary_trace_record_size));
    if (!checked) return;
    unsigned char sum[8];
    store_le<std::uint64_t>(sum, xxh64(buf, n * binary_trace_record_size));
    sums.append(reinterpret_cast<const char*>(sum), 8);
  };
  constexpr std::size_t chunk = static_cast<std::size_t>(binary_trace_block_records);
  std::vector<unsigned char> storage(std::min(trace.rows.size(), chunk) * binary_trace_record_size);
  unsigned char* const buf = storage.data();
  std::size_t n = 0;
  for (const trace_row& r : trace.rows) {
    unsigned char* p = buf + n * binary_trace_record_size;
    store_le<std::uint32_t>(p, r.turn);
    store_le<std::uint32_t>(p + 4, r.step);
    store_le<std::uint32_t>(p + 8, float_bits(r.weight));
    store_le<std::uint16_t>(p + 12, static_cast<std::uint16_t>(r.layer));
    store_le<std::uint16_t>(p + 14, static_cast<std::uint16_t>(r.expert));
    p[16] = r.slot;
    p[17] = static_cast<unsigned char>(r.phase);
    p[18] = r.residency;
    p[19] = static_cast<unsigned char>((r.expert_bytes != 0 ? 1 : 0) | ((r.dropped + 1) << 1));
    if (++n == chunk) {
      flush(buf, n);
      n = 0;
    }
  }
  flush(buf, n);
  if (checked) out.write(sums.data(), static_cast<std::streamsize>(sums.size()));
}
}  // namespace detail

inline void write_route_trace_binary(const validated_route_trace& trace, std::ostream& out) {
  detail::write_binary_rows(trace.trace(), out);
}

inline void write_route_trace_binary(const route_trace& trace, std::ostream& out) {
  detail::validate_rows(trace, "route_trace");
  detail::write_binary_rows(trace, out);
}

}  // namespace moe_residency
