// Router GEMV throughput as bytes of router matrix per second, against
// references measured in the same run: a streaming read of the same bytes
// (the memory-bandwidth roofline for this matrix), the scalar reference
// kernel, and a naive f16 GEMV that converts every element through an
// out-of-line function (the mistake that cost a first implementation
// 109 ms/token). Compare the ratios, not absolute times.
#include <benchmark/benchmark.h>

#include <type_traits>

#include "moe_residency/router.hpp"
#include "router_fixture.hpp"

namespace mr = moe_residency;

namespace {

using namespace router_bench;

// Roofline: read the same bytes with full-width SIMD integer loads and four
// independent sums (no conversion, no multiply): the most a GEMV over this
// matrix could stream from wherever it lives (cache or DRAM) in this run.
void BM_stream_read(benchmark::State& st) { run_stream_read(st, read_compiled); }

void BM_gemv(benchmark::State& st) {
  run_gemv(
      st, [](const mr::matrix_view& w, const float* x, float* y) { mr::gemv(w, x, y); }, mr::gemv_arch_name());
}

void BM_gemv_scalar(benchmark::State& st) {
  run_gemv(st, [](const mr::matrix_view& w, const float* x, float* y) { mr::gemv_scalar(w, x, y); });
}

// One token's 48 routers (from the last-level cache or DRAM).
void BM_stream_read_token(benchmark::State& st) { run_stream_read_token(st, read_compiled); }
void BM_gemv_token(benchmark::State& st) {
  run_gemv_token(
      st, [](const mr::matrix_view& w, const float* x, float* y) { mr::gemv(w, x, y); }, mr::gemv_arch_name());
}

// The two above alternating in one loop: their ratio on the same machine state.
void BM_token_pair(benchmark::State& st) {
  run_token_pair(
      st, read_compiled, [](const mr::matrix_view& w, const float* x, float* y) { mr::gemv(w, x, y); },
      mr::gemv_arch_name());
}

// One router in cache, the read and the kernel in turn (BM_token_pair's loop
// on one router): the in-cache ratio on the same machine state, where
// BM_gemv ÷ BM_stream_read takes two benchmarks seconds apart.
void BM_cache_pair(benchmark::State& st) {
  run_token_pair(
      st, read_compiled, [](const mr::matrix_view& w, const float* x, float* y) { mr::gemv(w, x, y); },
      mr::gemv_arch_name(), 1);
}

// The 109 ms/token mistake: one out-of-line call per element.
void BM_gemv_naive_f16_call(benchmark::State& st) { run_gemv_naive_f16_call(st); }

#if MOE_RESIDENCY_DETAIL_X86_KERNEL && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// ---- What bounds the 16-bit kernels in cache --------------------------------
//
// Minimal kernels over the same matrix, each keeping one part of the GEMV's
// work, to be read against BM_stream_read of the same run (args {type, rows}):
//   BM_bound_rows_read<R, D>   the kernel's access pattern and nothing else:
//                              R rows interleaved, 64 bytes per row per step,
//                              the next rows prefetched D passes ahead, two
//                              integer adds per 64 bytes per row;
//   BM_bound_cvt_add           memory order, vcvtph2ps + add, 8 sums;
//   BM_bound_load_fma          memory order, one 32-byte load and the two
//                              multiply-adds 16 weights need (no conversion);
//   BM_bound_cvt_fma           memory order, the f16 GEMV's instructions
//                              (convert, multiply-add, x loaded per 8) in 8
//                              independent sums: no summation order kept;
//   BM_bound_bf16_fma          the same for bf16 split from 32-byte loads;
//   BM_bound_f16_int_fma       f16 converted with integer shifts and a mask
//                              (exact for finite weights with x scaled by
//                              2^112), 8 independent sums.
// None computes a correct GEMV; each is an upper bound for a kernel that does
// at least that work.

using bench_acc = __m256[8];

float fold(const bench_acc& a) {
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])),
                           _mm256_add_ps(_mm256_add_ps(a[4], a[5]), _mm256_add_ps(a[6], a[7])));
  return _mm256_cvtss_f32(s);
}

template <std::size_t R, std::size_t D>
void BM_bound_rows_read(benchmark::State& st) {
  const auto t = type_of(st.range(0));
  const auto rows = static_cast<std::size_t>(st.range(1));
  const fixture f(t, rows);
  const auto w = f.view(t, rows);
  const char* base = static_cast<const char*>(w.data);
  const std::size_t row_bytes = w.row_stride_bytes;
  for (auto _ : st) {
    __m256i s[R][2];
    for (std::size_t r = 0; r < R; ++r) s[r][0] = s[r][1] = _mm256_setzero_si256();
    std::size_t rr = 0;
    for (; rr + R <= rows; rr += R) {
      const char* q = base + rr * row_bytes;
      for (std::size_t b = 0; b < row_bytes; b += 64) {
        if constexpr (D > 0)
          for (std::size_t r = D * R; r < (D + 1) * R; ++r) _mm_prefetch(q + r * row_bytes + b, _MM_HINT_T0);
        for (std::size_t r = 0; r < R; ++r) {
          s[r][0] =
              _mm256_add_epi32(s[r][0], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + r * row_bytes + b)));
          s[r][1] = _mm256_add_epi32(s[r][1],
                                     _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + r * row_bytes + b + 32)));
        }
      }
    }
    for (; rr < rows; ++rr)
      for (std::size_t b = 0; b < row_bytes; b += 32)
        s[0][0] =
            _mm256_add_epi32(s[0][0], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + rr * row_bytes + b)));
    __m256i u = s[0][0];
    for (std::size_t r = 0; r < R; ++r) u = _mm256_add_epi32(u, _mm256_add_epi32(s[r][0], s[r][1]));
    benchmark::DoNotOptimize(u);
  }
  set_bytes(st, w, "R=" + std::to_string(R) + " prefetch " + std::to_string(D));
}

/// Runs body(acc, p, x) over the matrix in memory order, 128 bytes (64
/// weights) per call; x advances alike and wraps at the row's end.
template <class Body>
void run_bound(benchmark::State& st, const std::string& what, Body body) {
  const auto t = type_of(st.range(0));
  const auto rows = static_cast<std::size_t>(st.range(1));
  const fixture f(t, rows);
  const auto w = f.view(t, rows);
  const char* base = static_cast<const char*>(w.data);
  const std::size_t bytes = w.bytes();
  const float* x = f.x.data();
  for (auto _ : st) {
    bench_acc a;
    for (auto& v : a) v = _mm256_setzero_ps();
    for (std::size_t b = 0, c = 0; b < bytes; b += 128, c = (c + 64) % cols) body(a, base + b, x + c);
    float s = fold(a);
    benchmark::DoNotOptimize(s);
  }
  set_bytes(st, w, what);
}

void BM_bound_cvt_add(benchmark::State& st) {
  run_bound(st, "load+vcvtph2ps+add", [](bench_acc& a, const char* p, const float*) {
    for (std::size_t k = 0; k < 8; ++k)
      a[k] = _mm256_add_ps(a[k], _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * k))));
  });
}

void BM_bound_load_fma(benchmark::State& st) {
  // 32 bytes = 16 weights: one load, two multiply-adds (raw bits as floats).
  run_bound(st, "load+2 fma per 32 bytes", [](bench_acc& a, const char* p, const float* x) {
    const __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8);
    for (std::size_t k = 0; k < 8; k += 2) {
      const __m256 v = _mm256_loadu_ps(reinterpret_cast<const float*>(p + 16 * k));
      a[k] = _mm256_fmadd_ps(v, x0, a[k]);
      a[k + 1] = _mm256_fmadd_ps(v, x1, a[k + 1]);
    }
  });
}

void BM_bound_cvt_fma(benchmark::State& st) {
  run_bound(st, "load+vcvtph2ps+fma", [](bench_acc& a, const char* p, const float* x) {
    for (std::size_t k = 0; k < 8; ++k)
      a[k] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * k))),
                             _mm256_loadu_ps(x + 8 * k), a[k]);
  });
}

void BM_bound_cvt_fma_xreg(benchmark::State& st) {
  run_bound(st, "load+vcvtph2ps+fma, x in registers", [](bench_acc& a, const char* p, const float* x) {
    const __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8);
    for (std::size_t k = 0; k < 8; ++k)
      a[k] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * k))),
                             k % 2 ? x1 : x0, a[k]);
  });
}

void BM_bound_cvt32_fma_xreg(benchmark::State& st) {
  run_bound(st, "32-byte load+extract+2 vcvtph2ps+fma, x in registers",
            [](bench_acc& a, const char* p, const float* x) {
              const __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8);
              for (std::size_t k = 0; k < 8; k += 2) {
                const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 * k));
                a[k] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(v)), x0, a[k]);
                a[k + 1] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(v, 1)), x1, a[k + 1]);
              }
            });
}

void BM_bound_bf16_fma(benchmark::State& st) {
  run_bound(st, "load+shift/and+fma", [](bench_acc& a, const char* p, const float* x) {
    const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    for (std::size_t k = 0; k < 8; k += 2) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 * k));
      a[k] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), _mm256_loadu_ps(x + 8 * k), a[k]);
      a[k + 1] =
          _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v, hi)), _mm256_loadu_ps(x + 8 * k + 8), a[k + 1]);
    }
  });
}

void BM_bound_bf16_fma_xreg(benchmark::State& st) {
  run_bound(st, "load+shift/and+fma, x in registers", [](bench_acc& a, const char* p, const float* x) {
    const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    const __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8);
    for (std::size_t k = 0; k < 8; k += 2) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 * k));
      a[k] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), x0, a[k]);
      a[k + 1] = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v, hi)), x1, a[k + 1]);
    }
  });
}

void BM_bound_bf16_add(benchmark::State& st) {
  run_bound(st, "load+shift/and+add", [](bench_acc& a, const char* p, const float*) {
    const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    for (std::size_t k = 0; k < 8; k += 2) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 * k));
      a[k] = _mm256_add_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), a[k]);
      a[k + 1] = _mm256_add_ps(_mm256_castsi256_ps(_mm256_and_si256(v, hi)), a[k + 1]);
    }
  });
}

// f16 through integer shifts, x in registers; Checked: plus what an exact
// kernel would also need, a running maximum of the magnitudes (two ops per 32
// bytes) to find inf/NaN weights, which the shifts turn into finite numbers.
template <bool Checked>
void BM_bound_f16_int_fma_xreg(benchmark::State& st) {
  __m256i seen = _mm256_setzero_si256();
  run_bound(st, Checked ? "load+int convert+inf/NaN check+fma, x in registers" : "load+int convert+fma, x in registers",
            [&seen](bench_acc& a, const char* p, const float* x) {
              const __m256i m = _mm256_set1_epi32(static_cast<int>(0x8fffe000u));
              const __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8);
              __m256i mx = seen;
              for (std::size_t k = 0; k < 8; k += 2) {
                const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 * k));
                if constexpr (Checked) mx = _mm256_max_epu16(mx, _mm256_add_epi16(v, v));
                const __m256i ev = _mm256_and_si256(_mm256_srai_epi32(_mm256_slli_epi32(v, 16), 3), m);
                const __m256i od = _mm256_and_si256(_mm256_srai_epi32(v, 3), m);
                a[k] = _mm256_fmadd_ps(_mm256_castsi256_ps(ev), x0, a[k]);
                a[k + 1] = _mm256_fmadd_ps(_mm256_castsi256_ps(od), x1, a[k + 1]);
              }
              seen = mx;
            });
  benchmark::DoNotOptimize(seen);
}

// ---- The vector work from L1, no order (2026-12-01) -------------------------
//
// BM_l1<Kind>: the instructions a 16-bit GEMV must issue for as many weights
// as the matrix holds (args {type, rows}), the weights read from one 4 KiB
// block that stays in L1, x in registers, 12 independent sums, no summation
// order: no kernel doing at least this work per weight can be faster, wherever
// its weights come from and however its rows are interleaved. Read against
// BM_stream_read of the same run (the matrix from L2/L3). Per 256 bytes:
//   0: 16 vcvtph2ps from memory + 16 FMA       (the native f16 kernel's work)
//   1: 16 vcvtph2ps from memory + 16 mul + 16 add (the default build's f16)
//   2: 8 loads + 8 shift + 8 and + 16 FMA       (the native bf16 kernel's work)
//   3: 8 loads + 8 shift + 8 and + 16 mul + 16 add (the default build's bf16)
//   4: 8 loads + 16 FMA, no conversion           (the multiply-adds alone)
//   5: 16 vcvtph2ps from memory, results unused   (the conversions alone)
// Never a GEMV: the sums are of the wrong elements in the wrong order.
template <int Kind>
void BM_l1(benchmark::State& st) {
  static const char* const names[] = {"L1: cvt+fma",           "L1: cvt+mul+add", "L1: shift/and+fma",
                                      "L1: shift/and+mul+add", "L1: load+fma",    "L1: cvt"};
  const auto t = type_of(st.range(0));
  const auto rows = static_cast<std::size_t>(st.range(1));
  const fixture f(t, rows);
  const auto w = f.view(t, rows);
  const char* base = static_cast<const char*>(w.data);
  const std::size_t steps = w.bytes() / 256;
  const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  for (auto _ : st) {
    __m256 a[12];
    for (auto& v : a) v = _mm256_setzero_ps();
    __m256 x0 = _mm256_set1_ps(1e-3f), x1 = _mm256_set1_ps(2e-3f);
    for (std::size_t i = 0; i < steps; ++i) {
      const char* p = base + (i * 256) % 4096;
      MOE_RESIDENCY_DETAIL_UNROLL
      for (std::size_t k = 0; k < 16; ++k) {
        __m256 wv;
        if constexpr (Kind == 0 || Kind == 1 || Kind == 5) {
          wv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * k)));
        } else if constexpr (Kind == 4) {
          wv = _mm256_loadu_ps(reinterpret_cast<const float*>(p + 16 * (k & ~std::size_t{1})));
        } else {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 * (k & ~std::size_t{1})));
          wv = _mm256_castsi256_ps(k % 2 ? _mm256_and_si256(v, hi) : _mm256_slli_epi32(v, 16));
        }
        const __m256 xv = k % 2 ? x1 : x0;
        if constexpr (Kind == 5) {
          __asm__ volatile("" : : "x"(wv));
        } else if constexpr (Kind == 1 || Kind == 3) {
          __m256 prod = _mm256_mul_ps(wv, xv);
          __asm__("" : "+x"(prod));  // rounded: no contraction
          a[k % 12] = _mm256_add_ps(prod, a[k % 12]);
        } else {
          a[k % 12] = _mm256_fmadd_ps(wv, xv, a[k % 12]);
        }
      }
    }
    __m256 s = a[0];
    for (std::size_t k = 1; k < 12; ++k) s = _mm256_add_ps(s, a[k]);
    float r = _mm256_cvtss_f32(s);
    benchmark::DoNotOptimize(r);
  }
  set_bytes(st, w, names[Kind]);
}

// A 16-bit kernel's instruction mix over the matrix in memory order (one
// stream, no row interleaving), 12 independent sums, no summation order:
// per 192 bytes, 12 vectors of 8 weights (f16: vcvtph2ps from memory; bf16:
// 6 32-byte loads, shift and and), each x vector loaded once for XU
// multiply-adds (x86_pass: XU = its rows, 3 for f16, 2 for bf16); Fused =
// false: a multiply and an add (the default build's); PF > 0: each of the 3
// lines of a step also prefetched PF bytes ahead. The last bytes of the
// matrix that do not fill 192 are not read (0.02%).
template <bool Fused, std::size_t XU, std::size_t PF = 0>
void BM_bound_mix(benchmark::State& st) {
  const auto t = type_of(st.range(0));
  const auto rows = static_cast<std::size_t>(st.range(1));
  const fixture f(t, rows);
  const auto w = f.view(t, rows);
  const char* base = static_cast<const char*>(w.data);
  const std::size_t steps = w.bytes() / 192, xn = f.x.size() - f.x.size() % 32;
  const float* xs = f.x.data();
  const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  const bool bf16 = t == mr::element_type::bf16;
  auto run = [&](auto is_bf16) {
    for (auto _ : st) {
      __m256 a[12];
      for (auto& v : a) v = _mm256_setzero_ps();
      for (std::size_t i = 0, c = 0; i < steps; ++i, c = (c + 8 * 12 / XU) % xn) {
        const char* p = base + 192 * i;
        if constexpr (PF > 0)
          for (std::size_t l = 0; l < 192; l += 64) _mm_prefetch(p + PF + l, _MM_HINT_T0);
        MOE_RESIDENCY_DETAIL_UNROLL
        for (std::size_t j = 0; j < 12 / XU; ++j) {
          __m256 xv = _mm256_loadu_ps(xs + c + 8 * j);
          __asm__("" : "+x"(xv));  // one load for XU uses
          MOE_RESIDENCY_DETAIL_UNROLL
          for (std::size_t r = 0; r < XU; ++r) {
            const std::size_t k = XU * j + r;
            __m256 wv;
            if constexpr (decltype(is_bf16)::value) {
              const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * (k / 2)));
              wv = _mm256_castsi256_ps(k % 2 ? _mm256_and_si256(v, hi) : _mm256_slli_epi32(v, 16));
            } else {
              wv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * k)));
            }
            a[k] = mr::detail::x86_madd<Fused>(wv, xv, a[k]);
          }
        }
      }
      __m256 sum = a[0];
      for (std::size_t k = 1; k < 12; ++k) sum = _mm256_add_ps(sum, a[k]);
      float r = _mm256_cvtss_f32(sum);
      benchmark::DoNotOptimize(r);
    }
  };
  if (bf16) run(std::true_type{});
  else run(std::false_type{});
  set_bytes(st, w,
            std::string(Fused ? "fma" : "mul+add") + ", x loaded per " + std::to_string(XU) + " vectors, memory order" +
                (PF ? ", prefetch " + std::to_string(PF) + " bytes ahead" : ""));
}

void BM_bound_f16_int_fma(benchmark::State& st) {
  run_bound(st, "load+int convert+fma", [](bench_acc& a, const char* p, const float* x) {
    const __m256i m = _mm256_set1_epi32(static_cast<int>(0x8fffe000u));
    for (std::size_t k = 0; k < 8; k += 2) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 * k));
      const __m256i ev = _mm256_and_si256(_mm256_srai_epi32(_mm256_slli_epi32(v, 16), 3), m);
      const __m256i od = _mm256_and_si256(_mm256_srai_epi32(v, 3), m);
      a[k] = _mm256_fmadd_ps(_mm256_castsi256_ps(ev), _mm256_loadu_ps(x + 8 * k), a[k]);
      a[k + 1] = _mm256_fmadd_ps(_mm256_castsi256_ps(od), _mm256_loadu_ps(x + 8 * k + 8), a[k + 1]);
    }
  });
}

// The GEMV kernel itself with another shape (rows per pass for f32/f16/bf16,
// prefetch distance in passes), fused or not (the default build's dispatched
// kernel is the unfused one): what each tuning would give, in the same run.
/// "prefetch D[ head H][ in-row][ locality L] fused|unfused": the tune's label.
std::string tune_label(std::size_t pf, std::size_t head, bool in_row, int loc, bool fused) {
  std::string s = "prefetch " + std::to_string(pf);
  if (head) s += " head " + std::to_string(head);
  if (in_row) s += " in-row";
  if (loc != 3) s += " locality " + std::to_string(loc);
  return s + (fused ? " fused" : " unfused");
}

template <std::size_t R32, std::size_t R16, std::size_t RB, std::size_t PF, bool Fused, std::size_t Head = 0,
          bool InRow = false, int Loc = 3, std::size_t G = 4>
void BM_gemv_tune(benchmark::State& st) {
  using tune = mr::detail::x86_tune<R32, R16, RB, PF, Head, Head, InRow, InRow, Loc, G>;
  run_gemv(
      st,
      [](const mr::matrix_view& w, const float* x, float* y) {
        mr::detail::gemv_x86_impl<xsimd::default_arch, Fused, tune>(w.data, w.type, w.rows, w.cols, w.row_stride_bytes,
                                                                    x, y, mr::activation_rounding::engine);
      },
      "rows " + std::to_string(R32) + "/" + std::to_string(R16) + "/" + std::to_string(RB) + " " +
          tune_label(PF, Head, InRow, Loc, Fused) +
          (G < 4 ? " f16 in sweeps of " + std::to_string(G) + " lane groups" : ""));
}

template <std::size_t R32, std::size_t R16, std::size_t RB, std::size_t PF, bool Fused, std::size_t Head = 0,
          bool InRow = false, int Loc = 3>
void BM_gemv_token_tune(benchmark::State& st) {
  using tune = mr::detail::x86_tune<R32, R16, RB, PF, Head, Head, InRow, InRow, Loc>;
  run_gemv_token(
      st,
      [](const mr::matrix_view& w, const float* x, float* y) {
        mr::detail::gemv_x86_impl<xsimd::default_arch, Fused, tune>(w.data, w.type, w.rows, w.cols, w.row_stride_bytes,
                                                                    x, y, mr::activation_rounding::engine);
      },
      "rows " + std::to_string(R32) + "/" + std::to_string(R16) + "/" + std::to_string(RB) + " " +
          tune_label(PF, Head, InRow, Loc, Fused));
}

template <std::size_t R32, std::size_t R16, std::size_t RB, std::size_t PF, bool Fused, std::size_t Head = 0,
          bool InRow = false, int Loc = 3, std::size_t G = 4>
void tune_kernel(const mr::matrix_view& w, const float* x, float* y) {
  using tune = mr::detail::x86_tune<R32, R16, RB, PF, Head, Head, InRow, InRow, Loc, G>;
  mr::detail::gemv_x86_impl<xsimd::default_arch, Fused, tune>(w.data, w.type, w.rows, w.cols, w.row_stride_bytes, x, y,
                                                              mr::activation_rounding::engine);
}

template <class Tune, bool Fused>
void tuned_kernel(const mr::matrix_view& w, const float* x, float* y) {
  mr::detail::gemv_x86_impl<xsimd::default_arch, Fused, Tune>(w.data, w.type, w.rows, w.cols, w.row_stride_bytes, x, y,
                                                              mr::activation_rounding::engine);
}
using wide4_tune = mr::detail::x86_tune<3, 3, 2, 1, 0, 0, false, false, 3, 4, 4>;
using wide3_tune = mr::detail::x86_tune<3, 3, 2, 1, 0, 0, false, false, 3, 4, 3>;
#if defined(__AVX512F__)
using l1_next_tune = mr::detail::x86_tune<4, 3, 3, 1, 0, 0, false, false, 3, 4, 2>;
using l2_next_tune = mr::detail::x86_tune<1, 3, 3, 1, 0, 0, false, false, 1, 4, 2>;
#else
using l1_next_tune = mr::detail::x86_tune<3, 3, 2, 1, 0, 0, false, false, 3, 4, 2>;
using l2_next_tune = mr::detail::x86_tune<1, 3, 2, 1, 0, 0, false, false, 1, 4, 2>;
#endif

// Shapes of the kernel and the read on one fixture (args {type, routers}: 0
// routers is a token's 48, from the last-level cache or DRAM; 1 is one router,
// in cache), each iteration running all of them in turn, so every ratio is
// taken on the same memory and the same machine load. Counters: each kernel's
// CPU time over the read's ("u_": unfused, the default build's kernel).
void BM_token_tunes(benchmark::State& st) {
  run_token_kernels(st, read_compiled,
                    {{"gemv", [](const mr::matrix_view& w, const float* x, float* y) { mr::gemv(w, x, y); }},
                     {"f16_head16", tune_kernel<3, 3, 2, 1, true, 16>},  // the f16 default before
                     {"none", tune_kernel<3, 3, 2, 0, true>},
                     {"inrow8", tune_kernel<3, 3, 2, 1, true, 8, true>},
                     {"inrow16", tune_kernel<3, 3, 2, 1, true, 16, true>},
                     {"whole_t2", tune_kernel<3, 3, 2, 1, true, 0, false, 1>},
                     {"bf16_3rows", tune_kernel<3, 3, 3, 1, true, 0>},
                     {"u_default", tune_kernel<3, 3, 2, 1, false, 0>},
                     {"u_f16_head16", tune_kernel<3, 3, 2, 1, false, 16>},
                     {"f16_6x2", tune_kernel<3, 6, 2, 1, true, 0, false, 3, 2>},
                     {"u_f16_6x2", tune_kernel<3, 6, 2, 1, false, 0, false, 3, 2>},
                     // `gemv` takes the 512-bit kernel for f16/bf16 on an AVX-512F CPU (4 rows a pass);
                     // the same shape on the 256-bit kernel only, and the 512-bit one with 6 rows.
                     {"narrow", tuned_kernel<mr::detail::x86_tune_narrow, true>},
                     {"u_narrow", tuned_kernel<mr::detail::x86_tune_narrow, false>},
                     {"u_wide", tuned_kernel<mr::detail::x86_tune_default, false>},
                     {"wide4", tuned_kernel<wide4_tune, true>},
                     {"wide3", tuned_kernel<wide3_tune, true>},
                     // The default before (this TU's): f32 4 rows a pass (3 without AVX-512),
                     // the 16-bit rows one pass ahead into L1; and the default's shape with
                     // the 16-bit rows only one pass ahead, into L2.
                     {"l1_next", tuned_kernel<l1_next_tune, true>},
                     {"l2_next", tuned_kernel<l2_next_tune, true>}});
}
#endif

}  // namespace

BENCHMARK(BM_stream_read)->Apply(shapes);
BENCHMARK(BM_gemv)->Apply(shapes);
BENCHMARK(BM_gemv_scalar)->Apply(shapes);
BENCHMARK(BM_stream_read_token)->Arg(0)->Arg(1)->Arg(2);
BENCHMARK(BM_gemv_token)->Arg(0)->Arg(1)->Arg(2);
BENCHMARK(BM_token_pair)->Arg(0)->Arg(1)->Arg(2);
BENCHMARK(BM_cache_pair)->Arg(0)->Arg(1)->Arg(2);
BENCHMARK(BM_gemv_naive_f16_call)->Args({1, 128})->Args({1, 256});

#if MOE_RESIDENCY_DETAIL_X86_KERNEL && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
namespace {
void bound_shapes(benchmark::internal::Benchmark* b) {
  for (const std::int64_t t : {1, 2}) b->Args({t, 128});
}
void tune_shapes(benchmark::internal::Benchmark* b) {
  for (const std::int64_t t : {0, 1, 2}) b->Args({t, 128});
}
}  // namespace
BENCHMARK(BM_bound_rows_read<3, 0>)->Apply(bound_shapes);
BENCHMARK(BM_bound_rows_read<3, 1>)->Apply(bound_shapes);
BENCHMARK(BM_bound_cvt_add)->Args({1, 128});
BENCHMARK(BM_bound_load_fma)->Args({1, 128});
BENCHMARK(BM_bound_cvt_fma)->Args({1, 128});
BENCHMARK(BM_bound_cvt_fma_xreg)->Args({1, 128});
BENCHMARK(BM_bound_cvt32_fma_xreg)->Args({1, 128});
BENCHMARK(BM_bound_f16_int_fma)->Args({1, 128});
BENCHMARK(BM_bound_f16_int_fma_xreg<false>)->Args({1, 128});
BENCHMARK(BM_bound_f16_int_fma_xreg<true>)->Args({1, 128});
BENCHMARK(BM_bound_bf16_fma)->Args({2, 128});
BENCHMARK(BM_bound_bf16_fma_xreg)->Args({2, 128});
BENCHMARK(BM_bound_bf16_add)->Args({2, 128});
BENCHMARK(BM_bound_mix<true, 3>)->Args({1, 128});
BENCHMARK(BM_bound_mix<true, 6>)->Args({1, 128});
BENCHMARK(BM_bound_mix<true, 12>)->Args({1, 128});
BENCHMARK(BM_bound_mix<true, 3, 512>)->Args({1, 128});
BENCHMARK(BM_bound_mix<true, 3, 2048>)->Args({1, 128});
BENCHMARK(BM_bound_mix<false, 3>)->Args({1, 128});
BENCHMARK(BM_bound_mix<true, 2>)->Args({2, 128});
BENCHMARK(BM_bound_mix<true, 6>)->Args({2, 128});
BENCHMARK(BM_bound_mix<false, 2>)->Args({2, 128});
BENCHMARK(BM_l1<0>)->Args({1, 128});
BENCHMARK(BM_l1<1>)->Args({1, 128});
BENCHMARK(BM_l1<2>)->Args({2, 128});
BENCHMARK(BM_l1<3>)->Args({2, 128});
BENCHMARK(BM_l1<4>)->Args({1, 128});
BENCHMARK(BM_l1<5>)->Args({1, 128});
// f16 and bf16 take their own row count; f32 only rows (never prefetched).
// The last argument: lines at the head of each next row prefetched (0: all).
BENCHMARK(BM_gemv_tune<3, 3, 2, 1, true, 0>)->Apply(tune_shapes);  // x86_tune_default
BENCHMARK(BM_gemv_tune<3, 3, 2, 0, true>)->Apply(tune_shapes);
BENCHMARK(BM_gemv_tune<3, 3, 2, 1, true, 16>)->Apply(tune_shapes);  // the f16 default before
BENCHMARK(BM_gemv_tune<3, 2, 3, 1, true, 0>)->Apply(tune_shapes);
BENCHMARK(BM_gemv_token_tune<3, 3, 2, 1, true, 0>)->Arg(1)->Arg(2);
BENCHMARK(BM_gemv_token_tune<3, 3, 2, 0, true>)->Arg(1)->Arg(2);
BENCHMARK(BM_gemv_token_tune<3, 3, 2, 1, true, 16>)->Arg(1)->Arg(2);
BENCHMARK(BM_gemv_token_tune<3, 2, 3, 1, true, 0>)->Arg(1)->Arg(2);
BENCHMARK(BM_gemv_tune<3, 3, 2, 1, true, 32>)->Args({1, 128});
// f16 in two sweeps of two lane groups (x86_pass_split): 4, 5, 6 rows a pass.
BENCHMARK(BM_gemv_tune<3, 1, 2, 0, true>)->Args({1, 128});
BENCHMARK(BM_gemv_tune<3, 2, 2, 0, true>)->Args({1, 128});
BENCHMARK(BM_gemv_tune<3, 4, 2, 1, true, 0, false, 3, 2>)->Args({1, 128});
BENCHMARK(BM_gemv_tune<3, 5, 2, 1, true, 0, false, 3, 2>)->Args({1, 128});
BENCHMARK(BM_gemv_tune<3, 6, 2, 1, true, 0, false, 3, 2>)->Args({1, 128});
BENCHMARK(BM_gemv_tune<3, 6, 2, 0, true, 0, false, 3, 2>)->Args({1, 128});
BENCHMARK(BM_gemv_tune<3, 6, 2, 1, false, 0, false, 3, 2>)->Args({1, 128});
BENCHMARK(BM_gemv_tune<3, 3, 2, 1, false, 0>)->Apply(tune_shapes);
// The default build's f32 (unfused) with 2 and 4 rows a pass.
BENCHMARK(BM_gemv_tune<2, 3, 2, 1, false, 0>)->Args({0, 128});
BENCHMARK(BM_gemv_tune<4, 3, 2, 1, false, 0>)->Args({0, 128});
BENCHMARK(BM_gemv_token_tune<3, 3, 2, 1, true, 32>)->Arg(1);
BENCHMARK(BM_token_tunes)->Args({0, 0})->Args({0, 1})->Args({1, 0})->Args({2, 0})->Args({1, 1})->Args({2, 1});
#endif

#if MOE_RESIDENCY_DETAIL_X86_KERNEL && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
// ---- gemv next to the xsimd kernel and an AVX2 read, in turn on one fixture --
//
// Args {type, routers} as BM_token_tunes (0 routers: a token's 48; 1: one
// router in cache). Counters: each one's CPU time over the read's
// (read_compiled, this TU's widest SIMD: AVX-512 on an AVX-512 host):
//   gemv       what `gemv` runs (the hand-written x86 kernel, also for AVX-512
//              TUs since 2026-12-01);
//   xsimd      gemv_simd_generic<default_arch> (what an AVX-512 TU ran before);
//   u_gemv     the hand-written kernel unfused (what the default build's
//              dispatch runs);
//   read_avx2  an AVX2 read of the same bytes (the default build's roofline,
//              bench_router_portable's BM_stream_read_best): on an AVX-512 host
//              the two reads differ, as 64-byte loads split two cache lines when
//              the rows start 32 bytes past one (router_fixture.hpp).
namespace {
void read_avx2_kernel(const mr::matrix_view& w, const float*, float* y) {
  const auto* p = static_cast<const std::uint32_t*>(w.data);
  const std::size_t words = w.bytes() / 4;
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  for (std::size_t i = 0; i + 32 <= words; i += 32) {
    a = _mm256_add_epi32(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_add_epi32(b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    c = _mm256_add_epi32(c, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 16)));
    d = _mm256_add_epi32(d, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 24)));
  }
  const __m256i s = _mm256_add_epi32(_mm256_add_epi32(a, b), _mm256_add_epi32(c, d));
  y[0] = static_cast<float>(_mm256_extract_epi32(s, 0));
}
void BM_token_kernels(benchmark::State& st) {
  run_token_kernels(st, read_compiled,
                    {{"gemv", [](const mr::matrix_view& w, const float* x, float* y) { mr::gemv(w, x, y); }},
                     {"xsimd",
                      [](const mr::matrix_view& w, const float* x, float* y) {
                        mr::detail::gemv_simd_generic<xsimd::default_arch, true>(
                            w.data, w.type, w.rows, w.cols, w.row_stride_bytes, x, y, mr::activation_rounding::engine);
                      }},
                     {"u_gemv", tune_kernel<3, 3, 2, 1, false, 0>},
                     {"read_avx2", read_avx2_kernel}});
}
}  // namespace
BENCHMARK(BM_token_kernels)->Args({0, 0})->Args({1, 0})->Args({2, 0})->Args({0, 1})->Args({1, 1})->Args({2, 1});
#endif
