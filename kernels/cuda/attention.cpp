// Host side of attention and the KV write on CUDA: describe each query row's cache (KvRef),
// stage the descriptors in the context's scratch, pick the split-K factor and launch
// (attention.cu). Also kv_copy (plain device-to-device copies) and the attention_tree
// refusal (no CUDA kernel yet). Semantics and layout: attention.hpp.
#include <algorithm>
#include <cmath>
#include <cstddef>
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
         std::int64_t capacity, const TensorView& out) {
  AttentionArgs a;
  a.q = static_cast<const float*>(q.data);
  a.ldq = q.row_stride();
  a.out = out.data;
  a.out_type = static_cast<Elem>(out.dtype);
  a.ldo = out.row_stride();
  a.rows = q.rows();
  for (const KvRef& r : refs) a.max_length = std::max(a.max_length, r.length);
  // In a CUDA graph the grid is fixed while the lengths grow: split by the capacity instead
  // (graph.hpp); splits past a row's length are empty and the merge skips them.
  if (s.mode != GraphMode::kOff) a.max_length = std::max(a.max_length, capacity);
  a.n_heads = dims.n_heads;
  a.n_kv_heads = dims.n_kv_heads;
  a.head_dim = dims.head_dim;
  a.scale = dims.scale != 0.0f ? dims.scale : 1.0f / std::sqrt(static_cast<float>(dims.head_dim));
  a.cache = static_cast<Elem>(cache);
  const int splits = attention_splits(a, s.sm_count);
  const std::size_t refs_bytes = align_up(refs.size() * sizeof(KvRef));
  auto* base = static_cast<std::byte*>(scratch(s, refs_bytes + attention_scratch_bytes(a, splits)));
  const void* kv = upload(s, base, refs.data(), refs.size() * sizeof(KvRef));
  if (filling(s)) return;
  a.kv = static_cast<const KvRef*>(kv);
  check(launch_attention(a, splits, base + refs_bytes, s.stream), "attention_kernel", s.gpu);
}

}  // namespace

void kv_write(const Context& ctx, const KvView& kv, const TensorView& k_new, const TensorView& v_new,
              std::int64_t start_pos) {
  CudaState& s = ctx.cuda_state();
  const KvWriteArgs args{ref_of(kv, 0), start_pos};
  const auto* dev = static_cast<const KvWriteArgs*>(upload(s, scratch(s, sizeof args), &args, sizeof args));
  if (filling(s)) return;
  check(launch_kv_write(mat_of(k_new), mat_of(v_new), dev, static_cast<Elem>(kv.k.dtype), static_cast<int>(kv.k.shape[0]),
                        static_cast<int>(kv.k.shape[2]), s.stream),
        "kv_write_kernel", s.gpu);
}

void attention_prefill(const Context& ctx, const AttentionDims& dims, const TensorView& q, const KvView& kv,
                       std::int64_t start_pos, const TensorView& out) {
  check_head_dim("attention_prefill", dims);
  // Query t of the chunk sees keys 0..start_pos + t: one KvRef per row, same cache.
  std::vector<KvRef> refs(static_cast<std::size_t>(q.rows()));
  for (std::size_t t = 0; t < refs.size(); ++t) refs[t] = ref_of(kv, start_pos + static_cast<std::int64_t>(t) + 1);
  run(ctx.cuda_state(), dims, q, refs, kv.k.dtype, kv.k.shape[1], out);
}

void attention_decode(const Context& ctx, const AttentionDims& dims, const TensorView& q, std::span<const KvView> kv,
                      std::span<const std::int64_t> lengths, const TensorView& out) {
  check_head_dim("attention_decode", dims);
  std::vector<KvRef> refs(kv.size());
  std::int64_t capacity = 0;
  for (std::size_t b = 0; b < kv.size(); ++b) {
    refs[b] = ref_of(kv[b], lengths[b]);
    capacity = std::max(capacity, kv[b].k.shape[1]);
  }
  run(ctx.cuda_state(), dims, q, refs, kv[0].k.dtype, capacity, out);
}

void attention_tree(const Context&, const AttentionDims&, const TensorView&, const KvView&, std::int64_t, std::int64_t,
                    std::span<const std::int32_t>, const TensorView&) {
  throw_error(ErrorCode::kUnsupported,
              "attention_tree: token-tree attention has no CUDA kernel yet; SWIFT runs on CPU ranks");
}

void kv_copy(const Context& ctx, const KvView& kv, std::int64_t src, std::int64_t dst, std::int64_t count) {
  CudaState& s = ctx.cuda_state();
  const std::size_t es = dtype_size(kv.k.dtype);
  const std::int64_t hkv = kv.k.shape[0], d = kv.k.shape[2];
  const std::size_t width = static_cast<std::size_t>(d) * es, rows = static_cast<std::size_t>(count);
  // cudaMemcpy*Async leave overlapping ranges undefined: those go through the context's
  // scratch (packed [2 * hkv][count][head_dim]), the rest copy directly.
  const bool overlap = (src < dst ? dst - src : src - dst) < count;
  std::byte* stage = overlap ? static_cast<std::byte*>(scratch(s, 2 * static_cast<std::size_t>(hkv) * rows * width))
                             : nullptr;
  if (filling(s)) return;
  auto copy_rows = [&](void* to, std::size_t to_pitch, const void* from, std::size_t from_pitch) {
    if (to_pitch == width && from_pitch == width)
      TRELLIS_CUDA_CHECK(s.gpu, cudaMemcpyAsync(to, from, rows * width, cudaMemcpyDeviceToDevice, s.stream));
    else
      TRELLIS_CUDA_CHECK(s.gpu, cudaMemcpy2DAsync(to, to_pitch, from, from_pitch, width, rows,
                                                  cudaMemcpyDeviceToDevice, s.stream));
  };
  int plane = 0;
  for (const TensorView* t : {&kv.k, &kv.v}) {
    auto* base = static_cast<std::byte*>(t->data);
    const std::size_t pitch = static_cast<std::size_t>(t->stride[1]) * es;
    for (std::int64_t g = 0; g < hkv; ++g, ++plane) {
      std::byte* head = base + static_cast<std::size_t>(g * t->stride[0]) * es;
      std::byte* from = head + static_cast<std::size_t>(src) * pitch;
      std::byte* to = head + static_cast<std::size_t>(dst) * pitch;
      if (!overlap) {
        copy_rows(to, pitch, from, pitch);
        continue;
      }
      std::byte* tmp = stage + static_cast<std::size_t>(plane) * rows * width;
      copy_rows(tmp, width, from, pitch);
      copy_rows(to, pitch, tmp, width);
    }
  }
}

}  // namespace trellis::kernels::cuda
