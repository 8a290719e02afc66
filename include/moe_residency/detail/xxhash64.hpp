#pragma once
// XXH64 (xxHash, 64-bit, seed 0 unless given), written from the algorithm's
// specification (github.com/Cyan4973/xxHash, doc/xxhash_spec.md): four 64-bit
// lanes of multiply-rotate over 32-byte stripes, then the tail and an
// avalanche. Portable scalar code, bytes read little-endian one load at a
// time, so the value is the same on every host; xxhsum -H64 prints the same
// (tests/test_trace_errors.cpp checks published values). The binary route
// trace's checksum: several GB/s without a vector unit or a CRC instruction.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "moe_residency/detail/trace_binary.hpp"

namespace moe_residency {
namespace detail {

inline constexpr std::uint64_t xxh64_p1 = 0x9E3779B185EBCA87ull, xxh64_p2 = 0xC2B2AE3D27D4EB4Full,
                               xxh64_p3 = 0x165667B19E3779F9ull, xxh64_p4 = 0x85EBCA77C2B2AE63ull,
                               xxh64_p5 = 0x27D4EB2F165667C5ull;

/// A little-endian load: one move where the host is little-endian (GCC at -O2
/// does not merge load_le's byte loop here), load_le elsewhere.
template <class T>
inline T xxh64_load(const unsigned char* p) noexcept {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
#else
  return load_le<T>(p);
#endif
}

inline constexpr std::uint64_t xxh64_rotl(std::uint64_t x, int r) noexcept { return (x << r) | (x >> (64 - r)); }
inline constexpr std::uint64_t xxh64_round(std::uint64_t acc, std::uint64_t input) noexcept {
  return xxh64_rotl(acc + input * xxh64_p2, 31) * xxh64_p1;
}
inline constexpr std::uint64_t xxh64_merge(std::uint64_t acc, std::uint64_t lane) noexcept {
  return (acc ^ xxh64_round(0, lane)) * xxh64_p1 + xxh64_p4;
}

inline std::uint64_t xxh64(const unsigned char* p, std::size_t n, std::uint64_t seed = 0) noexcept {
  const unsigned char* const end = p + n;
  std::uint64_t h;
  if (n >= 32) {
    std::uint64_t v1 = seed + xxh64_p1 + xxh64_p2, v2 = seed + xxh64_p2, v3 = seed, v4 = seed - xxh64_p1;
    for (; end - p >= 32; p += 32) {
      v1 = xxh64_round(v1, xxh64_load<std::uint64_t>(p));
      v2 = xxh64_round(v2, xxh64_load<std::uint64_t>(p + 8));
      v3 = xxh64_round(v3, xxh64_load<std::uint64_t>(p + 16));
      v4 = xxh64_round(v4, xxh64_load<std::uint64_t>(p + 24));
    }
    h = xxh64_rotl(v1, 1) + xxh64_rotl(v2, 7) + xxh64_rotl(v3, 12) + xxh64_rotl(v4, 18);
    h = xxh64_merge(xxh64_merge(xxh64_merge(xxh64_merge(h, v1), v2), v3), v4);
  } else {
    h = seed + xxh64_p5;
  }
  h += static_cast<std::uint64_t>(n);
  for (; end - p >= 8; p += 8)
    h = xxh64_rotl(h ^ xxh64_round(0, xxh64_load<std::uint64_t>(p)), 27) * xxh64_p1 + xxh64_p4;
  if (end - p >= 4) {
    h = xxh64_rotl(h ^ (std::uint64_t{xxh64_load<std::uint32_t>(p)} * xxh64_p1), 23) * xxh64_p2 + xxh64_p3;
    p += 4;
  }
  for (; p != end; ++p) h = xxh64_rotl(h ^ (std::uint64_t{*p} * xxh64_p5), 11) * xxh64_p1;
  h ^= h >> 33;
  h *= xxh64_p2;
  h ^= h >> 29;
  h *= xxh64_p3;
  h ^= h >> 32;
  return h;
}

}  // namespace detail
}  // namespace moe_residency
