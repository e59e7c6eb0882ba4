// The real file: SmolLM2-135M-Instruct Q4_1 (skipped without scripts/setup-models; a failure then
// under TRELLIS_REQUIRE_PEERS=1).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "gguf/smollm2_path.hpp"
#include "trellis/runtime/checkpoint/gguf_reader.hpp"

namespace trellis::runtime {
namespace {

TEST(GgufSmolLM2, ConfigAndTensorTable) {
  const std::string path = test::smollm2_gguf_path();
  TRELLIS_SKIP_WITHOUT_SMOLLM2(path);
  auto r = open_gguf(path);
  auto cfg = nlohmann::json::parse(r->config_json().value());
  EXPECT_EQ(cfg["hidden_size"], 576);
  EXPECT_EQ(cfg["intermediate_size"], 1536);
  EXPECT_EQ(cfg["num_hidden_layers"], 30);
  EXPECT_EQ(cfg["num_attention_heads"], 9);
  EXPECT_EQ(cfg["num_key_value_heads"], 3);
  EXPECT_EQ(cfg["head_dim"], 64);
  EXPECT_EQ(cfg["vocab_size"], 49152);
  EXPECT_EQ(cfg["max_position_embeddings"], 8192);
  EXPECT_EQ(cfg["tie_word_embeddings"], true);
  EXPECT_NEAR(cfg["rope_theta"].get<double>(), 100000.0, 1e-3);
  EXPECT_NEAR(cfg["rms_norm_eps"].get<double>(), 1e-5, 1e-9);
  EXPECT_EQ(cfg["bos_token_id"], 1);
  EXPECT_EQ(cfg["eos_token_id"], 2);
  EXPECT_EQ(r->tensors().size(), 272u);
  EXPECT_EQ(r->find("lm_head.weight"), nullptr);
  EXPECT_EQ(r->require("model.embed_tokens.weight").dtype, "Q8_0");
  EXPECT_EQ(r->require("model.layers.0.mlp.down_proj.weight").shape, (std::vector<std::int64_t>{576, 1536}));
  EXPECT_EQ(r->require("model.layers.0.self_attn.k_proj.weight").shape, (std::vector<std::int64_t>{192, 576}));
}

TEST(GgufSmolLM2, TensorParallelShardsTileTheTensor) {
  const std::string path = test::smollm2_gguf_path();
  TRELLIS_SKIP_WITHOUT_SMOLLM2(path);
  auto r = open_gguf(path);
  // Q rows split over t = 3 (3 heads each) and down_proj columns split over t = 3.
  for (const char* name : {"model.layers.5.self_attn.q_proj.weight", "model.layers.5.mlp.down_proj.weight"}) {
    const TensorInfo& t = r->require(name);
    std::vector<float> all(static_cast<std::size_t>(t.numel()));
    r->read_slice(name, Slice::all(t), ElemType::kF32, all.data());
    const bool by_rows = std::string(name).find("q_proj") != std::string::npos;
    for (int rank = 0; rank < 3; ++rank) {
      Slice s = by_rows ? Slice{rank * t.rows() / 3, (rank + 1) * t.rows() / 3, 0, t.cols()}
                        : Slice{0, t.rows(), rank * t.cols() / 3, (rank + 1) * t.cols() / 3};
      std::vector<float> part(static_cast<std::size_t>(s.rows() * s.cols()));
      r->read_slice(name, s, ElemType::kF32, part.data());
      for (std::int64_t i = 0; i < s.rows(); ++i)
        for (std::int64_t c = 0; c < s.cols(); ++c)
          ASSERT_EQ(part[i * s.cols() + c], all[(s.row_begin + i) * t.cols() + s.col_begin + c]) << name;
    }
  }
}

}  // namespace
}  // namespace trellis::runtime
