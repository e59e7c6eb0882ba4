// Matrix multiply with weights stored [N, K] (out, in): C = A * B^T + beta * C.
//
// Three implementations, chosen in matmul() (see kernels/README.md for the measurements):
//  * gemv: few rows of A (decode). Memory-bound: every weight is read once, converted to f32
//    in registers and used for all rows of A, so bf16 weights cost half the bytes of f32.
//  * gemm_packed: the prefill path. Goto-style blocking: a KC x NC block of B is packed into
//    32-wide f32 panels (bf16/f16 converted here, once per block, not per use), A is packed
//    into MR-row micro-panels, and an MR x 32 register tile accumulates with AVX-512 FMAs.
//  * gemm_blas: OpenBLAS sgemm, the peer the benchmark compares against, and the fallback
//    when the compiler does not target AVX-512.
#include <cblas.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cpu/cpu_ops.hpp"
#include "cpu/simd.hpp"
#include "trellis/kernels/progress_hook.hpp"

namespace trellis::kernels::cpu {
namespace {

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};

// Per-thread scratch that grows to the largest request and is reused across calls.
float* scratch(std::size_t floats, int which) {
  thread_local std::unique_ptr<float, FreeDeleter> bufs[2];
  thread_local std::size_t sizes[2] = {0, 0};
  auto i = static_cast<std::size_t>(which);
  if (sizes[i] < floats) {
    std::size_t bytes = (floats * sizeof(float) + 63) / 64 * 64;
    bufs[i].reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
    if (!bufs[i]) throw_error(ErrorCode::kResourceExhausted, "matmul: cannot allocate {} bytes of scratch", bytes);
    sizes[i] = floats;
  }
  return bufs[i].get();
}

// ---- small-M path ------------------------------------------------------------------------

// bf16 only: x deinterleaved per 32-element chunk c as [x[32c + 2j] for j < 16] then
// [x[32c + 2j + 1] for j < 16], K rounded down to a multiple of 32, one row after another.
// A 32-bit lane of 32 loaded bf16 weights holds an even element in its low half and an odd
// one in its high half, so `lane << 16` and `lane & 0xffff0000` are both exact f32 values
// (w[2j] and w[2j+1]): two FMAs against the matching halves of x widen 32 weights with 2
// integer ops instead of 4, which matters when cores are shared and decode turns
// compute-bound.
std::vector<float> deinterleave_x(const GemmArgs& g) {
  const std::int64_t k32 = g.k / 32 * 32;
  std::vector<float> xd(static_cast<std::size_t>(g.m * k32));
  for (std::int64_t i = 0; i < g.m; ++i)
    for (std::int64_t c = 0; c < k32; c += 32)
      for (int j = 0; j < 16; ++j) {
        xd[static_cast<std::size_t>(i * k32 + c + j)] = g.a[i * g.lda + c + 2 * j];
        xd[static_cast<std::size_t>(i * k32 + c + 16 + j)] = g.a[i * g.lda + c + 2 * j + 1];
      }
  return xd;
}

// ToL2: the line is wanted further ahead than L1 holds (gemv_typed says when), so it is
// fetched into L2 only; into L1 it would be evicted before its use.
template <bool ToL2, typename T>
inline void prefetch_next(const T* p, std::int64_t offset) {
#ifdef TRELLIS_KERNELS_AVX512
  if (offset) _mm_prefetch(reinterpret_cast<const char*>(p + offset), ToL2 ? _MM_HINT_T1 : _MM_HINT_T0);
#endif
}

// ToL2: the prefetches for the next block go to L2 only (gemv_typed says when).
template <typename E, int M, int NB, bool ToL2 = false>
void gemv_rows(const GemmArgs& g, std::int64_t n_begin, std::int64_t n_end, const float* xd) {
  const auto* b = static_cast<const typename E::T*>(g.b);
  const std::int64_t k = g.k;
  std::int64_t n = n_begin;
#ifdef TRELLIS_KERNELS_AVX512
  for (; n + NB <= n_end; n += NB) {
    __m512 acc[M][NB];
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
    const typename E::T* rows[NB];
    for (int j = 0; j < NB; ++j) rows[j] = b + (n + j) * g.ldb;
    // The same offset in the next block's rows. Each bf16 row of a 2048-wide matrix is one
    // 4 KiB page, where hardware stream prefetchers stop and retrain; fetching the next
    // rows while this block computes keeps DRAM busy across those page changes.
    const std::int64_t next = n + 2 * NB <= n_end ? NB * g.ldb : 0;
    std::int64_t kk = 0;
    if constexpr (std::is_same_v<E, BF16>) {
      const std::int64_t k32 = k / 32 * 32;
      const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
      for (; kk < k32; kk += 32) {
        __m512 we[NB], wo[NB];
        for (int j = 0; j < NB; ++j) {
          prefetch_next<ToL2>(rows[j] + kk, next);
          __m512i w = _mm512_loadu_si512(rows[j] + kk);
          we[j] = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
          wo[j] = _mm512_castsi512_ps(_mm512_and_si512(w, high));
        }
        for (int i = 0; i < M; ++i) {
          __m512 xe = _mm512_loadu_ps(xd + i * k32 + kk), xo = _mm512_loadu_ps(xd + i * k32 + kk + 16);
          for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_fmadd_ps(xo, wo[j], _mm512_fmadd_ps(xe, we[j], acc[i][j]));
        }
      }
    }
    for (; kk + 16 <= k; kk += 16) {
      __m512 w[NB];
      for (int j = 0; j < NB; ++j) {
        prefetch_next<ToL2>(rows[j] + kk, next);
        w[j] = load16<E>(rows[j] + kk);
      }
      for (int i = 0; i < M; ++i) {
        __m512 x = _mm512_loadu_ps(g.a + i * g.lda + kk);
        for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_fmadd_ps(x, w[j], acc[i][j]);
      }
    }
    if (kk < k) {
      int rem = static_cast<int>(k - kk);
      __m512 w[NB];
      for (int j = 0; j < NB; ++j) w[j] = load16_partial<E>(rows[j] + kk, rem);
      for (int i = 0; i < M; ++i) {
        __m512 x = load16_partial<F32>(g.a + i * g.lda + kk, rem);
        for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_fmadd_ps(x, w[j], acc[i][j]);
      }
    }
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < NB; ++j) {
        float s = hsum(acc[i][j]);
        float* c = g.c + i * g.ldc + n + j;
        *c = g.beta == 0.0f ? s : s + g.beta * *c;
      }
  }
  // Leftover rows one at a time with the same vector arithmetic: a row's result must not
  // depend on how many rows the pass takes (NB differs with M; batch invariance).
  if constexpr (NB > 1) {
    if (n < n_end) gemv_rows<E, M, 1>(g, n, n_end, xd);
    return;
  }
#endif
  for (; n < n_end; ++n) {  // leftover rows of NB = 1 (none) and the whole job without AVX-512
    const typename E::T* row = b + n * g.ldb;
    for (int i = 0; i < M; ++i) {
      float s = 0;
      const float* x = g.a + i * g.lda;
      for (std::int64_t kk = 0; kk < k; ++kk) s += x[kk] * to_f32<E>(row[kk]);
      float* c = g.c + i * g.ldc + n;
      *c = g.beta == 0.0f ? s : s + g.beta * *c;
    }
  }
}

template <typename E, int M>
void gemv_typed(ThreadPool& pool, const GemmArgs& g) {
  // Rows of B per pass: M * NB accumulators and NB weight vectors (two for bf16) within 32
  // zmm. bf16 at M = 1 takes 8: more rows in flight kept the 1-thread down projection
  // (K = 8192) at 28 GB/s instead of 22, and llama-1b decode 8% faster (docs/benchmarks.md).
  constexpr int kNb = std::is_same_v<E, BF16> && M == 1 ? 8 : M <= 4 ? 4 : 2;
  std::vector<float> xd;
  if constexpr (std::is_same_v<E, BF16>) xd = deinterleave_x(g);
  // gemv_rows prefetches each weight line one block of rows ahead. A block of wide rows (the
  // down projection's K = 8192: 8 bf16 rows are 128 KiB) puts that beyond what L1 (32-48 KiB)
  // keeps until the next block reads it, so those prefetches go to L2 only. Measured on an
  // Intel Xeon (bench kernels, llama-1b, 1 thread): the down projection's GEMV from 0.84 to
  // 0.97 of triad (docs/benchmarks.md); the K = 2048 shapes (32 KiB ahead) keep L1.
  const bool to_l2 = kNb * g.ldb * static_cast<std::int64_t>(sizeof(typename E::T)) > 32 * 1024;
  // Chunks of 64 rows keep every thread's slice of B contiguous and its stores apart. The
  // progress hook runs every 256 rows (a few microseconds of weights at M = 1).
  pool.parallel_for((g.n + 63) / 64, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t c = lo; c < hi; c += 4) {
      const std::int64_t n0 = c * 64, n1 = std::min(std::min(hi, c + 4) * 64, g.n);
      if (to_l2)
        gemv_rows<E, M, kNb, true>(g, n0, n1, xd.data());
      else
        gemv_rows<E, M, kNb>(g, n0, n1, xd.data());
      poll_progress();
    }
  });
}

template <typename E>
void gemv_dispatch(ThreadPool& pool, const GemmArgs& g) {
  switch (g.m) {
    case 1: return gemv_typed<E, 1>(pool, g);
    case 2: return gemv_typed<E, 2>(pool, g);
    case 3: return gemv_typed<E, 3>(pool, g);
    case 4: return gemv_typed<E, 4>(pool, g);
    case 5: return gemv_typed<E, 5>(pool, g);
    case 6: return gemv_typed<E, 6>(pool, g);
    case 7: return gemv_typed<E, 7>(pool, g);
    case 8: return gemv_typed<E, 8>(pool, g);
    default: break;
  }
  throw_error(ErrorCode::kInternal, "gemv: {} rows is more than the {} this path handles", g.m, kGemvMaxRows);
}

// ---- packed GEMM -------------------------------------------------------------------------

constexpr int kNr = 32;        // columns of C per register tile (2 zmm)
constexpr int kMr = 12;        // rows of C per register tile: 24 accumulators
constexpr std::int64_t kKc = 256;  // k-block: one B panel (kKc x 32 f32) = 32 KiB, fits L1
constexpr std::int64_t kNc = 512;  // n-block: packed B block = 512 KiB, fits L2

#ifdef TRELLIS_KERNELS_AVX512
// In-register transpose of a 16 x 16 f32 block: r[i] holds row i on entry, column i on exit.
void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {  // interleave row pairs within 128-bit lanes
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // r[4i + c], lane l: column 4l + c of rows 4i..4i+3
    auto pd = [](__m512 v) { return _mm512_castps_pd(v); };
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[4 * i]), pd(t[4 * i + 2])));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[4 * i]), pd(t[4 * i + 2])));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(t[4 * i + 1]), pd(t[4 * i + 3])));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(t[4 * i + 1]), pd(t[4 * i + 3])));
  }
  for (int c = 0; c < 4; ++c) {  // gather lane l of the four row groups into column 4l + c
    __m512 t0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x44), t1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xEE);
    __m512 t2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x44), t3 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xEE);
    t[c] = _mm512_shuffle_f32x4(t0, t2, 0x88);
    t[4 + c] = _mm512_shuffle_f32x4(t0, t2, 0xDD);
    t[8 + c] = _mm512_shuffle_f32x4(t1, t3, 0x88);
    t[12 + c] = _mm512_shuffle_f32x4(t1, t3, 0xDD);
  }
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

// bp[p][k][0..32) = B[n0 + 32p + j][k0 + k] as f32, zero beyond N. Widening and the
// transpose happen 16 x 16 at a time in registers: packing is the only per-weight work
// besides the FMAs, so it must stay far below their cost even at M = 128.
template <typename E>
void pack_b(const GemmArgs& g, std::int64_t n0, std::int64_t nc, std::int64_t k0, std::int64_t kc, float* bp) {
  const auto* b = static_cast<const typename E::T*>(g.b);
  std::int64_t panels = (nc + kNr - 1) / kNr;
  for (std::int64_t p = 0; p < panels; ++p) {
    float* dst = bp + p * kc * kNr;
    for (std::int64_t kk = 0; kk < kc; kk += 16) {
      int kn = static_cast<int>(std::min<std::int64_t>(16, kc - kk));
      for (int half = 0; half < 2; ++half) {
        __m512 r[16];
        for (int j = 0; j < 16; ++j) {
          std::int64_t n = p * kNr + half * 16 + j;
          const typename E::T* src = b + (n0 + n) * g.ldb + k0 + kk;
          r[j] = n >= nc ? _mm512_setzero_ps() : kn == 16 ? load16<E>(src) : load16_partial<E>(src, kn);
        }
        transpose16(r);
        for (int i = 0; i < kn; ++i) _mm512_store_ps(dst + (kk + i) * kNr + half * 16, r[i]);
      }
    }
  }
}

// C tile (MR x ncols, ncols <= 32) = A micro-panel (ap[k][MR]) * B panel (bp[k][32]) + beta C.
template <int MR>
void micro_kernel(std::int64_t kc, const float* ap, const float* bp, float* c, std::int64_t ldc, int ncols,
                  float beta) {
  __m512 acc0[MR], acc1[MR];
  for (int i = 0; i < MR; ++i) acc0[i] = acc1[i] = _mm512_setzero_ps();
  for (std::int64_t k = 0; k < kc; ++k) {
    __m512 b0 = _mm512_load_ps(bp + k * kNr), b1 = _mm512_load_ps(bp + k * kNr + 16);
    for (int i = 0; i < MR; ++i) {
      __m512 a = _mm512_set1_ps(ap[k * MR + i]);
      acc0[i] = _mm512_fmadd_ps(a, b0, acc0[i]);
      acc1[i] = _mm512_fmadd_ps(a, b1, acc1[i]);
    }
  }
  auto m0 = static_cast<__mmask16>(ncols >= 16 ? 0xffff : (1u << ncols) - 1u);
  auto m1 = static_cast<__mmask16>(ncols >= 32 ? 0xffff : ncols <= 16 ? 0 : (1u << (ncols - 16)) - 1u);
  __m512 vb = _mm512_set1_ps(beta);
  for (int i = 0; i < MR; ++i) {
    float* row = c + i * ldc;
    if (beta != 0.0f) {
      acc0[i] = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, row), acc0[i]);
      acc1[i] = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, row + 16), acc1[i]);
    }
    _mm512_mask_storeu_ps(row, m0, acc0[i]);
    _mm512_mask_storeu_ps(row + 16, m1, acc1[i]);
  }
}

template <int MR>
void run_row_block(const GemmArgs& g, std::int64_t m0, std::int64_t n0, std::int64_t nc, std::int64_t k0,
                   std::int64_t kc, const float* bp, float* ap, float beta) {
  for (std::int64_t kk = 0; kk < kc; ++kk)
    for (int i = 0; i < MR; ++i) ap[kk * MR + i] = g.a[(m0 + i) * g.lda + k0 + kk];
  std::int64_t panels = (nc + kNr - 1) / kNr;
  for (std::int64_t p = 0; p < panels; ++p) {
    int ncols = static_cast<int>(std::min<std::int64_t>(kNr, nc - p * kNr));
    micro_kernel<MR>(kc, ap, bp + p * kc * kNr, g.c + m0 * g.ldc + n0 + p * kNr, g.ldc, ncols, beta);
  }
}

template <int... Rs>
void run_row_block_any(int mr, std::integer_sequence<int, Rs...>, const GemmArgs& g, std::int64_t m0,
                       std::int64_t n0, std::int64_t nc, std::int64_t k0, std::int64_t kc, const float* bp,
                       float* ap, float beta) {
  ((mr == Rs + 1 ? run_row_block<Rs + 1>(g, m0, n0, nc, k0, kc, bp, ap, beta) : void()), ...);
}

template <typename E>
void gemm_columns(const GemmArgs& g, std::int64_t n_begin, std::int64_t n_end) {
  float* bp = scratch(static_cast<std::size_t>(kKc * kNc), 0);
  float* ap = scratch(static_cast<std::size_t>(kKc * kMr), 1);
  for (std::int64_t n0 = n_begin; n0 < n_end; n0 += kNc) {
    std::int64_t nc = std::min(kNc, n_end - n0);
    for (std::int64_t k0 = 0; k0 < g.k; k0 += kKc) {
      std::int64_t kc = std::min(kKc, g.k - k0);
      pack_b<E>(g, n0, nc, k0, kc, bp);
      float beta = k0 == 0 ? g.beta : 1.0f;
      for (std::int64_t m0 = 0; m0 < g.m; m0 += kMr) {
        int mr = static_cast<int>(std::min<std::int64_t>(kMr, g.m - m0));
        run_row_block_any(mr, std::make_integer_sequence<int, kMr>{}, g, m0, n0, nc, k0, kc, bp, ap, beta);
        poll_progress();  // every 12 x 512 x 256 multiply-adds (~0.1 ms)
      }
    }
  }
}
#endif

}  // namespace

void gemv(ThreadPool& pool, const GemmArgs& g) {
  dispatch_dtype(g.b_type, "matmul", [&]<typename E>() { gemv_dispatch<E>(pool, g); });
}

void gemv_invariant(ThreadPool& pool, const GemmArgs& g) {
#ifdef TRELLIS_KERNELS_AVX512
  if (g.m == 1) return gemv(pool, g);
  // Rows in chunks of 4 with the M <= 4 kernel (NB = 4, as M = 1 uses): each output element
  // is reduced in the same order as when its row is alone. A block of 256 weight rows is
  // kept in L2 while every chunk of activation rows passes over it.
  dispatch_dtype(g.b_type, "matmul", [&]<typename E>() {
    std::vector<float> xd;
    if constexpr (std::is_same_v<E, BF16>) xd = deinterleave_x(g);
    const std::int64_t k32 = g.k / 32 * 32;
    pool.parallel_for((g.n + 63) / 64, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t c = lo; c < hi; c += 4) {
        const std::int64_t n0 = c * 64, n1 = std::min(std::min(hi, c + 4) * 64, g.n);
        for (std::int64_t r = 0; r < g.m; r += 4) {
          GemmArgs s = g;
          s.m = std::min<std::int64_t>(4, g.m - r);
          s.a = g.a + r * g.lda;
          s.c = g.c + r * g.ldc;
          const float* x = xd.empty() ? nullptr : xd.data() + r * k32;
          switch (s.m) {
            case 1: gemv_rows<E, 1, 4>(s, n0, n1, x); break;
            case 2: gemv_rows<E, 2, 4>(s, n0, n1, x); break;
            case 3: gemv_rows<E, 3, 4>(s, n0, n1, x); break;
            default: gemv_rows<E, 4, 4>(s, n0, n1, x); break;
          }
        }
        poll_progress();
      }
    });
  });
#else
  // Without AVX-512 every path is the scalar loop of gemv_rows (one order per element) for
  // M <= 8; larger M goes through BLAS, whose order may differ: chunk it the same way.
  for (std::int64_t r = 0; r < g.m; r += kGemvMaxRows) {
    GemmArgs s = g;
    s.m = std::min<std::int64_t>(kGemvMaxRows, g.m - r);
    s.a = g.a + r * g.lda;
    s.c = g.c + r * g.ldc;
    gemv(pool, s);
  }
#endif
}

void gemm_packed(ThreadPool& pool, const GemmArgs& g) {
#ifdef TRELLIS_KERNELS_AVX512
  std::int64_t col_blocks = (g.n + kNr - 1) / kNr;
  dispatch_dtype(g.b_type, "matmul", [&]<typename E>() {
    pool.parallel_for(col_blocks, [&](std::int64_t lo, std::int64_t hi) {
      gemm_columns<E>(g, lo * kNr, std::min(hi * kNr, g.n));
    });
  });
#else
  gemm_blas(pool, g);
#endif
}

void for_f32_weight_blocks(const GemmArgs& g, const std::function<void(const GemmArgs&)>& f) {
  if (g.b_type == DType::kF32) return f(g);
  // Convert 256 weight rows at a time so the f32 copy stays small and cache-warm.
  constexpr std::int64_t kRows = 256;
  float* wf = scratch(static_cast<std::size_t>(kRows * std::max<std::int64_t>(g.k, 1)), 0);
  for (std::int64_t n0 = 0; n0 < g.n; n0 += kRows) {
    GemmArgs s = g;
    s.n = std::min(kRows, g.n - n0);
    dispatch_dtype(g.b_type, "matmul", [&]<typename E>() {
      const auto* b = static_cast<const typename E::T*>(g.b);
      for (std::int64_t r = 0; r < s.n; ++r) row_to_f32<E>(b + (n0 + r) * g.ldb, wf + r * g.k, g.k);
    });
    s.b = wf;
    s.b_type = DType::kF32;
    s.ldb = g.k;
    s.c = g.c + n0;
    f(s);
    poll_progress();  // the libraries have no hook: between their calls only
  }
}

void gemm_blas(ThreadPool& pool, const GemmArgs& g) {
  (void)pool;  // OpenBLAS runs its own threads (set to the pool's size by Context)
  for_f32_weight_blocks(g, [](const GemmArgs& s) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(s.m), static_cast<blasint>(s.n),
                static_cast<blasint>(s.k), 1.0f, s.a, static_cast<blasint>(s.lda), static_cast<const float*>(s.b),
                static_cast<blasint>(s.ldb), s.beta, s.c, static_cast<blasint>(s.ldc));
  });
  if (g.b_type == DType::kF32) poll_progress();
}

bool blas_uses_avx512() {
  // Measured (docs/benchmarks.md, Kernels): with f32 weights OpenBLAS's AVX-512 sgemm kernels
  // (what it loads for these core names) beat our GEMM by 8-20%; its AVX2 ones (e.g.
  // "Haswell", which DYNAMIC_ARCH 0.3.21 picks for Zen 4/5 unless OPENBLAS_CORETYPE says
  // otherwise) lose to it by 30-40%.
  static const bool avx512 = [] {
    std::string core = openblas_get_corename();
    return core == "SkylakeX" || core == "skylakex" || core == "Cooperlake" || core == "cooperlake" ||
           core == "SapphireRapids" || core == "sapphirerapids";
  }();
  return avx512;
}

MatmulAlgo prefill_algo(DType t) {
  // Measured (docs/benchmarks.md, "Prefill GEMM: ours, OpenBLAS and oneDNN"), 1 and 2 threads:
  //  * f32 weights: oneDNN's AVX-512 brgemm beats ours (1.1-1.4x) and OpenBLAS, its AVX-512
  //    kernels included (1.0-1.2x at 1 thread); without it, OpenBLAS's AVX-512 sgemm beats
  //    ours (1.08-1.2x).
  //  * 16-bit weights: both libraries take f32 weights only, and once they are widened (a pass
  //    ours does not need: it widens while packing) ours is 0.94-1.04x the faster of them at 1
  //    thread, 0.84-1.13x at 2: no consistent winner, so ours stays (no extra pass).
  if (t != DType::kF32) return MatmulAlgo::kGemm;
  if (onednn_has_avx512()) return MatmulAlgo::kOnednn;
  return blas_uses_avx512() ? MatmulAlgo::kBlas : MatmulAlgo::kGemm;
}

void matmul(ThreadPool& pool, const GemmArgs& g, MatmulAlgo algo) {
  if (algo == MatmulAlgo::kAuto) algo = g.m <= kGemvMaxRows ? MatmulAlgo::kGemv : prefill_algo(g.b_type);
  switch (algo) {
    case MatmulAlgo::kGemv: return gemv(pool, g);
    case MatmulAlgo::kBlas: return gemm_blas(pool, g);
    case MatmulAlgo::kOnednn: return gemm_onednn(pool, g);
    case MatmulAlgo::kOnednnBf16: return gemm_onednn_bf16(pool, g);
    case MatmulAlgo::kGemm:
    case MatmulAlgo::kAuto: return gemm_packed(pool, g);
  }
}

}  // namespace trellis::kernels::cpu
