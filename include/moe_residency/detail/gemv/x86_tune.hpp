#pragma once
/// The run-time dispatched x86 GEMV kernel's shape, as named fields: rows per
/// pass, how far and how much of the next rows to prefetch, and whether the
/// 512-bit kernel is taken. x86_tune_default is what `gemv` runs;
/// x86_tune<...> is a positional shorthand for bench_router's sweeps. Part of
/// detail/gemv.hpp; the kernels that read it are gemv/x86_avx2.hpp,
/// gemv/x86_avx512.hpp and gemv/x86.hpp.

#include "moe_residency/detail/gemv/config.hpp"

#include <cstddef>

#include "moe_residency/element_type.hpp"

#if MOE_RESIDENCY_DETAIL_X86_KERNEL
namespace moe_residency {
namespace detail {
inline namespace MOE_RESIDENCY_GEMV_ABI {

/// The kernel's shape. A type parameter (`class Tune`) of the kernels, so that
/// bench_router can measure the alternatives in one run; `gemv` runs
/// x86_tune_default. A tune is any type with these members:
///
/// - f32_rows, f16_rows, bf16_rows: rows interleaved per x86_pass for each
///   weight type. 3 rows are 12 accumulators of the 16 AVX2 registers; bf16
///   also keeps 4 x vectors, a mask and 2 loads live, so 2 rows. f32 takes
///   one row a pass: interleaved f32 rows are R streams of 8 KiB that the
///   hardware prefetcher keeps losing, which measured slower per token, and
///   in cache no faster (the 1 MiB router streams from L2).
/// - prefetch_passes: how many passes ahead the 16-bit rows are prefetched
///   (0: not at all).
/// - f16_prefetch_head_lines, bf16_prefetch_head_lines: how many 64-byte
///   lines at the start of each of those rows (0: the whole row).
/// - f16_prefetch_in_row, bf16_prefetch_in_row: whether the rows being read
///   are also prefetched that far ahead (see x86_prefetch_fits).
/// - prefetch_locality: __builtin_prefetch's locality (3 = prefetcht0 ...
///   0 = prefetchnta).
/// - f16_lane_groups: f16 lane groups per sweep (< 4: x86_pass_split, whole
///   rows prefetched, f16_prefetch_head_lines, f16_prefetch_in_row and
///   prefetch_locality unused). 6 f16 rows in two sweeps (2) measured no
///   faster (bench_router's BM_token_tunes).
/// - wide_rows: rows per pass of the 512-bit kernel for f16 and bf16 when the
///   CPU has AVX-512F (x86z_pass); 0: never, the 256-bit kernel on every CPU.
///
/// x86_tune_default takes the 512-bit kernel for f16 and bf16 where the CPU
/// has AVX-512F, 2 rows a pass (x86z_pass; 4 measured as fast in cache but,
/// unprefetched, slower per token), two passes prefetched into L2 (per token
/// faster than one pass ahead, or than into L1; docs/benchmarks.md,
/// "What the kernels do" and "The 512-bit kernel for f16 and bf16").
struct x86_tune_default {
  static constexpr std::size_t f32_rows = 1;
  static constexpr std::size_t f16_rows = 3;
#if defined(__AVX512F__)
  // A TU built for AVX-512 (e.g. -march=native on such a host) compiles the
  // kernel with 32 vector registers: 3 bf16 rows fit without spilling, and
  // measured faster there (bf16 per token and in cache, bench_router).
  // f16 keeps 3 rows: 4 or 5 per token cost more than they gain in cache.
  static constexpr std::size_t bf16_rows = 3;
#else
  static constexpr std::size_t bf16_rows = 2;
#endif
  static constexpr std::size_t prefetch_passes = 2;
  static constexpr std::size_t f16_prefetch_head_lines = 0;
  static constexpr std::size_t bf16_prefetch_head_lines = 0;
  static constexpr bool f16_prefetch_in_row = false;
  static constexpr bool bf16_prefetch_in_row = false;
  static constexpr int prefetch_locality = 1;  // prefetcht2: into L2
  static constexpr std::size_t f16_lane_groups = 4;
  static constexpr std::size_t wide_rows = 2;
};

/// x86_tune_default's shape on the 256-bit kernel only (for comparison, and
/// the tests of that kernel).
struct x86_tune_narrow : x86_tune_default {
  static constexpr std::size_t wide_rows = 0;
};

/// A tune from its fields in order (the defaults: whole rows, not in-row,
/// prefetcht0, 4 lane groups, no 512-bit kernel), for sweeps over shapes.
template <std::size_t F32Rows, std::size_t F16Rows, std::size_t Bf16Rows, std::size_t PrefetchPasses,
          std::size_t F16HeadLines = 0, std::size_t Bf16HeadLines = 0, bool F16InRow = false, bool Bf16InRow = false,
          int Locality = 3, std::size_t F16LaneGroups = 4, std::size_t WideRows = 0>
struct x86_tune {
  static constexpr std::size_t f32_rows = F32Rows;
  static constexpr std::size_t f16_rows = F16Rows;
  static constexpr std::size_t bf16_rows = Bf16Rows;
  static constexpr std::size_t prefetch_passes = PrefetchPasses;
  static constexpr std::size_t f16_prefetch_head_lines = F16HeadLines;
  static constexpr std::size_t bf16_prefetch_head_lines = Bf16HeadLines;
  static constexpr bool f16_prefetch_in_row = F16InRow;
  static constexpr bool bf16_prefetch_in_row = Bf16InRow;
  static constexpr int prefetch_locality = Locality;
  static constexpr std::size_t f16_lane_groups = F16LaneGroups;
  static constexpr std::size_t wide_rows = WideRows;
};

// A tune's fields for weight type T.

template <class Tune, element_type T>
constexpr std::size_t x86_tune_rows() noexcept {
  return T == element_type::f32 ? Tune::f32_rows : T == element_type::f16 ? Tune::f16_rows : Tune::bf16_rows;
}
template <class Tune, element_type T>
constexpr std::size_t x86_tune_head_lines() noexcept {
  return T == element_type::bf16 ? Tune::bf16_prefetch_head_lines : Tune::f16_prefetch_head_lines;
}
template <class Tune, element_type T>
constexpr bool x86_tune_in_row() noexcept {
  return T == element_type::bf16 ? Tune::bf16_prefetch_in_row : Tune::f16_prefetch_in_row;
}
template <class Tune, element_type T>
constexpr std::size_t x86_tune_lane_groups() noexcept {
  return T == element_type::f16 ? Tune::f16_lane_groups : 4;
}

}  // namespace MOE_RESIDENCY_GEMV_ABI
}  // namespace detail
}  // namespace moe_residency
#endif  // MOE_RESIDENCY_DETAIL_X86_KERNEL
