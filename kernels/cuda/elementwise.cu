// Elementwise and row-wise ops, RoPE and dequantisation. All memory-bound: one pass over the
// data, grid-stride loops over rows x cols (64-bit indices: prefill matrices pass 2^31
// elements), row ops one block per row. Semantics: kernels/ops.hpp, rope.hpp.
#include <cuda_runtime.h>

#include <cmath>

#include "cuda/device.cuh"

namespace trellis::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRowThreads = 1024;  // one block per row (rms_norm)

unsigned grid_for(std::int64_t n) {
  // Enough blocks to fill an H100 several times over; the loop covers the rest.
  std::int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65536 ? (b > 0 ? b : 1) : 65536);
}

#define TRELLIS_GRID_STRIDE(i, n) \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

__global__ void add_bias_kernel(Mat y, Mat bias) {
  TRELLIS_GRID_STRIDE(i, y.rows * y.cols) {
    std::int64_t r = i / y.cols, c = i % y.cols;
    float* p = static_cast<float*>(y.data) + r * y.ld + c;
    *p = *p + load_f32(bias, 0, c);
  }
}

__global__ void rms_norm_kernel(Mat x, Mat w, float eps, Mat y) {
  __shared__ double partial[32];
  const std::int64_t r = blockIdx.x;
  const float* in = static_cast<const float*>(x.data) + r * x.ld;
  // Sum of squares in double, as the CPU does: rows of thousands of values lose digits in f32.
  double ss = 0;
  for (std::int64_t i = threadIdx.x; i < x.cols; i += blockDim.x) ss += static_cast<double>(in[i]) * in[i];
  ss = block_sum(ss, partial);
  const auto inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(x.cols) + eps));
  // y f32, or bf16/f16 for the GEMM after it (rounded here once, as its conversion would).
  for (std::int64_t i = threadIdx.x; i < x.cols; i += blockDim.x)
    store_f32(y, r, i, __fmul_rn(__fmul_rn(in[i], inv), load_f32(w, 0, i)));
}

template <bool kSwiglu>
__global__ void binary_kernel(Mat a, Mat b, Mat out) {
  TRELLIS_GRID_STRIDE(i, a.rows * a.cols) {
    std::int64_t r = i / a.cols, c = i % a.cols;
    float x = static_cast<const float*>(a.data)[r * a.ld + c];
    float u = static_cast<const float*>(b.data)[r * b.ld + c];
    float v = kSwiglu ? __fmul_rn(x / (1.0f + expf(-x)), u) : x + u;
    store_f32(out, r, c, v);  // f32, or bf16/f16 for the GEMM after a SwiGLU
  }
}

__global__ void softmax_kernel(Mat x) {
  __shared__ float fpart[32];
  __shared__ double dpart[32];
  float* p = static_cast<float*>(x.data) + static_cast<std::int64_t>(blockIdx.x) * x.ld;
  float mx = -INFINITY;
  for (std::int64_t i = threadIdx.x; i < x.cols; i += blockDim.x) mx = fmaxf(mx, p[i]);
  mx = block_max(mx, fpart);
  if (mx == -INFINITY) mx = 0;  // all -inf: exp(-inf) = 0 rather than NaN, as on the CPU
  double sum = 0;
  for (std::int64_t i = threadIdx.x; i < x.cols; i += blockDim.x) {
    float e = expf(p[i] - mx);
    p[i] = e;
    sum += e;
  }
  sum = block_sum(sum, dpart);
  const float inv = sum > 0 ? static_cast<float>(1.0 / sum) : 0.0f;
  for (std::int64_t i = threadIdx.x; i < x.cols; i += blockDim.x) p[i] *= inv;
}

__global__ void embedding_kernel(Mat table, const std::int32_t* tokens, std::int64_t vocab_begin, Mat out) {
  const std::int64_t t = blockIdx.x;
  const std::int64_t id = tokens[t] - vocab_begin;
  float* o = static_cast<float*>(out.data) + t * out.ld;
  const bool inside = id >= 0 && id < table.rows;
  for (std::int64_t i = threadIdx.x; i < out.cols; i += blockDim.x) o[i] = inside ? load_f32(table, id, i) : 0.0f;
}

__global__ void convert_kernel(Mat src, Mat dst) {
  TRELLIS_GRID_STRIDE(i, src.rows * src.cols) {
    std::int64_t r = i / src.cols, c = i % src.cols;
    store_f32(dst, r, c, load_f32(src, r, c));
  }
}

// f32 -> bf16/f16 in 16-byte pieces, a 2-D grid (no 64-bit division per element): the
// conversion of a prefill GEMM's activations that cuBLASLt needs, so it runs at bandwidth.
// Needs cols, both leading dimensions a multiple of 8 and 16-byte aligned rows (fast_convert_ok).
template <bool kBf16>
__global__ void convert_f32_to_16_kernel(Mat src, Mat dst) {
  const std::int64_t r = blockIdx.y, c = (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) * 8;
  if (c >= src.cols) return;
  const float4* in = reinterpret_cast<const float4*>(static_cast<const float*>(src.data) + r * src.ld + c);
  const float4 a = in[0], b = in[1];
  const float f[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  unsigned words[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const std::uint32_t lo = kBf16 ? f32_to_bf16_bits(f[2 * i]) : f32_to_f16_bits(f[2 * i]);
    const std::uint32_t hi = kBf16 ? f32_to_bf16_bits(f[2 * i + 1]) : f32_to_f16_bits(f[2 * i + 1]);
    words[i] = lo | (hi << 16);
  }
  *reinterpret_cast<uint4*>(static_cast<std::uint16_t*>(dst.data) + r * dst.ld + c) =
      make_uint4(words[0], words[1], words[2], words[3]);
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

bool fast_convert_ok(const Mat& src, const Mat& dst) {
  return src.type == Elem::kF32 && (dst.type == Elem::kBF16 || dst.type == Elem::kF16) && src.cols % 8 == 0 &&
         src.ld % 8 == 0 && dst.ld % 8 == 0 && src.rows <= 65535 && aligned16(src.data) && aligned16(dst.data);
}

__global__ void rope_kernel(Mat x, int n_heads, int head_dim, const std::int32_t* positions, const double* inv_freq) {
  const int half = head_dim / 2;
  TRELLIS_GRID_STRIDE(idx, x.rows * n_heads * half) {
    const std::int64_t t = idx / (static_cast<std::int64_t>(n_heads) * half);
    const int rest = static_cast<int>(idx % (static_cast<std::int64_t>(n_heads) * half));
    const int h = rest / half, i = rest % half;
    // The angle and its cos/sin in double, rounded to f32: the values RopeTable stores.
    double s, c;
    sincos(static_cast<double>(positions[t]) * inv_freq[i], &s, &c);
    const auto cf = static_cast<float>(c), sf = static_cast<float>(s);
    float* p = static_cast<float*>(x.data) + t * x.ld + static_cast<std::int64_t>(h) * head_dim;
    const float a = p[i], b = p[i + half];
    p[i] = __fsub_rn(__fmul_rn(a, cf), __fmul_rn(b, sf));
    p[i + half] = __fadd_rn(__fmul_rn(b, cf), __fmul_rn(a, sf));
  }
}

__global__ void scale_kernel(Mat y, float beta) {
  TRELLIS_GRID_STRIDE(i, y.rows * y.cols) {
    float* p = static_cast<float*>(y.data) + (i / y.cols) * y.ld + i % y.cols;
    *p = beta == 0.0f ? 0.0f : beta * *p;
  }
}

#undef TRELLIS_GRID_STRIDE

unsigned rows_grid(std::int64_t rows) { return static_cast<unsigned>(rows); }

}  // namespace

cudaError_t load_elementwise_kernels() {
  cudaFuncAttributes a;
  cudaError_t e = cudaSuccess;
  const auto touch = [&](const void* f) {
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, f);
  };
  touch(reinterpret_cast<const void*>(add_bias_kernel));
  touch(reinterpret_cast<const void*>(rms_norm_kernel));
  touch(reinterpret_cast<const void*>(binary_kernel<true>));
  touch(reinterpret_cast<const void*>(binary_kernel<false>));
  touch(reinterpret_cast<const void*>(softmax_kernel));
  touch(reinterpret_cast<const void*>(embedding_kernel));
  touch(reinterpret_cast<const void*>(convert_kernel));
  touch(reinterpret_cast<const void*>(convert_f32_to_16_kernel<true>));
  touch(reinterpret_cast<const void*>(convert_f32_to_16_kernel<false>));
  touch(reinterpret_cast<const void*>(rope_kernel));
  touch(reinterpret_cast<const void*>(scale_kernel));
  return e;
}

cudaError_t launch_add_bias(const Mat& y, const Mat& bias, cudaStream_t s) {
  add_bias_kernel<<<grid_for(y.rows * y.cols), kThreads, 0, s>>>(y, bias);
  return cudaGetLastError();
}

cudaError_t launch_rms_norm(const Mat& x, const Mat& weight, float eps, const Mat& y, cudaStream_t s) {
  if (x.rows == 0) return cudaSuccess;
  // A decode step normalises one row per block: its loads are the whole cost, and with 256
  // threads each thread waited on 8 of them in turn, twice (6.9 us a norm on an H200, ncu,
  // docs/gpu-runs/2026-11-27-h200-12). 1024 threads wait on 2.
  rms_norm_kernel<<<rows_grid(x.rows), kRowThreads, 0, s>>>(x, weight, eps, y);
  return cudaGetLastError();
}

cudaError_t launch_swiglu(const Mat& gate, const Mat& up, const Mat& out, cudaStream_t s) {
  binary_kernel<true><<<grid_for(gate.rows * gate.cols), kThreads, 0, s>>>(gate, up, out);
  return cudaGetLastError();
}

cudaError_t launch_add(const Mat& a, const Mat& b, const Mat& out, cudaStream_t s) {
  binary_kernel<false><<<grid_for(a.rows * a.cols), kThreads, 0, s>>>(a, b, out);
  return cudaGetLastError();
}

cudaError_t launch_softmax_rows(const Mat& x, cudaStream_t s) {
  if (x.rows == 0) return cudaSuccess;
  softmax_kernel<<<rows_grid(x.rows), kThreads, 0, s>>>(x);
  return cudaGetLastError();
}

cudaError_t launch_embedding(const Mat& table, const std::int32_t* tokens, std::int64_t vocab_begin, const Mat& out,
                             cudaStream_t s) {
  if (out.rows == 0) return cudaSuccess;
  embedding_kernel<<<rows_grid(out.rows), kThreads, 0, s>>>(table, tokens, vocab_begin, out);
  return cudaGetLastError();
}

cudaError_t launch_convert(const Mat& src, const Mat& dst, cudaStream_t s) {
  if (src.rows == 0 || src.cols == 0) return cudaSuccess;
  if (fast_convert_ok(src, dst)) {
    const dim3 grid(static_cast<unsigned>((src.cols / 8 + kThreads - 1) / kThreads), static_cast<unsigned>(src.rows));
    if (dst.type == Elem::kBF16) convert_f32_to_16_kernel<true><<<grid, kThreads, 0, s>>>(src, dst);
    else convert_f32_to_16_kernel<false><<<grid, kThreads, 0, s>>>(src, dst);
    return cudaGetLastError();
  }
  convert_kernel<<<grid_for(src.rows * src.cols), kThreads, 0, s>>>(src, dst);
  return cudaGetLastError();
}

cudaError_t launch_rope(const Mat& x, int n_heads, int head_dim, const std::int32_t* positions, const double* inv_freq,
                        cudaStream_t s) {
  rope_kernel<<<grid_for(x.rows * n_heads * (head_dim / 2)), kThreads, 0, s>>>(x, n_heads, head_dim, positions,
                                                                                 inv_freq);
  return cudaGetLastError();
}

cudaError_t launch_scale(const Mat& y, float beta, cudaStream_t s) {
  scale_kernel<<<grid_for(y.rows * y.cols), kThreads, 0, s>>>(y, beta);
  return cudaGetLastError();
}

}  // namespace trellis::kernels::cuda
