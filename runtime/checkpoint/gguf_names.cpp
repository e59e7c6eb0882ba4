// Name, layout and config translation between GGUF (llama.cpp's conventions) and the
// Hugging Face Llama conventions the model code is written against.
#include <array>
#include <charconv>
#include <string>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "trellis/core/error.hpp"
#include "trellis/runtime/checkpoint/gguf_reader.hpp"

namespace trellis::runtime::gguf {
namespace {

struct NamePair {
  std::string_view gguf, hf;
};

constexpr std::array kLayerNames = {
    NamePair{"attn_q", "self_attn.q_proj"},  NamePair{"attn_k", "self_attn.k_proj"},
    NamePair{"attn_v", "self_attn.v_proj"},  NamePair{"attn_output", "self_attn.o_proj"},
    NamePair{"ffn_gate", "mlp.gate_proj"},   NamePair{"ffn_up", "mlp.up_proj"},
    NamePair{"ffn_down", "mlp.down_proj"},   NamePair{"attn_norm", "input_layernorm"},
    NamePair{"ffn_norm", "post_attention_layernorm"},
};

constexpr std::array kGlobalNames = {
    NamePair{"token_embd", "model.embed_tokens"},
    NamePair{"output_norm", "model.norm"},
    NamePair{"output", "lm_head"},
};

// Splits "<stem>.weight" / "<stem>.bias" into stem and suffix (".weight" / ".bias").
bool split_suffix(std::string_view name, std::string_view& stem, std::string_view& suffix) {
  for (std::string_view s : {std::string_view(".weight"), std::string_view(".bias")}) {
    if (name.size() > s.size() && name.ends_with(s)) {
      stem = name.substr(0, name.size() - s.size());
      suffix = s;
      return true;
    }
  }
  return false;
}

// Parses "<prefix><N>.<rest>" into N and rest.
bool split_layer(std::string_view name, std::string_view prefix, std::string_view& layer, std::string_view& rest) {
  if (!name.starts_with(prefix)) return false;
  name.remove_prefix(prefix.size());
  auto dot = name.find('.');
  if (dot == 0 || dot == std::string_view::npos) return false;
  layer = name.substr(0, dot);
  int n = 0;
  auto [p, ec] = std::from_chars(layer.data(), layer.data() + layer.size(), n);
  if (ec != std::errc() || p != layer.data() + layer.size()) return false;
  rest = name.substr(dot + 1);
  return true;
}

std::optional<std::string> translate(std::string_view name, bool to_hf) {
  std::string_view stem, suffix, layer, rest;
  if (!split_suffix(name, stem, suffix)) return std::nullopt;
  for (const NamePair& p : kGlobalNames)
    if (stem == (to_hf ? p.gguf : p.hf)) return std::string(to_hf ? p.hf : p.gguf) + std::string(suffix);
  if (!split_layer(stem, to_hf ? "blk." : "model.layers.", layer, rest)) return std::nullopt;
  for (const NamePair& p : kLayerNames) {
    if (rest != (to_hf ? p.gguf : p.hf)) continue;
    return std::string(to_hf ? "model.layers." : "blk.") + std::string(layer) + "." +
           std::string(to_hf ? p.hf : p.gguf) + std::string(suffix);
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> hf_name_from_gguf(std::string_view gguf_name) { return translate(gguf_name, true); }
std::optional<std::string> gguf_name_from_hf(std::string_view hf_name) { return translate(hf_name, false); }

std::int64_t hf_row_to_gguf(std::int64_t hf_row, std::int64_t rows, std::int64_t n_heads) {
  const std::int64_t d = rows / n_heads, half = d / 2;
  const std::int64_t h = hf_row / d, j = hf_row % d;
  const std::int64_t s = j / half, i = j % half;
  return h * d + 2 * i + s;
}

std::int64_t gguf_row_to_hf(std::int64_t gguf_row, std::int64_t rows, std::int64_t n_heads) {
  const std::int64_t d = rows / n_heads, half = d / 2;
  const std::int64_t h = gguf_row / d, j = gguf_row % d;
  return h * d + (j % 2) * half + j / 2;
}

namespace {

// GGUF stores these as f32; the shortest decimal that round-trips the f32 (1e-06, not
// 9.99999997e-07) is what config.json held before conversion.
double f32_decimal(const Value& v, std::string_view what) {
  const double d = v.as_double(what);
  if (v.type != ValueType::kF32) return d;
  return std::stod(fmt::format("{}", static_cast<float>(d)));
}

}  // namespace

std::string config_json_from_metadata(const GgufFile& f) {
  const Value* arch_v = f.find("general.architecture");
  const std::string arch = arch_v ? arch_v->as_string(f.name() + ": general.architecture") : "llama";
  auto key = [&](std::string_view k) { return arch + "." + std::string(k); };
  auto get_int = [&](std::string_view k) { return f.require(key(k)).as_int(f.name() + ": " + key(k)); };
  auto opt = [&](const std::string& k) { return f.find(k); };

  nlohmann::json j;
  j["model_type"] = arch;
  j["architectures"] = {arch == "qwen2" ? "Qwen2ForCausalLM" : "LlamaForCausalLM"};
  const std::int64_t hidden = get_int("embedding_length");
  const std::int64_t heads = get_int("attention.head_count");
  j["hidden_size"] = hidden;
  j["intermediate_size"] = get_int("feed_forward_length");
  j["num_hidden_layers"] = get_int("block_count");
  j["num_attention_heads"] = heads;
  const Value* kv = opt(key("attention.head_count_kv"));
  j["num_key_value_heads"] = kv ? kv->as_int(key("attention.head_count_kv")) : heads;
  std::int64_t head_dim = heads > 0 ? hidden / heads : 0;
  if (const Value* v = opt(key("attention.key_length"))) head_dim = v->as_int(key("attention.key_length"));
  else if (const Value* r = opt(key("rope.dimension_count"))) head_dim = r->as_int(key("rope.dimension_count"));
  j["head_dim"] = head_dim;
  j["rms_norm_eps"] = f32_decimal(f.require(key("attention.layer_norm_rms_epsilon")), key("attention.layer_norm_rms_epsilon"));
  const Value* theta = opt(key("rope.freq_base"));
  j["rope_theta"] = theta ? f32_decimal(*theta, key("rope.freq_base")) : 10000.0;
  j["max_position_embeddings"] = get_int("context_length");

  std::int64_t vocab = 0;
  if (const Value* v = opt(key("vocab_size"))) vocab = v->as_int(key("vocab_size"));
  else if (const Value* t = opt("tokenizer.ggml.tokens")) vocab = static_cast<std::int64_t>(t->as_array("tokens").size());
  else if (const TensorEntry* e = f.find_tensor("token_embd.weight")) vocab = e->ne.size() > 1 ? e->ne[1] : 0;
  j["vocab_size"] = vocab;
  j["tie_word_embeddings"] = f.find_tensor("output.weight") == nullptr;
  if (const Value* v = opt("tokenizer.ggml.bos_token_id")) j["bos_token_id"] = v->as_int("bos_token_id");
  if (const Value* v = opt("tokenizer.ggml.eos_token_id")) j["eos_token_id"] = v->as_int("eos_token_id");

  if (const Value* st = opt(key("rope.scaling.type")); st && st->as_string(key("rope.scaling.type")) != "none") {
    nlohmann::json rs;
    rs["rope_type"] = st->s;
    rs["type"] = st->s;
    if (const Value* v = opt(key("rope.scaling.factor"))) rs["factor"] = f32_decimal(*v, key("rope.scaling.factor"));
    if (const Value* v = opt(key("rope.scaling.original_context_length")))
      rs["original_max_position_embeddings"] = v->as_int(key("rope.scaling.original_context_length"));
    j["rope_scaling"] = rs;
  }
  if (const Value* v = opt("trellis.rope_scaling")) {  // written by trellis: the exact HF object
    try {
      j["rope_scaling"] = nlohmann::json::parse(v->as_string("trellis.rope_scaling"));
    } catch (const nlohmann::json::exception& e) {
      throw_error(ErrorCode::kCorruptInput, "{}: trellis.rope_scaling is not JSON: {}", f.name(), e.what());
    }
  }
  return j.dump(2);
}

}  // namespace trellis::runtime::gguf
