// The decode GEMV: y[M,N] = x[M,K] w[N,K]^T + beta y for M <= 8 and bf16/f16 weights.
//
// Decode is bound by reading w once, so the kernel's job is to keep enough bytes in flight
// on every SM. A block of 8 warps owns R rows of w (8 at M = 1, 4 above, so the f32
// accumulators stay in registers) and its 256 threads split K: thread t reads 16 bytes (8
// weights) of each of the R rows at k = 8t, 8t + 2048, ..., so a warp's loads are 512
// contiguous bytes per row and each thread has R (2R with the unroll) independent loads in
// flight. The first version gave each warp 4 rows and the whole of K: at N = 2048 that is 512
// warps, 4 per SM, and it reached 35-51% of the H100's read bandwidth on the 2048-row shapes
// (docs/benchmarks.md, "GPU"); splitting K gives every shape N/R blocks of 8 warps.
// Weights are loaded with the streaming hint (evict first) so that x, which every block
// reads, stays in L1/L2. Products and sums are f32: a warp reduction per output and thread,
// then the 8 warps' partial sums through shared memory. Larger M goes to cuBLASLt (ops.cpp).
#include <cuda_runtime.h>

#include "cuda/device.cuh"

namespace trellis::kernels::cuda {
namespace {

constexpr int kWarps = 8;  // per block, splitting K

// The 8 weights of a 16-byte load, widened to f32.
template <bool kBf16>
__device__ __forceinline__ void widen8(const uint4& u, float (&f)[8]) {
  const unsigned words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (kBf16) {
      f[2 * i] = __uint_as_float(words[i] << 16);
      f[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    } else {
      __half2 h = *reinterpret_cast<const __half2*>(&words[i]);
      float2 p = __half22float2(h);
      f[2 * i] = p.x;
      f[2 * i + 1] = p.y;
    }
  }
}

template <bool kBf16, int kMaxM, int kRows>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(Mat x, Mat w, Mat y, float beta) {
  __shared__ float partial[kWarps][kMaxM][kRows];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.x) * kRows;
  const int m_count = static_cast<int>(x.rows);
  const auto* wbase = static_cast<const std::uint16_t*>(w.data);
  const std::uint16_t* wrow[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    std::int64_t n = n0 + r < w.rows ? n0 + r : w.rows - 1;  // past the end: reread the last row, not stored
    wrow[r] = wbase + n * w.ld;
  }
  float acc[kMaxM][kRows] = {};
  const auto* xbase = static_cast<const float*>(x.data);
#pragma unroll 2
  for (std::int64_t k = threadIdx.x * 8; k < w.cols; k += kWarps * 32 * 8) {
    float wf[kRows][8];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      uint4 u = __ldcs(reinterpret_cast<const uint4*>(wrow[r] + k));
      widen8<kBf16>(u, wf[r]);
    }
#pragma unroll
    for (int m = 0; m < kMaxM; ++m) {
      if (m >= m_count) break;
      const float4* xp = reinterpret_cast<const float4*>(xbase + m * x.ld + k);
      float4 a = xp[0], b = xp[1];
      const float xf[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[m][r] = fmaf(xf[i], wf[r][i], acc[m][r]);
    }
  }
#pragma unroll
  for (int m = 0; m < kMaxM; ++m)
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float v = warp_sum(acc[m][r]);
      if (lane == 0) partial[warp][m][r] = v;
    }
  __syncthreads();
  for (int i = threadIdx.x; i < kMaxM * kRows; i += blockDim.x) {
    const int m = i / kRows, r = i % kRows;
    if (m >= m_count || n0 + r >= w.rows) continue;
    float v = 0;
#pragma unroll
    for (int q = 0; q < kWarps; ++q) v += partial[q][m][r];
    float* out = static_cast<float*>(y.data) + m * y.ld + n0 + r;
    *out = beta == 0.0f ? v : v + beta * *out;
  }
}

template <bool kBf16, int kMaxM, int kRows>
void launch_shape(const Mat& x, const Mat& w, const Mat& y, float beta, cudaStream_t s) {
  gemv_kernel<kBf16, kMaxM, kRows><<<blocks_for(w.rows, kRows), kWarps * 32, 0, s>>>(x, w, y, beta);
}

template <bool kBf16>
cudaError_t launch_typed(const Mat& x, const Mat& w, const Mat& y, float beta, cudaStream_t s) {
  if (x.rows <= 1) launch_shape<kBf16, 1, 8>(x, w, y, beta, s);
  else if (x.rows <= 2) launch_shape<kBf16, 2, 4>(x, w, y, beta, s);
  else if (x.rows <= 4) launch_shape<kBf16, 4, 4>(x, w, y, beta, s);
  else launch_shape<kBf16, 8, 4>(x, w, y, beta, s);
  return cudaGetLastError();
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t load_matmul_kernels() {
  cudaFuncAttributes a;
  cudaError_t e = cudaSuccess;
  const auto touch = [&](const void* f) {
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, f);
  };
  touch(reinterpret_cast<const void*>(gemv_kernel<true, 1, 8>));
  touch(reinterpret_cast<const void*>(gemv_kernel<true, 2, 4>));
  touch(reinterpret_cast<const void*>(gemv_kernel<true, 4, 4>));
  touch(reinterpret_cast<const void*>(gemv_kernel<true, 8, 4>));
  touch(reinterpret_cast<const void*>(gemv_kernel<false, 1, 8>));
  touch(reinterpret_cast<const void*>(gemv_kernel<false, 2, 4>));
  touch(reinterpret_cast<const void*>(gemv_kernel<false, 4, 4>));
  touch(reinterpret_cast<const void*>(gemv_kernel<false, 8, 4>));
  return e;
}

bool gemv_supported(const Mat& x, const Mat& w) {
  return x.rows >= 1 && x.rows <= kGemvMaxRows && (w.type == Elem::kBF16 || w.type == Elem::kF16) &&
         x.type == Elem::kF32 && w.cols % 8 == 0 && w.ld % 8 == 0 && x.ld % 4 == 0 && aligned16(w.data) &&
         aligned16(x.data);
}

cudaError_t launch_gemv(const Mat& x, const Mat& w, const Mat& y, float beta, cudaStream_t s) {
  if (w.rows == 0 || x.rows == 0) return cudaSuccess;
  return w.type == Elem::kBF16 ? launch_typed<true>(x, w, y, beta, s) : launch_typed<false>(x, w, y, beta, s);
}

}  // namespace trellis::kernels::cuda
