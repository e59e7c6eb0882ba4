// The decode GEMV: y[M,N] = x[M,K] w[N,K]^T + beta y for M <= 8 and bf16/f16 weights.
//
// Decode is bound by reading w once. Each warp owns 4 rows of w and walks K in steps of 256:
// every lane loads 16 bytes (8 weights) of each of its 4 rows, so a warp's loads are 512
// contiguous bytes per row, and the 4 rows give 4 independent loads in flight per lane (8
// with the unroll). x (at most 8 rows, f32) is read with 16-byte loads too and is served by
// L1/L2: it is reused by every warp, and 4 rows per warp cut its traffic per weight byte by 4.
// Products and sums are f32; one warp reduction per output at the end.
// Larger M goes to cuBLASLt (ops.cpp).
#include <cuda_runtime.h>

#include "cuda/device.cuh"

namespace trellis::kernels::cuda {
namespace {

constexpr int kWarps = 4;        // per block
constexpr int kRowsPerWarp = 4;  // rows of w per warp

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

template <bool kBf16, int kMaxM>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(Mat x, Mat w, Mat y, float beta) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const std::int64_t n0 = (static_cast<std::int64_t>(blockIdx.x) * kWarps + warp) * kRowsPerWarp;
  if (n0 >= w.rows) return;
  const int m_count = static_cast<int>(x.rows);
  const auto* wbase = static_cast<const std::uint16_t*>(w.data);
  const std::uint16_t* wrow[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    std::int64_t n = n0 + r < w.rows ? n0 + r : w.rows - 1;  // past the end: reread the last row, not stored
    wrow[r] = wbase + n * w.ld;
  }
  float acc[kMaxM][kRowsPerWarp] = {};
  const auto* xbase = static_cast<const float*>(x.data);
#pragma unroll 2
  for (std::int64_t k = lane * 8; k < w.cols; k += 256) {
    float wf[kRowsPerWarp][8];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      uint4 u = __ldg(reinterpret_cast<const uint4*>(wrow[r] + k));
      widen8<kBf16>(u, wf[r]);
    }
#pragma unroll
    for (int m = 0; m < kMaxM; ++m) {
      if (m >= m_count) break;
      const float4* xp = reinterpret_cast<const float4*>(xbase + m * x.ld + k);
      float4 a = xp[0], b = xp[1];
      const float xf[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[m][r] = fmaf(xf[i], wf[r][i], acc[m][r]);
    }
  }
#pragma unroll
  for (int m = 0; m < kMaxM; ++m) {
    if (m >= m_count) break;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      float v = warp_sum(acc[m][r]);
      if (lane == 0 && n0 + r < w.rows) {
        float* out = static_cast<float*>(y.data) + m * y.ld + n0 + r;
        *out = beta == 0.0f ? v : v + beta * *out;
      }
    }
  }
}

template <bool kBf16>
cudaError_t launch_typed(const Mat& x, const Mat& w, const Mat& y, float beta, cudaStream_t s) {
  const unsigned blocks = blocks_for(w.rows, kWarps * kRowsPerWarp);
  const int threads = kWarps * 32;
  if (x.rows <= 1) gemv_kernel<kBf16, 1><<<blocks, threads, 0, s>>>(x, w, y, beta);
  else if (x.rows <= 2) gemv_kernel<kBf16, 2><<<blocks, threads, 0, s>>>(x, w, y, beta);
  else if (x.rows <= 4) gemv_kernel<kBf16, 4><<<blocks, threads, 0, s>>>(x, w, y, beta);
  else gemv_kernel<kBf16, 8><<<blocks, threads, 0, s>>>(x, w, y, beta);
  return cudaGetLastError();
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

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
