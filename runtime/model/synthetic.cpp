// Counter-based synthetic weights (see synthetic.hpp for the scaling rules).
#include "trellis/runtime/model/synthetic.hpp"

#include <cmath>
#include <cstring>
#include <fstream>
#include <tuple>

#include "../checkpoint/convert.hpp"
#include "trellis/core/error.hpp"

namespace trellis::runtime {
namespace {

std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::uint64_t name_hash(std::string_view s) {
  std::uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Half-width of the uniform distribution of tensor `name`, and its centre.
std::pair<float, float> range_of(const ModelConfig& c, std::string_view name) {
  const double h = static_cast<double>(c.hidden_size), sqrt3 = std::sqrt(3.0);
  const double depth = 1.0 / std::sqrt(2.0 * c.num_layers);
  if (ends_with(name, "norm.weight")) return {0.1f, 1.0f};
  if (ends_with(name, ".bias")) return {0.1f, 0.0f};
  if (name == "model.embed_tokens.weight") return {1.0f, 0.0f};
  if (name == "lm_head.weight") return {static_cast<float>(sqrt3 / std::sqrt(h)), 0.0f};
  if (ends_with(name, "o_proj.weight"))
    return {static_cast<float>(sqrt3 * depth / std::sqrt(double(c.num_heads) * c.head_dim)), 0.0f};
  if (ends_with(name, "down_proj.weight"))
    return {static_cast<float>(sqrt3 * depth / std::sqrt(double(c.intermediate_size))), 0.0f};
  return {static_cast<float>(sqrt3 / std::sqrt(h)), 0.0f};  // q/k/v/gate/up: fan_in = hidden
}

ModelConfig base(std::int64_t vocab, std::int64_t hidden, std::int64_t inter, int layers, int heads, int kv) {
  ModelConfig c;
  c.vocab_size = vocab;
  c.hidden_size = hidden;
  c.intermediate_size = inter;
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv;
  c.head_dim = static_cast<int>(hidden / heads);
  c.rope.head_dim = c.head_dim;
  c.rope.theta = 10000.0;
  c.max_position_embeddings = 2048;
  return c;
}

}  // namespace

std::vector<std::string> model_preset_names() { return {"tiny", "tiny-qwen2", "small", "llama-1b"}; }

ModelConfig model_preset(std::string_view name) {
  ModelConfig c;
  if (name == "tiny") {
    c = base(512, 64, 160, 4, 4, 2);
    c.rope.theta = 500000.0;
    c.rope.scaling = kernels::RopeScaling::kLlama3;
    c.rope.factor = 8.0;
    c.rope.original_max_position_embeddings = 64;  // small, so short sequences see the scaling
  } else if (name == "tiny-qwen2") {
    c = base(384, 64, 128, 3, 4, 2);
    c.model_type = "qwen2";
    c.attention_bias = true;
    c.tie_word_embeddings = true;
    c.rope.theta = 1000000.0;
    c.rms_norm_eps = 1e-6;
  } else if (name == "small") {
    c = base(8192, 512, 1536, 8, 8, 4);
  } else if (name == "llama-1b") {
    c = base(32000, 2048, 8192, 16, 32, 8);
    c.rope.theta = 500000.0;
  } else {
    std::string names;
    for (auto& n : model_preset_names()) names += (names.empty() ? "" : ", ") + n;
    throw_error(ErrorCode::kInvalidArgument, "unknown model preset '{}' (known: {})", name, names);
  }
  c.validate(fmt::format("preset {}", name));
  return c;
}

std::vector<TensorSpec> model_tensor_specs(const ModelConfig& c, const std::string& dt) {
  const std::int64_t h = c.hidden_size, q = std::int64_t{c.num_heads} * c.head_dim,
                     kv = std::int64_t{c.num_kv_heads} * c.head_dim, in = c.intermediate_size;
  std::vector<TensorSpec> s;
  s.push_back({"model.embed_tokens.weight", dt, {c.vocab_size, h}});
  for (int l = 0; l < c.num_layers; ++l) {
    std::string p = fmt::format("model.layers.{}.", l);
    s.push_back({p + "input_layernorm.weight", dt, {h}});
    s.push_back({p + "self_attn.q_proj.weight", dt, {q, h}});
    s.push_back({p + "self_attn.k_proj.weight", dt, {kv, h}});
    s.push_back({p + "self_attn.v_proj.weight", dt, {kv, h}});
    if (c.attention_bias) {
      s.push_back({p + "self_attn.q_proj.bias", dt, {q}});
      s.push_back({p + "self_attn.k_proj.bias", dt, {kv}});
      s.push_back({p + "self_attn.v_proj.bias", dt, {kv}});
    }
    s.push_back({p + "self_attn.o_proj.weight", dt, {h, q}});
    s.push_back({p + "post_attention_layernorm.weight", dt, {h}});
    s.push_back({p + "mlp.gate_proj.weight", dt, {in, h}});
    s.push_back({p + "mlp.up_proj.weight", dt, {in, h}});
    s.push_back({p + "mlp.down_proj.weight", dt, {h, in}});
  }
  s.push_back({"model.norm.weight", dt, {h}});
  if (!c.tie_word_embeddings) s.push_back({"lm_head.weight", dt, {c.vocab_size, h}});
  return s;
}

namespace {

// The per-tensor part of synthetic_value, hoisted out of the element loop.
struct Generator {
  std::uint64_t key;
  float half, centre;
  Generator(const ModelConfig& c, std::uint64_t seed, std::string_view name)
      : key(splitmix(seed ^ name_hash(name))) {
    std::tie(half, centre) = range_of(c, name);
  }
  float at(std::uint64_t index) const {
    std::uint64_t r = splitmix(key + index);
    float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;  // [-1, 1)
    return centre + half * u;
  }
};

}  // namespace

float synthetic_value(const ModelConfig& c, std::uint64_t seed, std::string_view name, std::uint64_t index) {
  return Generator(c, seed, name).at(index);
}

namespace {

class SyntheticReader final : public CheckpointReader {
 public:
  SyntheticReader(const ModelConfig& c, const std::string& dtype, std::uint64_t seed)
      : cfg_(c), seed_(seed), specs_(model_tensor_specs(c, dtype)) {
    if (!convert::parse_stored(dtype, stored_))
      throw_error(ErrorCode::kInvalidArgument, "synthetic checkpoint: dtype '{}' is not F32, BF16 or F16", dtype);
    for (auto& s : specs_) infos_.push_back(TensorInfo{s.name, s.dtype, s.shape, "<synthetic>"});
    std::sort(infos_.begin(), infos_.end(), [](auto& a, auto& b) { return a.name < b.name; });
  }
  std::string describe() const override { return fmt::format("<synthetic seed {}>", seed_); }
  const std::vector<TensorInfo>& tensors() const override { return infos_; }
  const TensorInfo* find(std::string_view name) const override {
    auto it = std::lower_bound(infos_.begin(), infos_.end(), name, [](auto& t, auto n) { return t.name < n; });
    return it != infos_.end() && it->name == name ? &*it : nullptr;
  }
  void read_slice(std::string_view name, const Slice& s, ElemType out, void* dst) const override {
    const TensorInfo& t = require(name);
    if (s.row_begin < 0 || s.row_begin > s.row_end || s.row_end > t.rows() || s.col_begin < 0 ||
        s.col_begin > s.col_end || s.col_end > t.cols())
      throw_error(ErrorCode::kInvalidArgument, "{}: tensor '{}' slice outside its {}x{} shape", describe(), name,
                  t.rows(), t.cols());
    std::vector<std::byte> row(static_cast<std::size_t>(s.cols()) * 4);
    const Generator gen(cfg_, seed_, name);
    auto* d = static_cast<std::byte*>(dst);
    const std::size_t osize = elem_size(out);
    for (std::int64_t r = s.row_begin; r < s.row_end; ++r) {
      for (std::int64_t c = s.col_begin; c < s.col_end; ++c) {
        float v = gen.at(static_cast<std::uint64_t>(r * t.cols() + c));
        std::size_t i = static_cast<std::size_t>(c - s.col_begin);
        if (stored_ == convert::Stored::kF32) {
          std::memcpy(row.data() + 4 * i, &v, 4);
        } else {
          std::uint16_t hbits = stored_ == convert::Stored::kBF16 ? convert::f32_to_bf16(v) : convert::f32_to_f16(v);
          std::memcpy(row.data() + 2 * i, &hbits, 2);
        }
      }
      convert::convert_row(row.data(), stored_, d, out, static_cast<std::size_t>(s.cols()));
      d += static_cast<std::size_t>(s.cols()) * osize;
    }
  }
  std::optional<std::string> config_json() const override { return to_config_json(cfg_); }

 private:
  ModelConfig cfg_;
  std::uint64_t seed_;
  convert::Stored stored_ = convert::Stored::kF32;
  std::vector<TensorSpec> specs_;
  std::vector<TensorInfo> infos_;
};

}  // namespace

std::unique_ptr<CheckpointReader> make_synthetic_reader(const ModelConfig& cfg, const std::string& dtype,
                                                        std::uint64_t seed) {
  return std::make_unique<SyntheticReader>(cfg, dtype, seed);
}

std::vector<std::filesystem::path> write_synthetic_checkpoint(const std::filesystem::path& dir, const ModelConfig& cfg,
                                                              const std::string& dtype, std::uint64_t seed,
                                                              std::uint64_t max_shard_bytes) {
  ModelConfig c = cfg;
  c.torch_dtype = dtype == "F32" ? "float32" : dtype == "BF16" ? "bfloat16" : "float16";
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir / "config.json", std::ios::trunc);
    out << to_config_json(c);
    if (!out) throw_error(ErrorCode::kIo, "cannot write {}", (dir / "config.json").string());
  }
  auto specs = model_tensor_specs(c, dtype);
  auto reader = make_synthetic_reader(c, dtype, seed);
  ElemType raw = ElemType::kF32;
  return write_safetensors_sharded(
      dir, specs,
      [&](std::size_t k, std::span<std::byte> out) {
        const TensorInfo& t = reader->require(specs[k].name);
        if (dtype == "F32" || dtype == "BF16") {
          // The reader rounds to the stored dtype; F32 and BF16 are its own output types.
          reader->read_slice(t.name, Slice::all(t), dtype == "F32" ? ElemType::kF32 : ElemType::kBF16, out.data());
          return;
        }
        std::vector<float> f(static_cast<std::size_t>(t.numel()));
        reader->read_slice(t.name, Slice::all(t), raw, f.data());  // f16 values, exactly
        for (std::size_t i = 0; i < f.size(); ++i) {
          std::uint16_t hb = convert::f32_to_f16(f[i]);
          std::memcpy(out.data() + 2 * i, &hb, 2);
        }
      },
      max_shard_bytes);
}

}  // namespace trellis::runtime
