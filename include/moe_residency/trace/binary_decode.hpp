#pragma once
/// The binary route trace reader's decoders: records its fast scan accepted
/// into rows, in a 16-byte vector tail, two 64-bit words or member by member
/// (`detail::decode_binary_record`), and the iterator that constructs them
/// in a row vector's storage. Part of the reader in trace/binary.hpp.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <vector>

#include "moe_residency/core.hpp"
#include "moe_residency/detail/half.hpp"
#include "moe_residency/detail/trace_binary.hpp"
#include "moe_residency/trace/binary_vector.hpp"
#include "moe_residency/trace/types.hpp"

namespace moe_residency {
namespace detail {

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

}  // namespace detail
}  // namespace moe_residency
