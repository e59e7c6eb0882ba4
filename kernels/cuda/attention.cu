// Causal GQA attention over the [kv_head, position, head_dim] cache (attention.hpp) and the KV
// write.
//
// One kernel serves decode and prefill: every query row r has its own KvRef (pointers,
// strides, length), so decode passes one per sequence and prefill passes the same cache for
// each of its T tokens with lengths start_pos + t + 1. A block takes one (row, KV head, up
// to 8 query heads of its group, split of the keys): its 4 warps walk the split's keys
// round-robin, each lane holding head_dim / 32 elements of q, k, v and the accumulator, with
// an online softmax per query head; the warps merge through shared memory. The keys and
// values of a KV head are read once for the whole group (decode is bound by that read).
// When the grid is too small to fill the GPU (decode: few rows), the keys are split
// (flash-decoding) and a second kernel merges the partial softmaxes of the splits.
//
// Prefill with this kernel is correct but not fast (each query row re-reads its keys from
// L2, no tensor cores); a tiled tensor-core prefill kernel is future work (kernels/README.md).
#include <cuda_runtime.h>

#include "cuda/device.cuh"

namespace trellis::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxQ = 8;  // query heads per block
// A split holds at least this many keys (2 per warp); attention_splits() explains why.
constexpr std::int64_t kMinSplitKeys = 8;

// The keys each split of a row of `length` keys takes: the row's own keys shared out over the
// splits, at least kMinSplitKeys each. In a CUDA graph `splits` was fixed for the cache's
// capacity, so a short row fills only its first few splits; the rest are empty.
__host__ __device__ __forceinline__ std::int64_t keys_per_split(std::int64_t length, int splits) {
  const std::int64_t even = (length + splits - 1) / splits;
  return even > kMinSplitKeys ? even : kMinSplitKeys;
}
// The splits that hold keys of a row (the merge reads no others).
__host__ __device__ __forceinline__ int used_splits(std::int64_t length, int splits) {
  const std::int64_t per = keys_per_split(length, splits), used = (length + per - 1) / per;
  return used < splits ? static_cast<int>(used) : splits;
}

template <typename CT>
__device__ __forceinline__ float cache_load(const CT* p, std::int64_t i) {
  if constexpr (sizeof(CT) == 4) return p[i];
  else return bf16_bits_to_f32(p[i]);
}

__host__ __device__ int head_chunks(const AttentionArgs& a) {
  const int group = a.n_heads / a.n_kv_heads;
  return (group + kMaxQ - 1) / kMaxQ;
}

// kE: head_dim elements per lane (head_dim <= 32 * kE). CT: float (f32 cache) or uint16 (bf16).
// The output row r, column c: f32, or rounded once to bf16/f16 for the o-projection GEMM after
// it (the rounding its conversion pass would do).
__device__ __forceinline__ void store_out(const AttentionArgs& a, std::int64_t r, std::int64_t c, float v) {
  const Mat m{a.out, a.out_type, a.rows, 0, a.ldo};
  store_f32(m, r, c, v);
}

template <typename CT, int kE>
__global__ void __launch_bounds__(kWarps * 32) attention_kernel(AttentionArgs a, int splits, float* partial) {
  __shared__ float s_m[kWarps][kMaxQ], s_l[kWarps][kMaxQ];
  __shared__ float s_acc[kWarps][kMaxQ][kE * 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int group = a.n_heads / a.n_kv_heads, chunks = head_chunks(a), D = a.head_dim;
  const std::int64_t item = blockIdx.x;
  const int chunk = static_cast<int>(item % chunks);
  const int g = static_cast<int>((item / chunks) % a.n_kv_heads);
  const std::int64_t r = item / chunks / a.n_kv_heads;
  const int h0 = g * group + chunk * kMaxQ;
  const int nq = min(kMaxQ, g * group + group - h0);
  const KvRef kv = a.kv[r];
  // The splits share this row's own keys: in a CUDA graph `splits` was fixed for the cache's
  // capacity, and splitting the capacity left one or two splits holding every key of a short
  // sequence (10 us a layer on an H200 at ~100 keys, ncu). Splits past the row's keys write an
  // empty partial (m = -inf) that the merge does not read.
  const std::int64_t per_split = keys_per_split(kv.length, splits);
  const std::int64_t begin = blockIdx.y * per_split, end = min(begin + per_split, kv.length);

  float q[kMaxQ][kE], acc[kMaxQ][kE], m[kMaxQ], l[kMaxQ];
  const float* qrow = a.q + r * a.ldq;
#pragma unroll
  for (int i = 0; i < kMaxQ; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      const int d = lane + 32 * e;
      q[i][e] = (i < nq && d < D) ? qrow[static_cast<std::int64_t>(h0 + i) * D + d] : 0.0f;
      acc[i][e] = 0.0f;
    }
  }
  const CT* kb = static_cast<const CT*>(kv.k) + g * kv.k_head_stride;
  const CT* vb = static_cast<const CT*>(kv.v) + g * kv.v_head_stride;
  for (std::int64_t j = begin + warp; j < end; j += kWarps) {
    float kf[kE], vf[kE];
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      const int d = lane + 32 * e;
      kf[e] = d < D ? cache_load(kb, j * kv.k_pos_stride + d) : 0.0f;
      vf[e] = d < D ? cache_load(vb, j * kv.v_pos_stride + d) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kMaxQ; ++i) {
      if (i >= nq) break;
      float s = 0.0f;
#pragma unroll
      for (int e = 0; e < kE; ++e) s = fmaf(q[i][e], kf[e], s);
      s = a.scale * warp_sum(s);
      const float m_new = fmaxf(m[i], s);
      const float corr = __expf(m[i] - m_new), p = __expf(s - m_new);
      l[i] = l[i] * corr + p;
#pragma unroll
      for (int e = 0; e < kE; ++e) acc[i][e] = fmaf(p, vf[e], acc[i][e] * corr);
      m[i] = m_new;
    }
  }
  // Merge the warps' (m, l, acc) per query head.
#pragma unroll
  for (int i = 0; i < kMaxQ; ++i) {
    if (lane == 0) {
      s_m[warp][i] = m[i];
      s_l[warp][i] = l[i];
    }
#pragma unroll
    for (int e = 0; e < kE; ++e) s_acc[warp][i][lane + 32 * e] = acc[i][e];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < nq * D; idx += blockDim.x) {
    const int i = idx / D, d = idx % D;
    float mx = -INFINITY;
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, s_m[w][i]);
    float sum_l = 0.0f, sum_a = 0.0f;
    if (mx != -INFINITY) {
      for (int w = 0; w < kWarps; ++w) {
        const float f = __expf(s_m[w][i] - mx);
        sum_l += f * s_l[w][i];
        sum_a += f * s_acc[w][i][d];
      }
    }
    const int h = h0 + i;
    if (splits == 1) {
      store_out(a, r, static_cast<std::int64_t>(h) * D + d, sum_a / sum_l);
    } else {
      float* p = partial + ((r * a.n_heads + h) * splits + blockIdx.y) * (D + 2);
      if (d == 0) {
        p[0] = mx;
        p[1] = sum_l;
      }
      p[2 + d] = sum_a;
    }
  }
}

// One block per (row, query head): combines the partial softmaxes of the splits that hold
// the row's keys. Its loops are chains of dependent loads: reading every split of a graph's
// capacity (66 at a short decode row) made it 7.6 us a layer on an H200 (ncu, call 13).
__global__ void merge_kernel(AttentionArgs a, int splits, const float* partial) {
  const std::int64_t r = blockIdx.x / a.n_heads;
  const int h = static_cast<int>(blockIdx.x % a.n_heads), D = a.head_dim;
  const float* base = partial + (r * a.n_heads + h) * splits * (D + 2);
  const int used = used_splits(a.kv[r].length, splits);
  float mx = -INFINITY;
  for (int s = 0; s < used; ++s) mx = fmaxf(mx, base[s * (D + 2)]);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float sum_l = 0.0f, sum_a = 0.0f;
    for (int s = 0; s < used; ++s) {
      const float* p = base + s * (D + 2);
      if (p[0] == -INFINITY) continue;  // an empty split (past this row's length)
      const float f = __expf(p[0] - mx);
      sum_l += f * p[1];
      sum_a += f * p[2 + d];
    }
    store_out(a, r, static_cast<std::int64_t>(h) * D + d, sum_a / sum_l);
  }
}

template <typename CT, int kE>
void launch_typed(const AttentionArgs& a, int splits, float* partial, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(a.rows * a.n_kv_heads * head_chunks(a)), static_cast<unsigned>(splits));
  attention_kernel<CT, kE><<<grid, kWarps * 32, 0, s>>>(a, splits, partial);
}

template <typename CT>
void launch_cache(const AttentionArgs& a, int splits, float* partial, cudaStream_t s) {
  if (a.head_dim <= 64) launch_typed<CT, 2>(a, splits, partial, s);
  else if (a.head_dim <= 128) launch_typed<CT, 4>(a, splits, partial, s);
  else launch_typed<CT, 8>(a, splits, partial, s);
}

__global__ void kv_write_kernel(Mat k_new, Mat v_new, const KvWriteArgs* args, Elem type, int n_kv_heads, int head_dim) {
  const KvRef cache = args->cache;
  const std::int64_t start_pos = args->start_pos;
  const std::int64_t per_row = static_cast<std::int64_t>(n_kv_heads) * head_dim;
  const std::int64_t n = k_new.rows * per_row;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t t = i / per_row, c = i % per_row, g = c / head_dim, d = c % head_dim;
    const std::int64_t p = start_pos + t;
    // Each cache element as a one-row matrix: store_f32 rounds to the cache type.
    const Mat kc{const_cast<void*>(cache.k), type, 1, 1, 0}, vc{const_cast<void*>(cache.v), type, 1, 1, 0};
    store_f32(kc, 0, g * cache.k_head_stride + p * cache.k_pos_stride + d, load_f32(k_new, t, c));
    store_f32(vc, 0, g * cache.v_head_stride + p * cache.v_pos_stride + d, load_f32(v_new, t, c));
  }
}

}  // namespace

cudaError_t load_attention_kernels() {
  cudaFuncAttributes a;
  cudaError_t e = cudaSuccess;
  const auto touch = [&](const void* f) {
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, f);
  };
  touch(reinterpret_cast<const void*>(attention_kernel<float, 2>));
  touch(reinterpret_cast<const void*>(attention_kernel<float, 4>));
  touch(reinterpret_cast<const void*>(attention_kernel<float, 8>));
  touch(reinterpret_cast<const void*>(attention_kernel<std::uint16_t, 2>));
  touch(reinterpret_cast<const void*>(attention_kernel<std::uint16_t, 4>));
  touch(reinterpret_cast<const void*>(attention_kernel<std::uint16_t, 8>));
  touch(reinterpret_cast<const void*>(merge_kernel));
  touch(reinterpret_cast<const void*>(kv_write_kernel));
  return e;
}

int attention_splits(const AttentionArgs& a, int sm_count) {
  const std::int64_t blocks = a.rows * a.n_kv_heads * head_chunks(a);
  const std::int64_t want = 2LL * sm_count;  // two blocks per SM hide some latency
  // A block's warps walk their keys one at a time (a dependent load each): decode of one
  // sequence (8 KV heads: 8 blocks) took ~40 us a layer at 100 keys on an H200 when only
  // lengths above 128 were split, and ~10 us with splits of 32 keys (8 per warp). Splits of
  // at least 8 keys (2 per warp) from 16 keys up (kMinSplitKeys; the kernel keeps to it for
  // rows shorter than the grid's length too).
  if (blocks >= want || a.max_length < 2 * kMinSplitKeys) return 1;
  std::int64_t splits = (want + blocks - 1) / blocks;
  splits = min(splits, (a.max_length + kMinSplitKeys - 1) / kMinSplitKeys);
  return static_cast<int>(splits < 1 ? 1 : splits);
}

std::size_t attention_scratch_bytes(const AttentionArgs& a, int splits) {
  if (splits <= 1) return 0;
  return static_cast<std::size_t>(a.rows) * a.n_heads * splits * (a.head_dim + 2) * sizeof(float);
}

cudaError_t launch_attention(const AttentionArgs& a, int splits, void* scratch, cudaStream_t s) {
  if (a.rows == 0) return cudaSuccess;
  auto* partial = static_cast<float*>(scratch);
  if (a.cache == Elem::kF32) launch_cache<float>(a, splits, partial, s);
  else launch_cache<std::uint16_t>(a, splits, partial, s);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || splits == 1) return e;
  const int threads = a.head_dim <= 128 ? 128 : 256;
  merge_kernel<<<static_cast<unsigned>(a.rows * a.n_heads), threads, 0, s>>>(a, splits, partial);
  return cudaGetLastError();
}

cudaError_t launch_kv_write(const Mat& k_new, const Mat& v_new, const KvWriteArgs* args, Elem type, int n_kv_heads,
                            int head_dim, cudaStream_t s) {
  const std::int64_t n = k_new.rows * n_kv_heads * head_dim;
  if (n == 0) return cudaSuccess;
  const std::int64_t b = (n + 255) / 256;
  kv_write_kernel<<<static_cast<unsigned>(b < 65536 ? b : 65536), 256, 0, s>>>(k_new, v_new, args, type, n_kv_heads,
                                                                               head_dim);
  return cudaGetLastError();
}

}  // namespace trellis::kernels::cuda
