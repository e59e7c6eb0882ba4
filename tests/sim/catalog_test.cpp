// Catalog entries: public config values give the known parameter counts, dense and sparse
// FLOP/s stay apart, unknown names list the valid ones, config.json files are read with
// errors naming the field.
#include <gtest/gtest.h>

#include "trellis/core/error.hpp"
#include "trellis/sim/catalog.hpp"

namespace trellis::sim {
namespace {

TEST(Catalog, ModelParameterCountsMatchTheirNames) {
  EXPECT_NEAR(load_model("llama-3.1-70b").total_params() / 1e9, 70.6, 0.2);
  EXPECT_NEAR(load_model("llama-3.1-8b").total_params() / 1e9, 8.03, 0.05);
  EXPECT_NEAR(load_model("llama-2-7b").total_params() / 1e9, 6.74, 0.05);
  EXPECT_NEAR(load_model("llama-3.1-405b").total_params() / 1e9, 405.9, 1.0);
  EXPECT_NEAR(load_model("qwen2.5-72b").total_params() / 1e9, 72.7, 0.3);
  EXPECT_NEAR(load_model("smollm2-135m").total_params() / 1e6, 134.5, 1.0);
}

TEST(Catalog, KvBytesFollowGqa) {
  const ModelSpec m = load_model("Llama-3.1-70B");  // case-insensitive
  EXPECT_DOUBLE_EQ(m.kv_bytes_per_token_layer(2), 2.0 * 8 * 128 * 2);
}

TEST(Catalog, DenseAndSparseKeptApart) {
  for (const auto& d : device_catalog()) {
    EXPECT_FALSE(d.source.empty()) << d.name;
    if (d.sparse_flops_bf16 > 0) EXPECT_NEAR(d.sparse_flops_bf16 / d.dense_flops_bf16, 2.0, 0.05) << d.name;
  }
  EXPECT_DOUBLE_EQ(find_device("h100").dense_flops_bf16, 989e12);
  EXPECT_EQ(find_device("H100_SXM").name, "H100-SXM");
}

TEST(Catalog, EveryLinkHasASourceAndPositiveFigures) {
  for (const auto& l : link_catalog()) {
    EXPECT_FALSE(l.source.empty()) << l.name;
    EXPECT_GT(l.bandwidth, 0) << l.name;
  }
  EXPECT_DOUBLE_EQ(find_link("ib-ndr").bandwidth, 50e9);
}

TEST(Catalog, UnknownNamesListTheValidOnes) {
  try {
    load_model("llama-9");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("llama-3.1-70b"), std::string::npos) << e.what();
  }
  try {
    find_device("TPU-v5");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("H100-SXM"), std::string::npos) << e.what();
  }
}

TEST(Catalog, ParsesALocalConfigJson) {
  const ModelSpec m = parse_model_config(
      R"({"num_hidden_layers": 30, "hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9,
          "num_key_value_heads": 3, "vocab_size": 49152, "tie_word_embeddings": true})",
      "smol/config.json");
  EXPECT_EQ(m.layers, 30);
  EXPECT_EQ(m.head_dim, 64);
  EXPECT_TRUE(m.tied_embeddings);
  EXPECT_NEAR(m.total_params(), load_model("smollm2-135m").total_params(), 1);
}

TEST(Catalog, MalformedConfigNamesTheField) {
  try {
    parse_model_config(R"({"num_hidden_layers": 30, "hidden_size": "wide"})", "bad.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruptInput);
    EXPECT_NE(std::string(e.what()).find("hidden_size"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_model_config("{", "x.json"), Error);
  EXPECT_THROW(parse_model_config(R"({"num_hidden_layers": 2})", "x.json"), Error);
}

}  // namespace
}  // namespace trellis::sim
