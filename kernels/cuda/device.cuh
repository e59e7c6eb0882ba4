// Internal: device helpers shared by the .cu files (element loads and stores by type, warp
// and block reductions). Conversions round to nearest even, as trellis/core/half.hpp does.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/launch.hpp"

namespace trellis::kernels::cuda {

__device__ __forceinline__ float bf16_bits_to_f32(std::uint16_t u) { return __uint_as_float(static_cast<unsigned>(u) << 16); }
__device__ __forceinline__ float f16_bits_to_f32(std::uint16_t u) { return __half2float(__ushort_as_half(u)); }
__device__ __forceinline__ std::uint16_t f32_to_bf16_bits(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
__device__ __forceinline__ std::uint16_t f32_to_f16_bits(float f) { return __half_as_ushort(__float2half_rn(f)); }

// Element j of a row of a block type (ggml layouts, quant.hpp). The products are rounded
// separately (__fmul_rn, no FMA contraction) so the values equal the CPU's dequantize_row.
__device__ __forceinline__ float load_block_elem(const unsigned char* row, Elem t, std::int64_t j) {
  const std::int64_t b = j / 32;
  const int e = static_cast<int>(j % 32);
  if (t == Elem::kQ4_1) {
    const unsigned char* blk = row + b * 20;
    float d = f16_bits_to_f32(*reinterpret_cast<const std::uint16_t*>(blk));
    float m = f16_bits_to_f32(*reinterpret_cast<const std::uint16_t*>(blk + 2));
    int q = e < 16 ? (blk[4 + e] & 15) : (blk[4 + e - 16] >> 4);
    return __fadd_rn(__fmul_rn(static_cast<float>(q), d), m);
  }
  const unsigned char* blk = row + b * 34;  // kQ8_0
  float d = f16_bits_to_f32(*reinterpret_cast<const std::uint16_t*>(blk));
  return __fmul_rn(static_cast<float>(static_cast<signed char>(blk[2 + e])), d);
}

// Bytes from the start of a matrix to row r (block types: 20 or 34 bytes per 32 elements).
__device__ __forceinline__ std::int64_t row_offset_bytes(Elem t, std::int64_t r, std::int64_t ld) {
  switch (t) {
    case Elem::kF32: return r * ld * 4;
    case Elem::kBF16:
    case Elem::kF16: return r * ld * 2;
    case Elem::kQ4_1: return r * (ld / 32) * 20;
    case Elem::kQ8_0: return r * (ld / 32) * 34;
  }
  return 0;
}

// m[r, j] as f32, any type (a uniform switch: every thread of a launch takes the same branch).
__device__ __forceinline__ float load_f32(const Mat& m, std::int64_t r, std::int64_t j) {
  const auto* row = static_cast<const unsigned char*>(m.data) + row_offset_bytes(m.type, r, m.ld);
  switch (m.type) {
    case Elem::kF32: return reinterpret_cast<const float*>(row)[j];
    case Elem::kBF16: return bf16_bits_to_f32(reinterpret_cast<const std::uint16_t*>(row)[j]);
    case Elem::kF16: return f16_bits_to_f32(reinterpret_cast<const std::uint16_t*>(row)[j]);
    default: return load_block_elem(row, m.type, j);
  }
}

// m[r, j] = f, rounded to m's plain type.
__device__ __forceinline__ void store_f32(const Mat& m, std::int64_t r, std::int64_t j, float f) {
  auto* row = static_cast<unsigned char*>(m.data) + row_offset_bytes(m.type, r, m.ld);
  switch (m.type) {
    case Elem::kF32: reinterpret_cast<float*>(row)[j] = f; break;
    case Elem::kBF16: reinterpret_cast<std::uint16_t*>(row)[j] = f32_to_bf16_bits(f); break;
    case Elem::kF16: reinterpret_cast<std::uint16_t*>(row)[j] = f32_to_f16_bits(f); break;
    default: break;  // block types are never written (the host side rejects them)
  }
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (or max) over a block of blockDim.x threads (a multiple of 32, <= 1024); every
// thread gets the result. `shared` holds 32 values.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read by a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T total = lane < warps ? shared[lane] : T(0);
  return warp_sum(total);
}

__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float m = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(m);
}

inline unsigned blocks_for(std::int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace trellis::kernels::cuda
