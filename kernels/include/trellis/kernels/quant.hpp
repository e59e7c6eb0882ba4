// Block-quantised weights in ggml's formats and the arithmetic llama.cpp's CPU backend does
// with them, so that trellis can keep a GGUF file's Q4_1 / Q8_0 weights as they are stored
// and compute the same numbers llama.cpp computes.
//
// Formats (32 elements per block, little-endian, as in GGUF files):
//   Q4_1: f16 d, f16 m, 16 bytes of nibbles; element j <  16 is (qs[j] & 15) * d + m,
//         element j >= 16 is (qs[j-16] >> 4) * d + m.
//   Q8_0: f16 d, 32 int8;  element j = qs[j] * d.
//   Q8_1: f16 d, f16 s, 32 int8; element j = qs[j] * d, s = d * sum(qs) (activations only).
//
// How a matmul with quantised weights is computed (what llama.cpp does, and why the numbers
// differ from multiplying dequantised weights in f32): every row of the f32 activations x is
// itself quantised to 8 bits per 32-element block (to Q8_1 for Q4_1 weights, Q8_0 for Q8_0
// weights: d = max|x| / 127, q = round-to-nearest-even(x * 127 / max|x|), d stored as f16),
// then each block contributes d_w * d_x * sum_j(q_w[j] * q_x[j]) (+ m_w * s_x for Q4_1) with
// the inner sum in integers. The activation rounding (about 0.4% of a block's largest value
// per element) is the main difference from an f32 product of dequantised weights.
//
// The scalar functions in namespace `ref` are the specification; the fast paths (AVX2,
// AVX-VNNI or AVX-512 VNNI integer dot products, used by matmul) compute the same integer
// sums and differ only in the order of the f32 additions of block results.
// Threading: all functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>

#include "trellis/kernels/tensor.hpp"

namespace trellis::kernels {

inline constexpr std::int64_t kQuantBlock = 32;

struct BlockQ4_1 {
  std::uint16_t d, m;  // f16 scale and minimum
  std::uint8_t qs[16];
};
struct BlockQ8_0 {
  std::uint16_t d;  // f16 scale
  std::int8_t qs[32];
};
struct BlockQ8_1 {
  std::uint16_t d, s;  // f16 scale and f16 d * sum(qs)
  std::int8_t qs[32];
};
static_assert(sizeof(BlockQ4_1) == 20 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ8_1) == 36,
              "ggml block layouts are packed");

// Quantise k floats (a multiple of 32) into k / 32 blocks, as llama.cpp quantises
// activations before a quantised dot product.
void quantize_row_q8_1(const float* x, BlockQ8_1* y, std::int64_t k);
void quantize_row_q8_0(const float* x, BlockQ8_0* y, std::int64_t k);
// Quantise k weights into Q4_1 / Q8_0 (for tests and for writing files; llama.cpp's rules:
// Q4_1 d = (max - min) / 15, m = min, q = min(15, (int)((x - min) / d + 0.5))).
void quantize_row_q4_1(const float* x, BlockQ4_1* y, std::int64_t k);

// dst[0..k) = the k elements of a row stored as `t` (kQ4_1, kQ8_0, or a plain type).
void dequantize_row(DType t, const void* src, float* dst, std::int64_t k);

// Dot products over n_blocks blocks (the fast path where compiled, else the scalar one).
float vec_dot_q4_1_q8_1(const BlockQ4_1* w, const BlockQ8_1* x, std::int64_t n_blocks);
float vec_dot_q8_0_q8_0(const BlockQ8_0* w, const BlockQ8_0* x, std::int64_t n_blocks);

namespace ref {
// The scalar specification of the functions above.
void quantize_row_q8_1(const float* x, BlockQ8_1* y, std::int64_t k);
void quantize_row_q8_0(const float* x, BlockQ8_0* y, std::int64_t k);
float vec_dot_q4_1_q8_1(const BlockQ4_1* w, const BlockQ8_1* x, std::int64_t n_blocks);
float vec_dot_q8_0_q8_0(const BlockQ8_0* w, const BlockQ8_0* x, std::int64_t n_blocks);
}  // namespace ref

// Which SIMD path vec_dot_* use in this build (for messages and tests): AVX-512 VNNI (two
// blocks per step), AVX-VNNI, AVX2 or scalar.
const char* quant_dot_path();

}  // namespace trellis::kernels
