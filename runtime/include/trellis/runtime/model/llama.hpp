// LlamaModel: a Llama-family decoder (Llama 2/3, Qwen2, Mistral) for one pipeline stage
// and one tensor-parallel rank.
//
// What a rank holds: layers [first_layer, last_layer) of the model, each sharded by
// TpLayout (Q/K/V and gate/up column-parallel, O and down row-parallel), the
// vocab-parallel embedding only on the first stage (first_layer == 0) and the final norm
// plus vocab-parallel LM head only on the last stage (last_layer == num_layers). Weights
// are read from a CheckpointReader slice by slice (never a full matrix this rank does not
// own) and kept in f32 or bf16; activations are f32.
//
// The block's residual wiring is NOT baked in: attention_partial() and mlp_partial() each
// compute one module (its norm, its projections) and leave this rank's partial sum of the
// row-parallel output; all_reduce()/all_reduce_async() complete it explicitly through the
// transport Group. standard_layer() is the usual wiring
//     x += AllReduce(attn(norm1(x)));  x += AllReduce(mlp(norm2(x)))
// and variants (parallel attention+MLP, Ladder Residual with async all-reduce, Desynced
// Residual, Layer Parallelism) compose the same steps differently.
//
// Batches: one forward processes a Batch of sequences, each appending n_tokens new tokens
// to its own KV-cache slot at positions [start_pos, start_pos + n_tokens). Prefill
// (n_tokens > 1), decode (n_tokens == 1) and mixtures are all valid; sequences may have
// different lengths. The caller tracks each slot's length (start_pos); the model only
// checks it against the cache capacity.
//
// Device: the model lives where its Context runs (ctx.device()). On a CUDA context the
// weights are read from the checkpoint into host staging and copied to the GPU (block-
// quantised weights dequantised to weight_dtype: WeightsFormat::kNative is refused there,
// the CUDA matmul multiplies no Q4_1/Q8_0 blocks), and the KV cache, the scratch and the
// reduce buffers are GPU memory: every TensorView the steps take or return is then a device
// view, except Batch's host arrays (tokens, positions), which the kernels stage. The TP
// all-reduce of a device buffer goes through host staging (shm groups cannot read GPU
// memory: correct, but a device-to-host and a host-to-device copy per reduction), and
// all_reduce_async is then synchronous. gather_logits accepts device logits.
//
// Threading: one thread at a time (it owns scratch buffers and the KV cache, and uses the
// Context and Group given at construction, which must outlive it). Every member of the TP
// group must make the same calls in the same order (the all-reduces are collectives).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "trellis/kernels/attention.hpp"
#include "trellis/kernels/context.hpp"
#include "trellis/kernels/rope.hpp"
#include "trellis/kernels/tensor.hpp"
#include "trellis/runtime/checkpoint/reader.hpp"
#include "trellis/runtime/model/config.hpp"
#include "trellis/runtime/model/tp_layout.hpp"
#include "trellis/transport/group.hpp"

namespace trellis::runtime {

// How weights stored in a block-quantised type (GGUF Q4_1, Q8_0) are held in memory.
enum class WeightsFormat {
  // Dequantised at load into weight_dtype (f32/bf16) and multiplied in f32: the products of
  // the exact stored values. Plain stored types (safetensors, GGUF F32/F16/BF16) always load
  // this way.
  kDequant,
  // Kept as stored and multiplied as llama.cpp multiplies them (activations quantised to 8
  // bits per block, integer dot products: kernels/quant.hpp), so results follow llama.cpp's
  // numerics; 5-8.5 bits per weight streamed per decode token instead of 16-32. A fused
  // weight whose parts are stored in different types, or a shard whose columns do not start
  // on a 32-element block, falls back to kDequant for that weight.
  kNative,
};
// "dequant" / "native"; throws kInvalidArgument naming `what` otherwise.
WeightsFormat parse_weights_format(std::string_view text, std::string_view what = "weights format");
std::string_view to_string(WeightsFormat f);

struct LoadOptions {
  int first_layer = 0;
  int last_layer = -1;  // exclusive; -1: num_layers
  // Weight type in memory. nullopt: bf16 when the checkpoint stores bf16 (or a quantized
  // type), f32 when it stores f32 or f16 (f16 -> bf16 would round). matmul reads bf16
  // weights directly: half the bytes per decode token of f32.
  std::optional<ElemType> weight_dtype;
  WeightsFormat weights_format = WeightsFormat::kDequant;
  int max_slots = 1;              // KV-cache slots (concurrent sequences)
  std::int64_t max_seq_len = 0;   // per slot; 0: min(max_position_embeddings, 4096)
  kernels::DType kv_dtype = kernels::DType::kF32;
  // Bytes per rank of memory registered with the TP group (Group::allocate_window, setting
  // comm.coll_shm_window) for the partial sums the TP all-reduce completes, split into two
  // buffers (reduce_buffer). In a host the shm group then all-reduces them without copying
  // in or out; forwards with more rows than a buffer holds, and groups without shared
  // memory, use private scratch and the copying path. 0: none.
  std::size_t window_bytes = 0;
};

// One sequence's share of a forward: n_tokens new tokens appended to `slot` at
// positions [start_pos, start_pos + n_tokens).
//
// Token trees (SWIFT, runtime/swift): with `parents` set (one entry per token, parents[i] < i
// or -1), token i sits at position start_pos + depth(i), its K/V go to cache position
// kv_pos + i, and it attends to cache positions [0, prefix) and to its own path through the
// chunk (kernels::attention_tree). That verifies a linearised tree of draft tokens in one
// forward, and scores a draft over tokens already in the cache by writing their new K/V past
// the sequence (kv_pos) while reading only the prefix before them.
struct SeqChunk {
  int slot = 0;
  std::int64_t start_pos = 0;
  std::int64_t n_tokens = 1;
  // Whether the last new token gets a logits row (unless all_logits): false for a prefill
  // chunk that is not the prompt's last (nothing is sampled after it).
  bool logits = true;
  // Every token of this sequence gets a logits row (a tree to verify, a draft to score).
  bool every_logit = false;
  std::vector<std::int32_t> parents;  // empty: a causal chain (kv_pos and prefix unused)
  std::int64_t kv_pos = 0;
  std::int64_t prefix = 0;
  // Where token i's K/V go and its RoPE position.
  std::int64_t kv_start() const { return parents.empty() ? start_pos : kv_pos; }
  std::int64_t position(std::int64_t i) const;
};

// Copies the K/V at cache positions [src, src + count) of `slot` to [dst, dst + count) in
// every layer of the stage (SWIFT: an accepted tree path moved into place).
struct KvMove {
  int slot = 0;
  std::int64_t src = 0, dst = 0, count = 0;
};

struct Batch {
  std::vector<std::int32_t> tokens;  // all new tokens, sequence after sequence (stage 0)
  std::vector<SeqChunk> seqs;
  // Which rows get logits: the last token of each sequence with `logits` set, or every token.
  bool all_logits = false;
  // Sub-layers replaced by the identity (SWIFT's draft): 2 * num_layers entries, [2l] the
  // attention and [2l + 1] the MLP of layer l; empty: none. A skipped sub-layer does no
  // all-reduce and writes no K/V.
  std::vector<std::uint8_t> skip;

  std::int64_t total_tokens() const;
  std::int64_t logit_rows() const;
  // Positions of every new token (row order), for RoPE.
  std::vector<std::int32_t> positions() const;
  // Convenience: one decode step (one token per sequence) for slots 0..B-1 at `lengths`.
  static Batch decode(std::span<const std::int32_t> tokens, std::span<const std::int64_t> start_pos);
};

class LlamaModel {
 public:
  // Loads this rank's shard of layers [opt.first_layer, opt.last_layer). Throws
  // kInvalidArgument / kNotFound / kCorruptInput naming the file and tensor when a tensor
  // is missing or its shape or dtype disagrees with `cfg`, and kInvalidArgument when the
  // model cannot be split across tp.size() ranks. `ctx` and `tp` must outlive the model.
  // On a CUDA context: kUnsupported for WeightsFormat::kNative, and kResourceExhausted when
  // the GPU is too small, naming the bytes this rank's shard and KV cache need, the GPU's
  // memory and free bytes, and the layout changes that would fit.
  LlamaModel(const CheckpointReader& reader, const ModelConfig& cfg, transport::Group& tp,
             const kernels::Context& ctx, const LoadOptions& opt = {});
  ~LlamaModel();
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const TpLayout& layout() const { return tp_layout_; }
  int first_layer() const { return first_; }
  int last_layer() const { return last_; }
  bool has_embedding() const { return first_ == 0; }
  bool has_lm_head() const { return last_ == cfg_.num_layers; }
  ElemType weight_dtype() const { return wtype_; }
  // Whether any weight is held block-quantised (WeightsFormat::kNative found some to keep).
  bool has_quantized_weights() const;
  // How this rank's host weights are paged, for logs ("weights 258 MiB, 256 MiB of it on 2 MiB
  // pages", or why they are on 4 KiB pages); empty on a GPU.
  const std::string& weight_pages() const { return weight_pages_; }
  // Bytes of weights this rank holds, and those one decode token streams through.
  std::size_t weight_bytes() const;
  std::size_t decode_bytes_per_token() const;
  // The weight matrices one decode step streams through matmul, in the order it runs them
  // (each layer's qkv, o, gate/up and down, then the LM head on the last stage). `trellis
  // bench model` times them alone to tell the matmuls' share of a step from the rest.
  std::vector<kernels::TensorView> decode_linears() const;
  transport::Group& group() { return tp_; }
  // A GPU model's all-reduces go through `g` (a group with device_memory(), e.g. NCCL over the
  // same members in the same order; it must outlive the model) instead of being staged
  // through host memory and tp_. tp_ keeps everything on host data (logit gathering).
  void use_device_group(transport::Group& g);
  // Whether the TP all-reduce of device tensors runs in GPU memory (use_device_group).
  bool device_collectives() const { return device_tp_ != nullptr; }
  const kernels::Context& context() const { return ctx_; }
  // Ranks in this stage's TP group.
  int tp_size() const;
  // Changes whenever one of the model's scratch buffers is reallocated (a larger batch): a
  // CUDA graph recorded over them must then be recorded again.
  std::size_t scratch_fingerprint() const;
  // Where weights, KV cache and activations live (the context's device).
  kernels::Device device() const { return ctx_.device(); }
  // Positions each KV-cache slot holds.
  std::int64_t kv_capacity() const;
  // Bytes this rank's shard of weights and its KV cache take for `cfg` split by `layout`
  // (what a GPU must hold; the estimate the out-of-memory message names).
  static std::size_t estimate_weight_bytes(const ModelConfig& cfg, const TpLayout& layout, int first_layer,
                                           int last_layer, ElemType weight_dtype);
  static std::size_t estimate_kv_bytes(const ModelConfig& cfg, const TpLayout& layout, int layers, int slots,
                                       std::int64_t capacity, kernels::DType kv_dtype);

  // ---- steps (every one is collective over the TP group where it says all-reduce) ----

  // x[T, H] = embedding of batch.tokens (vocab-parallel lookup + all-reduce). Stage 0 only.
  void embed(const Batch& batch, const kernels::TensorView& x);
  // What embed() checks of the token ids: every one inside the vocabulary (throws, request
  // scope). For callers that stage ids past embed() (a CUDA graph filled ahead).
  void check_tokens(std::span<const std::int32_t> tokens) const;
  // out[T, H] = this rank's partial sum of o_proj(attention(rope(qkv(rms_norm(x))))) for
  // `layer`, writing the new K/V into the cache. No communication. With `beta` 1 the sum is
  // added onto out (out = sum + out, the projection's epilogue), and out may be x itself (the
  // residual add; x is read before it is written); with 0 (the default) out may not alias x.
  void attention_partial(int layer, const Batch& batch, const kernels::TensorView& x,
                         const kernels::TensorView& out, float beta = 0.0f);
  // out[T, H] = this rank's partial sum of down(swiglu(gate(n), up(n))), n = rms_norm(x);
  // `beta` as for attention_partial.
  void mlp_partial(int layer, const kernels::TensorView& x, const kernels::TensorView& out, float beta = 0.0f);
  // [rows, H] f32 for a partial sum that the TP all-reduce will complete: buffer `which`
  // (0 or 1; both can be in use at once, e.g. one in flight while the next module writes the
  // other) of the registered window when it holds `rows` rows, else private scratch. Valid
  // until the next call with the same `which`.
  kernels::TensorView reduce_buffer(int which, std::int64_t rows);
  // Whether reduce_buffer can hand out window memory for `rows` rows, and the most rows it
  // can (0: no window; the TP group has no shared memory or window_bytes was 0).
  bool window_fits(std::int64_t rows) const { return rows > 0 && rows <= window_rows(); }
  std::int64_t window_rows() const;
  // Completes a partial sum across the TP group (in place). No-op at t = 1.
  void all_reduce(const kernels::TensorView& partial);
  transport::RequestPtr all_reduce_async(const kernels::TensorView& partial);
  // The standard block: x += AR(attn(x)); x += AR(mlp(x)); a sub-layer in batch.skip is
  // left out (with its all-reduce).
  void standard_layer(int layer, const Batch& batch, const kernels::TensorView& x);
  // Applies `moves` to the KV cache of every layer of this stage (before a forward that reads
  // the moved positions). Throws (request scope) when a move does not fit the cache.
  void move_kv(std::span<const KvMove> moves);
  // Sub-layers left out and the all-reduces that saved, since construction (SWIFT's drafts).
  std::int64_t skipped_sublayers() const { return skipped_sublayers_; }
  std::int64_t skipped_reductions() const { return skipped_reductions_; }

  // Runs this stage on x[T, H]: embeds first if has_embedding(), then every layer with
  // standard_layer. x holds the stage's output hidden state afterwards.
  void run_stage(const Batch& batch, const kernels::TensorView& x);

  // Last stage: final norm + LM head for the logit rows of `batch` (see Batch), into
  // out[rows, layout().vocab_local()] — this rank's vocabulary slice. No communication.
  void local_logits(const Batch& batch, const kernels::TensorView& x, const kernels::TensorView& out);
  // Gathers every rank's local_logits into full[rows, vocab] on every rank (all-gather).
  void gather_logits(const kernels::TensorView& local, std::vector<float>& full);

  // Single-stage convenience: run_stage + local_logits + gather_logits. Returns
  // logits[batch.logit_rows(), vocab] (row-major). Requires first and last stage.
  std::vector<float> forward(const Batch& batch);

 private:
  struct Layer;
  struct Scratch;
  void load(const CheckpointReader& reader, const LoadOptions& opt);
  // Device models: moves a host-staged tensor to the GPU (no-op on the CPU).
  void to_device(kernels::Tensor& t) const;
  // Allocates weights and KV cache; on a GPU turns out-of-memory into the layout advice.
  void load_and_allocate(const CheckpointReader& reader, const LoadOptions& opt, std::int64_t capacity);
  // The TP all-reduce of a device buffer, through host staging.
  void all_reduce_staged(const kernels::TensorView& partial);
  // Throws (request scope) when a sequence's slot or positions do not fit the KV cache.
  void check_batch(const Batch& batch) const;
  const Layer& layer_ref(int layer) const;
  kernels::TensorView scratch(int which, std::int64_t rows, std::int64_t cols,
                              kernels::DType dtype = kernels::DType::kF32);
  // The type a norm or SwiGLU writes for the matmul by `w` after it: on a GPU, prefill rows
  // (more than the GEMV takes) in w's 16-bit type, which cuBLASLt reads as it is (the rounding
  // its conversion pass did, with one kernel and one pass over the activations fewer); f32
  // everywhere else.
  kernels::DType gemm_input(std::int64_t rows, const kernels::Tensor& w) const;
  void attention_core(const Batch& batch, const kernels::TensorView& qkv, int layer,
                      const kernels::TensorView& out);

  ModelConfig cfg_;
  transport::Group& tp_;
  transport::Group* device_tp_ = nullptr;  // use_device_group
  const kernels::Context& ctx_;
  TpLayout tp_layout_;
  int first_ = 0, last_ = 0;
  ElemType wtype_ = ElemType::kF32;
  std::string weight_pages_;  // weight_pages()
  std::vector<Layer> layers_;
  kernels::Tensor embed_, final_norm_, lm_head_;  // lm_head_ empty when tied: use embed_
  kernels::RopeTable rope_;
  kernels::KvCache kv_;
  std::vector<kernels::Tensor> scratch_;
  kernels::Tensor host_stage_;  // device models: host copy of a partial sum or of logits
  std::vector<std::int32_t> positions_;
  std::span<std::byte> window_;        // registered with tp_ (LoadOptions::window_bytes)
  std::size_t window_buffer_bytes_ = 0;  // each of the two reduce buffers in it
  std::int64_t skipped_sublayers_ = 0, skipped_reductions_ = 0;
};

}  // namespace trellis::runtime
