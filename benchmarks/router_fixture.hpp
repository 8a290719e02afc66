#pragma once
// What bench_router.cpp and bench_router_portable.cpp share: the router
// matrix fixture, the label, the streaming read (roofline) and the GEMV
// loops. Everything here is compiled with the including TU's own flags
// (xsimd::default_arch is that TU's), so it must not require AVX2 or any other
// -march at compile time: bench_router_portable is built without -march.
// Internal linkage on purpose: each benchmark is its own executable, and what
// xsimd::default_arch means differs between them.
#include <benchmark/benchmark.h>

#include <time.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "moe_residency/router.hpp"

namespace router_bench {
namespace {

namespace mr = moe_residency;

constexpr std::size_t cols = 2048;

/// Where the matrix starts relative to a 64-byte cache line: 32 bytes past
/// one, as a GGUF tensor may (ggml aligns tensor data to 32 bytes, not to a
/// line). Fixed, so that every benchmark reads the same layout: a plain
/// std::vector's offset can depend on the heap's history (glibc's mmap
/// threshold moves after the first large free), and loads that straddle two
/// lines are slower.
constexpr std::size_t matrix_line_offset = 32;

struct fixture {
  std::vector<unsigned char> storage;
  float* f32 = nullptr;
  std::uint16_t* h16 = nullptr;
  std::vector<float> x, y;
  fixture(const fixture&) = delete;  // f32/h16 point into storage
  fixture& operator=(const fixture&) = delete;
  fixture(fixture&&) = default;  // the buffer moves with its pointers
  fixture& operator=(fixture&&) = default;
  ~fixture() = default;
  fixture(mr::element_type t, std::size_t rows) : x(cols), y(rows) {
    std::mt19937 rng(1);
    std::normal_distribution<float> d(0.0f, 0.05f);
    for (auto& v : x) v = d(rng) * 20.0f;
    const std::size_t n = rows * cols;
    storage.resize(n * (t == mr::element_type::f32 ? 4 : 2) + 128);
    const auto addr = reinterpret_cast<std::uintptr_t>(storage.data());
    void* at = storage.data() + ((64 - addr % 64) % 64 + matrix_line_offset);
    if (t == mr::element_type::f32) {
      f32 = static_cast<float*>(at);
      for (std::size_t i = 0; i < n; ++i) f32[i] = d(rng);
    } else {
      h16 = static_cast<std::uint16_t*>(at);
      for (std::size_t i = 0; i < n; ++i)
        h16[i] =
            t == mr::element_type::f16 ? mr::detail::f32_to_f16_bits(d(rng)) : mr::detail::f32_to_bf16_bits(d(rng));
    }
  }
  mr::matrix_view view(mr::element_type t, std::size_t rows) const {
    if (t == mr::element_type::f32) return mr::matrix_view::f32(f32, rows, cols);
    if (t == mr::element_type::f16) return mr::matrix_view::f16(h16, rows, cols);
    return mr::matrix_view::bf16(h16, rows, cols);
  }
};

inline mr::element_type type_of(std::int64_t i) { return static_cast<mr::element_type>(i); }

/// Bytes of router matrix per second, and the label "<type> <rows>x<cols>",
/// followed by " <what>" when `what` is not empty.
inline void set_bytes(benchmark::State& st, const mr::matrix_view& w, const std::string& what = {}) {
  st.SetBytesProcessed(static_cast<std::int64_t>(st.iterations()) * static_cast<std::int64_t>(w.bytes()));
  std::string label = std::string(mr::to_string(w.type)) + " " + std::to_string(w.rows) + "x" + std::to_string(w.cols);
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

/// How many times the in-turn loops below run each half over `layers`
/// routers: one router (in cache) takes ~10 µs, of the order of reading the
/// thread CPU clock (a system call in this VM), which would pull every ratio
/// towards 1; 32 passes make each timed half ~0.3 ms.
inline std::size_t in_turn_repeats(std::size_t layers) { return layers < 4 ? 32 : 1; }

/// This thread's CPU time in seconds (wall time where there is no such clock).
inline double thread_seconds() {
#if defined(CLOCK_THREAD_CPUTIME_ID)
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
#else
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
#endif
}

/// One token's routers read with `read` and multiplied with `kernel`, the two
/// alternating within each iteration (which goes first alternates too), so
/// both see the same machine: on a shared machine the load changes between
/// two benchmarks run seconds apart, and their ratio with it. Counters:
/// gemv_over_read (the sum of the kernel's CPU times over the read's), and
/// each one's mean ms per iteration (a token; for one router, 32 calls, see
/// in_turn_repeats). The iteration's own time is both together.
/// `layers` routers (1: one router, in cache: the pair for the in-cache rows,
/// BM_cache_pair).
template <class Read, class Kernel>
void run_token_pair(benchmark::State& st, Read read, Kernel kernel, const std::string& what = {},
                    std::size_t layers = token_layers) {
  const auto t = type_of(st.range(0));
  token_fixture f(t, layers);
  const std::size_t reps = in_turn_repeats(layers);
  double t_read = 0.0, t_gemv = 0.0;
  std::uint32_t s = 0;
  bool read_first = true;
  for (auto _ : st) {
    for (int half = 0; half < 2; ++half) {
      const double a = thread_seconds();
      if ((half == 0) == read_first) {
        for (std::size_t rep = 0; rep < reps; ++rep)
          for (const fixture& l : f.layers) {
            const auto w = l.view(t, 128);
            s ^= read(static_cast<const std::uint32_t*>(w.data), w.bytes() / 4);
          }
        benchmark::DoNotOptimize(s);
        t_read += thread_seconds() - a;
      } else {
        for (std::size_t rep = 0; rep < reps; ++rep)
          for (fixture& l : f.layers) kernel(l.view(t, 128), l.x.data(), l.y.data());
        benchmark::ClobberMemory();
        t_gemv += thread_seconds() - a;
      }
    }
    read_first = !read_first;
  }
  const double n = static_cast<double>(st.iterations());
  st.counters["gemv_over_read"] = t_read > 0.0 ? t_gemv / t_read : 0.0;
  st.counters["read_ms"] = 1e3 * t_read / n;
  st.counters["gemv_ms"] = 1e3 * t_gemv / n;
  st.SetLabel(std::string(mr::to_string(t)) + " " + std::to_string(layers) + " x 128x2048" +
              (what.empty() ? "" : " " + what));
}

/// run_token_pair for several kernels on one fixture of st.range(1) routers
/// (0: a token's 48; 1: one router, in cache): each iteration runs the
/// read and every kernel once, starting one later each time. Counters: each
/// kernel's CPU time over the read's, under the kernel's name. Kernels as
/// {name, void(*)(const matrix_view&, const float*, float*)}.
using token_kernel = void (*)(const mr::matrix_view&, const float*, float*);
template <class Read>
void run_token_kernels(benchmark::State& st, Read read,
                       const std::vector<std::pair<std::string, token_kernel>>& kernels) {
  const auto t = type_of(st.range(0));
  const std::size_t layers = st.range(1) > 0 ? static_cast<std::size_t>(st.range(1)) : token_layers;
  token_fixture f(t, layers);
  const std::size_t reps = in_turn_repeats(layers);
  const std::size_t k = kernels.size();
  std::vector<double> spent(k + 1, 0.0);
  std::uint32_t s = 0;
  std::size_t first = 0;
  for (auto _ : st) {
    for (std::size_t j = 0; j <= k; ++j) {
      const std::size_t which = (first + j) % (k + 1);
      const double a = thread_seconds();
      if (which == k) {
        for (std::size_t rep = 0; rep < reps; ++rep)
          for (const fixture& l : f.layers) {
            const auto w = l.view(t, 128);
            s ^= read(static_cast<const std::uint32_t*>(w.data), w.bytes() / 4);
          }
        benchmark::DoNotOptimize(s);
      } else {
        for (std::size_t rep = 0; rep < reps; ++rep)
          for (fixture& l : f.layers) kernels[which].second(l.view(t, 128), l.x.data(), l.y.data());
        benchmark::ClobberMemory();
      }
      spent[which] += thread_seconds() - a;
    }
    first = (first + 1) % (k + 1);
  }
  for (std::size_t j = 0; j < k; ++j) st.counters[kernels[j].first] = spent[k] > 0.0 ? spent[j] / spent[k] : 0.0;
  st.SetLabel(std::string(mr::to_string(t)) + " " + std::to_string(layers) +
              " x 128x2048, each kernel's time over the read's");
}

/// Args {type (0 f32, 1 f16, 2 bf16), rows}.
inline void shapes(benchmark::internal::Benchmark* b) {
  for (const std::int64_t t : {0, 1, 2})
    for (const std::int64_t rows : {128, 256}) b->Args({t, rows});
}

}  // namespace
}  // namespace router_bench
