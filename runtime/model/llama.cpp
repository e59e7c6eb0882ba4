// LlamaModel forward: the per-module steps and the standard residual wiring (the
// wiring lives only in standard_layer so variants can replace it).
#include <cstring>
#include <functional>

#include "llama_internal.hpp"
#include "trellis/core/error.hpp"
#include "trellis/kernels/ops.hpp"

namespace trellis::runtime {

using kernels::TensorView;

std::int64_t Batch::total_tokens() const {
  std::int64_t n = 0;
  for (const auto& s : seqs) n += s.n_tokens;
  return n;
}

std::int64_t Batch::logit_rows() const {
  if (all_logits) return total_tokens();
  std::int64_t n = 0;
  for (const auto& s : seqs) n += s.every_logit ? s.n_tokens : (s.logits ? 1 : 0);
  return n;
}

std::int64_t SeqChunk::position(std::int64_t i) const {
  if (parents.empty()) return start_pos + i;
  std::int64_t depth = 0;
  // parents[j] < j (checked by check_batch), so the walk ends.
  for (std::int64_t j = parents[static_cast<std::size_t>(i)]; j >= 0; j = parents[static_cast<std::size_t>(j)]) ++depth;
  return start_pos + depth;
}

std::vector<std::int32_t> Batch::positions() const {
  std::vector<std::int32_t> p;
  p.reserve(static_cast<std::size_t>(total_tokens()));
  for (const auto& s : seqs) {
    if (s.parents.empty()) {
      for (std::int64_t i = 0; i < s.n_tokens; ++i) p.push_back(static_cast<std::int32_t>(s.start_pos + i));
      continue;
    }
    const std::size_t base = p.size();  // a parent precedes its child: its position is known
    for (std::int64_t i = 0; i < s.n_tokens; ++i) {
      const auto par = s.parents[static_cast<std::size_t>(i)];
      p.push_back(par < 0 ? static_cast<std::int32_t>(s.start_pos) : p[base + static_cast<std::size_t>(par)] + 1);
    }
  }
  return p;
}

Batch Batch::decode(std::span<const std::int32_t> tokens, std::span<const std::int64_t> start_pos) {
  Batch b;
  b.tokens.assign(tokens.begin(), tokens.end());
  for (std::size_t i = 0; i < tokens.size(); ++i) b.seqs.push_back({static_cast<int>(i), start_pos[i], 1});
  return b;
}

LlamaModel::LlamaModel(const CheckpointReader& reader, const ModelConfig& cfg, transport::Group& tp,
                       const kernels::Context& ctx, const LoadOptions& opt)
    : cfg_(cfg), tp_(tp), ctx_(ctx), tp_layout_(TpLayout::make(cfg, tp.rank(), tp.size())) {
  first_ = opt.first_layer;
  last_ = opt.last_layer < 0 ? cfg.num_layers : opt.last_layer;
  if (first_ < 0 || first_ >= last_ || last_ > cfg.num_layers)
    throw_error(ErrorCode::kInvalidArgument, "stage layers [{}, {}) are not a non-empty range of the model's {} layers",
                first_, last_, cfg.num_layers);
  if (opt.max_slots < 1) throw_error(ErrorCode::kInvalidArgument, "max_slots must be >= 1 (got {})", opt.max_slots);
  std::int64_t cap = opt.max_seq_len > 0 ? opt.max_seq_len : std::min<std::int64_t>(cfg.max_position_embeddings, 4096);
  if (cfg.sliding_window > 0 && cap > cfg.sliding_window)
    throw_error(ErrorCode::kUnsupported,
                "the model config has sliding_window {} (Mistral) but trellis attends over the whole context; "
                "limit the context (max_seq_len, now {}) to at most {} tokens", cfg.sliding_window, cap,
                cfg.sliding_window);
  rope_ = kernels::RopeTable(cfg.rope, cap);
  load_and_allocate(reader, opt, cap);
  scratch_.resize(kScratchCount);
  // Collective over the TP group: every member constructs its model with the same options.
  // A GPU model reduces device buffers through host staging, so it registers no window (the
  // whole TP group runs on one kind of device: prepare_job gives every rank the same choice).
  if (tp_.size() > 1 && opt.window_bytes >= 2 * 64 && device() == kernels::Device::kCpu) {
    try {
      window_ = tp_.allocate_window(opt.window_bytes);
    } catch (const Error& e) {
      throw_error(e.code(), "{} (the TP all-reduce buffers; a smaller comm.coll_shm_window, or 0, needs less shared "
                  "memory)", e.what());
    }
    window_buffer_bytes_ = window_.size() / 2 / 64 * 64;  // two buffers, cache-line aligned
  }
}

LlamaModel::~LlamaModel() = default;

TensorView LlamaModel::scratch(int which, std::int64_t rows, std::int64_t cols, kernels::DType dtype) {
  kernels::Tensor& t = scratch_[static_cast<std::size_t>(which)];
  // Slots hold f32 elements; a 16-bit view of the same shape takes half of them.
  const std::int64_t need = dtype == kernels::DType::kF32 ? rows * cols : (rows * cols + 1) / 2;
  if (t.numel() < need) t = kernels::Tensor::empty(kernels::DType::kF32, {need}, device());
  return TensorView::matrix(t.view().data, dtype, rows, cols, -1, device());
}

kernels::DType LlamaModel::gemm_input(std::int64_t rows, const kernels::Tensor& w) const {
  const kernels::DType t = w.view().dtype;
  if (device() == kernels::Device::kCpu || rows <= kernels::kGemvMaxRows || ctx_.batch_invariant()) return kernels::DType::kF32;
  return t == kernels::DType::kBF16 || t == kernels::DType::kF16 ? t : kernels::DType::kF32;
}

int LlamaModel::tp_size() const { return tp_.size(); }

std::size_t LlamaModel::scratch_fingerprint() const {
  std::size_t h = 0;
  for (const auto& t : scratch_) h = h * 1000003u ^ std::hash<std::uint64_t>{}(t.serial());
  return h;
}

std::int64_t LlamaModel::window_rows() const {
  return static_cast<std::int64_t>(window_buffer_bytes_ / (static_cast<std::size_t>(cfg_.hidden_size) * sizeof(float)));
}

TensorView LlamaModel::reduce_buffer(int which, std::int64_t rows) {
  if (which != 0 && which != 1) throw_error(ErrorCode::kInternal, "reduce_buffer {} is not 0 or 1", which);
  if (window_fits(rows))
    return TensorView::matrix(window_.data() + static_cast<std::size_t>(which) * window_buffer_bytes_,
                              kernels::DType::kF32, rows, cfg_.hidden_size);
  return scratch(which == 0 ? kPartial : kPartial2, rows, cfg_.hidden_size);
}

void LlamaModel::embed(const Batch& batch, const TensorView& x) {
  if (!has_embedding())
    throw_error(ErrorCode::kInvalidArgument, "embed() on a stage without the embedding (layers [{}, {}))", first_, last_);
  if (static_cast<std::int64_t>(batch.tokens.size()) != batch.total_tokens())
    throw_scoped(ErrorScope::kRequest, ErrorCode::kInvalidArgument, "batch has {} tokens but its sequences add up to {}",
                 batch.tokens.size(), batch.total_tokens());
  check_tokens(batch.tokens);
  kernels::embedding(ctx_, embed_, batch.tokens, tp_layout_.vocab_begin, x);
  all_reduce(x);  // each rank contributed only the rows of its vocabulary slice
}

void LlamaModel::check_tokens(std::span<const std::int32_t> tokens) const {
  for (std::size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] >= cfg_.vocab_size)
      throw_scoped(ErrorScope::kRequest, ErrorCode::kInvalidArgument, "token {} at batch position {} is outside the vocabulary [0, {})",
                   tokens[i], i, cfg_.vocab_size);
}

std::int64_t LlamaModel::kv_capacity() const { return kv_.capacity(); }

const LlamaModel::Layer& LlamaModel::layer_ref(int layer) const {
  if (layer < first_ || layer >= last_)
    throw_error(ErrorCode::kInvalidArgument, "layer {} is not on this stage (layers [{}, {}))", layer, first_, last_);
  return layers_[static_cast<std::size_t>(layer - first_)];
}

void LlamaModel::check_batch(const Batch& batch) const {
  if (!batch.skip.empty() && batch.skip.size() != 2 * static_cast<std::size_t>(cfg_.num_layers))
    throw_scoped(ErrorScope::kRequest, ErrorCode::kInvalidArgument, "skip set has {} entries; the model has {} sub-layers",
                 batch.skip.size(), 2 * cfg_.num_layers);
  for (const auto& s : batch.seqs) {
    if (s.slot < 0 || s.slot >= kv_.n_slots() || s.n_tokens < 1 || s.start_pos < 0 ||
        s.start_pos + s.n_tokens > kv_.capacity())
      throw_scoped(ErrorScope::kRequest, ErrorCode::kInvalidArgument,
                   "sequence in slot {} at positions [{}, {}) does not fit the KV cache ({} slots x {} positions)", s.slot,
                   s.start_pos, s.start_pos + s.n_tokens, kv_.n_slots(), kv_.capacity());
    if (s.parents.empty()) continue;
    bool ok = static_cast<std::int64_t>(s.parents.size()) == s.n_tokens && s.prefix >= 0 && s.prefix <= s.kv_pos &&
              s.kv_pos + s.n_tokens <= kv_.capacity();
    for (std::size_t i = 0; ok && i < s.parents.size(); ++i)
      ok = s.parents[i] >= -1 && s.parents[i] < static_cast<std::int32_t>(i);
    if (!ok)
      throw_scoped(ErrorScope::kRequest, ErrorCode::kInvalidArgument,
                   "token tree in slot {}: {} parents for {} tokens, prefix {}, K/V at [{}, {}) (parents must point "
                   "back, prefix <= K/V start, capacity {})", s.slot, s.parents.size(), s.n_tokens, s.prefix, s.kv_pos,
                   s.kv_pos + s.n_tokens, kv_.capacity());
  }
}

void LlamaModel::move_kv(std::span<const KvMove> moves) {
  for (const auto& m : moves) {
    if (m.slot < 0 || m.slot >= kv_.n_slots() || m.count < 0 || m.src < 0 || m.dst < 0 ||
        std::max(m.src, m.dst) + m.count > kv_.capacity())
      throw_scoped(ErrorScope::kRequest, ErrorCode::kInvalidArgument,
                   "KV move of {} positions {} -> {} in slot {} does not fit the KV cache ({} slots x {} positions)",
                   m.count, m.src, m.dst, m.slot, kv_.n_slots(), kv_.capacity());
    if (m.count == 0 || m.src == m.dst) continue;
    for (int l = first_; l < last_; ++l) kernels::kv_copy(ctx_, kv_.view(l - first_, m.slot), m.src, m.dst, m.count);
  }
}

void LlamaModel::attention_core(const Batch& batch, const TensorView& qkv, int layer, const TensorView& out) {
  const std::int64_t qc = tp_layout_.q_cols(cfg_.head_dim), kvc = tp_layout_.kv_cols(cfg_.head_dim);
  const TensorView q = qkv.slice_cols(0, qc), k = qkv.slice_cols(qc, kvc), v = qkv.slice_cols(qc + kvc, kvc);
  const kernels::AttentionDims dims{tp_layout_.heads, tp_layout_.kv_heads, cfg_.head_dim, 0.0f};
  const int local = layer - first_;
  bool all_decode = true;
  std::int64_t row = 0;
  std::vector<kernels::KvView> views;
  std::vector<std::int64_t> lengths;
  for (const auto& s : batch.seqs) {
    kernels::KvView kv = kv_.view(local, s.slot);
    kernels::kv_write(ctx_, kv, k.slice_rows(row, s.n_tokens), v.slice_rows(row, s.n_tokens), s.kv_start());
    views.push_back(kv);
    lengths.push_back(s.start_pos + s.n_tokens);
    all_decode = all_decode && s.n_tokens == 1 && s.parents.empty();
    row += s.n_tokens;
  }
  if (all_decode) {
    kernels::attention_decode(ctx_, dims, q, views, lengths, out);
    return;
  }
  row = 0;
  for (std::size_t i = 0; i < batch.seqs.size(); ++i) {
    const auto& s = batch.seqs[i];
    if (!s.parents.empty())
      kernels::attention_tree(ctx_, dims, q.slice_rows(row, s.n_tokens), views[i], s.prefix, s.kv_pos, s.parents,
                              out.slice_rows(row, s.n_tokens));
    else
      kernels::attention_prefill(ctx_, dims, q.slice_rows(row, s.n_tokens), views[i], s.start_pos,
                                 out.slice_rows(row, s.n_tokens));
    row += s.n_tokens;
  }
}

void LlamaModel::attention_partial(int layer, const Batch& batch, const TensorView& x, const TensorView& out,
                                   float beta) {
  check_batch(batch);
  const Layer& y = layer_ref(layer);
  const std::int64_t T = batch.total_tokens(), qc = tp_layout_.q_cols(cfg_.head_dim),
                     kvc = tp_layout_.kv_cols(cfg_.head_dim);
  TensorView n = scratch(kNormed, T, cfg_.hidden_size, gemm_input(T, y.wqkv));
  kernels::rms_norm(ctx_, x, y.in_norm, static_cast<float>(cfg_.rms_norm_eps), n);
  TensorView qkv = scratch(kQkv, T, qc + 2 * kvc);
  kernels::matmul(ctx_, n, y.wqkv, qkv);
  if (!y.bqkv.empty_tensor()) kernels::add_bias(ctx_, qkv, y.bqkv);
  positions_ = batch.positions();
  // q's heads and k's heads lie side by side in qkv and turn alike: one call for both (on a
  // GPU one launch and one upload of the positions fewer per layer).
  kernels::apply_rope(ctx_, rope_, qkv.slice_cols(0, qc + kvc), tp_layout_.heads + tp_layout_.kv_heads, positions_);
  TensorView attn = scratch(kAttn, T, qc, gemm_input(T, y.wo));
  attention_core(batch, qkv, layer, attn);
  kernels::matmul(ctx_, attn, y.wo, out, {.beta = beta});
}

void LlamaModel::mlp_partial(int layer, const TensorView& x, const TensorView& out, float beta) {
  const Layer& y = layer_ref(layer);
  const std::int64_t T = x.rows(), I = tp_layout_.inter;
  TensorView n = scratch(kNormed, T, cfg_.hidden_size, gemm_input(T, y.w_gate_up));
  kernels::rms_norm(ctx_, x, y.post_norm, static_cast<float>(cfg_.rms_norm_eps), n);
  TensorView gu = scratch(kGateUp, T, 2 * I);
  kernels::matmul(ctx_, n, y.w_gate_up, gu);
  TensorView g = gu.slice_cols(0, I);
  const kernels::DType act = gemm_input(T, y.w_down);
  // In place (f32), or into a slot of its own in the down projection's 16-bit type.
  TensorView a = act == kernels::DType::kF32 ? g : scratch(kAct16, T, I, act);
  kernels::swiglu(ctx_, g, gu.slice_cols(I, I), a);
  kernels::matmul(ctx_, a, y.w_down, out, {.beta = beta});
}

void LlamaModel::all_reduce(const TensorView& partial) {
  if (tp_.size() == 1) return;
  if (!partial.is_contiguous())
    throw_error(ErrorCode::kInternal, "all_reduce needs a contiguous tensor, got {}", partial.describe());
  if (partial.device != kernels::Device::kCpu) {
    if (!device_tp_) return all_reduce_staged(partial);
    return device_tp_->all_reduce(partial.data, static_cast<std::size_t>(partial.numel()), transport::DType::kF32);
  }
  tp_.all_reduce(partial.data, static_cast<std::size_t>(partial.numel()), transport::DType::kF32);
}

transport::RequestPtr LlamaModel::all_reduce_async(const TensorView& partial) {
  if (tp_.size() == 1) return transport::make_completed_request(0, "all-reduce over a group of one");
  if (!partial.is_contiguous())
    throw_error(ErrorCode::kInternal, "all_reduce_async needs a contiguous tensor, got {}", partial.describe());
  if (partial.device != kernels::Device::kCpu && device_tp_)  // on the group's own stream, fenced by events
    return device_tp_->all_reduce_async(partial.data, static_cast<std::size_t>(partial.numel()), transport::DType::kF32);
  if (partial.device != kernels::Device::kCpu) {
    // Host staging is synchronous; the request is complete when it is returned (ladder then
    // overlaps nothing on a GPU until device-memory collectives exist).
    all_reduce_staged(partial);
    return transport::make_completed_request(static_cast<std::size_t>(partial.numel()) * sizeof(float),
                                             "all-reduce through host staging");
  }
  return tp_.all_reduce_async(partial.data, static_cast<std::size_t>(partial.numel()), transport::DType::kF32);
}

void LlamaModel::standard_layer(int layer, const Batch& batch, const TensorView& x) {
  if (!batch.skip.empty() && batch.skip.size() != 2 * static_cast<std::size_t>(cfg_.num_layers)) check_batch(batch);
  TensorView p = reduce_buffer(0, x.rows());
  const auto skipped = [&](int which) {
    if (batch.skip.empty() || batch.skip[static_cast<std::size_t>(2 * layer + which)] == 0) return false;
    ++skipped_sublayers_;
    if (tp_.size() > 1) ++skipped_reductions_;
    return true;
  };
  // A GPU decode step on one TP rank adds each projection straight onto x in the matmul's
  // epilogue (x = a w^T + 1 * x, rounded once, as the add kernel rounds x + p): two launches
  // and two passes over x fewer per layer. Decode rows only (the GEMV's), and never on the
  // CPU, whose GEMM would sum in another order than its add.
  const bool onto_x = tp_.size() == 1 && x.device != kernels::Device::kCpu && x.rows() <= kernels::kGemvMaxRows &&
                      !ctx_.batch_invariant();
  if (!skipped(0)) {
    if (onto_x) {
      attention_partial(layer, batch, x, x, 1.0f);
    } else {
      attention_partial(layer, batch, x, p);
      all_reduce(p);
      kernels::add(ctx_, x, p, x);
    }
  }
  if (!skipped(1)) {
    if (onto_x) {
      mlp_partial(layer, x, x, 1.0f);
    } else {
      mlp_partial(layer, x, p);
      all_reduce(p);
      kernels::add(ctx_, x, p, x);
    }
  }
}

void LlamaModel::run_stage(const Batch& batch, const TensorView& x) {
  if (has_embedding()) embed(batch, x);
  for (int l = first_; l < last_; ++l) standard_layer(l, batch, x);
}

void LlamaModel::local_logits(const Batch& batch, const TensorView& x, const TensorView& out) {
  if (!has_lm_head())
    throw_error(ErrorCode::kInvalidArgument, "local_logits() on a stage without the LM head (layers [{}, {}))", first_, last_);
  const std::int64_t R = batch.logit_rows(), H = cfg_.hidden_size;
  if (R == 0) return;
  TensorView sel = scratch(kSelected, R, H);
  if (device() != kernels::Device::kCpu) {
    // GPU: the same row selection as device-to-device copies, enqueued on the stream.
    if (batch.all_logits) {
      kernels::copy(ctx_, x.slice_rows(0, R), sel);
    } else {
      std::int64_t row = 0, out_row = 0;
      for (const auto& s : batch.seqs) {
        row += s.n_tokens;
        if (s.every_logit) {
          kernels::copy(ctx_, x.slice_rows(row - s.n_tokens, s.n_tokens), sel.slice_rows(out_row, s.n_tokens));
          out_row += s.n_tokens;
        } else if (s.logits) {
          kernels::copy(ctx_, x.slice_rows(row - 1, 1), sel.slice_rows(out_row++, 1));
        }
      }
    }
  } else if (batch.all_logits) {
    std::memcpy(sel.data, x.data, static_cast<std::size_t>(R * H) * sizeof(float));
  } else {
    std::int64_t row = 0, out_row = 0;
    for (const auto& s : batch.seqs) {
      row += s.n_tokens;
      const std::int64_t first = s.every_logit ? row - s.n_tokens : row - 1;
      if (!s.every_logit && !s.logits) continue;
      for (std::int64_t r = first; r < row; ++r)
        std::memcpy(sel.row_ptr(out_row++), x.row_ptr(r), static_cast<std::size_t>(H) * sizeof(float));
    }
  }
  kernels::rms_norm(ctx_, sel, final_norm_, static_cast<float>(cfg_.rms_norm_eps), sel);
  const kernels::Tensor& head = lm_head_.empty_tensor() ? embed_ : lm_head_;
  kernels::matmul(ctx_, sel, head, out);
}

void LlamaModel::gather_logits(const TensorView& device_local, std::vector<float>& full) {
  TensorView local = device_local;
  if (local.device != kernels::Device::kCpu) {  // a GPU model's logits: read on the host
    const std::int64_t n = local.rows() * local.cols();
    if (host_stage_.numel() < n) host_stage_ = kernels::Tensor::empty(kernels::DType::kF32, {n});
    local = TensorView::matrix(host_stage_.view().data, kernels::DType::kF32, local.rows(), local.cols());
    kernels::copy(ctx_, device_local, local);
  }
  const std::int64_t R = local.rows(), V = cfg_.vocab_size, chunk = tp_layout_.vocab_chunk;
  const int t = tp_.size();
  full.resize(static_cast<std::size_t>(R * V));
  if (t == 1) {
    for (std::int64_t r = 0; r < R; ++r)
      std::memcpy(full.data() + r * V, local.row_ptr(r), static_cast<std::size_t>(V) * sizeof(float));
    return;
  }
  // Equal-sized contributions (all_gather's contract): pad each rank's slice to `chunk`.
  std::vector<float> mine(static_cast<std::size_t>(R * chunk), 0.0f), all(static_cast<std::size_t>(t * R * chunk));
  for (std::int64_t r = 0; r < R; ++r)
    std::memcpy(mine.data() + r * chunk, local.row_ptr(r), static_cast<std::size_t>(local.cols()) * sizeof(float));
  tp_.all_gather(mine.data(), all.data(), mine.size() * sizeof(float));
  for (int q = 0; q < t; ++q) {
    const std::int64_t vb = std::min<std::int64_t>(V, q * chunk), n = std::min<std::int64_t>(V, vb + chunk) - vb;
    for (std::int64_t r = 0; r < R; ++r)
      std::memcpy(full.data() + r * V + vb, all.data() + (q * R + r) * chunk, static_cast<std::size_t>(n) * sizeof(float));
  }
}

std::vector<float> LlamaModel::forward(const Batch& batch) {
  if (!has_embedding() || !has_lm_head())
    throw_error(ErrorCode::kInvalidArgument, "forward() needs the whole model on this stage (has layers [{}, {}) of {})",
                first_, last_, cfg_.num_layers);
  const std::int64_t T = batch.total_tokens();
  TensorView x = scratch(kHidden, T, cfg_.hidden_size);
  run_stage(batch, x);
  TensorView local = scratch(kLogits, batch.logit_rows(), tp_layout_.vocab_local());
  local_logits(batch, x, local);
  std::vector<float> full;
  gather_logits(local, full);
  return full;
}

}  // namespace trellis::runtime
