// Catalogs the planner predicts from: devices (GPUs and a CPU host), links (NVLink
// generations, PCIe, InfiniBand, RoCE, TCP, shared memory) and model shapes (public
// config.json values, or a local config.json). Every entry carries a source note saying
// where its numbers come from; numbers that are assumptions say so.
//
// Dense and sparse FLOP/s are separate fields on purpose: datasheets headline the 2:4
// structured-sparsity figure, which dense LLM inference never reaches, and planners that
// read the headline over-predict compute-bound phases twofold. The cost model reads only
// the dense fields.
//
// Catalog lookups are case-insensitive; an unknown name throws kNotFound listing the valid
// names. All data is immutable and static; functions are thread-safe.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "trellis/core/variant.hpp"

namespace trellis::sim {

using trellis::Variant;

enum class DeviceKind { kGpu, kCpu };

// One accelerator or CPU host as the cost model sees it. Bandwidths in bytes/s, FLOP/s per
// device, memory in bytes.
struct DeviceSpec {
  std::string name;               // catalog key, e.g. "H100-SXM"
  DeviceKind kind = DeviceKind::kGpu;
  double dense_flops_bf16 = 0;    // dense tensor-core (or SIMD) FLOP/s at 16-bit
  double sparse_flops_bf16 = 0;   // 2:4 structured-sparse figure, informational only
  double dense_flops_fp32 = 0;    // used for f32 compute (the CPU path)
  double memory_bytes = 0;        // device memory (host RAM for kind kCpu)
  double memory_bandwidth = 0;    // bytes/s
  std::string intra_link;         // link catalog key between devices of one host
  std::string host_link;          // link catalog key device <-> host (PCIe gen)
  double launch_overhead_s = 0;   // fixed cost per kernel-group (one layer) launch
  std::string source;             // where the numbers come from
  double dense_flops_fp8 = 0;     // dense FP8 (e4m3) tensor-core FLOP/s; 0 = no FP8 tensor cores
  bool has_fp8() const { return dense_flops_fp8 > 0; }
};

// The class of a link, fastest first; mirrors the topology layer's classes.
enum class LinkKind { kSameProcess, kSharedMemory, kNvlink, kPcie, kRdma, kTcp };
std::string_view to_string(LinkKind k);

// One link type: per-direction bandwidth of one device's port and the per-step start-up
// latency alpha of a collective or transfer over it.
struct LinkSpec {
  std::string name;        // catalog key, e.g. "nvlink4", "ib-ndr"
  LinkKind kind = LinkKind::kPcie;
  double bandwidth = 0;    // bytes/s per direction, per device port
  double alpha_s = 0;      // start-up latency per communication step
  std::string source;
};

// Mixture of experts (DeepSeek-V3, Mixtral, Qwen3-MoE): in a MoE layer the MLP is `experts`
// routed SwiGLU experts of width `expert_intermediate`, of which a router (hidden x experts,
// replicated) sends each token to `top_k`, plus shared experts every token passes through
// (`shared_intermediate` is their widths added up). Layers that are not MoE layers keep
// the dense MLP of width ModelSpec::intermediate (DeepSeek-V3's first three); which they are
// is kept as a prefix count so that a stage's share is found in O(1).
struct MoeShape {
  int experts = 0;                 // routed experts per MoE layer; 0: a dense model
  int top_k = 0;                   // routed experts per token (num_experts_per_tok)
  int expert_intermediate = 0;     // FFN width of one routed expert
  int shared_intermediate = 0;     // FFN width of the shared experts together; 0: none
  std::vector<int> moe_before;     // MoE layers among layers [0, i), i = 0..layers; empty: dense
};

// Multi-head latent attention (DeepSeek-V2/V3): K and V are compressed into one latent of
// `kv_lora_rank` elements per token plus a `qk_rope_head_dim` RoPE key shared by all heads,
// and that is what the cache holds. Queries go through a `q_lora_rank` bottleneck (0: none).
struct MlaShape {
  int kv_lora_rank = 0;            // 0: ordinary attention (MHA/GQA)
  int q_lora_rank = 0;
  int qk_rope_head_dim = 0;
  int qk_nope_head_dim = 0;
  int v_head_dim = 0;
};

// A decoder-only model shape (Llama family: RMSNorm, SwiGLU MLP, GQA, RoPE), optionally with
// experts (MoeShape) and latent attention (MlaShape).
struct ModelSpec {
  std::string name;
  int layers = 0;
  int hidden = 0;
  int intermediate = 0;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;        // hidden / heads unless the config says otherwise
  int vocab = 0;
  bool tied_embeddings = false;
  bool qkv_bias = false;
  int max_positions = 0;
  std::string source;
  // The variant the checkpoint was trained as: `standard` unless its config says otherwise
  // (`use_parallel_residual`, `parallel_attn` or a GPT-J config: attention and MLP side by
  // side, i.e. `parallel`). Other variants need a model trained for them.
  Variant trained_variant = Variant::kStandard;
  std::string trained_variant_field;  // the config field that said so (empty: standard)

  MoeShape moe;
  MlaShape mla;

  bool is_moe() const { return moe.experts > 0; }
  bool is_mla() const { return mla.kv_lora_rank > 0; }
  bool is_moe_layer(int layer) const { return moe_layers_in(layer, 1) == 1; }
  // MoE layers among layers [first, first + n) (clipped to the model's layers).
  int moe_layers_in(int first, int n) const {
    const int size = static_cast<int>(moe.moe_before.size());
    if (!is_moe() || size == 0) return 0;
    const int lo = first < 0 ? 0 : first >= size ? size - 1 : first;
    const int hi = first + n < lo ? lo : first + n >= size ? size - 1 : first + n;
    return moe.moe_before[static_cast<std::size_t>(hi)] - moe.moe_before[static_cast<std::size_t>(lo)];
  }

  // Parameter counts (elements).
  double attention_params() const;    // one layer's attention (q, k, v, o or MLA's projections)
  double dense_mlp_params() const;    // a dense layer's MLP
  double expert_params() const;       // one routed expert (gate, up, down)
  double shared_expert_params() const;  // all shared experts of one MoE layer
  double router_params() const;       // one MoE layer's router
  double layer_params() const;        // one decoder layer, the mean over the layers (all experts)
  double active_layer_params() const; // the same with top_k routed experts instead of all
  double embedding_params() const;    // token embedding
  double lm_head_params() const;      // 0 extra when tied (shares the embedding)
  double total_params() const;
  // Parameters one token passes through: every routed expert but its top_k left out.
  double active_params() const;
  // Bytes of the KV cache for one token in one layer at `bytes_per_element`: K and V of all
  // KV heads, or with MLA the latent plus the RoPE key (kv_lora_rank + qk_rope_head_dim),
  // once for all heads.
  double kv_bytes_per_token_layer(double bytes_per_element) const;
};

std::span<const DeviceSpec> device_catalog();
std::span<const LinkSpec> link_catalog();
std::span<const ModelSpec> model_catalog();

// Lookups by catalog key (case-insensitive; '_' and '-' are interchangeable, and a few
// aliases like "H100" for "H100-SXM" are accepted). Unknown -> kNotFound with the list.
const DeviceSpec& find_device(std::string_view name);
const LinkSpec& find_link(std::string_view name);
// A catalog model name, or a path to a Hugging Face config.json (or a directory holding
// one). A malformed file throws kCorruptInput naming the file and the field. Experts and MLA
// are read (num_local_experts / n_routed_experts / num_experts, num_experts_per_tok,
// n_shared_experts, moe_intermediate_size, shared_expert_intermediate_size,
// first_k_dense_replace, moe_layer_freq, decoder_sparse_step, mlp_only_layers, kv_lora_rank,
// q_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim); a field about experts,
// routing or latent attention the planner does not know throws kInvalidArgument naming it,
// rather than being planned as a model it is not (docs/planner.md, "MoE and MLA").
ModelSpec load_model(std::string_view name_or_path);
// Parses the text of a config.json; `origin` names it in errors.
ModelSpec parse_model_config(std::string_view json_text, std::string_view origin);

// The catalog keys, comma-separated, for error messages and --help.
std::string device_names();
std::string link_names();
std::string model_names();
// Devices with FP8 tensor cores, comma-separated.
std::string fp8_device_names();

}  // namespace trellis::sim
