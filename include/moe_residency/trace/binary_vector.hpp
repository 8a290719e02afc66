#pragma once
/// Whether the binary route trace reader checks and decodes records in
/// vector lanes (MOE_RESIDENCY_BINARY_SCAN_VECTOR), read by its fast scan
/// (trace/binary_scan.hpp) and its decoders (trace/binary_decode.hpp).

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
