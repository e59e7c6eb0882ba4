#include "trellis/runtime/model/config.hpp"

#include <nlohmann/json.hpp>

#include "trellis/core/error.hpp"

namespace trellis::runtime {
namespace {

using nlohmann::json;

template <typename T>
T get_or(const json& j, const char* key, T dflt, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw_error(ErrorCode::kInvalidArgument, "{}: field '{}' has the wrong type ({})", source, key, it->dump());
  }
}

template <typename T>
T require(const json& j, const char* key, const std::string& source) {
  if (!j.contains(key) || j[key].is_null())
    throw_error(ErrorCode::kInvalidArgument, "{}: required field '{}' is missing", source, key);
  return get_or<T>(j, key, T{}, source);
}

void parse_rope_scaling(const json& j, ModelConfig& c, const std::string& source) {
  auto it = j.find("rope_scaling");
  if (it == j.end() || it->is_null()) return;
  if (!it->is_object()) throw_error(ErrorCode::kInvalidArgument, "{}: 'rope_scaling' must be an object", source);
  std::string type = get_or<std::string>(*it, "rope_type", get_or<std::string>(*it, "type", "", source), source);
  if (type == "default" || type.empty()) return;
  if (type != "llama3")
    throw_error(ErrorCode::kUnsupported, "{}: rope_scaling type '{}' is not supported (only llama3)", source, type);
  c.rope.scaling = kernels::RopeScaling::kLlama3;
  c.rope.factor = get_or<double>(*it, "factor", 8.0, source);
  c.rope.low_freq_factor = get_or<double>(*it, "low_freq_factor", 1.0, source);
  c.rope.high_freq_factor = get_or<double>(*it, "high_freq_factor", 4.0, source);
  c.rope.original_max_position_embeddings =
      get_or<std::int64_t>(*it, "original_max_position_embeddings", 8192, source);
}

}  // namespace

std::int64_t ModelConfig::parameter_count() const {
  std::int64_t h = hidden_size, qd = std::int64_t{num_heads} * head_dim, kvd = std::int64_t{num_kv_heads} * head_dim;
  std::int64_t layer = 2 * h + h * qd + 2 * h * kvd + qd * h + 3 * h * intermediate_size;
  if (attention_bias) layer += qd + 2 * kvd;
  std::int64_t p = vocab_size * h + num_layers * layer + h;
  if (!tie_word_embeddings) p += vocab_size * h;
  return p;
}

double ModelConfig::decode_weight_bytes(double bytes_per_weight) const {
  double lm_head = static_cast<double>(vocab_size * hidden_size);
  double rest = static_cast<double>(parameter_count() - vocab_size * hidden_size * (tie_word_embeddings ? 1 : 2));
  return (rest + lm_head) * bytes_per_weight;
}

void ModelConfig::validate(const std::string& source) const {
  auto bad = [&](const char* field, auto value, const char* why) {
    throw_error(ErrorCode::kInvalidArgument, "{}: {} = {} {}", source, field, value, why);
  };
  if (vocab_size <= 0) bad("vocab_size", vocab_size, "must be positive");
  if (hidden_size <= 0) bad("hidden_size", hidden_size, "must be positive");
  if (intermediate_size <= 0) bad("intermediate_size", intermediate_size, "must be positive");
  if (num_layers <= 0) bad("num_hidden_layers", num_layers, "must be positive");
  if (num_heads <= 0) bad("num_attention_heads", num_heads, "must be positive");
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0)
    bad("num_key_value_heads", num_kv_heads, "must be positive and divide num_attention_heads");
  if (head_dim <= 0 || head_dim % 2 != 0) bad("head_dim", head_dim, "must be positive and even");
  if (rms_norm_eps <= 0) bad("rms_norm_eps", rms_norm_eps, "must be positive");
  if (rope.theta <= 0) bad("rope_theta", rope.theta, "must be positive");
}

ModelConfig parse_model_config(const std::string& text, const std::string& source) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw_error(ErrorCode::kInvalidArgument, "{}: not a JSON object", source);
  ModelConfig c;
  c.model_type = get_or<std::string>(j, "model_type", "llama", source);
  c.vocab_size = require<std::int64_t>(j, "vocab_size", source);
  c.hidden_size = require<std::int64_t>(j, "hidden_size", source);
  c.intermediate_size = require<std::int64_t>(j, "intermediate_size", source);
  c.num_layers = require<int>(j, "num_hidden_layers", source);
  c.num_heads = require<int>(j, "num_attention_heads", source);
  c.num_kv_heads = get_or<int>(j, "num_key_value_heads", c.num_heads, source);
  c.head_dim = get_or<int>(j, "head_dim", c.num_heads > 0 ? static_cast<int>(c.hidden_size / c.num_heads) : 0, source);
  c.rms_norm_eps = get_or<double>(j, "rms_norm_eps", 1e-6, source);
  c.rope.theta = get_or<double>(j, "rope_theta", 10000.0, source);
  c.rope.head_dim = c.head_dim;
  parse_rope_scaling(j, c, source);
  c.max_position_embeddings = get_or<std::int64_t>(j, "max_position_embeddings", 4096, source);
  c.tie_word_embeddings = get_or<bool>(j, "tie_word_embeddings", false, source);
  c.attention_bias = get_or<bool>(j, "attention_bias", c.model_type == "qwen2", source);
  c.torch_dtype = get_or<std::string>(j, "torch_dtype", "", source);
  if (c.model_type != "qwen2" || get_or<bool>(j, "use_sliding_window", false, source))
    c.sliding_window = get_or<std::int64_t>(j, "sliding_window", 0, source);
  c.validate(source);
  return c;
}

std::string to_config_json(const ModelConfig& c) {
  static const char* kArch[][2] = {{"llama", "LlamaForCausalLM"}, {"qwen2", "Qwen2ForCausalLM"},
                                   {"mistral", "MistralForCausalLM"}};
  std::string arch = "LlamaForCausalLM";
  for (auto& a : kArch)
    if (c.model_type == a[0]) arch = a[1];
  json j = {{"architectures", {arch}},
            {"model_type", c.model_type},
            {"vocab_size", c.vocab_size},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.intermediate_size},
            {"num_hidden_layers", c.num_layers},
            {"num_attention_heads", c.num_heads},
            {"num_key_value_heads", c.num_kv_heads},
            {"head_dim", c.head_dim},
            {"rms_norm_eps", c.rms_norm_eps},
            {"rope_theta", c.rope.theta},
            {"max_position_embeddings", c.max_position_embeddings},
            {"tie_word_embeddings", c.tie_word_embeddings},
            {"attention_bias", c.attention_bias},
            {"hidden_act", "silu"}};
  if (!c.torch_dtype.empty()) j["torch_dtype"] = c.torch_dtype;
  if (c.sliding_window > 0) j["sliding_window"] = c.sliding_window;
  if (c.rope.scaling == kernels::RopeScaling::kLlama3)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", c.rope.factor},
                         {"low_freq_factor", c.rope.low_freq_factor},
                         {"high_freq_factor", c.rope.high_freq_factor},
                         {"original_max_position_embeddings", c.rope.original_max_position_embeddings}};
  else
    j["rope_scaling"] = nullptr;
  return j.dump(2) + "\n";
}

}  // namespace trellis::runtime
