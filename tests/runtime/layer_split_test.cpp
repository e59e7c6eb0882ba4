// run.layer_split (runtime/engine/layer_split.hpp): the LM head weighed in decoder layers by
// parameters, and the setting's list parsed with clear errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "trellis/core/error.hpp"
#include "trellis/runtime/engine/layer_split.hpp"

namespace trellis::runtime {
namespace {

// A checkpoint of tensor names, shapes and stored types only (nothing is read).
class ShapesOnly final : public CheckpointReader {
 public:
  explicit ShapesOnly(std::vector<TensorInfo> t) : tensors_(std::move(t)) {}
  std::string describe() const override { return "shapes-only"; }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  const TensorInfo* find(std::string_view name) const override {
    for (const auto& t : tensors_)
      if (t.name == name) return &t;
    return nullptr;
  }
  void read_slice(std::string_view, const Slice&, ElemType, void*) const override { ADD_FAILURE() << "read"; }
  std::optional<std::string> config_json() const override { return std::nullopt; }

 private:
  std::vector<TensorInfo> tensors_;
};

// A SmolLM2-135M-shaped checkpoint: 30 layers of hidden 576, 9 heads of 64, 3 KV heads,
// MLP 1536, a tied 49,152-token table; layers stored `layer_type`, the table `table_type`.
ShapesOnly smollm2_like(const std::string& layer_type, const std::string& table_type, ModelConfig& cfg) {
  cfg.num_layers = 30;
  cfg.hidden_size = 576;
  cfg.num_heads = 9;
  cfg.num_kv_heads = 3;
  cfg.head_dim = 64;
  cfg.intermediate_size = 1536;
  cfg.vocab_size = 49152;
  cfg.tie_word_embeddings = true;
  std::vector<TensorInfo> t{{"model.embed_tokens.weight", table_type, {49152, 576}, "f"},
                            {"model.norm.weight", "F32", {576}, "f"}};
  for (int l = 0; l < 30; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (auto [name, rows, cols] : std::vector<std::tuple<std::string, std::int64_t, std::int64_t>>{
             {"self_attn.q_proj.weight", 576, 576}, {"self_attn.k_proj.weight", 192, 576},
             {"self_attn.v_proj.weight", 192, 576}, {"self_attn.o_proj.weight", 576, 576},
             {"mlp.gate_proj.weight", 1536, 576}, {"mlp.up_proj.weight", 1536, 576},
             {"mlp.down_proj.weight", 576, 1536}})
      t.push_back({p + name, layer_type, {rows, cols}, "f"});
    t.push_back({p + "input_layernorm.weight", "F32", {576}, "f"});
    t.push_back({p + "post_attention_layernorm.weight", "F32", {576}, "f"});
  }
  return ShapesOnly(std::move(t));
}

TEST(LayerSplit, HeadWeighedInLayersByParameters) {
  ModelConfig cfg;
  // 28.3 M head parameters (+ the final norm) over 3.54 M per layer, whatever the stored
  // types (a Q8_0 head is not weighed heavier than Q4_1 layers: docs/runtime.md says why).
  const ShapesOnly q = smollm2_like("Q4_1", "Q8_0", cfg);
  EXPECT_NEAR(head_cost_in_layers(q, cfg), 28311552.0 / 3540096.0, 0.01);
  const ShapesOnly b = smollm2_like("BF16", "BF16", cfg);
  EXPECT_NEAR(head_cost_in_layers(b, cfg), head_cost_in_layers(q, cfg), 1e-9);
  // An untied head is the lm_head tensor, not the embedding table.
  std::vector<TensorInfo> t = b.tensors();
  t.push_back({"lm_head.weight", "BF16", {1000, 576}, "f"});
  const ShapesOnly untied(std::move(t));
  cfg.tie_word_embeddings = false;
  EXPECT_NEAR(head_cost_in_layers(untied, cfg), (1000.0 * 576 + 576) / 3540096.0, 1e-6);
}

TEST(LayerSplit, SettingGivesTheShapePlacementSplits) {
  ModelConfig cfg;
  const ShapesOnly q = smollm2_like("Q4_1", "Q8_0", cfg);
  const auto a = stage_model_shape(q, cfg, "auto", "run.layer_split");
  EXPECT_EQ(a.layers, 30);
  EXPECT_EQ(a.heads, 9);
  EXPECT_EQ(a.kv_heads, 3);
  EXPECT_NEAR(a.head_cost, 8.0, 0.01);
  EXPECT_TRUE(a.split.empty());
  const auto e = stage_model_shape(q, cfg, "even", "run.layer_split");
  EXPECT_EQ(e.head_cost, 0.0);
  EXPECT_EQ(stage_model_shape(q, cfg, "22,8", "run.layer_split").split, (std::vector<int>{22, 8}));
  for (const char* bad : {"", "22,", ",8", "22;8", "22,x", "0,30", "-1,31", "1.5,28.5", "evenly"}) {
    try {
      stage_model_shape(q, cfg, bad, "run.layer_split (--layer-split)");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(err.what()).find("run.layer_split (--layer-split)"), std::string::npos) << err.what();
    }
  }
}

}  // namespace
}  // namespace trellis::runtime
