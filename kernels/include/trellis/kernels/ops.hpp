// The compute ops of a Llama-family decoder, device-agnostic: each takes a Context and
// TensorViews, checks shapes/dtypes/devices (throwing trellis::Error kInvalidArgument that
// names the op and the offending view, or kUnsupported for a dtype/device combination that is
// not implemented), and dispatches to the backend of the views' device. Every op is
// implemented on the CPU and on CUDA except where it says otherwise.
//
// Unless stated otherwise: activations are f32 matrices [rows, cols] (see tensor.hpp for the
// row-stride convention), outputs are written, never accumulated, and an output may alias an
// input only where the op says so. On the CPU, ops run on the Context's threads and return
// when done; on CUDA they are enqueued on the context's stream (context.hpp).
#pragma once

#include <cstdint>
#include <span>

#include "trellis/kernels/context.hpp"
#include "trellis/kernels/tensor.hpp"

namespace trellis::kernels {

// ---- linear algebra --------------------------------------------------------------------

// Which implementation runs a matmul. kAuto picks by shape and dtype (kernels/README.md says
// how and why); the others force one, for benchmarks and tests.
// The most rows matmul's kAuto gives the GEMV (it takes f32 x); more go to a GEMM, which on
// CUDA takes x in the weight's 16-bit type as it is.
inline constexpr std::int64_t kGemvMaxRows = 8;

enum class MatmulAlgo : std::uint8_t {
  kAuto,
  kGemv,   // memory-bound small-M path (streams the weights once); M <= 8
  kGemm,   // our cache-blocked AVX-512 GEMM (weights converted to f32 while packing)
  kBlas,   // OpenBLAS cblas_sgemm (non-f32 weights converted to f32 first)
  kOnednn, // oneDNN's f32 matmul primitive (non-f32 weights converted to f32 first)
  // oneDNN's bf16 matmul: x is ROUNDED TO BF16 (a pass counted in its time), w must be bf16,
  // f32 accumulation and output. Changes results (x loses 16 bits), so kAuto never picks it:
  // opt in where 2x prefill is worth it. On CUDA: as kGemm.
  kOnednnBf16,
};

struct MatmulOptions {
  // y = x * w^T + beta * y. beta 0 (the default) ignores what y held (may be garbage/NaN).
  float beta = 0.0f;
  MatmulAlgo algo = MatmulAlgo::kAuto;
};

// y[M,N] = x[M,K] * w[N,K]^T, the linear layer with weights stored [out, in].
//  x: f32; w: f32, bf16 or f16; y: f32. Accumulation in f32.
//  w may also be block-quantised (kQ4_1, kQ8_0; K a multiple of 32): then x is quantised to
//  8 bits per block and the products are integer dot products, as llama.cpp computes them
//  (quant.hpp); opt.algo is ignored.
//  Small M (decode) takes the memory-bound path that streams w once for all rows of x;
//  large M (prefill) takes the GEMM path. kernels/README.md says which code runs each case
//  and why. y must not alias x or w.
//  CUDA: cuBLASLt (bf16/f16 weights: x rounded to the weight type first, f32 accumulation),
//  and for M <= 8 with bf16/f16 weights a GEMV kernel (x kept in f32). x may also be of the
//  weight's 16-bit type there (cuBLASLt takes it as it is, no rounding pass). Block-quantised
//  weights are not supported on CUDA (kUnsupported): convert them to bf16 at load.
void matmul(const Context& ctx, const TensorView& x, const TensorView& w, const TensorView& y,
            const MatmulOptions& opt = {});

// y[m, :] += bias[:] for every row (Qwen2's q/k/v biases). bias: f32, bf16 or f16, length N.
void add_bias(const Context& ctx, const TensorView& y, const TensorView& bias);

// ---- elementwise and normalisation -----------------------------------------------------

// y = x / sqrt(mean(x^2) + eps) * weight, per row. weight: [D] f32, bf16 or f16. y may be x.
// On CUDA y may also be bf16/f16 (the result rounded once, as a 16-bit GEMM after it would
// round it: the model's prefill hands it to such a GEMM without a conversion pass).
void rms_norm(const Context& ctx, const TensorView& x, const TensorView& weight, float eps,
              const TensorView& y);

// out = silu(gate) * up elementwise, silu(g) = g / (1 + exp(-g)). out may be gate or up. On
// CUDA out may also be bf16/f16 (rounded once; see rms_norm).
void swiglu(const Context& ctx, const TensorView& gate, const TensorView& up,
            const TensorView& out);

// out = a + b elementwise (the residual add). out may be a or b.
void add(const Context& ctx, const TensorView& a, const TensorView& b, const TensorView& out);

// In-place softmax of each row of x (f32), numerically stable (max subtracted).
void softmax_rows(const Context& ctx, const TensorView& x);

// out[i, :] = table[tokens[i] - vocab_begin, :] converted to f32, or zeros when the token is
// outside [vocab_begin, vocab_begin + table.rows()) — the vocabulary-parallel embedding of
// Megatron (each rank holds a slice; the all-reduce of the outputs completes the lookup).
// table: [V_local, D] f32, bf16, f16 or block-quantised (rows dequantised exactly). out: [tokens.size(), D] f32. A negative token throws.
void embedding(const Context& ctx, const TensorView& table, std::span<const std::int32_t> tokens,
               std::int64_t vocab_begin, const TensorView& out);

// dst = src with dtype conversion (any of f32, bf16, f16 to any); same shape (as matrices).
// f32 -> bf16/f16 rounds to nearest even. src may also be block-quantised (kQ4_1, kQ8_0):
// it is dequantised exactly as quant.hpp's dequantize_row does, then rounded to dst's type
// (how a GGUF checkpoint's weights become bf16 on a GPU at load).
void convert(const Context& ctx, const TensorView& src, const TensorView& dst);

// ---- memory ----------------------------------------------------------------------------

// dst = src byte for byte, between any two devices: host to GPU, GPU to host, GPU to GPU, host
// to host. Same dtype and shape (as matrices; rows may be strided, e.g. a column slice).
// Copies that involve a GPU need a CUDA context (any other operand may be on the CPU) and
// run on its stream; a copy to or from host memory has finished when copy() returns, a GPU to
// GPU copy is enqueued like any op. A CPU context copies host to host only.
void copy(const Context& ctx, const TensorView& src, const TensorView& dst);

}  // namespace trellis::kernels
