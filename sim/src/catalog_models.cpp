// Model shapes from the public config.json of each checkpoint on the Hugging Face hub
// (hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads, vocab_size, tie_word_embeddings, max_position_embeddings).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "catalog_lookup.hpp"
#include "catalog_models_moe.hpp"
#include "trellis/core/error.hpp"
#include "trellis/sim/catalog.hpp"

namespace trellis::sim {
namespace {

ModelSpec shape(std::string name, int layers, int hidden, int inter, int heads, int kv, int vocab, bool tied,
                int max_pos, std::string source, bool qkv_bias = false) {
  ModelSpec m;
  m.name = std::move(name);
  m.layers = layers;
  m.hidden = hidden;
  m.intermediate = inter;
  m.heads = heads;
  m.kv_heads = kv;
  m.head_dim = hidden / heads;
  m.vocab = vocab;
  m.tied_embeddings = tied;
  m.qkv_bias = qkv_bias;
  m.max_positions = max_pos;
  m.source = std::move(source);
  return m;
}

const std::vector<ModelSpec>& models() {
  static const std::vector<ModelSpec> kModels = {
      shape("llama-2-7b", 32, 4096, 11008, 32, 32, 32000, false, 4096, "meta-llama/Llama-2-7b-hf config.json"),
      shape("llama-2-13b", 40, 5120, 13824, 40, 40, 32000, false, 4096, "meta-llama/Llama-2-13b-hf config.json"),
      shape("llama-2-70b", 80, 8192, 28672, 64, 8, 32000, false, 4096, "meta-llama/Llama-2-70b-hf config.json"),
      shape("llama-3.1-8b", 32, 4096, 14336, 32, 8, 128256, false, 131072, "meta-llama/Llama-3.1-8B config.json"),
      shape("llama-3.1-70b", 80, 8192, 28672, 64, 8, 128256, false, 131072,
            "meta-llama/Llama-3.1-70B config.json"),
      shape("llama-3.1-405b", 126, 16384, 53248, 128, 8, 128256, false, 131072,
            "meta-llama/Llama-3.1-405B config.json"),
      shape("llama-3.2-1b", 16, 2048, 8192, 32, 8, 128256, true, 131072, "meta-llama/Llama-3.2-1B config.json"),
      shape("llama-3.2-3b", 28, 3072, 8192, 24, 8, 128256, true, 131072, "meta-llama/Llama-3.2-3B config.json"),
      shape("mistral-7b", 32, 4096, 14336, 32, 8, 32000, false, 32768, "mistralai/Mistral-7B-v0.1 config.json"),
      shape("qwen2.5-7b", 28, 3584, 18944, 28, 4, 152064, false, 131072, "Qwen/Qwen2.5-7B config.json", true),
      shape("qwen2.5-72b", 80, 8192, 29568, 64, 8, 152064, false, 131072, "Qwen/Qwen2.5-72B config.json", true),
      shape("smollm2-135m", 30, 576, 1536, 9, 3, 49152, true, 8192,
            "HuggingFaceTB/SmolLM2-135M-Instruct config.json (the model of issue 9)"),
      shape("smollm2-1.7b", 24, 2048, 8192, 32, 32, 49152, true, 8192, "HuggingFaceTB/SmolLM2-1.7B config.json"),
  };
  static const std::vector<ModelSpec> kAll = [] {
    std::vector<ModelSpec> all = kModels;
    for (const auto& m : detail::moe_models()) all.push_back(m);
    return all;
  }();
  return kAll;
}

const nlohmann::json& field(const nlohmann::json& j, const char* name, std::string_view origin) {
  auto it = j.find(name);
  if (it == j.end())
    throw_error(ErrorCode::kCorruptInput, "{}: field '{}' is missing", origin, name);
  if (!it->is_number_integer() || it->get<long long>() <= 0)
    throw_error(ErrorCode::kCorruptInput, "{}: field '{}' must be a positive integer (got {})", origin, name,
                it->dump());
  return *it;
}

int int_field(const nlohmann::json& j, const char* name, std::string_view origin) {
  return static_cast<int>(field(j, name, origin).get<long long>());
}

}  // namespace

double ModelSpec::attention_params() const {
  const double h = hidden, n = heads;
  if (is_mla()) {
    // DeepSeek-V3's MLA: q_a (hidden -> q_lora_rank, RMSNorm) and q_b (-> heads x (nope + rope)),
    // kv_a (hidden -> kv_lora_rank + rope, RMSNorm on the latent), kv_b (latent -> heads x
    // (nope + v)), o (heads x v -> hidden).
    const double qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim;
    const double q = mla.q_lora_rank > 0 ? h * mla.q_lora_rank + mla.q_lora_rank + mla.q_lora_rank * n * qk : h * n * qk;
    const double kv = h * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank +
                      static_cast<double>(mla.kv_lora_rank) * n * (mla.qk_nope_head_dim + mla.v_head_dim);
    return q + kv + n * mla.v_head_dim * h;
  }
  const double q = n * head_dim, kv = static_cast<double>(kv_heads) * head_dim;
  return h * (q + 2 * kv) + q * h + (qkv_bias ? q + 2 * kv : 0);
}

double ModelSpec::dense_mlp_params() const { return 3.0 * hidden * intermediate; }
double ModelSpec::expert_params() const { return 3.0 * hidden * moe.expert_intermediate; }
double ModelSpec::shared_expert_params() const { return 3.0 * hidden * moe.shared_intermediate; }
double ModelSpec::router_params() const { return static_cast<double>(hidden) * moe.experts; }

double ModelSpec::layer_params() const {
  const double n_moe = moe_layers_in(0, layers);
  const double moe_block = moe.experts * expert_params() + shared_expert_params() + router_params();
  const double mlp = ((layers - n_moe) * dense_mlp_params() + n_moe * moe_block) / layers;
  return attention_params() + mlp + 2.0 * hidden;  // two RMSNorm weights
}

double ModelSpec::active_layer_params() const {
  return layer_params() - static_cast<double>(moe_layers_in(0, layers)) * (moe.experts - moe.top_k) * expert_params() / layers;
}

double ModelSpec::embedding_params() const { return static_cast<double>(vocab) * hidden; }
double ModelSpec::lm_head_params() const { return tied_embeddings ? 0 : static_cast<double>(vocab) * hidden; }

double ModelSpec::total_params() const {
  return layers * layer_params() + embedding_params() + lm_head_params() + hidden;
}

double ModelSpec::active_params() const {
  return layers * active_layer_params() + embedding_params() + lm_head_params() + hidden;
}

double ModelSpec::kv_bytes_per_token_layer(double bytes_per_element) const {
  if (is_mla()) return static_cast<double>(mla.kv_lora_rank + mla.qk_rope_head_dim) * bytes_per_element;
  return 2.0 * kv_heads * head_dim * bytes_per_element;
}

std::span<const ModelSpec> model_catalog() { return models(); }

std::string model_names() {
  std::string out;
  for (const auto& m : models()) out += (out.empty() ? "" : ", ") + m.name;
  return out;
}

ModelSpec parse_model_config(std::string_view json_text, std::string_view origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::parse_error& e) {
    throw_error(ErrorCode::kCorruptInput, "{}: not valid JSON: {}", origin, e.what());
  }
  if (!j.is_object()) throw_error(ErrorCode::kCorruptInput, "{}: expected a JSON object", origin);
  ModelSpec m;
  m.name = std::string(origin);
  m.layers = int_field(j, "num_hidden_layers", origin);
  m.hidden = int_field(j, "hidden_size", origin);
  m.intermediate = int_field(j, "intermediate_size", origin);
  m.heads = int_field(j, "num_attention_heads", origin);
  m.kv_heads = j.contains("num_key_value_heads") ? int_field(j, "num_key_value_heads", origin) : m.heads;
  m.vocab = int_field(j, "vocab_size", origin);
  m.head_dim = j.contains("head_dim") && !j["head_dim"].is_null() ? int_field(j, "head_dim", origin)
                                                                  : m.hidden / m.heads;
  if (m.hidden % m.heads != 0 && !j.contains("head_dim"))
    throw_error(ErrorCode::kCorruptInput, "{}: hidden_size {} is not a multiple of num_attention_heads {}",
                origin, m.hidden, m.heads);
  if (m.heads % m.kv_heads != 0)
    throw_error(ErrorCode::kCorruptInput, "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                origin, m.heads, m.kv_heads);
  if (auto it = j.find("tie_word_embeddings"); it != j.end()) {
    if (!it->is_boolean())
      throw_error(ErrorCode::kCorruptInput, "{}: field 'tie_word_embeddings' must be true or false", origin);
    m.tied_embeddings = it->get<bool>();
  }
  if (auto it = j.find("max_position_embeddings"); it != j.end() && it->is_number_integer())
    m.max_positions = it->get<int>();
  m.qkv_bias = j.value("attention_bias", false) || j.value("model_type", std::string()) == "qwen2";
  // Experts and latent attention: read where the planner models them, refused by name where
  // it does not (catalog_models_moe.cpp), never planned as the dense model they are not.
  detail::read_experts_and_mla(j, m, origin);
  // A model trained with attention and MLP side by side (GPT-NeoX/Pythia's
  // use_parallel_residual, Falcon's parallel_attn, GPT-J) is the `parallel` variant.
  for (const char* f : {"use_parallel_residual", "parallel_attn"})
    if (auto it = j.find(f); it != j.end()) {
      if (!it->is_boolean())
        throw_error(ErrorCode::kCorruptInput, "{}: field '{}' must be true or false (got {})", origin, f, it->dump());
      if (it->get<bool>()) {
        m.trained_variant = Variant::kParallel;
        m.trained_variant_field = f;
      }
    }
  if (j.value("model_type", std::string()) == "gptj") {
    m.trained_variant = Variant::kParallel;
    m.trained_variant_field = "model_type: gptj";
  }
  m.source = "local file " + std::string(origin);
  return m;
}

ModelSpec load_model(std::string_view name_or_path) {
  const std::string key = detail::catalog_key(name_or_path);
  for (const auto& m : models())
    if (detail::catalog_key(m.name) == key) return m;
  std::filesystem::path path(name_or_path);
  if (std::filesystem::is_directory(path)) path /= "config.json";
  if (!std::filesystem::is_regular_file(path))
    throw_error(ErrorCode::kNotFound, "unknown model '{}' (not a catalog name, not a config.json file); valid "
                "models: {}", name_or_path, model_names());
  std::ifstream in(path);
  if (!in) throw_error(ErrorCode::kIo, "cannot read model config {}", path.string());
  std::stringstream text;
  text << in.rdbuf();
  return parse_model_config(text.str(), path.string());
}

}  // namespace trellis::sim
