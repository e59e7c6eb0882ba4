// The quantised matmul at M = 1 (quant_gemv.hpp): decode at batch 1 of a GGUF model whose
// weights stay Q4_1 / Q8_0. Same integer products as quant.cpp's dot_rows (llama.cpp's
// arithmetic), summed exactly in s32 lanes of 8 (Q4_1) or 4 (Q8_0) elements of one block;
// each lane is scaled by its block's d_w d_x in f32 and the lanes added in f32 in an order
// of their own, which is the only difference from the single-row dot.
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
// once per call into int8 values (for Q4_1 laid out like the weights) and f32 block scales
// (ActRow), and NW weight rows share every activation load. Per group of 16 blocks and weight
// row, the f16 headers of all 16 blocks are loaded and converted at once; the d_w d_x
// products are one vector multiply, and the m_w s_x terms one vector FMA. Integer sums are
// exact as before; only the f32 order of adding block results differs from the single-row
// dot.
struct ActRow {
  const std::int8_t* q;  // n_blocks * 32 quantised values, block after block (Q8_0 weights)
  const float* d;        // per block: d_x
  const float* s;        // per block: s_x = d_x * sum(q) (Q8_1 only)
  // Q4_1 weights: the values laid out like the weight row's bytes (q4_1_layout), so that a
  // 64-byte load of weights meets its activations at the same offset.
  const std::int8_t* lo;  // at byte 20b + 4 + j of block b: q[32b + j]; 0 at the headers
  const std::int8_t* hi;  // there q[32b + 16 + j], the element in qs[j]'s high nibble
};

// The headers of g <= 16 consecutive blocks, one per lane, from the blocks' own bytes: a few
// 64-byte loads (masked to the g blocks, so nothing past them is read) and permutes. A
// hardware gather (vpgatherdd) made the whole decode 1.6x slower on Zen 5.
// Q4_1: lane i = block i's (d | m << 16), from z = the g blocks' 5g dwords (block i at dword
// 5i) as q4_1_dwords loads them.
inline __m512i headers_q4_1(const __m512i* z, int g) {
  const __m512i five = _mm512_set_epi32(75, 70, 65, 60, 55, 50, 45, 40, 35, 30, 25, 20, 15, 10, 5, 0);
  // A short tail group (SmolLM2's rows of 18 blocks end in 2): one permute.
  if (g <= 3) return _mm512_maskz_permutexvar_epi32(static_cast<__mmask16>((1u << g) - 1u), five, z[0]);
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
// out[r] = the sum of v[r]'s 16 lanes, r < 4: 14 instructions where four hsum take 32, which
// at 18 blocks a row is ~5% of a row's work.
inline void hsum4(const __m512* v, float* out) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], 0x44), _mm512_shuffle_f32x4(v[0], v[1], 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(v[2], v[3], 0x44), _mm512_shuffle_f32x4(v[2], v[3], 0xEE));
  __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));  // 128-bit lane r: v[r]
  t = _mm512_add_ps(t, _mm512_permute_ps(t, 0x4E));
  t = _mm512_add_ps(t, _mm512_permute_ps(t, 0xB1));
  const __m512i firsts = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0);
  _mm_storeu_ps(out, _mm512_castps512_ps128(_mm512_permutexvar_ps(firsts, t)));
}

// Scale lanes for a block pair p (dpbusd's 16 s32 lanes: 0-7 block 2p, 8-15 block 2p+1).
inline __m512i pair_lanes() { return _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0); }

// Q4_1 without unpacking. A row's bytes are taken as they lie, 64 at a time (16 blocks = 320
// bytes = 5 registers, so every group of 16 has the same layout), and dpbusd takes the low
// nibbles of a register against ActRow::lo and the high nibbles against ActRow::hi at the same
// offset. Blocks are 20 bytes, a multiple of 4, so each s32 lane of the result sums 8 elements
// of one block; the header dwords meet zeros. Per 64 bytes and weight row: a line load and a
// permute (q4_1_dwords); and, shift, and, two dpbusd; one permute, cvt and FMA to scale the
// lanes: ~10 instructions per 3.2 blocks, where unpacking pairs of blocks into element order
// took ~10 per 2 blocks. kDwordBlock[16k + i]: the block of the group that dword 16k + i is in.
alignas(64) constexpr std::int32_t kDwordBlock[80] = {
    0,  0,  0,  0,  0,  1,  1,  1,  1,  1,  2,  2,  2,  2,  2,  3,  3,  3,  3,  3,  4,  4,  4,  4,  4,  5,  5,
    5,  5,  5,  6,  6,  6,  6,  6,  7,  7,  7,  7,  7,  8,  8,  8,  8,  8,  9,  9,  9,  9,  9,  10, 10, 10, 10,
    10, 11, 11, 11, 11, 11, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15};

// z[0..kLoads) = the 5g dwords of g <= 16 blocks at p (p 4-byte aligned), zeros after. The
// loads are of whole cache lines, realigned by one permute each: with rows of 18 blocks (360
// bytes) most 64-byte loads at p would straddle two lines, and while the weights stream from
// DRAM such loads made the kernel ~30% slower (weights aligned to 64 bytes: 29.5 GB/s; shifted
// by one block: 19.6), more than the permutes cost. The first and last lines are masked to the
// blocks' bytes, so nothing outside them is read.
template <int kLoads>
inline void q4_1_dwords(const BlockQ4_1* p, int g, __m512i* z) {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  const auto* a = reinterpret_cast<const std::int32_t*>(addr & ~std::uintptr_t{63});
  const int m = static_cast<int>(addr & 63) / 4, end = m + 5 * g;  // live dwords [m, end) from a
  __m512i line[kLoads + 1];
#pragma GCC unroll 6
  for (int l = 0; l <= kLoads; ++l) {
    const unsigned n = static_cast<unsigned>(std::clamp(end - 16 * l, 0, 16));
    const auto mask = static_cast<__mmask16>(((1u << n) - 1u) & (l == 0 ? ~((1u << m) - 1u) : ~0u));
    line[l] = l == 0 || l + 1 >= kLoads ? _mm512_maskz_loadu_epi32(mask, a + 16 * l) : _mm512_load_si512(a + 16 * l);
  }
  const __m512i idx =
      _mm512_add_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(m));
#pragma GCC unroll 5
  for (int k = 0; k < 5; ++k) z[k] = k < kLoads ? _mm512_permutex2var_epi32(line[k], idx, line[k + 1]) : _mm512_setzero_si512();
}

// For NW weight rows (at w + r * wstride), the group of g <= 16 blocks from block b0, whose 5g
// dwords take kLoads registers: acc[r] and mins[r] += the scaled integer parts and the m_w s_x
// terms. The load count is a template argument so that a tail group (2 blocks in SmolLM2's
// rows of 18) costs what its one load does; with a run-time count it cost as much as a full
// group.
template <int NW, int kLoads>
inline void q4_1_group(const BlockQ4_1* w, std::int64_t wstride, const ActRow& x, std::int64_t b0, int g, __m512* acc,
                       __m512* mins) {
  const auto live = static_cast<__mmask16>(g == 16 ? 0xFFFFu : (1u << g) - 1u);
  const __m512 xd = _mm512_maskz_loadu_ps(live, x.d + b0), xs = _mm512_maskz_loadu_ps(live, x.s + b0);
  const std::int8_t *xlo = x.lo + 20 * b0, *xhi = x.hi + 20 * b0;
  const __m512i nib = _mm512_set1_epi8(15);
#pragma GCC unroll 4
  for (int r = 0; r < NW; ++r) {
    __m512i z[5];
    q4_1_dwords<kLoads>(w + r * wstride + b0, g, z);
    const __m512i h = headers_q4_1(z, g);
    const __m512 sc = _mm512_mul_ps(header_lo(h), xd);
    mins[r] = _mm512_fmadd_ps(header_hi(h), xs, mins[r]);
#pragma GCC unroll 5
    for (int k = 0; k < kLoads; ++k) {
      const __m512i lo = _mm512_and_si512(z[k], nib), hi = _mm512_and_si512(_mm512_srli_epi16(z[k], 4), nib);
      __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xlo + 64 * k));
      s = _mm512_dpbusd_epi32(s, hi, _mm512_loadu_si512(xhi + 64 * k));
      const __m512 scale = _mm512_permutexvar_ps(_mm512_load_si512(kDwordBlock + 16 * k), sc);
      __m512& a = k % 2 ? mins[r] : acc[r];  // two FMA chains: both are summed at the end
      a = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(s), a);
    }
  }
}

// out[r] = dot(weight row r (at w + r * wstride), x), r < NW; rows of nb blocks, the last group
// taking kTail loads (0: nb is a multiple of 16). The tail is fixed per call and a template
// argument: chosen inside the loop, it made GCC keep acc and mins on the stack, and the
// reloads at the end of each quad held up the next one.
template <int NW, int kTail>
void gemv_rows_q4_1(const BlockQ4_1* w, std::int64_t wstride, const ActRow& x, std::int64_t nb, float* out) {
  __m512 acc[NW], mins[NW];
  for (int r = 0; r < NW; ++r) acc[r] = mins[r] = _mm512_setzero_ps();
  std::int64_t b0 = 0;
  for (; b0 + 16 <= nb; b0 += 16) q4_1_group<NW, 5>(w, wstride, x, b0, 16, acc, mins);
  if constexpr (kTail > 0) q4_1_group<NW, kTail>(w, wstride, x, b0, static_cast<int>(nb - b0), acc, mins);
  for (int r = 0; r < NW; ++r) acc[r] = _mm512_add_ps(acc[r], mins[r]);
  if constexpr (NW == 4)
    hsum4(acc, out);
  else
    for (int r = 0; r < NW; ++r) out[r] = hsum(acc[r]);
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
  if constexpr (NW == 4)
    hsum4(acc, out);
  else
    for (int r = 0; r < NW; ++r) out[r] = hsum(acc[r]);
}

template <typename WB, int NW, int kTail>
void gemv_rows(const WB* w, std::int64_t wstride, const ActRow& x, std::int64_t nb, float* out) {
  if constexpr (std::is_same_v<WB, BlockQ4_1>)
    gemv_rows_q4_1<NW, kTail>(w, wstride, x, nb, out);
  else
    gemv_rows_q8_0<NW>(w, wstride, x, nb, out);
}

constexpr std::int64_t kGemvRows = 4;  // weight rows per pass over the activation row
#ifndef TRELLIS_QUANT_PREFETCH
#define TRELLIS_QUANT_PREFETCH 8192
#endif
constexpr std::int64_t kPrefetchBytes = TRELLIS_QUANT_PREFETCH;  // how far ahead to prefetch

// C columns of the weight-row quads [q_begin, q_end), M = 1. kTail: gemv_rows_q4_1's.
template <typename WB, int kTail>
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
      case 4: gemv_rows<WB, 4, kTail>(wr, wstride, x, nb, v); break;
      case 3: gemv_rows<WB, 3, kTail>(wr, wstride, x, nb, v); break;
      case 2: gemv_rows<WB, 2, kTail>(wr, wstride, x, nb, v); break;
      default: gemv_rows<WB, 1, kTail>(wr, wstride, x, nb, v); break;
    }
    for (int r = 0; r < rows; ++r) g.c[n + r] = g.beta == 0.0f ? v[r] : v[r] + g.beta * g.c[n + r];
  }
}

using TileFn = void (*)(const GemmArgs&, const ActRow&, std::int64_t, std::int64_t);

// Q4_1 rows of nb blocks: the tile function whose last group of nb % 16 blocks takes its loads.
TileFn q4_1_tile(std::int64_t nb) {
  switch ((5 * (nb % 16) + 15) / 16) {
    case 1: return &gemv_tile<BlockQ4_1, 1>;
    case 2: return &gemv_tile<BlockQ4_1, 2>;
    case 3: return &gemv_tile<BlockQ4_1, 3>;
    case 4: return &gemv_tile<BlockQ4_1, 4>;
    case 5: return &gemv_tile<BlockQ4_1, 5>;
    default: return &gemv_tile<BlockQ4_1, 0>;
  }
}

// ActRow::lo and hi from the n_blocks * 32 values q, into buf: each a whole number of groups of
// 16 blocks (320 bytes), zero where no element lies, so that full 64-byte loads stay inside.
const std::int8_t* q4_1_layout(const std::int8_t* q, std::int64_t nb, std::vector<std::int8_t>& buf) {
  const auto half = static_cast<std::size_t>((nb + 15) / 16 * 320);
  buf.assign(2 * half, 0);
  for (std::int64_t b = 0; b < nb; ++b) {
    std::copy_n(q + 32 * b, 16, buf.data() + 20 * b + 4);
    std::copy_n(q + 32 * b + 16, 16, buf.data() + half + 20 * b + 4);
  }
  return buf.data();
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
  ActRow x{q.data(), ds.data(), ds.data() + nb, nullptr, nullptr};
  if constexpr (std::is_same_v<WB, BlockQ4_1>) {
    thread_local std::vector<std::int8_t> lohi;
    x.lo = q4_1_layout(q.data(), nb, lohi);
    x.hi = x.lo + lohi.size() / 2;
  }
  // Chunks of ~32 KiB of weights; work is split in whole quads of rows.
  const std::int64_t quads = (g.n + kGemvRows - 1) / kGemvRows;
  const std::int64_t grain = std::max<std::int64_t>(1, 32768 / (kGemvRows * nb * static_cast<std::int64_t>(sizeof(WB))));
  TileFn tile = &gemv_tile<WB, 0>;
  if constexpr (std::is_same_v<WB, BlockQ4_1>) tile = q4_1_tile(nb);
  pool.parallel_for(quads, [&](std::int64_t lo, std::int64_t hi) { tile(g, x, lo, hi); }, grain);
}

}  // namespace

bool quant_gemv(ThreadPool& pool, const GemmArgs& g) {
  switch (g.b_type) {
    case DType::kQ4_1:
      // Blocks are 20 bytes (alignment 2); the cache-line realignment needs 4-byte aligned rows.
      if (reinterpret_cast<std::uintptr_t>(g.b) % 4 != 0) return false;
      quant_gemv_as<BlockQ4_1, BlockQ8_1, &quantize_row_q8_1>(pool, g); return true;
    case DType::kQ8_0: quant_gemv_as<BlockQ8_0, BlockQ8_0, &quantize_row_q8_0>(pool, g); return true;
    default: return false;
  }
}
#else
bool quant_gemv(ThreadPool&, const GemmArgs&) { return false; }
#endif

}  // namespace trellis::kernels::cpu
