// LlamaModel on a GPU: host staging of weights at load, the out-of-memory advice, and the TP
// all-reduce of device buffers (a device-memory group, or staged through the host). The
// forward itself does not fork: every step calls the same kernels ops, which dispatch by the
// views' device.
#include <cmath>

#include "llama_internal.hpp"
#include "trellis/core/error.hpp"
#include "trellis/kernels/library.hpp"
#include "trellis/kernels/ops.hpp"

namespace trellis::runtime {
namespace {

std::string gib(std::size_t bytes) { return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1u << 30)); }

}  // namespace

std::size_t LlamaModel::estimate_weight_bytes(const ModelConfig& cfg, const TpLayout& L, int first_layer,
                                              int last_layer, ElemType weight_dtype) {
  const std::size_t w = elem_size(weight_dtype), f = sizeof(float);
  const auto H = static_cast<std::size_t>(cfg.hidden_size);
  const auto qkv = static_cast<std::size_t>(L.q_cols(cfg.head_dim) + 2 * L.kv_cols(cfg.head_dim));
  const auto qc = static_cast<std::size_t>(L.q_cols(cfg.head_dim)), inter = static_cast<std::size_t>(L.inter);
  std::size_t layer = 2 * H * f + qkv * H * w + H * qc * w + 3 * inter * H * w;
  if (cfg.attention_bias) layer += qkv * f;
  std::size_t n = layer * static_cast<std::size_t>(last_layer - first_layer);
  const std::size_t table = static_cast<std::size_t>(L.vocab_local()) * H * w;
  if (first_layer == 0) n += table;
  if (last_layer == cfg.num_layers) n += H * f + (cfg.tie_word_embeddings && first_layer == 0 ? 0 : table);
  return n;
}

std::size_t LlamaModel::estimate_kv_bytes(const ModelConfig& cfg, const TpLayout& L, int layers, int slots,
                                          std::int64_t capacity, kernels::DType kv_dtype) {
  return 2 * static_cast<std::size_t>(layers) * static_cast<std::size_t>(slots) * static_cast<std::size_t>(L.kv_heads) *
         static_cast<std::size_t>(capacity) * static_cast<std::size_t>(cfg.head_dim) * kernels::dtype_size(kv_dtype);
}

void LlamaModel::to_device(kernels::Tensor& t) const {
  if (device() == kernels::Device::kCpu || t.empty_tensor()) return;
  const kernels::TensorView& h = t.view();
  kernels::Tensor d = kernels::Tensor::empty(h.dtype, std::span<const std::int64_t>(h.shape.data(), h.ndim), device());
  kernels::copy(ctx_, h, d);  // host to GPU: finished when it returns, so the staging may go
  t = std::move(d);
}

void LlamaModel::load_and_allocate(const CheckpointReader& reader, const LoadOptions& opt, std::int64_t capacity) {
  const bool gpu = device() != kernels::Device::kCpu;
  try {
    load(reader, opt);
    kv_ = kernels::KvCache(last_ - first_, opt.max_slots, tp_layout_.kv_heads, capacity, cfg_.head_dim, opt.kv_dtype,
                           device());
  } catch (const Error& e) {
    if (!gpu || e.code() != ErrorCode::kResourceExhausted) throw;
    // Say what the shard needs against what the GPU has, and what would make it fit.
    const std::size_t wb = estimate_weight_bytes(cfg_, tp_layout_, first_, last_, wtype_),
                      kb = estimate_kv_bytes(cfg_, tp_layout_, last_ - first_, opt.max_slots, capacity, opt.kv_dtype),
                      need = wb + kb;
    std::size_t total = 0;
    std::string name = "?";
    const auto info = kernels::cuda_kernels_info();
    for (const auto& g : info.gpus)
      if (g.index == ctx_.gpu()) total = static_cast<std::size_t>(g.memory_bytes), name = g.name;
    // Leave ~10% of the GPU for scratch, cuBLASLt's workspace and the CUDA context.
    const double usable = 0.9 * static_cast<double>(total);
    const int factor = usable > 0 ? static_cast<int>(std::ceil(static_cast<double>(need) / usable)) : 0;
    throw_error(ErrorCode::kResourceExhausted,
                "GPU {} ({}, {} in all) cannot hold this rank's shard: layers [{}, {}) at t={} need {} of {} weights "
                "+ {} of {} KV cache ({} slots x {} positions) = {}; {}. A layout that fits: {}, or a smaller KV "
                "cache (--max-context, --max-seqs). The allocation that failed: {}",
                ctx_.gpu(), name, gib(total), first_, last_, tp_.size(), gib(wb), to_string(to_kernel_dtype(wtype_)),
                gib(kb), to_string(opt.kv_dtype), opt.max_slots, capacity, gib(need),
                total > 0 ? fmt::format("about {} fit in 90% of it", gib(static_cast<std::size_t>(usable)))
                          : std::string("its size is unknown"),
                factor > 1 ? fmt::format("about {}x the ranks for these layers (--pp or --tp {}x larger)", factor, factor)
                           : std::string("more ranks (a larger --pp or --tp)"),
                e.what());
  }
}

void LlamaModel::use_device_group(transport::Group& g) {
  if (device() == kernels::Device::kCpu)
    throw_error(ErrorCode::kInvalidArgument, "use_device_group: this model runs on the CPU; its tensors are host memory");
  if (!g.device_memory() || g.size() != tp_.size() || g.rank() != tp_.rank())
    throw_error(ErrorCode::kInternal, "use_device_group: {} is not a GPU-memory group of this TP group's {} ranks (rank {})",
                g.describe(), tp_.size(), tp_.rank());
  device_tp_ = &g;
}

void LlamaModel::all_reduce_staged(const kernels::TensorView& partial) {
  // Shared-memory and socket groups read host memory only: device -> host, reduce, host ->
  // device. Correct but slow (two PCIe copies per reduction): the path when the ranks of a
  // TP group share a GPU (NCCL refuses that) or comm.tp_collectives=host forces it.
  const std::int64_t n = partial.numel();
  if (host_stage_.numel() < n) host_stage_ = kernels::Tensor::empty(kernels::DType::kF32, {n});
  const kernels::TensorView host =
      kernels::TensorView::matrix(host_stage_.view().data, kernels::DType::kF32, partial.rows(), partial.cols());
  kernels::copy(ctx_, partial, host);
  tp_.all_reduce(host.data, static_cast<std::size_t>(n), transport::DType::kF32);
  kernels::copy(ctx_, host, partial);
}

}  // namespace trellis::runtime
