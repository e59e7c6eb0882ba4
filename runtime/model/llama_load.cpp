// Loading a rank's shard of a Llama checkpoint: every weight is read as a Slice of the
// checkpoint tensor straight into this rank's (fused) weight buffer, in parallel row
// chunks, after its full shape and stored dtype were checked against the config.
#include <fmt/ranges.h>

#include <cmath>
#include <optional>

#include "llama_internal.hpp"
#include "trellis/core/error.hpp"

namespace trellis::runtime {
namespace {

using kernels::Tensor;

std::string stored_name_of(const std::string& torch_dtype) {
  if (torch_dtype == "bfloat16") return "BF16";
  if (torch_dtype == "float32") return "F32";
  if (torch_dtype == "float16") return "F16";
  return {};
}

struct Loader {
  const CheckpointReader& reader;
  const ModelConfig& cfg;
  kernels::ThreadPool& pool;  // host threads for reading (a GPU context's pool has one)
  bool native = false;  // WeightsFormat::kNative
  // CPU weights are packed into one arena on huge pages (host_arena.hpp); a GPU's host
  // staging is freed layer by layer, so it takes plain allocations (nullptr).
  kernels::HostArena* arena = nullptr;

  Tensor alloc(kernels::DType t, std::initializer_list<std::int64_t> shape) const {
    return arena ? Tensor::empty(t, shape, *arena) : Tensor::empty(t, shape);
  }

  // Checks `name` exists with shape `full`, then reads `slice` of it into dst: converted to
  // `type`, or (qtype a block type) copied as stored.
  void read(const std::string& name, std::vector<std::int64_t> full, const Slice& slice, ElemType type, void* dst,
            kernels::DType qtype = kernels::DType::kF32) const {
    check(name, full);
    const bool raw = kernels::is_quantized(qtype);
    const std::size_t row_bytes = raw ? kernels::dtype_bytes(qtype, slice.cols())
                                      : static_cast<std::size_t>(slice.cols()) * elem_size(type);
    auto* base = static_cast<std::byte*>(dst);
    // Rows are independent: split them over the threads (mmap page faults and dtype
    // conversion both scale).
    pool.parallel_for(
        slice.rows(),
        [&](std::int64_t b, std::int64_t e) {
          Slice part{slice.row_begin + b, slice.row_begin + e, slice.col_begin, slice.col_end};
          std::byte* out = base + static_cast<std::size_t>(b) * row_bytes;
          if (raw)
            reader.read_slice_raw(name, part, out);
          else
            reader.read_slice(name, part, type, out);
        },
        std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(1, slice.cols())));
  }

  // The block type to keep the weights `parts` (name, slice) in, when every part is stored
  // in the same block type the kernels multiply and every slice is on block boundaries;
  // kF32 (meaning: dequantise) otherwise.
  kernels::DType keep_as(const std::vector<std::pair<std::string, Slice>>& parts) const {
    if (!native) return kernels::DType::kF32;
    std::string stored;
    for (const auto& [name, slice] : parts) {
      const TensorInfo& t = reader.require(name);
      if ((!stored.empty() && t.dtype != stored) || slice.col_begin % 32 != 0 || slice.col_end % 32 != 0)
        return kernels::DType::kF32;
      stored = t.dtype;
    }
    return stored == "Q4_1" ? kernels::DType::kQ4_1 : stored == "Q8_0" ? kernels::DType::kQ8_0 : kernels::DType::kF32;
  }

  void check(const std::string& name, const std::vector<std::int64_t>& full) const {
    const TensorInfo& t = reader.require(name);
    if (t.shape != full)
      throw_error(ErrorCode::kCorruptInput,
                  "{}: tensor '{}' has shape [{}] but the model config (hidden_size={}, intermediate_size={}, "
                  "heads={}, kv_heads={}, head_dim={}, vocab_size={}) implies [{}]",
                  t.file, name, fmt::join(t.shape, ", "), cfg.hidden_size, cfg.intermediate_size, cfg.num_heads,
                  cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size, fmt::join(full, ", "));
    std::string want = stored_name_of(cfg.torch_dtype);
    bool is_float = t.dtype == "F32" || t.dtype == "BF16" || t.dtype == "F16";
    if (!want.empty() && is_float && full.size() > 1 && t.dtype != want)
      throw_error(ErrorCode::kCorruptInput, "{}: tensor '{}' is stored as {} but config.json says torch_dtype {}",
                  t.file, name, t.dtype, cfg.torch_dtype);
  }

  Tensor vector_f32(const std::string& name, std::int64_t n) const {
    Tensor t = alloc(kernels::DType::kF32, {n});
    read(name, {n}, {0, 1, 0, n}, ElemType::kF32, t.ptr<float>());
    // Norm weights and biases are small and a flipped exponent bit in one turns a whole layer's
    // output into NaN or Inf: cheap to check at every load (trellis verify-model checks every
    // byte against a manifest).
    const float* v = t.ptr<float>();
    for (std::int64_t i = 0; i < n; ++i)
      if (!std::isfinite(v[i]))
        throw_error(ErrorCode::kCorruptInput, "{}: tensor '{}' element {} is {} (a norm or bias must be finite; "
                    "the file is damaged: trellis verify-model checks it against its manifest)",
                    reader.describe(), name, i, v[i]);
    return t;
  }
};

std::byte* row_ptr(const Tensor& t, std::int64_t row) {
  return static_cast<std::byte*>(t.view().row_ptr(row));
}

}  // namespace

kernels::DType to_kernel_dtype(ElemType t) { return t == ElemType::kF32 ? kernels::DType::kF32 : kernels::DType::kBF16; }

void LlamaModel::load(const CheckpointReader& reader, const LoadOptions& opt) {
  const bool gpu = device() != kernels::Device::kCpu;
  if (gpu && opt.weights_format == WeightsFormat::kNative)
    throw_error(ErrorCode::kUnsupported,
                "model.weights_format=native keeps Q4_1/Q8_0 blocks, which the CUDA backend cannot multiply; use "
                "model.weights_format=dequant on a GPU (the weights are dequantised to bf16 at load) or --device cpu");
  // A GPU context's pool has one thread; reading and converting a shard scales with cores.
  std::optional<kernels::ThreadPool> host_pool;
  if (gpu) host_pool.emplace(0);
  std::optional<kernels::HostArena> arena;
  if (!gpu) arena.emplace(kernels::HostArena::Options{.huge_pages = ctx_.huge_pages()});
  const Loader ld{reader, cfg_, gpu ? *host_pool : ctx_.pool(), opt.weights_format == WeightsFormat::kNative,
                  arena ? &*arena : nullptr};
  const auto& L = tp_layout_;
  const std::int64_t H = cfg_.hidden_size, hd = cfg_.head_dim, qc = L.q_cols(cfg_.head_dim),
                     kvc = L.kv_cols(cfg_.head_dim), q_full = std::int64_t{cfg_.num_heads} * hd,
                     kv_full = std::int64_t{cfg_.num_kv_heads} * hd, I = cfg_.intermediate_size;
  if (opt.weight_dtype) {
    wtype_ = *opt.weight_dtype;
  } else {
    // f32 and f16 are kept in f32 (exact; f16 -> bf16 would round), bf16 and quantized
    // types in bf16.
    const std::string& stored = reader.require("model.embed_tokens.weight").dtype;
    wtype_ = stored == "F32" || stored == "F16" ? ElemType::kF32 : ElemType::kBF16;
  }
  const kernels::DType wdt = to_kernel_dtype(wtype_);
  for (int l = first_; l < last_; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    Layer& y = layers_.emplace_back();
    y.in_norm = ld.vector_f32(p + "input_layernorm.weight", H);
    y.post_norm = ld.vector_f32(p + "post_attention_layernorm.weight", H);
    const std::int64_t q0 = L.head_begin * hd, kv0 = L.kv_head_begin * hd;
    const Slice qs{q0, q0 + qc, 0, H}, kvs{kv0, kv0 + kvc, 0, H};
    const std::string qn = p + "self_attn.q_proj.weight", kn = p + "self_attn.k_proj.weight",
                      vn = p + "self_attn.v_proj.weight";
    kernels::DType qt = ld.keep_as({{qn, qs}, {kn, kvs}, {vn, kvs}});
    y.wqkv = ld.alloc(is_quantized(qt) ? qt : wdt, {qc + 2 * kvc, H});
    ld.read(qn, {q_full, H}, qs, wtype_, row_ptr(y.wqkv, 0), qt);
    ld.read(kn, {kv_full, H}, kvs, wtype_, row_ptr(y.wqkv, qc), qt);
    ld.read(vn, {kv_full, H}, kvs, wtype_, row_ptr(y.wqkv, qc + kvc), qt);
    if (cfg_.attention_bias) {
      y.bqkv = ld.alloc(kernels::DType::kF32, {qc + 2 * kvc});
      float* b = y.bqkv.ptr<float>();
      ld.read(p + "self_attn.q_proj.bias", {q_full}, {0, 1, q0, q0 + qc}, ElemType::kF32, b);
      ld.read(p + "self_attn.k_proj.bias", {kv_full}, {0, 1, kv0, kv0 + kvc}, ElemType::kF32, b + qc);
      ld.read(p + "self_attn.v_proj.bias", {kv_full}, {0, 1, kv0, kv0 + kvc}, ElemType::kF32, b + qc + kvc);
    }
    const std::string on = p + "self_attn.o_proj.weight";
    const Slice os{0, H, q0, q0 + qc};
    qt = ld.keep_as({{on, os}});
    y.wo = ld.alloc(is_quantized(qt) ? qt : wdt, {H, qc});
    ld.read(on, {H, q_full}, os, wtype_, y.wo.view().data, qt);
    const std::int64_t i0 = L.inter_begin;
    const Slice gs{i0, i0 + L.inter, 0, H}, ds{0, H, i0, i0 + L.inter};
    const std::string gn = p + "mlp.gate_proj.weight", un = p + "mlp.up_proj.weight", dn = p + "mlp.down_proj.weight";
    qt = ld.keep_as({{gn, gs}, {un, gs}});
    y.w_gate_up = ld.alloc(is_quantized(qt) ? qt : wdt, {2 * L.inter, H});
    ld.read(gn, {I, H}, gs, wtype_, row_ptr(y.w_gate_up, 0), qt);
    ld.read(un, {I, H}, gs, wtype_, row_ptr(y.w_gate_up, L.inter), qt);
    qt = ld.keep_as({{dn, ds}});
    y.w_down = ld.alloc(is_quantized(qt) ? qt : wdt, {H, L.inter});
    ld.read(dn, {H, I}, ds, wtype_, y.w_down.view().data, qt);
    // Host staging -> GPU one layer at a time, so host memory holds at most one layer.
    for (Tensor* t : {&y.in_norm, &y.post_norm, &y.wqkv, &y.bqkv, &y.wo, &y.w_gate_up, &y.w_down}) to_device(*t);
  }
  const std::int64_t V = cfg_.vocab_size, vl = L.vocab_local();
  const Slice vocab_rows{L.vocab_begin, L.vocab_end, 0, H};
  if (has_embedding()) {
    const kernels::DType qt = ld.keep_as({{"model.embed_tokens.weight", vocab_rows}});
    embed_ = ld.alloc(is_quantized(qt) ? qt : wdt, {vl, H});
    ld.read("model.embed_tokens.weight", {V, H}, vocab_rows, wtype_, embed_.view().data, qt);
    to_device(embed_);
  }
  if (has_lm_head()) {
    final_norm_ = ld.vector_f32("model.norm.weight", H);
    if (!(cfg_.tie_word_embeddings && has_embedding())) {
      const std::string name = cfg_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
      const kernels::DType qt = ld.keep_as({{name, vocab_rows}});
      lm_head_ = ld.alloc(is_quantized(qt) ? qt : wdt, {vl, H});
      ld.read(name, {V, H}, vocab_rows, wtype_, lm_head_.view().data, qt);
      to_device(lm_head_);
    }
    to_device(final_norm_);
  }
  if (arena) weight_pages_ = kernels::describe_huge_pages(*arena, "weights");
}

WeightsFormat parse_weights_format(std::string_view text, std::string_view what) {
  if (text == "dequant") return WeightsFormat::kDequant;
  if (text == "native") return WeightsFormat::kNative;
  throw_error(ErrorCode::kInvalidArgument, "{}: unknown weights format '{}' (expected dequant or native)", what, text);
}

std::string_view to_string(WeightsFormat f) { return f == WeightsFormat::kNative ? "native" : "dequant"; }

bool LlamaModel::has_quantized_weights() const {
  if (is_quantized(embed_.view().dtype) || is_quantized(lm_head_.view().dtype)) return true;
  for (const auto& y : layers_)
    for (const Tensor* t : {&y.wqkv, &y.wo, &y.w_gate_up, &y.w_down})
      if (is_quantized(t->view().dtype)) return true;
  return false;
}

std::size_t LlamaModel::weight_bytes() const {
  std::size_t n = embed_.bytes() + final_norm_.bytes() + lm_head_.bytes();
  for (const auto& y : layers_)
    n += y.in_norm.bytes() + y.post_norm.bytes() + y.wqkv.bytes() + y.bqkv.bytes() + y.wo.bytes() +
         y.w_gate_up.bytes() + y.w_down.bytes();
  return n;
}

std::size_t LlamaModel::decode_bytes_per_token() const {
  // Everything but the embedding table, of which decode reads one row per token; a tied
  // head streams the embedding table instead.
  std::size_t n = weight_bytes() - embed_.bytes();
  if (has_lm_head() && lm_head_.empty_tensor()) n += embed_.bytes();
  return n;
}

std::vector<kernels::TensorView> LlamaModel::decode_linears() const {
  std::vector<kernels::TensorView> out;
  for (const auto& y : layers_)
    for (const kernels::Tensor* t : {&y.wqkv, &y.wo, &y.w_gate_up, &y.w_down}) out.push_back(t->view());
  if (has_lm_head()) out.push_back((lm_head_.empty_tensor() ? embed_ : lm_head_).view());
  return out;
}

}  // namespace trellis::runtime
