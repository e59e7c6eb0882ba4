// Quantised blocks (quant.hpp): activation quantisation, integer dot products and the matmul
// with Q4_1 / Q8_0 weights, computed as llama.cpp's CPU backend computes them.
//
// The SIMD paths use 256-bit integer ops: AVX2's maddubs (u8 x s8 -> s16 pairs, which cannot
// saturate here: 15 * 127 * 2 and 127 * 128 * 2 both fit) then madd with ones to s32, or one
// VNNI dpbusd where the CPU has it. Both give the exact integer block sums, so they differ from
// the scalar reference only in the f32 order of adding block results (acc lanes, then summed).
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#if defined(__AVX2__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include "cpu/cpu_ops.hpp"
#include "cpu/quant_gemv.hpp"
#include "trellis/core/error.hpp"
#include "trellis/kernels/quant.hpp"

namespace trellis::kernels {

// ---- scalar specification --------------------------------------------------------------

namespace ref {
namespace {

// The 8-bit quantisation shared by Q8_0 and Q8_1: d = amax / 127, and the elements are
// scaled by 127 / amax (not 1 / d: ggml's x86 path multiplies by 127 / amax, and the two can
// differ in the last bit) and rounded to nearest, ties to even. Returns d (as f32).
float quantize_block_8(const float* x, std::int8_t* q) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
  for (int j = 0; j < 32; ++j) q[j] = static_cast<std::int8_t>(std::nearbyint(x[j] * id));
  return d;
}

}  // namespace

void quantize_row_q8_1(const float* x, BlockQ8_1* y, std::int64_t k) {
  for (std::int64_t b = 0; b < k / kQuantBlock; ++b) {
    const float d = quantize_block_8(x + b * kQuantBlock, y[b].qs);
    int sum = 0;
    for (int j = 0; j < 32; ++j) sum += y[b].qs[j];
    y[b].d = f32_to_f16(d);
    y[b].s = f32_to_f16(d * static_cast<float>(sum));
  }
}

void quantize_row_q8_0(const float* x, BlockQ8_0* y, std::int64_t k) {
  for (std::int64_t b = 0; b < k / kQuantBlock; ++b) y[b].d = f32_to_f16(quantize_block_8(x + b * kQuantBlock, y[b].qs));
}

float vec_dot_q4_1_q8_1(const BlockQ4_1* w, const BlockQ8_1* x, std::int64_t n_blocks) {
  float sum = 0.0f;
  for (std::int64_t b = 0; b < n_blocks; ++b) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j)
      sumi += (w[b].qs[j] & 15) * x[b].qs[j] + (w[b].qs[j] >> 4) * x[b].qs[j + 16];
    sum += f16_to_f32(w[b].d) * f16_to_f32(x[b].d) * static_cast<float>(sumi) + f16_to_f32(w[b].m) * f16_to_f32(x[b].s);
  }
  return sum;
}

float vec_dot_q8_0_q8_0(const BlockQ8_0* w, const BlockQ8_0* x, std::int64_t n_blocks) {
  float sum = 0.0f;
  for (std::int64_t b = 0; b < n_blocks; ++b) {
    int sumi = 0;
    for (int j = 0; j < 32; ++j) sumi += w[b].qs[j] * x[b].qs[j];
    sum += f16_to_f32(w[b].d) * f16_to_f32(x[b].d) * static_cast<float>(sumi);
  }
  return sum;
}

}  // namespace ref

void quantize_row_q4_1(const float* x, BlockQ4_1* y, std::int64_t k) {
  for (std::int64_t b = 0; b < k / kQuantBlock; ++b) {
    const float* v = x + b * kQuantBlock;
    const float mn = *std::min_element(v, v + 32), mx = *std::max_element(v, v + 32);
    const float d = (mx - mn) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = f32_to_f16(d);
    y[b].m = f32_to_f16(mn);
    for (int j = 0; j < 16; ++j) {
      const int lo = std::min(15, static_cast<int>((v[j] - mn) * id + 0.5f));
      const int hi = std::min(15, static_cast<int>((v[j + 16] - mn) * id + 0.5f));
      y[b].qs[j] = static_cast<std::uint8_t>(lo | (hi << 4));
    }
  }
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
namespace {
// ref::quantize_block_8 bit for bit: the max of |x| does not depend on order, x * id is the
// same f32 product, and cvtps_epi32 rounds to nearest even as nearbyint does (default MXCSR).
// At batch 1 the scalar loop was ~2% of a SmolLM2 decode step once the dot products got faster.
float quantize_block_8_avx512(const float* x, std::int8_t* q, int* sum) {
  const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
  __m512 m = _mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b));
  m = _mm512_max_ps(m, _mm512_shuffle_f32x4(m, m, 0x4E));
  m = _mm512_max_ps(m, _mm512_shuffle_f32x4(m, m, 0xB1));
  __m128 r = _mm512_castps512_ps128(m);
  r = _mm_max_ps(r, _mm_movehl_ps(r, r));
  r = _mm_max_ss(r, _mm_movehdup_ps(r));
  const float amax = _mm_cvtss_f32(r);
  const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
  const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, _mm512_set1_ps(id)));
  const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, _mm512_set1_ps(id)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(qa));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(qb));
  if (sum != nullptr) *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
  return d;
}
}  // namespace

void quantize_row_q8_1(const float* x, BlockQ8_1* y, std::int64_t k) {
  for (std::int64_t b = 0; b < k / kQuantBlock; ++b) {
    int sum = 0;
    const float d = quantize_block_8_avx512(x + b * kQuantBlock, y[b].qs, &sum);
    y[b].d = f32_to_f16(d);
    y[b].s = f32_to_f16(d * static_cast<float>(sum));
  }
}
void quantize_row_q8_0(const float* x, BlockQ8_0* y, std::int64_t k) {
  for (std::int64_t b = 0; b < k / kQuantBlock; ++b)
    y[b].d = f32_to_f16(quantize_block_8_avx512(x + b * kQuantBlock, y[b].qs, nullptr));
}
#else
// Without AVX-512 the scalar specification itself: O(K) per row against O(N K) for the product.
void quantize_row_q8_1(const float* x, BlockQ8_1* y, std::int64_t k) { ref::quantize_row_q8_1(x, y, k); }
void quantize_row_q8_0(const float* x, BlockQ8_0* y, std::int64_t k) { ref::quantize_row_q8_0(x, y, k); }
#endif

void dequantize_row(DType t, const void* src, float* dst, std::int64_t k) {
  switch (t) {
    case DType::kQ4_1: {
      const auto* b = static_cast<const BlockQ4_1*>(src);
      for (std::int64_t i = 0; i < k / kQuantBlock; ++i, dst += kQuantBlock) {
        const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
        for (int j = 0; j < 16; ++j) {
          dst[j] = static_cast<float>(b[i].qs[j] & 15) * d + m;
          dst[j + 16] = static_cast<float>(b[i].qs[j] >> 4) * d + m;
        }
      }
      return;
    }
    case DType::kQ8_0: {
      const auto* b = static_cast<const BlockQ8_0*>(src);
      for (std::int64_t i = 0; i < k / kQuantBlock; ++i, dst += kQuantBlock) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < 32; ++j) dst[j] = static_cast<float>(b[i].qs[j]) * d;
      }
      return;
    }
    case DType::kF32: std::copy_n(static_cast<const float*>(src), k, dst); return;
    case DType::kBF16:
      for (std::int64_t i = 0; i < k; ++i) dst[i] = bf16_to_f32(static_cast<const std::uint16_t*>(src)[i]);
      return;
    case DType::kF16:
      for (std::int64_t i = 0; i < k; ++i) dst[i] = f16_to_f32(static_cast<const std::uint16_t*>(src)[i]);
      return;
  }
  throw_error(ErrorCode::kUnsupported, "dequantize_row: unknown dtype {}", static_cast<int>(t));
}

// ---- SIMD dot products -----------------------------------------------------------------

namespace {

#if defined(__AVX2__)
// f16 -> f32 inline (F16C): the out-of-line f16_to_f32 cost a fifth of the decode time.
inline float h2f(std::uint16_t h) { return _cvtsh_ss(h); }

// 8 s32 lanes whose sum is sum_j u[j] * s[j] (u unsigned 0..255 bytes, s signed bytes).
inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

inline float hsum8(__m256 v) {
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_movehdup_ps(x));
  return _mm_cvtss_f32(x);
}

// The 32 nibbles of a Q4_1 block as bytes 0..15 in element order (low nibbles, then high).
inline __m256i unpack_q4(const std::uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i lo = _mm_and_si128(raw, _mm_set1_epi8(15));
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(15));
  return _mm256_set_m128i(hi, lo);
}

inline __m256i load32(const std::int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512DQ__)
#define TRELLIS_QUANT_AVX512 1
inline __m512i join256(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }
// Lanes 0-7 = a (the first block's scale), lanes 8-15 = b.
inline __m512 scales2(float a, float b) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(a)), _mm256_set1_ps(b), 1);
}
// The two 8-lane halves added: back to the 256-bit accumulator of the one-block loop.
inline __m256 fold512(__m512 v) {
  return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
}
#endif
#endif

// The activation rows' f16 scales as f32, converted once per matmul call (per activation row)
// instead of once per weight row it meets: on cores with one shuffle port (Intel's), the
// scalar conversions and the broadcasts that made each block's scale vector were the M > 1
// kernels' bound. d2 holds, per pair of blocks, block 2p's d in 8 lanes then block 2p+1's
// (the 512-bit step's lane order); s holds each block's s (Q8_1's d * sum(qs); unused for Q8_0).
struct XScales {
  const float* d2 = nullptr;
  const float* s = nullptr;
};
inline std::int64_t x_scale_floats(std::int64_t n_blocks) { return n_blocks / 2 * 16 + n_blocks; }
// Fills `out` (x_scale_floats(n_blocks) floats) for one row; returns the view of it.
template <typename XB>
XScales x_scales(const XB* x, std::int64_t n_blocks, float* out) {
  float* d2 = out;
  float* sv = out + n_blocks / 2 * 16;
  for (std::int64_t p = 0; p < n_blocks / 2; ++p)
    for (int l = 0; l < 16; ++l) d2[16 * p + l] = f16_to_f32(x[2 * p + l / 8].d);
  for (std::int64_t b = 0; b < n_blocks; ++b) {
    if constexpr (std::is_same_v<XB, BlockQ8_1>)
      sv[b] = f16_to_f32(x[b].s);
    else
      sv[b] = 0.0f;
  }
  return {d2, sv};
}

// One weight row against R activation rows (x[r] each n_blocks blocks, xs[r] their scales),
// out[r] = dots. The weight block is unpacked once for all R rows; per row the arithmetic (and
// its order) is that of the single-row dot.
template <int R>
void dot_rows_q4_1(const BlockQ4_1* w, const BlockQ8_1* const* x, const XScales* xs, std::int64_t n_blocks, float* out) {
#if defined(__AVX2__)
  __m256 acc[R];
  float mins[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    mins[r] = 0.0f;
  }
  std::int64_t b = 0;
#if defined(TRELLIS_QUANT_AVX512)
  // Two blocks per 512-bit step: half the dot/convert/FMA instructions per activation row.
  __m512 acc2[R];
  for (int r = 0; r < R; ++r) acc2[r] = _mm512_setzero_ps();
  for (; b + 2 <= n_blocks; b += 2) {
    const __m512i q = join256(unpack_q4(w[b].qs), unpack_q4(w[b + 1].qs));
    const float mw0 = h2f(w[b].m), mw1 = h2f(w[b + 1].m);
    const __m512 dw = scales2(h2f(w[b].d), h2f(w[b + 1].d));
    for (int r = 0; r < R; ++r) {
      const BlockQ8_1* xb = x[r] + b;
      mins[r] += mw0 * xs[r].s[b];
      mins[r] += mw1 * xs[r].s[b + 1];
      const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, join256(load32(xb[0].qs), load32(xb[1].qs)));
      const __m512 scale = _mm512_mul_ps(dw, _mm512_loadu_ps(xs[r].d2 + 8 * b));
      acc2[r] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(s), acc2[r]);
    }
  }
  for (int r = 0; r < R; ++r) acc[r] = fold512(acc2[r]);
#endif
  for (; b < n_blocks; ++b) {
    const __m256i q = unpack_q4(w[b].qs);
    const float dw = h2f(w[b].d), mw = h2f(w[b].m);
    for (int r = 0; r < R; ++r) {
      const BlockQ8_1& xb = x[r][b];
      mins[r] += mw * xs[r].s[b];
      const __m256i s = dot_u8s8(q, load32(xb.qs));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * h2f(xb.d)), _mm256_cvtepi32_ps(s), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum8(acc[r]) + mins[r];
#else
  (void)xs;
  for (int r = 0; r < R; ++r) out[r] = ref::vec_dot_q4_1_q8_1(w, x[r], n_blocks);
#endif
}

template <int R>
void dot_rows_q8_0(const BlockQ8_0* w, const BlockQ8_0* const* x, const XScales* xs, std::int64_t n_blocks, float* out) {
#if defined(__AVX2__)
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  std::int64_t b = 0;
#if defined(TRELLIS_QUANT_AVX512) && defined(__AVX512BW__)
  __m512 acc2[R];
  for (int r = 0; r < R; ++r) acc2[r] = _mm512_setzero_ps();
  for (; b + 2 <= n_blocks; b += 2) {
    // AVX-512 has no sign_epi8: |w| times x negated where w < 0 (where w = 0 |w| is 0 anyway).
    const __m512i wq = join256(load32(w[b].qs), load32(w[b + 1].qs)), aw = _mm512_abs_epi8(wq);
    const __mmask64 neg = _mm512_movepi8_mask(wq);
    const __m512 dw = scales2(h2f(w[b].d), h2f(w[b + 1].d));
    for (int r = 0; r < R; ++r) {
      const BlockQ8_0* xb = x[r] + b;
      const __m512i xv = join256(load32(xb[0].qs), load32(xb[1].qs));
      const __m512i sx = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
      const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), aw, sx);
      const __m512 scale = _mm512_mul_ps(dw, _mm512_loadu_ps(xs[r].d2 + 8 * b));
      acc2[r] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(s), acc2[r]);
    }
  }
  for (int r = 0; r < R; ++r) acc[r] = fold512(acc2[r]);
#else
  (void)xs;
#endif
  for (; b < n_blocks; ++b) {
    const __m256i wq = load32(w[b].qs), aw = _mm256_sign_epi8(wq, wq);
    const float dw = h2f(w[b].d);
    for (int r = 0; r < R; ++r) {
      // |w| x (x with w's sign): an unsigned-by-signed product with the same value per byte.
      const __m256i s = dot_u8s8(aw, _mm256_sign_epi8(load32(x[r][b].qs), wq));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * h2f(x[r][b].d)), _mm256_cvtepi32_ps(s), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum8(acc[r]);
#else
  (void)xs;
  for (int r = 0; r < R; ++r) out[r] = ref::vec_dot_q8_0_q8_0(w, x[r], n_blocks);
#endif
}

}  // namespace

float vec_dot_q4_1_q8_1(const BlockQ4_1* w, const BlockQ8_1* x, std::int64_t n_blocks) {
  std::vector<float> scales(static_cast<std::size_t>(x_scale_floats(n_blocks)));
  const XScales xs = x_scales(x, n_blocks, scales.data());
  float out;
  dot_rows_q4_1<1>(w, &x, &xs, n_blocks, &out);
  return out;
}

float vec_dot_q8_0_q8_0(const BlockQ8_0* w, const BlockQ8_0* x, std::int64_t n_blocks) {
  std::vector<float> scales(static_cast<std::size_t>(x_scale_floats(n_blocks)));
  const XScales xs = x_scales(x, n_blocks, scales.data());
  float out;
  dot_rows_q8_0<1>(w, &x, &xs, n_blocks, &out);
  return out;
}

const char* quant_dot_path() {
#if defined(TRELLIS_QUANT_AVX512)
  return "avx512-vnni (two blocks per step; at M = 1 four weight rows per pass), avx-vnni for a last odd block";
#elif defined(__AVX2__) && ((defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__))
  return "avx-vnni";
#elif defined(__AVX2__)
  return "avx2";
#else
  return "scalar";
#endif
}

// ---- matmul ----------------------------------------------------------------------------

namespace cpu {
namespace {

template <typename WB, typename XB, int R>
void dot_rows(const WB* w, const XB* const* x, const XScales* xs, std::int64_t nb, float* out) {
  if constexpr (std::is_same_v<WB, BlockQ4_1>)
    dot_rows_q4_1<R>(w, x, xs, nb, out);
  else
    dot_rows_q8_0<R>(w, x, xs, nb, out);
}

// C columns [n_begin, n_end) (all M rows) from quantised A rows (xq) and the weights.
template <typename WB, typename XB>
void quant_tile(const GemmArgs& g, const XB* xq, const XScales* xsc, std::int64_t n_begin, std::int64_t n_end) {
  // Activation rows per pass over a weight row: each weight block is unpacked and its scales
  // converted once per pass, so more rows share that work (8 rather than 4: 1.3-1.7x at
  // M = 16 on an Intel Xeon, docs/benchmarks.md "Batch 16 with weights kept Q4_1").
  constexpr int kRows = 8;
  const std::int64_t nb = g.k / kQuantBlock, wstride = g.ldb / kQuantBlock;
  const auto* w = static_cast<const WB*>(g.b);
  // Weight rows outer: one row (K / 32 blocks, under 2 KiB for K <= 3072) stays in L1 while
  // every activation row meets it, so each weight byte comes from memory once per call.
  for (std::int64_t n = n_begin; n < n_end; ++n) {
    const WB* wr = w + n * wstride;
    for (std::int64_t i = 0; i < g.m; i += kRows) {
      const int rows = static_cast<int>(std::min<std::int64_t>(kRows, g.m - i));
      const XB* x[kRows];
      float v[kRows];
      for (int r = 0; r < rows; ++r) x[r] = xq + (i + r) * nb;
      const XScales* xs = xsc + i;
      switch (rows) {
        case 8: dot_rows<WB, XB, 8>(wr, x, xs, nb, v); break;
        case 7: dot_rows<WB, XB, 7>(wr, x, xs, nb, v); break;
        case 6: dot_rows<WB, XB, 6>(wr, x, xs, nb, v); break;
        case 5: dot_rows<WB, XB, 5>(wr, x, xs, nb, v); break;
        case 4: dot_rows<WB, XB, 4>(wr, x, xs, nb, v); break;
        case 3: dot_rows<WB, XB, 3>(wr, x, xs, nb, v); break;
        case 2: dot_rows<WB, XB, 2>(wr, x, xs, nb, v); break;
        default: dot_rows<WB, XB, 1>(wr, x, xs, nb, v); break;
      }
      for (int r = 0; r < rows; ++r) {
        float& c = g.c[(i + r) * g.ldc + n];
        c = g.beta == 0.0f ? v[r] : v[r] + g.beta * c;
      }
    }
  }
}

template <typename WB, typename XB, void (*Quantize)(const float*, XB*, std::int64_t)>
void quant_matmul_as(ThreadPool& pool, const GemmArgs& g) {
  if (g.m == 1 && quant_gemv(pool, g)) return;
  const std::int64_t nb = g.k / kQuantBlock;
  thread_local std::vector<XB> xq;
  xq.resize(static_cast<std::size_t>(g.m * nb));
  XB* xp = xq.data();
  thread_local std::vector<float> scales;
  thread_local std::vector<XScales> xs;
  const std::int64_t per_row = x_scale_floats(nb);
  scales.resize(static_cast<std::size_t>(g.m * per_row));
  xs.resize(static_cast<std::size_t>(g.m));
  float* sp = scales.data();
  XScales* xsp = xs.data();
  pool.parallel_for(g.m, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) {
      Quantize(g.a + i * g.lda, xp + i * nb, g.k);
      xsp[i] = x_scales(xp + i * nb, nb, sp + i * per_row);
    }
  }, std::max<std::int64_t>(1, 8192 / g.k));
  // Chunks of weight rows sized so that each is ~32 KiB of work per activation row.
  const std::int64_t grain = std::max<std::int64_t>(1, 32768 / std::max<std::int64_t>(1, g.k * g.m / 4));
  pool.parallel_for(g.n, [&](std::int64_t lo, std::int64_t hi) { quant_tile<WB, XB>(g, xp, xsp, lo, hi); }, grain);
}

}  // namespace

void quant_matmul(ThreadPool& pool, const GemmArgs& g) {
  switch (g.b_type) {
    case DType::kQ4_1:
      return quant_matmul_as<BlockQ4_1, BlockQ8_1, &quantize_row_q8_1>(pool, g);
    case DType::kQ8_0:
      return quant_matmul_as<BlockQ8_0, BlockQ8_0, &quantize_row_q8_0>(pool, g);
    default: break;
  }
  throw_error(ErrorCode::kUnsupported, "matmul: weights of dtype {} are not block-quantised", to_string(g.b_type));
}

}  // namespace cpu
}  // namespace trellis::kernels
