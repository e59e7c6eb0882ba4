// ModelConfig: the shape of a Llama-family decoder, read from a Hugging Face config.json
// (LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM field names) and written back out
// by `trellis make-model`.
//
// Fields read: vocab_size, hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads (default: num_attention_heads), head_dim
// (default: hidden_size / num_attention_heads), rms_norm_eps, rope_theta, rope_scaling
// (rope_type/type "llama3" with factor, low_freq_factor, high_freq_factor,
// original_max_position_embeddings; absent/null means none), max_position_embeddings,
// tie_word_embeddings, attention_bias (Qwen2 has q/k/v biases and no such field: a
// model_type of "qwen2" implies it), torch_dtype, sliding_window (+ use_sliding_window).
// Anything else is ignored.
#pragma once

#include <cstdint>
#include <string>

#include "trellis/kernels/rope.hpp"

namespace trellis::runtime {

struct ModelConfig {
  std::string model_type = "llama";  // "llama", "qwen2", "mistral"
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  double rms_norm_eps = 1e-5;
  kernels::RopeConfig rope;  // rope.head_dim == head_dim
  std::int64_t max_position_embeddings = 4096;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections have biases (Qwen2)
  std::string torch_dtype;      // "bfloat16", "float32", "float16" or empty
  // Mistral's sliding-window attention span (0: none). Qwen2 configs carry a window but
  // use it only with use_sliding_window: true. The model attends over the full context, so
  // it refuses a context longer than a non-zero window instead of computing it wrongly.
  std::int64_t sliding_window = 0;

  // Parameter count of the whole model (embedding, layers, final norm, LM head if untied).
  std::int64_t parameter_count() const;
  // Bytes of weights one decode step reads at `bytes_per_weight`: every layer, the final
  // norm and the LM head (the embedding contributes one row per token).
  double decode_weight_bytes(double bytes_per_weight) const;

  // Throws kInvalidArgument naming `source` and the field when the shape is impossible
  // (non-positive sizes, heads not a multiple of KV heads, odd head_dim, ...).
  void validate(const std::string& source) const;
};

// Parses config.json text; `source` (a path) is quoted in errors.
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);
// config.json text for `cfg` (architectures, model_type and every field above).
std::string to_config_json(const ModelConfig& cfg);

}  // namespace trellis::runtime
