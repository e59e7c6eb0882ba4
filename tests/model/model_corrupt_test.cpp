// Checkpoints that disagree with their config: each error names the file and the tensor.
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "model_test_util.hpp"
#include "trellis/runtime/checkpoint/reader.hpp"
#include "trellis/runtime/checkpoint/safetensors.hpp"

using namespace trellis;
using namespace trellis::runtime;
using namespace trellis::runtime::testing;

namespace {

// Writes a tiny checkpoint whose tensors are `specs` (values irrelevant) and config `cfg`.
std::filesystem::path write_ckpt(const std::string& tag, const ModelConfig& cfg, const std::vector<TensorSpec>& specs) {
  auto dir = temp_dir(tag);
  std::ofstream(dir / "config.json") << to_config_json(cfg);
  write_safetensors(dir / "model.safetensors", specs, [](std::size_t, std::span<std::byte> o) {
    std::fill(o.begin(), o.end(), std::byte{0});
  });
  return dir;
}

void load(const std::filesystem::path& dir) {
  auto r = open_checkpoint(dir);
  auto cfg = parse_model_config(r->config_json().value(), (dir / "config.json").string());
  kernels::Context ctx(1);
  auto g = transport::make_single_group(0);
  LoadOptions o;
  o.max_seq_len = 16;
  LlamaModel m(*r, cfg, *g, ctx, o);
}

}  // namespace

TEST(ModelCorrupt, ShapeMismatchWithConfig) {
  auto cfg = model_preset("tiny");
  auto specs = model_tensor_specs(cfg, "F32");
  for (auto& s : specs)
    if (s.name == "model.layers.1.mlp.up_proj.weight") s.shape = {cfg.intermediate_size + 8, cfg.hidden_size};
  auto dir = write_ckpt("shape", cfg, specs);
  expect_error([&] { load(dir); }, {(dir / "model.safetensors").string(), "model.layers.1.mlp.up_proj.weight", "shape"});
  std::filesystem::remove_all(dir);
}

TEST(ModelCorrupt, DtypeMismatchWithConfig) {
  auto cfg = model_preset("tiny");
  cfg.torch_dtype = "bfloat16";
  auto specs = model_tensor_specs(cfg, "BF16");
  for (auto& s : specs)
    if (s.name == "model.layers.0.self_attn.k_proj.weight") s.dtype = "F16";
  auto dir = write_ckpt("dtype", cfg, specs);
  expect_error([&] { load(dir); },
               {(dir / "model.safetensors").string(), "model.layers.0.self_attn.k_proj.weight", "torch_dtype"});
  std::filesystem::remove_all(dir);
}

TEST(ModelCorrupt, NonFloatTensor) {
  auto cfg = model_preset("tiny");
  auto specs = model_tensor_specs(cfg, "F32");
  for (auto& s : specs)
    if (s.name == "model.norm.weight") s.dtype = "I32";
  auto dir = write_ckpt("int", cfg, specs);
  expect_error([&] { load(dir); }, {(dir / "model.safetensors").string(), "model.norm.weight", "I32"});
  std::filesystem::remove_all(dir);
}

TEST(ModelCorrupt, MissingTensor) {
  auto cfg = model_preset("tiny");
  auto specs = model_tensor_specs(cfg, "F32");
  std::erase_if(specs, [](const TensorSpec& s) { return s.name == "model.layers.2.self_attn.o_proj.weight"; });
  auto dir = write_ckpt("missing", cfg, specs);
  expect_error([&] { load(dir); }, {dir.string(), "model.layers.2.self_attn.o_proj.weight", "missing"});
  std::filesystem::remove_all(dir);
}

TEST(ModelCorrupt, MissingTensorInShardedCheckpoint) {
  auto cfg = model_preset("tiny");
  auto dir = temp_dir("shardmiss");
  write_synthetic_checkpoint(dir, cfg, "F32", 1, 100 << 10);
  auto index = nlohmann::json::parse(std::ifstream(dir / "model.safetensors.index.json"));
  // The index sends lm_head.weight to a shard that is not there.
  index["weight_map"]["lm_head.weight"] = "model-00042-of-00042.safetensors";
  std::ofstream(dir / "model.safetensors.index.json", std::ios::trunc) << index.dump();
  expect_error([&] { load(dir); }, {"model-00042-of-00042.safetensors", "lm_head.weight"});
  std::filesystem::remove_all(dir);
}

TEST(ModelCorrupt, NonFiniteNormIsRefusedNamingTheTensor) {
  // A flipped exponent bit turns a norm weight into Inf or NaN: the whole layer's output would
  // be NaN. Every value of a norm is checked at load.
  auto cfg = model_preset("tiny");
  auto specs = model_tensor_specs(cfg, "F32");
  std::size_t norm = specs.size();
  for (std::size_t i = 0; i < specs.size(); ++i)
    if (specs[i].name == "model.layers.2.post_attention_layernorm.weight") norm = i;
  ASSERT_LT(norm, specs.size());
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    auto dir = temp_dir("nan-norm");
    std::ofstream(dir / "config.json") << to_config_json(cfg);
    write_safetensors(dir / "model.safetensors", specs, [&](std::size_t i, std::span<std::byte> o) {
      std::vector<float> v(o.size() / sizeof(float), 1.0f);
      if (i == norm) v[5] = bad;
      std::memcpy(o.data(), v.data(), o.size());
    });
    expect_error([&] { load(dir); }, {"model.layers.2.post_attention_layernorm.weight", "element 5", "finite"});
    std::filesystem::remove_all(dir);
  }
}
