// Causal grouped-query attention over a KV cache, for prefill and decode.
//
// KV cache layout (one sequence, one layer): K and V are each a 3-D view
//     [n_kv_heads, capacity, head_dim]      (head_dim contiguous, f32 or bf16)
// so one KV head's keys for positions 0..len-1 are one contiguous run of len * head_dim
// elements (decode streams them once per query head group). Position p of a sequence lives at
// index p (no ring buffer); a sequence longer than capacity is an error. KvCache below owns
// such views for n_layers x n_slots; a model may also build KvViews over its own memory.
//
// GQA: query head h uses KV head h / (n_heads / n_kv_heads); n_heads must be a multiple of
// n_kv_heads. Q, K_new, V_new and the output are f32 matrices whose rows are tokens and whose
// columns are heads * head_dim (head-major), possibly with a larger row stride (views into a
// fused qkv buffer are fine).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "trellis/kernels/context.hpp"
#include "trellis/kernels/tensor.hpp"

namespace trellis::kernels {

struct AttentionDims {
  int n_heads = 0;     // query heads (on this rank)
  int n_kv_heads = 0;  // key/value heads (on this rank)
  int head_dim = 0;
  float scale = 0.0f;  // softmax scale; 0 means 1/sqrt(head_dim)
};

struct KvView {
  TensorView k;  // [n_kv_heads, capacity, head_dim]
  TensorView v;  // [n_kv_heads, capacity, head_dim]
  std::int64_t capacity() const { return k.shape[1]; }
};

// Writes T new tokens' keys and values (k_new, v_new: [T, n_kv_heads * head_dim] f32) into the
// cache at positions [start_pos, start_pos + T), converting to the cache dtype. Throws
// kResourceExhausted when start_pos + T > capacity.
void kv_write(const Context& ctx, const KvView& kv, const TensorView& k_new,
              const TensorView& v_new, std::int64_t start_pos);

// Prefill (or a chunk of it) for one sequence: q is [T, n_heads * head_dim] for positions
// [start_pos, start_pos + T); the cache must already hold positions [0, start_pos + T) (call
// kv_write first). Query t attends to keys 0..start_pos + t. out: [T, n_heads * head_dim].
// out may not alias q. On CUDA out may be bf16/f16 (each value rounded once, for the
// o-projection GEMM after it, which then takes it as it is); f32 elsewhere.
void attention_prefill(const Context& ctx, const AttentionDims& dims, const TensorView& q,
                       const KvView& kv, std::int64_t start_pos, const TensorView& out);

// Decode for a batch of B sequences, one new query token each: q row b attends to keys
// 0..lengths[b]-1 of kv[b] (lengths include the new token, already written with kv_write).
// Sequences may have different lengths. q, out: [B, n_heads * head_dim].
void attention_decode(const Context& ctx, const AttentionDims& dims, const TensorView& q,
                      std::span<const KvView> kv, std::span<const std::int64_t> lengths,
                      const TensorView& out);

// Tree attention: SWIFT's verification of a token tree in one forward pass (also a draft
// forward over tokens whose keys sit in scratch positions past the committed prefix).
//
// q: [T, n_heads * head_dim] for the T tokens of the chunk. Chunk token t's key and value sit
// at cache position chunk_start + t (written with kv_write first). parents[t] is the index in
// the chunk of t's parent (-1 for a root; otherwise < t, so a parent precedes its children).
// Query t attends to the committed prefix, cache positions [0, prefix), and to position
// chunk_start + a for every a on its path to the root: t, parents[t], parents[parents[t]], ...
// Positions [prefix, chunk_start) are ignored (stale drafts), as are the chunk's other
// branches. A chain (parents[t] = t - 1) with prefix == chunk_start is attention_prefill at
// start_pos = chunk_start (the CPU kernel gives the same bits).
//
// Requires 0 <= prefix <= chunk_start, chunk_start + T <= capacity, parents.size() == T and
// -1 <= parents[t] < t; otherwise throws kInvalidArgument. out: [T, n_heads * head_dim]; out
// may not alias q. CPU only for now: a CUDA context throws kUnsupported.
void attention_tree(const Context& ctx, const AttentionDims& dims, const TensorView& q, const KvView& kv,
                    std::int64_t prefix, std::int64_t chunk_start, std::span<const std::int32_t> parents,
                    const TensorView& out);

// Copies the keys and values at cache positions [src, src + count) of one KV view (one layer
// and slot) to positions [dst, dst + count), for every KV head; the two ranges may overlap
// (memmove semantics). Used to compact an accepted tree path to consecutive positions. Any
// cache dtype. Throws kInvalidArgument when a range is negative or outside the capacity.
void kv_copy(const Context& ctx, const KvView& kv, std::int64_t src, std::int64_t dst, std::int64_t count);

// Owns K/V memory for n_layers x n_slots sequences of up to `capacity` tokens, laid out as
// above. Not thread-safe to create/destroy; views may be used from any thread.
class KvCache {
 public:
  KvCache() = default;
  KvCache(int n_layers, int n_slots, int n_kv_heads, std::int64_t capacity, int head_dim,
          DType dtype = DType::kF32, Device device = Device::kCpu);

  KvView view(int layer, int slot) const;
  int n_layers() const { return n_layers_; }
  int n_slots() const { return n_slots_; }
  std::int64_t capacity() const { return capacity_; }
  std::size_t bytes() const { return storage_.bytes(); }

 private:
  int n_layers_ = 0, n_slots_ = 0, n_kv_heads_ = 0, head_dim_ = 0;
  std::int64_t capacity_ = 0;
  Tensor storage_;  // [n_layers][n_slots][k, v][n_kv_heads][capacity][head_dim], flat
};

}  // namespace trellis::kernels
