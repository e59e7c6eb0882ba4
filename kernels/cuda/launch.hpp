// Internal: the CUDA kernels' launchers. The .cu files implement them with plain pointers,
// strides in elements and a stream, and return the launch status (cudaGetLastError) for the
// host side (runtime.cpp, ops.cpp, attention.cpp) to check and name. Nothing here includes a
// trellis header, so nvcc never parses the C++20 layers above (fmt, spdlog, spans).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace trellis::kernels::cuda {

// Element types, numbered as kernels::DType (runtime.cpp static_asserts that they agree).
enum class Elem : std::uint8_t { kF32, kBF16, kF16, kQ4_1, kQ8_0 };

// A row-major matrix on the device: `rows` x `cols`, `ld` elements between rows (for block
// types, elements too: a multiple of 32).
struct Mat {
  void* data = nullptr;
  Elem type = Elem::kF32;
  std::int64_t rows = 0, cols = 0, ld = 0;
};

// Each .cu file's kernels, loaded now (cudaFuncGetAttributes on every instantiation). CUDA
// loads a kernel lazily at its first launch by default; a context loads them all when it is
// made (runtime.cpp create_state), so that no capture is the first use of a kernel. (This was
// first suspected of a crash in cuGraphLaunch; the cause was a reallocation at the same
// address, docs/gpu-runs/README.md run 8, but loading up front keeps captures predictable.)
cudaError_t load_elementwise_kernels();
cudaError_t load_matmul_kernels();
cudaError_t load_attention_kernels();

// ---- elementwise.cu -------------------------------------------------------------------
cudaError_t launch_add_bias(const Mat& y, const Mat& bias, cudaStream_t s);
cudaError_t launch_rms_norm(const Mat& x, const Mat& weight, float eps, const Mat& y, cudaStream_t s);
cudaError_t launch_swiglu(const Mat& gate, const Mat& up, const Mat& out, cudaStream_t s);
cudaError_t launch_add(const Mat& a, const Mat& b, const Mat& out, cudaStream_t s);
cudaError_t launch_softmax_rows(const Mat& x, cudaStream_t s);
// tokens: device array of out.rows ids.
cudaError_t launch_embedding(const Mat& table, const std::int32_t* tokens, std::int64_t vocab_begin,
                             const Mat& out, cudaStream_t s);
// Any plain or block type to any plain type (block types dequantised exactly, as the CPU does).
cudaError_t launch_convert(const Mat& src, const Mat& dst, cudaStream_t s);
// x f32 [T, n_heads * head_dim]; positions: device [T]; inv_freq: device [head_dim / 2]
// doubles (rope_inv_freq): angles and their cos/sin in double, rounded to f32 as RopeTable does.
cudaError_t launch_rope(const Mat& x, int n_heads, int head_dim, const std::int32_t* positions,
                        const double* inv_freq, cudaStream_t s);
// y = beta * y (a matmul with K = 0).
cudaError_t launch_scale(const Mat& y, float beta, cudaStream_t s);

// ---- matmul.cu ------------------------------------------------------------------------
inline constexpr int kGemvMaxRows = 8;
// True when launch_gemv takes these operands: x.rows <= 8, w bf16/f16, K a multiple of 8 and
// every row of x (f32) and w 16-byte aligned (the kernel reads both with 16-byte loads).
bool gemv_supported(const Mat& x, const Mat& w);
// y[M,N] = x[M,K] w[N,K]^T + beta y: streams w once, each warp 4 rows of w, f32 accumulation.
cudaError_t launch_gemv(const Mat& x, const Mat& w, const Mat& y, float beta, cudaStream_t s);

// ---- attention.cu ---------------------------------------------------------------------
// One query row's keys and values: head g's position p is at k + g * head_stride + p * pos_stride.
struct KvRef {
  const void* k = nullptr;
  const void* v = nullptr;
  std::int64_t k_head_stride = 0, k_pos_stride = 0, v_head_stride = 0, v_pos_stride = 0;
  std::int64_t length = 0;  // keys 0..length-1 are attended to
};

struct AttentionArgs {
  const float* q = nullptr;  // [rows, n_heads * head_dim], row stride ldq
  std::int64_t ldq = 0;
  void* out = nullptr;       // same shape, row stride ldo (elements of out_type)
  Elem out_type = Elem::kF32;  // kF32, or kBF16/kF16 for the GEMM after it
  std::int64_t ldo = 0;
  const KvRef* kv = nullptr;  // device array, one per query row
  std::int64_t rows = 0;
  std::int64_t max_length = 0;  // max of kv[r].length, to size the split-K grid
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 0.0f;
  Elem cache = Elem::kF32;  // kF32 or kBF16
};

// head_dim may be anything up to this (the host side checks).
inline constexpr int kAttentionMaxHeadDim = 256;
// Splits of the keys that launch_attention uses for these arguments (1: no partials).
int attention_splits(const AttentionArgs& a, int sm_count);
// Bytes of scratch launch_attention needs for `splits` > 1 (0 for 1).
std::size_t attention_scratch_bytes(const AttentionArgs& a, int splits);
// Flash-decoding: every query row attends to its own KvRef; split-K over the keys with a
// second pass that merges the partial softmaxes. scratch: attention_scratch_bytes bytes.
cudaError_t launch_attention(const AttentionArgs& a, int splits, void* scratch, cudaStream_t s);

// Where a KV write goes, read by the kernel from device memory (so a captured graph writes
// to this step's slot and position): the cache's pointers and strides (length unused) and
// the first position.
struct KvWriteArgs {
  KvRef cache;
  std::int64_t start_pos = 0;
};
// k_new/v_new f32 [T, n_kv_heads * head_dim] into the cache at positions start_pos.. (args:
// a device pointer); cache element type kF32, kBF16 or kF16.
cudaError_t launch_kv_write(const Mat& k_new, const Mat& v_new, const KvWriteArgs* args, Elem type, int n_kv_heads,
                            int head_dim, cudaStream_t s);

// ---- bench.cu (device_bench.hpp) -------------------------------------------------------
// Word i of a filled buffer is a fixed function of i; pattern_xor (host) is the XOR of the
// first `words` of them, which launch_read_stream must reproduce.
cudaError_t launch_fill_pattern(std::uint32_t* p, std::uint64_t words, cudaStream_t s);
std::uint32_t pattern_xor(std::uint64_t words);
// XORs every 32-bit word of p[0, bytes) (bytes a multiple of 16, p 16-byte aligned) into
// *xor_out (which the caller zeroes first).
cudaError_t launch_read_stream(const void* p, std::uint64_t bytes, std::uint32_t* xor_out, int sm_count,
                               cudaStream_t s);

}  // namespace trellis::kernels::cuda
