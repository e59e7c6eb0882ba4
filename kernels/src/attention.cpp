// Checks for the attention entry points and the KvCache owner; the math is in cpu/.
#include "trellis/kernels/attention.hpp"

#include "cpu/cpu_ops.hpp"
#include "cuda/cuda_ops.hpp"
#include "trellis/core/error.hpp"

namespace trellis::kernels {
namespace {

void check_dims(const char* op, const AttentionDims& d) {
  if (d.n_heads <= 0 || d.n_kv_heads <= 0 || d.head_dim <= 0 || d.n_heads % d.n_kv_heads != 0)
    throw_error(ErrorCode::kInvalidArgument,
                "{}: need n_heads a positive multiple of n_kv_heads and head_dim > 0 (got {} heads, {} KV heads, "
                "head_dim {})",
                op, d.n_heads, d.n_kv_heads, d.head_dim);
}

void check_kv(const Context& ctx, const char* op, const KvView& kv, const AttentionDims* d, int kv_heads, int head_dim) {
  for (const TensorView* t : {&kv.k, &kv.v}) {
    ctx.check_device(op, *t);
    if (t->ndim != 3 || t->stride[2] != 1)
      throw_error(ErrorCode::kInvalidArgument, "{}: KV cache view {} must be [kv_heads, capacity, head_dim] with head_dim contiguous",
                  op, t->describe());
    if (t->shape[0] != kv_heads || t->shape[2] != head_dim)
      throw_error(ErrorCode::kInvalidArgument, "{}: KV cache view {} should have {} heads of dim {}", op, t->describe(),
                  kv_heads, head_dim);
  }
  if (kv.k.dtype != kv.v.dtype || kv.k.shape[1] != kv.v.shape[1])
    throw_error(ErrorCode::kInvalidArgument, "{}: K {} and V {} differ in dtype or capacity", op, kv.k.describe(),
                kv.v.describe());
  if (kv.k.dtype == DType::kF16 && d != nullptr)
    throw_error(ErrorCode::kUnsupported, "{}: f16 KV caches are not supported (use f32 or bf16)", op);
}

TensorView f32_rows(const Context& ctx, const char* op, const TensorView& v, std::int64_t cols, const char* what,
                    bool cuda_16bit_ok = false) {
  ctx.check_device(op, v);
  TensorView m = v.as_matrix();
  const bool sixteen = cuda_16bit_ok && ctx.device() == Device::kCuda && (m.dtype == DType::kBF16 || m.dtype == DType::kF16);
  if ((m.dtype != DType::kF32 && !sixteen) || m.cols() != cols)
    throw_error(ErrorCode::kInvalidArgument, "{}: {} {} should be f32{} with {} columns", op, what, m.describe(),
                cuda_16bit_ok ? " (or bf16/f16 on CUDA)" : "", cols);
  return m;
}

}  // namespace

void kv_write(const Context& ctx, const KvView& kv, const TensorView& k_new, const TensorView& v_new,
              std::int64_t start_pos) {
  const char* op = "kv_write";
  auto hkv = static_cast<int>(kv.k.shape[0]);
  auto d = static_cast<int>(kv.k.shape[2]);
  check_kv(ctx, op, kv, nullptr, hkv, d);
  TensorView k = f32_rows(ctx, op, k_new, static_cast<std::int64_t>(hkv) * d, "new keys");
  TensorView v = f32_rows(ctx, op, v_new, static_cast<std::int64_t>(hkv) * d, "new values");
  if (k.rows() != v.rows())
    throw_error(ErrorCode::kInvalidArgument, "kv_write: {} keys but {} values", k.rows(), v.rows());
  if (start_pos < 0 || start_pos + k.rows() > kv.capacity())
    throw_error(ErrorCode::kResourceExhausted, "kv_write: positions [{}, {}) do not fit a KV cache of capacity {}",
                start_pos, start_pos + k.rows(), kv.capacity());
  if (ctx.device() == Device::kCuda) return cuda::kv_write(ctx, kv, k, v, start_pos);
  cpu::kv_write(ctx.pool(), kv, k, v, start_pos);
}

void attention_prefill(const Context& ctx, const AttentionDims& dims, const TensorView& q, const KvView& kv,
                       std::int64_t start_pos, const TensorView& out) {
  const char* op = "attention_prefill";
  check_dims(op, dims);
  check_kv(ctx, op, kv, &dims, dims.n_kv_heads, dims.head_dim);
  std::int64_t width = static_cast<std::int64_t>(dims.n_heads) * dims.head_dim;
  TensorView qm = f32_rows(ctx, op, q, width, "queries");
  TensorView om = f32_rows(ctx, op, out, width, "output", /*cuda_16bit_ok=*/true);
  if (qm.rows() != om.rows())
    throw_error(ErrorCode::kInvalidArgument, "{}: {} queries but output {} has {} rows", op, qm.rows(), om.describe(), om.rows());
  if (start_pos < 0 || start_pos + qm.rows() > kv.capacity())
    throw_error(ErrorCode::kInvalidArgument, "{}: positions [{}, {}) exceed the KV cache capacity {}", op, start_pos,
                start_pos + qm.rows(), kv.capacity());
  if (qm.rows() == 0) return;
  if (ctx.device() == Device::kCuda) return cuda::attention_prefill(ctx, dims, qm, kv, start_pos, om);
  cpu::attention_prefill(ctx.pool(), dims, qm, kv, start_pos, om);
}

void attention_decode(const Context& ctx, const AttentionDims& dims, const TensorView& q, std::span<const KvView> kv,
                      std::span<const std::int64_t> lengths, const TensorView& out) {
  const char* op = "attention_decode";
  check_dims(op, dims);
  std::int64_t width = static_cast<std::int64_t>(dims.n_heads) * dims.head_dim;
  TensorView qm = f32_rows(ctx, op, q, width, "queries");
  TensorView om = f32_rows(ctx, op, out, width, "output", /*cuda_16bit_ok=*/true);
  auto batch = static_cast<std::size_t>(qm.rows());
  if (om.rows() != qm.rows() || kv.size() != batch || lengths.size() != batch)
    throw_error(ErrorCode::kInvalidArgument, "{}: {} queries, {} output rows, {} KV views and {} lengths must agree", op,
                batch, om.rows(), kv.size(), lengths.size());
  for (std::size_t b = 0; b < batch; ++b) {
    check_kv(ctx, op, kv[b], &dims, dims.n_kv_heads, dims.head_dim);
    if (kv[b].k.dtype != kv[0].k.dtype)
      throw_error(ErrorCode::kInvalidArgument, "{}: sequence {} has a {} cache but sequence 0 has {}", op, b,
                  to_string(kv[b].k.dtype), to_string(kv[0].k.dtype));
    if (lengths[b] < 1 || lengths[b] > kv[b].capacity())
      throw_error(ErrorCode::kInvalidArgument, "{}: sequence {} has length {} outside [1, capacity {}]", op, b,
                  lengths[b], kv[b].capacity());
  }
  if (batch == 0) return;
  if (ctx.device() == Device::kCuda) return cuda::attention_decode(ctx, dims, qm, kv, lengths, om);
  cpu::attention_decode(ctx.pool(), dims, qm, kv, lengths, om);
}

void attention_tree(const Context& ctx, const AttentionDims& dims, const TensorView& q, const KvView& kv,
                    std::int64_t prefix, std::int64_t chunk_start, std::span<const std::int32_t> parents,
                    const TensorView& out) {
  const char* op = "attention_tree";
  check_dims(op, dims);
  check_kv(ctx, op, kv, &dims, dims.n_kv_heads, dims.head_dim);
  std::int64_t width = static_cast<std::int64_t>(dims.n_heads) * dims.head_dim;
  TensorView qm = f32_rows(ctx, op, q, width, "queries");
  TensorView om = f32_rows(ctx, op, out, width, "output", /*cuda_16bit_ok=*/true);
  const std::int64_t t_count = qm.rows();
  if (om.rows() != t_count)
    throw_error(ErrorCode::kInvalidArgument, "{}: {} queries but output {} has {} rows", op, t_count, om.describe(),
                om.rows());
  if (static_cast<std::int64_t>(parents.size()) != t_count)
    throw_error(ErrorCode::kInvalidArgument, "{}: {} queries but {} parents", op, t_count, parents.size());
  if (prefix < 0 || prefix > chunk_start)
    throw_error(ErrorCode::kInvalidArgument, "{}: prefix {} must be in [0, chunk_start {}]", op, prefix, chunk_start);
  if (chunk_start + t_count > kv.capacity())
    throw_error(ErrorCode::kInvalidArgument, "{}: chunk positions [{}, {}) exceed the KV cache capacity {}", op,
                chunk_start, chunk_start + t_count, kv.capacity());
  for (std::int64_t t = 0; t < t_count; ++t) {
    const std::int32_t p = parents[static_cast<std::size_t>(t)];
    if (p < -1 || p >= t)
      throw_error(ErrorCode::kInvalidArgument, "{}: parents[{}] is {}; a parent must be -1 or an earlier token (< {})",
                  op, t, p, t);
  }
  if (t_count == 0) return;
  if (ctx.device() == Device::kCuda) return cuda::attention_tree(ctx, dims, qm, kv, prefix, chunk_start, parents, om);
  cpu::attention_tree(ctx.pool(), dims, qm, kv, prefix, chunk_start, parents, om);
}

void kv_copy(const Context& ctx, const KvView& kv, std::int64_t src, std::int64_t dst, std::int64_t count) {
  const char* op = "kv_copy";
  check_kv(ctx, op, kv, nullptr, static_cast<int>(kv.k.shape[0]), static_cast<int>(kv.k.shape[2]));
  if (count < 0 || src < 0 || dst < 0 || src + count > kv.capacity() || dst + count > kv.capacity())
    throw_error(ErrorCode::kInvalidArgument,
                "{}: copying {} positions from {} to {} leaves the KV cache of capacity {} (ranges [{}, {}) -> [{}, {}))",
                op, count, src, dst, kv.capacity(), src, src + count, dst, dst + count);
  if (count == 0 || src == dst) return;
  if (ctx.device() == Device::kCuda) return cuda::kv_copy(ctx, kv, src, dst, count);
  cpu::kv_copy(kv, src, dst, count);
}

KvCache::KvCache(int n_layers, int n_slots, int n_kv_heads, std::int64_t capacity, int head_dim, DType dtype,
                 Device device)
    : n_layers_(n_layers), n_slots_(n_slots), n_kv_heads_(n_kv_heads), head_dim_(head_dim), capacity_(capacity) {
  if (n_layers <= 0 || n_slots <= 0 || n_kv_heads <= 0 || capacity <= 0 || head_dim <= 0)
    throw_error(ErrorCode::kInvalidArgument,
                "KvCache: layers {}, slots {}, KV heads {}, capacity {} and head_dim {} must all be positive", n_layers,
                n_slots, n_kv_heads, capacity, head_dim);
  if (dtype == DType::kF16) throw_error(ErrorCode::kUnsupported, "KvCache: f16 caches are not supported (use f32 or bf16)");
  // Flat [layers * slots * 2, kv_heads * capacity * head_dim]: views carve the 3-D planes.
  storage_ = Tensor::zeros(dtype, {static_cast<std::int64_t>(n_layers) * n_slots * 2,
                                   static_cast<std::int64_t>(n_kv_heads) * capacity * head_dim}, device);
}

KvView KvCache::view(int layer, int slot) const {
  if (layer < 0 || layer >= n_layers_ || slot < 0 || slot >= n_slots_)
    throw_error(ErrorCode::kInvalidArgument, "KvCache: layer {} / slot {} outside {} layers x {} slots", layer, slot,
                n_layers_, n_slots_);
  const std::int64_t plane = static_cast<std::int64_t>(n_kv_heads_) * capacity_ * head_dim_;
  const std::size_t es = dtype_size(storage_.view().dtype);
  auto* base = static_cast<std::byte*>(storage_.view().data) +
               static_cast<std::size_t>((static_cast<std::int64_t>(layer) * n_slots_ + slot) * 2 * plane) * es;
  std::int64_t shape[3] = {n_kv_heads_, capacity_, head_dim_};
  KvView v;
  v.k = TensorView::contiguous(base, storage_.view().dtype, shape, storage_.view().device);
  v.v = TensorView::contiguous(base + static_cast<std::size_t>(plane) * es, storage_.view().dtype, shape,
                               storage_.view().device);
  return v;
}

}  // namespace trellis::kernels
