// Internal: the CPU implementations behind the public ops. Arguments are already validated
// by kernels/src (shapes, dtypes, devices); these functions only compute.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "trellis/kernels/attention.hpp"
#include "trellis/kernels/context.hpp"
#include "trellis/kernels/ops.hpp"
#include "trellis/kernels/rope.hpp"

namespace trellis::kernels::cpu {

// C[M,N] = A[M,K] * B[N,K]^T + beta * C, A and C f32, B f32/bf16/f16; leading dimensions in
// elements.
struct GemmArgs {
  std::int64_t m = 0, n = 0, k = 0;
  const float* a = nullptr;
  std::int64_t lda = 0;
  const void* b = nullptr;
  DType b_type = DType::kF32;
  std::int64_t ldb = 0;
  float* c = nullptr;
  std::int64_t ldc = 0;
  float beta = 0.0f;
};

// Streams B once for all (few) rows of A; the decode path. M <= kGemvMaxRows.
inline constexpr std::int64_t kGemvMaxRows = 8;
void gemv(ThreadPool& pool, const GemmArgs& g);
// gemv's arithmetic for any M (chunks of 4 rows): a row's result does not depend on the
// other rows (Context::batch_invariant).
void gemv_invariant(ThreadPool& pool, const GemmArgs& g);
// Our cache-blocked AVX-512 GEMM: B packed to f32 panels (converting bf16/f16 on the way).
void gemm_packed(ThreadPool& pool, const GemmArgs& g);
// OpenBLAS cblas_sgemm; non-f32 B is converted to f32 in row blocks first.
void gemm_blas(ThreadPool& pool, const GemmArgs& g);
// Calls f with g's B as f32: g itself when B is f32, else blocks of up to 256 rows of B
// widened to f32 in per-thread scratch (C and N of each block's args offset to match). For
// libraries that take f32 weights only.
void for_f32_weight_blocks(const GemmArgs& g, const std::function<void(const GemmArgs&)>& f);
// oneDNN (onednn.cpp): its f32 matmul primitive (B widened by for_f32_weight_blocks), and its
// bf16 one (A rounded to bf16 first, B must be bf16). The pool's threads each run oneDNN
// single-threaded on blocks of columns; primitives are created once per shape, strides and
// beta, and cached.
void gemm_onednn(ThreadPool& pool, const GemmArgs& g);
void gemm_onednn_bf16(ThreadPool& pool, const GemmArgs& g);
// Whether oneDNN's effective ISA (dnnl_get_effective_cpu_isa) includes AVX-512 (avx512_core),
// where its f32 matmul is a JIT brgemm kernel.
bool onednn_has_avx512();
// Whether OpenBLAS loaded AVX-512 kernels (its core name; gemm.cpp).
bool blas_uses_avx512();
// The library kAuto takes for M > kGemvMaxRows with B of type t (never kOnednnBf16).
MatmulAlgo prefill_algo(DType t);

void matmul(ThreadPool& pool, const GemmArgs& g, MatmulAlgo algo);
// B block-quantised (kQ4_1 or kQ8_0; K and ldb multiples of 32): A's rows are quantised to
// 8 bits and multiplied with integer dot products, as llama.cpp does (quant.hpp, quant.cpp).
void quant_matmul(ThreadPool& pool, const GemmArgs& g);

// Elementwise ops on validated matrix views (see ops.hpp for the semantics).
void add_bias(ThreadPool& pool, const TensorView& y, const TensorView& bias);
void rms_norm(ThreadPool& pool, const TensorView& x, const TensorView& weight, float eps, const TensorView& y);
void swiglu(ThreadPool& pool, const TensorView& gate, const TensorView& up, const TensorView& out);
void add(ThreadPool& pool, const TensorView& a, const TensorView& b, const TensorView& out);
void softmax_rows(ThreadPool& pool, const TensorView& x);
void embedding(ThreadPool& pool, const TensorView& table, std::span<const std::int32_t> tokens,
               std::int64_t vocab_begin, const TensorView& out);
void convert(ThreadPool& pool, const TensorView& src, const TensorView& dst);
void apply_rope(ThreadPool& pool, const RopeTable& table, const TensorView& x, int n_heads,
                std::span<const std::int32_t> positions);

// Attention (see attention.hpp).
void kv_write(ThreadPool& pool, const KvView& kv, const TensorView& k_new, const TensorView& v_new,
              std::int64_t start_pos);
void attention_prefill(ThreadPool& pool, const AttentionDims& dims, const TensorView& q, const KvView& kv,
                       std::int64_t start_pos, const TensorView& out);
void attention_decode(ThreadPool& pool, const AttentionDims& dims, const TensorView& q,
                      std::span<const KvView> kv, std::span<const std::int64_t> lengths, const TensorView& out);
void attention_tree(ThreadPool& pool, const AttentionDims& dims, const TensorView& q, const KvView& kv,
                    std::int64_t prefix, std::int64_t chunk_start, std::span<const std::int32_t> parents,
                    const TensorView& out);
void kv_copy(const KvView& kv, std::int64_t src, std::int64_t dst, std::int64_t count);

}  // namespace trellis::kernels::cpu
