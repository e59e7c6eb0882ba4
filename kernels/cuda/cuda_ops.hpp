// Internal: the CUDA backend behind the public ops, as kernels/src/ calls it. Plain C++ (no
// CUDA headers), so src/ compiles the same with or without CUDA: a build without the
// toolkit links absent.cpp instead, where every function throws kUnsupported saying why.
//
// Arguments are validated by kernels/src/ (shapes, dtypes, that every view is on the
// context's device) before these run; the context is a CUDA one. What is left to check here
// is what only the CUDA backend limits (head_dim, quantised matmul weights).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "trellis/kernels/attention.hpp"
#include "trellis/kernels/context.hpp"
#include "trellis/kernels/library.hpp"
#include "trellis/kernels/ops.hpp"
#include "trellis/kernels/rope.hpp"

namespace trellis::kernels::cuda {

// Context state (runtime.cpp).
CudaState* create_state(int gpu);
void destroy_state(CudaState* s) noexcept;
void synchronize(const CudaState& s);
void* stream_of(const CudaState& s);

// Device memory for Tensor (runtime.cpp): cudaMalloc on the current device, 256-byte aligned.
void* device_alloc(std::size_t bytes);
void device_free(void* p) noexcept;
void device_zero(void* p, std::size_t bytes);  // returns when the memory is zero

void copy(const Context& ctx, const TensorView& src, const TensorView& dst);
CudaKernelsInfo info();

// Ops (ops.cpp, attention.cpp); views are matrices (as_matrix) except the KV views.
void matmul(const Context& ctx, const TensorView& x, const TensorView& w, const TensorView& y, const MatmulOptions& opt);
void add_bias(const Context& ctx, const TensorView& y, const TensorView& bias);
void rms_norm(const Context& ctx, const TensorView& x, const TensorView& weight, float eps, const TensorView& y);
void swiglu(const Context& ctx, const TensorView& gate, const TensorView& up, const TensorView& out);
void add(const Context& ctx, const TensorView& a, const TensorView& b, const TensorView& out);
void softmax_rows(const Context& ctx, const TensorView& x);
void embedding(const Context& ctx, const TensorView& table, std::span<const std::int32_t> tokens,
               std::int64_t vocab_begin, const TensorView& out);
void convert(const Context& ctx, const TensorView& src, const TensorView& dst);
void apply_rope(const Context& ctx, const RopeTable& table, const TensorView& x, int n_heads,
                std::span<const std::int32_t> positions);
void kv_write(const Context& ctx, const KvView& kv, const TensorView& k_new, const TensorView& v_new,
              std::int64_t start_pos);
void attention_prefill(const Context& ctx, const AttentionDims& dims, const TensorView& q, const KvView& kv,
                       std::int64_t start_pos, const TensorView& out);
void attention_decode(const Context& ctx, const AttentionDims& dims, const TensorView& q, std::span<const KvView> kv,
                      std::span<const std::int64_t> lengths, const TensorView& out);
// No CUDA kernel yet: throws kUnsupported (SWIFT runs on CPU ranks).
void attention_tree(const Context& ctx, const AttentionDims& dims, const TensorView& q, const KvView& kv,
                    std::int64_t prefix, std::int64_t chunk_start, std::span<const std::int32_t> parents,
                    const TensorView& out);
// Device-to-device copies on the context's stream; overlapping ranges go through scratch.
void kv_copy(const Context& ctx, const KvView& kv, std::int64_t src, std::int64_t dst, std::int64_t count);

}  // namespace trellis::kernels::cuda
