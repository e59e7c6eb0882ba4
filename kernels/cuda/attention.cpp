// Host side of attention and the KV write on CUDA: describe each query row's cache (KvRef),
// stage the descriptors in the context's scratch, pick the split-K factor and launch
// (attention.cu). Semantics and layout: attention.hpp.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cuda/cuda_ops.hpp"
#include "cuda/state.hpp"
#include "trellis/core/error.hpp"

namespace trellis::kernels::cuda {
namespace {

KvRef ref_of(const KvView& kv, std::int64_t length) {
  return KvRef{kv.k.data, kv.v.data, kv.k.stride[0], kv.k.stride[1], kv.v.stride[0], kv.v.stride[1], length};
}

void check_head_dim(const char* op, const AttentionDims& d) {
  if (d.head_dim > kAttentionMaxHeadDim)
    throw_error(ErrorCode::kUnsupported, "{}: head_dim {} is above the CUDA kernel's limit of {}", op, d.head_dim,
                kAttentionMaxHeadDim);
}

// Runs the attention kernel over q's rows, row r attending to refs[r].
void run(CudaState& s, const AttentionDims& dims, const TensorView& q, const std::vector<KvRef>& refs, DType cache,
         const TensorView& out) {
  AttentionArgs a;
  a.q = static_cast<const float*>(q.data);
  a.ldq = q.row_stride();
  a.out = static_cast<float*>(out.data);
  a.ldo = out.row_stride();
  a.rows = q.rows();
  for (const KvRef& r : refs) a.max_length = std::max(a.max_length, r.length);
  a.n_heads = dims.n_heads;
  a.n_kv_heads = dims.n_kv_heads;
  a.head_dim = dims.head_dim;
  a.scale = dims.scale != 0.0f ? dims.scale : 1.0f / std::sqrt(static_cast<float>(dims.head_dim));
  a.cache = static_cast<Elem>(cache);
  const int splits = attention_splits(a, s.sm_count);
  const std::size_t refs_bytes = align_up(refs.size() * sizeof(KvRef));
  auto* base = static_cast<std::byte*>(scratch(s, refs_bytes + attention_scratch_bytes(a, splits)));
  upload(s, base, refs.data(), refs.size() * sizeof(KvRef));
  a.kv = reinterpret_cast<const KvRef*>(base);
  check(launch_attention(a, splits, base + refs_bytes, s.stream), "attention_kernel", s.gpu);
}

}  // namespace

void kv_write(const Context& ctx, const KvView& kv, const TensorView& k_new, const TensorView& v_new,
              std::int64_t start_pos) {
  CudaState& s = ctx.cuda_state();
  check(launch_kv_write(mat_of(k_new), mat_of(v_new), ref_of(kv, 0), static_cast<Elem>(kv.k.dtype),
                        static_cast<int>(kv.k.shape[0]), static_cast<int>(kv.k.shape[2]), start_pos, s.stream),
        "kv_write_kernel", s.gpu);
}

void attention_prefill(const Context& ctx, const AttentionDims& dims, const TensorView& q, const KvView& kv,
                       std::int64_t start_pos, const TensorView& out) {
  check_head_dim("attention_prefill", dims);
  // Query t of the chunk sees keys 0..start_pos + t: one KvRef per row, same cache.
  std::vector<KvRef> refs(static_cast<std::size_t>(q.rows()));
  for (std::size_t t = 0; t < refs.size(); ++t) refs[t] = ref_of(kv, start_pos + static_cast<std::int64_t>(t) + 1);
  run(ctx.cuda_state(), dims, q, refs, kv.k.dtype, out);
}

void attention_decode(const Context& ctx, const AttentionDims& dims, const TensorView& q, std::span<const KvView> kv,
                      std::span<const std::int64_t> lengths, const TensorView& out) {
  check_head_dim("attention_decode", dims);
  std::vector<KvRef> refs(kv.size());
  for (std::size_t b = 0; b < kv.size(); ++b) refs[b] = ref_of(kv[b], lengths[b]);
  run(ctx.cuda_state(), dims, q, refs, kv[0].k.dtype, out);
}

}  // namespace trellis::kernels::cuda
