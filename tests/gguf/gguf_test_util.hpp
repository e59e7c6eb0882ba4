// Helpers shared by the GGUF tests: a tiny Llama checkpoint with deterministic values,
// written through write_llama_gguf, and a scratch directory.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "trellis/runtime/checkpoint/gguf_writer.hpp"

namespace trellis::test {

inline std::filesystem::path scratch_dir(const std::string& tag) {
  auto dir = std::filesystem::temp_directory_path() /
             ("trellis_gguf_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

// Value of element (r, c) of a tensor, distinct per tensor (seeded by its name).
inline float synth_value(const std::string& name, std::int64_t r, std::int64_t c) {
  std::uint32_t h = 2166136261u;
  for (char ch : name) h = (h ^ static_cast<std::uint8_t>(ch)) * 16777619u;
  return std::sin(0.37f * static_cast<float>(r) + 0.11f * static_cast<float>(c) + static_cast<float>(h % 1000)) *
         (name.find("norm") != std::string::npos ? 1.0f : 0.25f);
}

struct TinyLlama {
  std::int64_t hidden = 64, heads = 4, kv_heads = 2, layers = 2, ff = 96, vocab = 80;
  std::int64_t head_dim() const { return hidden / heads; }

  std::string config_json() const {
    return "{\"hidden_size\": " + std::to_string(hidden) + ", \"num_attention_heads\": " + std::to_string(heads) +
           ", \"num_key_value_heads\": " + std::to_string(kv_heads) + ", \"num_hidden_layers\": " +
           std::to_string(layers) + ", \"intermediate_size\": " + std::to_string(ff) +
           ", \"vocab_size\": " + std::to_string(vocab) +
           ", \"rms_norm_eps\": 1e-6, \"rope_theta\": 50000.0, \"max_position_embeddings\": 512}";
  }

  std::vector<runtime::TensorInfo> tensors() const {
    std::vector<runtime::TensorInfo> out;
    auto add = [&](std::string n, std::vector<std::int64_t> shape) {
      runtime::TensorInfo t;
      t.name = std::move(n);
      t.shape = std::move(shape);
      out.push_back(std::move(t));
    };
    const std::int64_t kv = kv_heads * head_dim();
    add("model.embed_tokens.weight", {vocab, hidden});
    add("model.norm.weight", {hidden});
    add("lm_head.weight", {vocab, hidden});
    for (std::int64_t l = 0; l < layers; ++l) {
      std::string p = "model.layers." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", {hidden});
      add(p + "post_attention_layernorm.weight", {hidden});
      add(p + "self_attn.q_proj.weight", {hidden, hidden});
      add(p + "self_attn.k_proj.weight", {kv, hidden});
      add(p + "self_attn.v_proj.weight", {kv, hidden});
      add(p + "self_attn.o_proj.weight", {hidden, hidden});
      add(p + "mlp.gate_proj.weight", {ff, hidden});
      add(p + "mlp.up_proj.weight", {ff, hidden});
      add(p + "mlp.down_proj.weight", {hidden, ff});
    }
    return out;
  }

  void write(const std::filesystem::path& path, runtime::gguf::GgmlType type,
             const std::vector<std::pair<std::string, runtime::gguf::Value>>& extra = {}) const {
    runtime::gguf::write_llama_gguf(
        path, config_json(), tensors(),
        [](const runtime::TensorInfo& t, float* dst) {
          for (std::int64_t r = 0; r < t.rows(); ++r)
            for (std::int64_t c = 0; c < t.cols(); ++c) dst[r * t.cols() + c] = synth_value(t.name, r, c);
        },
        type, extra);
  }
};

inline std::vector<std::byte> read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  std::memcpy(b.data(), c.data(), c.size());
  return b;
}

inline void write_all(const std::filesystem::path& p, const std::vector<std::byte>& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

}  // namespace trellis::test
