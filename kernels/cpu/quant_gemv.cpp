// The quantised matmul at M = 1 (quant_gemv.hpp): decode at batch 1 of a GGUF model whose
// weights stay Q4_1 / Q8_0. Same integer block sums as quant.cpp's dot_rows (llama.cpp's
// arithmetic); only the f32 order of adding block results differs.
#include "cpu/quant_gemv.hpp"

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define TRELLIS_QUANT_GEMV 1
#include "cpu/simd.hpp"  // immintrin.h (with GCC 12's warnings silenced), hsum
#endif

#include "trellis/kernels/quant.hpp"

namespace trellis::kernels::cpu {

#if defined(TRELLIS_QUANT_GEMV)
namespace {

inline __m256i load32(const std::int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// At batch 1 the rows are short (SmolLM2: 18 or 48 blocks), so the per-block scalar work of
// dot_rows (f16 -> f32 of four scales, two scalar products, a broadcast) and the per-row
// horizontal sum cost more than the integer dot itself. Here the activation row is split
// once per call into contiguous int8 values and f32 block scales (ActRow), and NW weight
// rows share every activation load. Per group of 16 blocks and weight row, the f16 headers
// of all 16 blocks are loaded and converted at once; the d_w d_x products are one vector
// multiply, and the m_w s_x terms one vector FMA. Integer sums are exact as before; only
// the f32 order of adding block results differs from the single-row dot.
struct ActRow {
  const std::int8_t* q;  // n_blocks * 32 quantised values, block after block
  const float* d;        // per block: d_x
  const float* s;        // per block: s_x = d_x * sum(q) (Q8_1 only)
};

// The headers of g <= 16 consecutive blocks, one per lane, from the blocks' own bytes: a few
// 64-byte loads (masked to the g blocks, so nothing past them is read) and permutes. A
// hardware gather (vpgatherdd) made the whole decode 1.6x slower on Zen 5.
// Q4_1: lane i = block i's (d | m << 16); 16 blocks are 80 dwords, block i at dword 5i.
inline __m512i headers_q4_1(const BlockQ4_1* w, int g) {
  const auto* p = reinterpret_cast<const std::int32_t*>(w);
  const int live = 5 * g;  // dwords of the g blocks
  const __m512i five = _mm512_set_epi32(75, 70, 65, 60, 55, 50, 45, 40, 35, 30, 25, 20, 15, 10, 5, 0);
  // A short tail group (SmolLM2's rows of 18 blocks end in 2): one load, one permute.
  if (g <= 3) return _mm512_maskz_permutexvar_epi32(static_cast<__mmask16>((1u << g) - 1u), five,
                                                    _mm512_maskz_loadu_epi32(static_cast<__mmask16>((1u << live) - 1u), p));
  __m512i z[5];
  for (int k = 0; k < 5; ++k) {
    const int n = std::clamp(live - 16 * k, 0, 16);
    z[k] = _mm512_maskz_loadu_epi32(static_cast<__mmask16>((1u << n) - 1u), p + 16 * k);
  }
  const __m512i a = _mm512_permutex2var_epi32(z[0], five, z[1]);                                    // blocks 0-6
  const __m512i b = _mm512_permutex2var_epi32(z[2], _mm512_sub_epi32(five, _mm512_set1_epi32(32)), z[3]);  // 7-12 at lanes 7-12
  const __m512i ab = _mm512_mask_blend_epi32(0x1F80, a, b);
  return _mm512_mask_permutexvar_epi32(ab, 0xE000, _mm512_sub_epi32(five, _mm512_set1_epi32(64)), z[4]);  // 13-15
}
// Q8_0: the 16 f16 scales; 16 blocks are 272 words, block i's d at word 17i. Each pair of
// registers (64 words) holds 4 blocks: with the first block i = 4j, at words 17 * 4j - 64j +
// {0, 17, 34, 51} = 4j + {0, 17, 34, 51} of the pair.
inline __m512i q8_0_quad(const std::int16_t* p, int live, int j) {
  __m512i z[2];
  for (int k = 0; k < 2; ++k) {
    const int n = std::clamp(live - 64 * j - 32 * k, 0, 32);
    z[k] = _mm512_maskz_loadu_epi16(static_cast<__mmask32>(n == 32 ? ~0u : (1u << n) - 1u), p + 64 * j + 32 * k);
  }
  const __m512i idx = _mm512_add_epi16(_mm512_set1_epi16(static_cast<short>(4 * j)),
                                       _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  //
                                                        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 51, 34, 17, 0));
  return _mm512_permutex2var_epi16(z[0], idx, z[1]);  // blocks 4j..4j+3 at words 0-3
}
inline __m256i headers_q8_0(const BlockQ8_0* w, int g) {
  const auto* p = reinterpret_cast<const std::int16_t*>(w);
  const int live = 17 * g;
  // A short tail group (SmolLM2's rows of 18 blocks end in 2): the first quad alone.
  if (g <= 3) return _mm256_maskz_mov_epi16(static_cast<__mmask16>((1u << g) - 1u), _mm512_castsi512_si256(q8_0_quad(p, live, 0)));
  // Words 0-3 of each quad to words 4j..4j+3: the 64-bit lane 0 of each, as 64-bit lanes 0-3.
  const __m512i lo = _mm512_unpacklo_epi64(q8_0_quad(p, live, 0), q8_0_quad(p, live, 1));
  const __m512i hi = _mm512_unpacklo_epi64(q8_0_quad(p, live, 2), q8_0_quad(p, live, 3));
  return _mm512_castsi512_si256(_mm512_permutex2var_epi64(lo, _mm512_set_epi64(0, 0, 0, 0, 9, 8, 1, 0), hi));
}
// The first f16 of each block's (d, m) dword as f32, and the second.
inline __m512 header_lo(__m512i h) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h)); }
inline __m512 header_hi(__m512i h) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16))); }
// Scale lanes for a block pair p (dpbusd's 16 s32 lanes: 0-7 block 2p, 8-15 block 2p+1).
inline __m512i pair_lanes() { return _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0); }

// Two Q4_1 blocks' nibbles as bytes in element order ([lo0 hi0 lo1 hi1]); kTwo = false: the
// second block is past the row's end and reads as zeros.
template <bool kTwo>
inline __m512i unpack_q4_pair(const BlockQ4_1* wb) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb[0].qs));
  const __m128i c = kTwo ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb[1].qs)) : _mm_setzero_si128();
  const __m256i t = _mm256_set_m128i(c, a);
  const __m512i q = _mm512_permutex2var_epi64(_mm512_zextsi256_si512(t), _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0),
                                              _mm512_zextsi256_si512(_mm256_srli_epi16(t, 4)));
  return _mm512_and_si512(q, _mm512_set1_epi8(15));
}

template <int NW, bool kTwo>
inline void q4_1_pair_step(const BlockQ4_1* w, std::int64_t wstride, const std::int8_t* xq, __m512i idx,
                           const __m512* sc, __m512* acc) {
  const __m512i xv = kTwo ? _mm512_loadu_si512(xq) : _mm512_maskz_loadu_epi8(0xFFFFFFFFull, xq);
  for (int r = 0; r < NW; ++r) {
    const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), unpack_q4_pair<kTwo>(w + r * wstride), xv);
    acc[r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx, sc[r]), _mm512_cvtepi32_ps(s), acc[r]);
  }
}

// out[r] = dot(weight row r (at w + r * wstride), x), r < NW.
template <int NW>
void gemv_rows_q4_1(const BlockQ4_1* w, std::int64_t wstride, const ActRow& x, std::int64_t nb, float* out) {
  __m512 acc[NW], mins[NW], sc[NW];
  for (int r = 0; r < NW; ++r) acc[r] = mins[r] = _mm512_setzero_ps();
  for (std::int64_t b0 = 0; b0 < nb; b0 += 16) {
    const int g = static_cast<int>(std::min<std::int64_t>(16, nb - b0));
    const auto live = static_cast<__mmask16>((1u << g) - 1u);
    const __m512 xd = _mm512_maskz_loadu_ps(live, x.d + b0), xs = _mm512_maskz_loadu_ps(live, x.s + b0);
    for (int r = 0; r < NW; ++r) {
      const __m512i h = headers_q4_1(w + r * wstride + b0, g);
      sc[r] = _mm512_mul_ps(header_lo(h), xd);
      mins[r] = _mm512_fmadd_ps(header_hi(h), xs, mins[r]);
    }
    __m512i idx = pair_lanes();
    int p = 0;
    for (; p + 2 <= g; p += 2, idx = _mm512_add_epi32(idx, _mm512_set1_epi32(2)))
      q4_1_pair_step<NW, true>(w + b0 + p, wstride, x.q + (b0 + p) * 32, idx, sc, acc);
    if (p < g) q4_1_pair_step<NW, false>(w + b0 + p, wstride, x.q + (b0 + p) * 32, idx, sc, acc);
  }
  for (int r = 0; r < NW; ++r) out[r] = hsum(_mm512_add_ps(acc[r], mins[r]));
}

// Q8_0 x Q8_0: x + 128 is unsigned, so dpbusd(x + 128, w) - dpbusd(128, w) = sum(x w) exactly,
// with x + 128 formed once per pair for all NW rows.
template <int NW, bool kTwo>
inline void q8_0_pair_step(const BlockQ8_0* w, std::int64_t wstride, const std::int8_t* xq, __m512i idx,
                           const __m512* sc, __m512* acc) {
  const __m512i k80 = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i xv = kTwo ? _mm512_loadu_si512(xq) : _mm512_maskz_loadu_epi8(0xFFFFFFFFull, xq);
  const __m512i xu = _mm512_xor_si512(xv, k80);
  for (int r = 0; r < NW; ++r) {
    const BlockQ8_0* wb = w + r * wstride;
    __m512i wv = _mm512_zextsi256_si512(load32(wb[0].qs));
    if constexpr (kTwo) wv = _mm512_inserti64x4(wv, load32(wb[1].qs), 1);
    const __m512i s = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), xu, wv),
                                       _mm512_dpbusd_epi32(_mm512_setzero_si512(), k80, wv));
    acc[r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(idx, sc[r]), _mm512_cvtepi32_ps(s), acc[r]);
  }
}

template <int NW>
void gemv_rows_q8_0(const BlockQ8_0* w, std::int64_t wstride, const ActRow& x, std::int64_t nb, float* out) {
  __m512 acc[NW], sc[NW];
  for (int r = 0; r < NW; ++r) acc[r] = _mm512_setzero_ps();
  for (std::int64_t b0 = 0; b0 < nb; b0 += 16) {
    const int g = static_cast<int>(std::min<std::int64_t>(16, nb - b0));
    const auto live = static_cast<__mmask16>((1u << g) - 1u);
    const __m512 xd = _mm512_maskz_loadu_ps(live, x.d + b0);
    for (int r = 0; r < NW; ++r)
      sc[r] = _mm512_mul_ps(_mm512_cvtph_ps(headers_q8_0(w + r * wstride + b0, g)), xd);
    __m512i idx = pair_lanes();
    int p = 0;
    for (; p + 2 <= g; p += 2, idx = _mm512_add_epi32(idx, _mm512_set1_epi32(2)))
      q8_0_pair_step<NW, true>(w + b0 + p, wstride, x.q + (b0 + p) * 32, idx, sc, acc);
    if (p < g) q8_0_pair_step<NW, false>(w + b0 + p, wstride, x.q + (b0 + p) * 32, idx, sc, acc);
  }
  for (int r = 0; r < NW; ++r) out[r] = hsum(acc[r]);
}

template <typename WB, int NW>
void gemv_rows(const WB* w, std::int64_t wstride, const ActRow& x, std::int64_t nb, float* out) {
  if constexpr (std::is_same_v<WB, BlockQ4_1>)
    gemv_rows_q4_1<NW>(w, wstride, x, nb, out);
  else
    gemv_rows_q8_0<NW>(w, wstride, x, nb, out);
}

constexpr std::int64_t kGemvRows = 4;  // weight rows per pass over the activation row
#ifndef TRELLIS_QUANT_PREFETCH
#define TRELLIS_QUANT_PREFETCH 8192
#endif
constexpr std::int64_t kPrefetchBytes = TRELLIS_QUANT_PREFETCH;  // how far ahead to prefetch

// C columns of the weight-row quads [q_begin, q_end), M = 1.
template <typename WB>
void gemv_tile(const GemmArgs& g, const ActRow& x, std::int64_t q_begin, std::int64_t q_end) {
  const std::int64_t nb = g.k / kQuantBlock, wstride = g.ldb / kQuantBlock;
  const auto* w = static_cast<const WB*>(g.b);
  float v[kGemvRows];
  for (std::int64_t n = q_begin * kGemvRows; n < std::min(g.n, q_end * kGemvRows); n += kGemvRows) {
    const int rows = static_cast<int>(std::min(kGemvRows, g.n - n));
    const WB* wr = w + n * wstride;
    {
      // The hardware prefetcher alone left the decode at ~45% of the read limit: it does not
      // run far enough ahead of 4 interleaved row streams. Rows are contiguous, so fetch the
      // bytes of this quad shifted by a fixed distance (past the matrix: nothing).
      const char* row = reinterpret_cast<const char*>(wr);
      const char* end = reinterpret_cast<const char*>(w + g.n * wstride);
      const std::int64_t bytes = std::min<std::int64_t>(rows * wstride * sizeof(WB), end - (row + kPrefetchBytes));
      for (std::int64_t o = 0; o < bytes; o += 64) _mm_prefetch(row + kPrefetchBytes + o, _MM_HINT_T0);
    }
    switch (rows) {
      case 4: gemv_rows<WB, 4>(wr, wstride, x, nb, v); break;
      case 3: gemv_rows<WB, 3>(wr, wstride, x, nb, v); break;
      case 2: gemv_rows<WB, 2>(wr, wstride, x, nb, v); break;
      default: gemv_rows<WB, 1>(wr, wstride, x, nb, v); break;
    }
    for (int r = 0; r < rows; ++r) g.c[n + r] = g.beta == 0.0f ? v[r] : v[r] + g.beta * g.c[n + r];
  }
}

// M = 1: the activation row quantised as for dot_rows, then split into ActRow's arrays.
template <typename WB, typename XB, void (*Quantize)(const float*, XB*, std::int64_t)>
void quant_gemv_as(ThreadPool& pool, const GemmArgs& g) {
  const std::int64_t nb = g.k / kQuantBlock;
  thread_local std::vector<XB> blocks;
  thread_local std::vector<std::int8_t> q;
  thread_local std::vector<float> ds;
  blocks.resize(static_cast<std::size_t>(nb));
  q.resize(static_cast<std::size_t>(nb * kQuantBlock));
  ds.resize(static_cast<std::size_t>(2 * nb));
  Quantize(g.a, blocks.data(), g.k);
  for (std::int64_t b = 0; b < nb; ++b) {
    const XB& xb = blocks[static_cast<std::size_t>(b)];
    std::copy_n(xb.qs, kQuantBlock, q.data() + b * kQuantBlock);
    ds[static_cast<std::size_t>(b)] = f16_to_f32(xb.d);
    if constexpr (std::is_same_v<XB, BlockQ8_1>) ds[static_cast<std::size_t>(nb + b)] = f16_to_f32(xb.s);
  }
  const ActRow x{q.data(), ds.data(), ds.data() + nb};
  // Chunks of ~32 KiB of weights; work is split in whole quads of rows.
  const std::int64_t quads = (g.n + kGemvRows - 1) / kGemvRows;
  const std::int64_t grain = std::max<std::int64_t>(1, 32768 / (kGemvRows * nb * static_cast<std::int64_t>(sizeof(WB))));
  pool.parallel_for(quads, [&](std::int64_t lo, std::int64_t hi) { gemv_tile<WB>(g, x, lo, hi); }, grain);
}

}  // namespace

bool quant_gemv(ThreadPool& pool, const GemmArgs& g) {
  switch (g.b_type) {
    case DType::kQ4_1: quant_gemv_as<BlockQ4_1, BlockQ8_1, &quantize_row_q8_1>(pool, g); return true;
    case DType::kQ8_0: quant_gemv_as<BlockQ8_0, BlockQ8_0, &quantize_row_q8_0>(pool, g); return true;
    default: return false;
  }
}
#else
bool quant_gemv(ThreadPool&, const GemmArgs&) { return false; }
#endif

}  // namespace trellis::kernels::cpu
