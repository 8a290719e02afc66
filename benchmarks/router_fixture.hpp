#pragma once
// What bench_router.cpp and bench_router_portable.cpp share: the router
// matrix fixture, the label, the streaming read (roofline) and the GEMV
// loops. Everything here is compiled with the including TU's own flags
// (xsimd::default_arch is that TU's), so it must not require AVX2 or any other
// -march at compile time: bench_router_portable is built without -march.
// Internal linkage on purpose: each benchmark is its own executable, and what
// xsimd::default_arch means differs between them.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "moe_residency/router.hpp"

namespace router_bench {
namespace {

namespace mr = moe_residency;

constexpr std::size_t cols = 2048;

struct fixture {
  std::vector<float> f32;
  std::vector<std::uint16_t> h16;
  std::vector<float> x, y;
  fixture(mr::element_type t, std::size_t rows) : x(cols), y(rows) {
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 0.05f);
    for (auto& v : x) v = d(rng) * 20.0f;
    if (t == mr::element_type::f32) {
      f32.resize(rows * cols);
      for (auto& v : f32) v = d(rng);
    } else {
      h16.resize(rows * cols);
      for (auto& v : h16)
        v = t == mr::element_type::f16 ? mr::detail::f32_to_f16_bits(d(rng))
                                       : mr::detail::f32_to_bf16_bits(d(rng));
    }
  }
  mr::matrix_view view(mr::element_type t, std::size_t rows) const {
    if (t == mr::element_type::f32) return mr::matrix_view::f32(f32.data(), rows, cols);
    if (t == mr::element_type::f16) return mr::matrix_view::f16(h16.data(), rows, cols);
    return mr::matrix_view::bf16(h16.data(), rows, cols);
  }
};

inline mr::element_type type_of(std::int64_t i) { return static_cast<mr::element_type>(i); }

/// Bytes of router matrix per second, and the label "<type> <rows>x<cols>",
/// followed by " <what>" when `what` is not empty.
inline void set_bytes(benchmark::State& st, const mr::matrix_view& w,
                      const std::string& what = {}) {
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) *
                       static_cast<std::int64_t>(w.bytes()));
  std::string label =
      std::string(mr::to_string(w.type)) + " " + std::to_string(w.rows) + "x" + std::to_string(w.cols);
  if (!what.empty()) label += " " + what;
  st.SetLabel(label);
}

/// Four independent integer sums over the bytes with the TU's own SIMD
/// (full-width integer loads, no conversion, no multiply).
inline std::uint32_t read_compiled(const std::uint32_t* p, std::size_t words) {
  using U = xsimd::batch<std::uint32_t, xsimd::default_arch>;
  U a(0u), b(0u), c(0u), d(0u);
  for (std::size_t i = 0; i + 4 * U::size <= words; i += 4 * U::size) {
    a += U::load_unaligned(p + i);
    b += U::load_unaligned(p + i + U::size);
    c += U::load_unaligned(p + i + 2 * U::size);
    d += U::load_unaligned(p + i + 3 * U::size);
  }
  alignas(64) std::uint32_t out[U::size];
  ((a + b) + (c + d)).store_aligned(out);
  return out[0];
}

/// Streams the matrix of the shape in st's args {type, rows} once per
/// iteration with `read(const std::uint32_t*, words)`.
template <class Read>
void run_stream_read(benchmark::State& st, Read read, const std::string& what = {}) {
  const auto t = type_of(st.range(0));
  const auto rows = static_cast<std::size_t>(st.range(1));
  const fixture f(t, rows);
  const auto w = f.view(t, rows);
  const std::size_t words = w.bytes() / 4;
  const auto* p = static_cast<const std::uint32_t*>(w.data);
  for (auto _ : st) {
    const std::uint32_t s = read(p, words);
    benchmark::DoNotOptimize(s);
  }
  set_bytes(st, w, what);
}

/// Runs `kernel(w, x, y)` once per iteration over the matrix of the shape in
/// st's args {type, rows}.
template <class Kernel>
void run_gemv(benchmark::State& st, Kernel kernel, const std::string& what = {}) {
  const auto t = type_of(st.range(0));
  const auto rows = static_cast<std::size_t>(st.range(1));
  fixture f(t, rows);
  const auto w = f.view(t, rows);
  for (auto _ : st) {
    kernel(w, f.x.data(), f.y.data());
    benchmark::DoNotOptimize(f.y.data());
    benchmark::ClobberMemory();
  }
  set_bytes(st, w, what);
}

// The 109 ms/token mistake: one out-of-line call per element.
#if defined(__GNUC__)
__attribute__((noinline))
#endif
float exported_f16_to_f32(std::uint16_t h) {
  return mr::detail::f16_to_f32(h);
}

/// The naive f16 GEMV (exported_f16_to_f32 per element); rows from st.range(1).
inline void run_gemv_naive_f16_call(benchmark::State& st, const std::string& what = {}) {
  const auto rows = static_cast<std::size_t>(st.range(1));
  fixture f(mr::element_type::f16, rows);
  const auto w = f.view(mr::element_type::f16, rows);
  for (auto _ : st) {
    for (std::size_t r = 0; r < rows; ++r) {
      float s = 0.0f;
      for (std::size_t c = 0; c < cols; ++c) s += exported_f16_to_f32(f.h16[r * cols + c]) * f.x[c];
      f.y[r] = s;
    }
    benchmark::DoNotOptimize(f.y.data());
    benchmark::ClobberMemory();
  }
  set_bytes(st, w, what);
}

/// One decode token's routers: `n` separate 128 x 2048 matrices (48: the
/// Qwen3-30B shape, 24 MiB of f16, 48 MiB of f32; more than a core's caches,
/// so they come from the last-level cache or DRAM as in a decode loop).
struct token_fixture {
  std::vector<fixture> layers;
  token_fixture(mr::element_type t, std::size_t n) {
    layers.reserve(n);
    for (std::size_t l = 0; l < n; ++l) layers.emplace_back(t, 128);
  }
};

constexpr std::size_t token_layers = 48;

/// Streams every router of the token once per iteration with `read`.
template <class Read>
void run_stream_read_token(benchmark::State& st, Read read, const std::string& what = {}) {
  const auto t = type_of(st.range(0));
  const token_fixture f(t, token_layers);
  std::size_t bytes = 0;
  for (auto _ : st) {
    std::uint32_t s = 0;
    for (const fixture& l : f.layers) {
      const auto w = l.view(t, 128);
      s ^= read(static_cast<const std::uint32_t*>(w.data), w.bytes() / 4);
    }
    benchmark::DoNotOptimize(s);
  }
  for (const fixture& l : f.layers) bytes += l.view(t, 128).bytes();
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * static_cast<std::int64_t>(bytes));
  st.SetLabel(std::string(mr::to_string(t)) + " " + std::to_string(token_layers) + " x 128x2048" +
              (what.empty() ? "" : " " + what));
}

/// Runs `kernel(w, x, y)` over every router of the token once per iteration.
template <class Kernel>
void run_gemv_token(benchmark::State& st, Kernel kernel, const std::string& what = {}) {
  const auto t = type_of(st.range(0));
  token_fixture f(t, token_layers);
  std::size_t bytes = 0;
  for (auto _ : st) {
    for (fixture& l : f.layers) kernel(l.view(t, 128), l.x.data(), l.y.data());
    benchmark::ClobberMemory();
  }
  for (const fixture& l : f.layers) bytes += l.view(t, 128).bytes();
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * static_cast<std::int64_t>(bytes));
  st.SetLabel(std::string(mr::to_string(t)) + " " + std::to_string(token_layers) + " x 128x2048" +
              (what.empty() ? "" : " " + what));
}

/// Args {type (0 f32, 1 f16, 2 bf16), rows}.
inline void shapes(benchmark::internal::Benchmark* b) {
  for (const std::int64_t t : {0, 1, 2})
    for (const std::int64_t rows : {128, 256}) b->Args({t, rows});
}

}  // namespace
}  // namespace router_bench
