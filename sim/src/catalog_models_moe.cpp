// Mixture-of-experts and MLA models: catalog entries from each checkpoint's public
// config.json on the Hugging Face hub, and the config.json fields that describe experts and
// latent attention. docs/planner.md, "MoE and MLA", has the formulas that use them.
#include "catalog_models_moe.hpp"

#include <algorithm>
#include <cctype>
#include <string>

#include "trellis/core/error.hpp"

namespace trellis::sim::detail {
namespace {

struct Dense {
  const char* name;
  int layers, hidden, intermediate, heads, kv_heads, head_dim, vocab, max_positions;
  const char* source;
};

ModelSpec dense_part(const Dense& d) {
  ModelSpec m;
  m.name = d.name;
  m.layers = d.layers;
  m.hidden = d.hidden;
  m.intermediate = d.intermediate;
  m.heads = d.heads;
  m.kv_heads = d.kv_heads;
  m.head_dim = d.head_dim;
  m.vocab = d.vocab;
  m.max_positions = d.max_positions;
  m.source = d.source;
  return m;
}

ModelSpec deepseek_v3() {
  // deepseek-ai/DeepSeek-V3 config.json: num_hidden_layers 61, hidden_size 7168,
  // intermediate_size 18432 (the dense layers), num_attention_heads 128, num_key_value_heads
  // 128, vocab_size 129280, max_position_embeddings 163840, tie_word_embeddings false;
  // n_routed_experts 256, num_experts_per_tok 8, n_shared_experts 1, moe_intermediate_size 2048,
  // first_k_dense_replace 3, moe_layer_freq 1; kv_lora_rank 512, q_lora_rank 1536,
  // qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128. The multi-token-prediction
  // module (num_nextn_predict_layers 1, 14 B more on the hub) serves speculative decoding
  // and is not loaded here.
  ModelSpec m = dense_part({"deepseek-v3", 61, 7168, 18432, 128, 128, 192, 129280, 163840,
                            "deepseek-ai/DeepSeek-V3 config.json (MTP module not counted)"});
  m.moe = {256, 8, 2048, 2048, moe_layer_pattern(61, 3, 1, 0)};
  m.mla = {512, 1536, 64, 128, 128};
  return m;
}

ModelSpec mixtral_8x22b() {
  // mistralai/Mixtral-8x22B-v0.1 config.json: num_hidden_layers 56, hidden_size 6144,
  // intermediate_size 16384 (each expert's width: Mixtral has no moe_intermediate_size),
  // num_attention_heads 48, num_key_value_heads 8, vocab_size 32768, max_position_embeddings
  // 65536, num_local_experts 8, num_experts_per_tok 2; every layer MoE, no shared expert.
  ModelSpec m = dense_part({"mixtral-8x22b", 56, 6144, 16384, 48, 8, 128, 32768, 65536,
                            "mistralai/Mixtral-8x22B-v0.1 config.json"});
  m.moe = {8, 2, 16384, 0, moe_layer_pattern(56, 0, 1, 0)};
  return m;
}

ModelSpec qwen3_moe(const char* name, int layers, int hidden, int intermediate, int heads, int moe_inter,
                    const char* source) {
  // Qwen3-MoE config.json: head_dim 128, num_key_value_heads 4, vocab_size 151936,
  // max_position_embeddings 40960, num_experts 128, num_experts_per_tok 8,
  // decoder_sparse_step 1, mlp_only_layers [], no shared expert, tie_word_embeddings false.
  ModelSpec m = dense_part({name, layers, hidden, intermediate, heads, 4, 128, 151936, 40960, source});
  m.moe = {128, 8, moe_inter, 0, moe_layer_pattern(layers, 0, 1, -1)};
  return m;
}

// Fields the planner reads, or knows and leaves out because they change which experts a
// token picks (the planner assumes routing spreads tokens evenly, up to the load-imbalance
// factor) or not what is computed per token at all.
constexpr const char* kKnown[] = {
    "num_local_experts", "n_routed_experts", "num_experts", "num_experts_per_tok", "n_shared_experts",
    "moe_intermediate_size", "shared_expert_intermediate_size", "first_k_dense_replace", "moe_layer_freq",
    "decoder_sparse_step", "mlp_only_layers", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim",
    "qk_nope_head_dim", "v_head_dim",
    // routing details: which experts, not how many
    "norm_topk_prob", "routed_scaling_factor", "scoring_func", "topk_method", "n_group", "topk_group",
    // training-only
    "router_aux_loss_coef", "aux_loss_alpha", "seq_aux", "output_router_logits", "router_jitter_noise", "ep_size",
    // DeepSeek-V3's multi-token-prediction module: speculative decoding, not loaded for plain decoding
    "num_nextn_predict_layers"};

// Name fragments of fields about experts, routing or latent attention: such a field that is
// not in kKnown is refused by name.
constexpr const char* kMoeWords[] = {"expert", "moe", "router", "routed", "topk", "top_k", "lora", "sparse",
                                     "nextn", "latent", "mlp_only"};

bool present(const nlohmann::json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && !it->is_null() && !(it->is_number() && it->get<double>() == 0);
}

int positive(const nlohmann::json& j, const char* name, std::string_view origin, bool zero_ok = false) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) throw_error(ErrorCode::kCorruptInput, "{}: field '{}' is missing", origin, name);
  if (!it->is_number_integer() || it->get<long long>() < (zero_ok ? 0 : 1) || it->get<long long>() > (1 << 30))
    throw_error(ErrorCode::kCorruptInput, "{}: field '{}' must be a {} integer (got {})", origin, name,
                zero_ok ? "non-negative" : "positive", it->dump());
  return static_cast<int>(it->get<long long>());
}

void refuse_unknown(const nlohmann::json& j, std::string_view origin) {
  for (const auto& [key, value] : j.items()) {
    std::string lower = key;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    const bool moe_word = std::any_of(std::begin(kMoeWords), std::end(kMoeWords),
                                      [&](const char* w) { return lower.find(w) != std::string::npos; });
    const bool known = std::any_of(std::begin(kKnown), std::end(kKnown), [&](const char* k) { return key == k; });
    if (moe_word && !known)
      throw_error(ErrorCode::kInvalidArgument,
                  "{}: field '{}' (experts, routing or latent attention) is not modelled by the planner, which "
                  "would plan the model as something it is not; expert and MLA fields it reads: num_local_experts, "
                  "n_routed_experts, num_experts, num_experts_per_tok, n_shared_experts, moe_intermediate_size, "
                  "shared_expert_intermediate_size, first_k_dense_replace, moe_layer_freq, decoder_sparse_step, "
                  "mlp_only_layers, kv_lora_rank, q_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim",
                  origin, key);
  }
}

void read_experts(const nlohmann::json& j, ModelSpec& m, std::string_view origin) {
  const char* count_field = nullptr;
  for (const char* f : {"num_local_experts", "n_routed_experts", "num_experts"})
    if (present(j, f)) {
      const int e = positive(j, f, origin);
      if (count_field && e != m.moe.experts)
        throw_error(ErrorCode::kCorruptInput, "{}: fields '{}' ({}) and '{}' ({}) disagree on the number of experts",
                    origin, count_field, m.moe.experts, f, e);
      count_field = f;
      m.moe.experts = e;
    }
  if (!count_field) return;
  m.moe.top_k = positive(j, "num_experts_per_tok", origin);
  if (m.moe.top_k > m.moe.experts)
    throw_error(ErrorCode::kCorruptInput, "{}: num_experts_per_tok {} exceeds the {} experts ('{}')", origin,
                m.moe.top_k, m.moe.experts, count_field);
  // Mixtral has no moe_intermediate_size: its intermediate_size is each expert's width.
  m.moe.expert_intermediate =
      present(j, "moe_intermediate_size") ? positive(j, "moe_intermediate_size", origin) : m.intermediate;
  if (present(j, "shared_expert_intermediate_size"))
    m.moe.shared_intermediate = positive(j, "shared_expert_intermediate_size", origin);
  else if (present(j, "n_shared_experts"))
    m.moe.shared_intermediate = positive(j, "n_shared_experts", origin) * m.moe.expert_intermediate;
  const int first_dense = present(j, "first_k_dense_replace") ? positive(j, "first_k_dense_replace", origin) : 0;
  if (first_dense > m.layers)
    throw_error(ErrorCode::kCorruptInput, "{}: first_k_dense_replace {} exceeds the {} layers", origin, first_dense,
                m.layers);
  if (present(j, "moe_layer_freq") && present(j, "decoder_sparse_step"))
    throw_error(ErrorCode::kInvalidArgument,
                "{}: both 'moe_layer_freq' and 'decoder_sparse_step' are set; the planner knows each alone "
                "(DeepSeek's and Qwen's layer patterns) but not the two together",
                origin);
  int step = 1, offset = 0;
  if (present(j, "moe_layer_freq")) step = positive(j, "moe_layer_freq", origin);
  if (present(j, "decoder_sparse_step")) step = positive(j, "decoder_sparse_step", origin), offset = -1;
  std::vector<int> dense;
  if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) throw_error(ErrorCode::kCorruptInput, "{}: field 'mlp_only_layers' must be a list", origin);
    for (const auto& v : *it) {
      if (!v.is_number_integer() || v.get<long long>() < 0 || v.get<long long>() >= m.layers)
        throw_error(ErrorCode::kCorruptInput, "{}: field 'mlp_only_layers' holds {}, not a layer index below {}",
                    origin, v.dump(), m.layers);
      dense.push_back(v.get<int>());
    }
  }
  m.moe.moe_before = moe_layer_pattern(m.layers, first_dense, step, offset, dense);
}

void read_mla(const nlohmann::json& j, ModelSpec& m, std::string_view origin) {
  if (!present(j, "kv_lora_rank")) {
    for (const char* f : {"q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim"})
      if (present(j, f))
        throw_error(ErrorCode::kInvalidArgument,
                    "{}: field '{}' without 'kv_lora_rank': latent attention without a compressed KV is not "
                    "modelled by the planner",
                    origin, f);
    return;
  }
  m.mla.kv_lora_rank = positive(j, "kv_lora_rank", origin);
  m.mla.q_lora_rank = present(j, "q_lora_rank") ? positive(j, "q_lora_rank", origin) : 0;
  m.mla.qk_rope_head_dim = positive(j, "qk_rope_head_dim", origin);
  m.mla.qk_nope_head_dim = positive(j, "qk_nope_head_dim", origin);
  m.mla.v_head_dim = positive(j, "v_head_dim", origin);
  m.head_dim = m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim;
}

}  // namespace

std::vector<int> moe_layer_pattern(int layers, int first_dense, int step, int offset, const std::vector<int>& dense) {
  std::vector<int> before(static_cast<std::size_t>(layers) + 1, 0);
  for (int i = 0; i < layers; ++i) {
    const bool moe = i >= first_dense && (i - offset) % step == 0 &&
                     std::find(dense.begin(), dense.end(), i) == dense.end();
    before[static_cast<std::size_t>(i) + 1] = before[static_cast<std::size_t>(i)] + moe;
  }
  return before;
}

const std::vector<ModelSpec>& moe_models() {
  static const std::vector<ModelSpec> kModels = {
      deepseek_v3(),
      mixtral_8x22b(),
      qwen3_moe("qwen3-235b-a22b", 94, 4096, 12288, 64, 1536, "Qwen/Qwen3-235B-A22B config.json"),
      qwen3_moe("qwen3-30b-a3b", 48, 2048, 6144, 32, 768, "Qwen/Qwen3-30B-A3B config.json"),
  };
  return kModels;
}

void read_experts_and_mla(const nlohmann::json& j, ModelSpec& m, std::string_view origin) {
  refuse_unknown(j, origin);
  read_experts(j, m, origin);
  read_mla(j, m, origin);
}

}  // namespace trellis::sim::detail
