#pragma once
// Layout of the binary route trace (version 2) and little-endian loads and
// stores that compile to plain moves on little-endian hosts. A weight's bits
// go through detail::float_bits / bits_float (half.hpp), the one bit cast.
//
//   offset  size  field
//        0     8  magic "\x89MRTRACE" (0x89 marks it binary, like PNG)
//        8     4  version (2; 1 is the same layout without the checksums)
//       12     4  record size in bytes (20)
//       16     4  flags: bit 0 = the CSV had a dropped column
//       20     4  n_layer
//       24     4  n_expert
//       28     4  n_expert_used
//       32     8  row count
//       40     4  model length M
//       44     4  arch length A
//       48   M+A  model, arch (no terminator); zero padding to a multiple of 8
//            8·L  expert_bytes per layer
//            8·L  dense_bytes per layer
//              L  1 if the layer had a "# layer=" line, else 0; zero padding to 8
//          20·N   records:
//                  0 u32 turn   4 u32 step   8 f32 weight (IEEE-754 bits)
//                 12 u16 layer 14 u16 expert 16 u8 slot 17 u8 phase
//                 18 u8 residency
//                 19 u8 bits: bit 0 = expert_bytes is the layer's bytes (else 0)
//                             bits 1-2 = dropped + 1 (0 = no dropped column)
//            8   XXH64 of the header: bytes 0 up to the first record
//          8·B   XXH64 of each block of 4096 records (the last may be shorter),
//                B = ceil(N / 4096); none when N = 0
// All integers little-endian. The file ends right after the last checksum
// (version 1: after the last record).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "moe_residency/detail/half.hpp"

namespace moe_residency {
namespace detail {

inline constexpr char binary_trace_magic[8] = {'\x89', 'M', 'R', 'T', 'R', 'A', 'C', 'E'};
inline constexpr std::uint32_t binary_trace_version = 2;
/// The first version: the same layout without the checksums. Read with a warning.
inline constexpr std::uint32_t binary_trace_version_unchecked = 1;
/// Records per checksummed block (80 KiB of records).
inline constexpr std::uint64_t binary_trace_block_records = 4096;
/// The checksums after the records of a version 2 file of n_rows rows, in bytes.
inline constexpr std::uint64_t binary_trace_trailer_size(std::uint64_t n_rows) noexcept {
  return 8 + 8 * ((n_rows + binary_trace_block_records - 1) / binary_trace_block_records);
}
inline constexpr std::size_t binary_trace_record_size = 20;
inline constexpr std::size_t binary_trace_fixed_header = 48;

inline constexpr std::size_t pad8(std::size_t n) noexcept { return (n + 7) & ~std::size_t{7}; }
inline constexpr std::uint64_t pad8_u64(std::uint64_t n) noexcept { return (n + 7) & ~std::uint64_t{7}; }

/// Where the variable parts of a binary header end, from its 32-bit lengths,
/// in 64-bit arithmetic: at most 48 + 2 (2^32 - 1) + 7 + 17 (2^32 - 1) + 7 <
/// 2^37, so nothing wraps on any target, 32-bit ones included. A reader
/// compares these with the file size before it forms any size_t offset.
struct binary_trace_extent {
  std::uint64_t strings_end;  ///< end of model + arch, padded to 8
  std::uint64_t layers_end;   ///< end of the per-layer tables, padded to 8: the first record
};
inline constexpr binary_trace_extent binary_trace_header_extent(std::uint32_t model_len, std::uint32_t arch_len,
                                                                std::uint32_t n_layer) noexcept {
  const std::uint64_t strings_end =
      pad8_u64(std::uint64_t{binary_trace_fixed_header} + std::uint64_t{model_len} + std::uint64_t{arch_len});
  return {strings_end, strings_end + 16 * std::uint64_t{n_layer} + pad8_u64(n_layer)};
}

template <class T>
inline T load_le(const unsigned char* p) noexcept {
  static_assert(std::is_unsigned<T>::value, "load_le reads unsigned integers");
  T v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) v = static_cast<T>(v | (static_cast<T>(p[i]) << (8 * i)));
  return v;
}

template <class T>
inline void store_le(unsigned char* p, T v) noexcept {
  static_assert(std::is_unsigned<T>::value, "store_le writes unsigned integers");
  for (std::size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

}  // namespace detail
}  // namespace moe_residency
