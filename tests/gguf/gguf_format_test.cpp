// GGUF format tests on files trellis writes: quantisation round trips, name/layout mapping,
// the rotary row permutation, sliced reads (as tensor-parallel ranks do) and the config.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <random>

#include "gguf/gguf_test_util.hpp"
#include "trellis/core/error.hpp"
#include "trellis/runtime/checkpoint/gguf_quant.hpp"
#include "trellis/runtime/checkpoint/gguf_reader.hpp"

namespace trellis::runtime::gguf {
namespace {

using test::synth_value;

std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

TEST(GgufQuant, RoundTripErrorWithinFormatBound) {
  const auto x = random_values(32 * 64, 7);
  struct Case { GgmlType type; float rel; };
  // Bounds: half a quantisation step of each format, relative to the block range, plus f16 slack.
  for (Case c : {Case{GgmlType::kQ8_0, 0.5f / 127 + 1e-3f}, Case{GgmlType::kQ4_0, 1.0f / 8 + 1e-2f},
                 Case{GgmlType::kQ4_1, 0.5f / 15 * 2 + 1e-2f}, Case{GgmlType::kF16, 1e-3f},
                 Case{GgmlType::kBF16, 8e-3f}, Case{GgmlType::kF32, 0.0f}}) {
    const TypeTraits& tr = type_traits(c.type);
    std::vector<std::byte> packed(x.size() / tr.block_elems * tr.block_bytes);
    quantize(c.type, x.data(), static_cast<std::int64_t>(x.size()), packed.data());
    std::vector<float> y(x.size());
    dequantize_blocks(c.type, packed.data(), static_cast<std::int64_t>(x.size()) / tr.block_elems, y.data());
    for (std::size_t b = 0; b < x.size(); b += 32) {
      std::vector<float> blk(x.begin() + b, x.begin() + b + 32);
      const float bound = c.rel * max_abs(blk);
      for (std::size_t j = b; j < b + 32; ++j) ASSERT_LE(std::fabs(x[j] - y[j]), bound) << tr.name << " at " << j;
    }
  }
}

TEST(GgufQuant, KnownBlockDecodes) {
  // Q4_1 block: d = 0.5, m = -1, nibbles low = j % 16, high = 15 - j % 16.
  std::vector<std::byte> blk(20);
  std::uint16_t d = f32_to_f16_bits(0.5f), m = f32_to_f16_bits(-1.0f);
  std::memcpy(blk.data(), &d, 2);
  std::memcpy(blk.data() + 2, &m, 2);
  for (int j = 0; j < 16; ++j) blk[4 + j] = static_cast<std::byte>(j | ((15 - j) << 4));
  float out[32];
  dequantize_blocks(GgmlType::kQ4_1, blk.data(), 1, out);
  for (int j = 0; j < 16; ++j) {
    EXPECT_FLOAT_EQ(out[j], 0.5f * j - 1.0f);
    EXPECT_FLOAT_EQ(out[j + 16], 0.5f * (15 - j) - 1.0f);
  }
}

TEST(GgufNames, MapBothWays) {
  EXPECT_EQ(hf_name_from_gguf("blk.12.attn_q.weight"), "model.layers.12.self_attn.q_proj.weight");
  EXPECT_EQ(hf_name_from_gguf("blk.0.ffn_norm.weight"), "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(hf_name_from_gguf("token_embd.weight"), "model.embed_tokens.weight");
  EXPECT_EQ(hf_name_from_gguf("output.weight"), "lm_head.weight");
  EXPECT_EQ(hf_name_from_gguf("blk.x.attn_q.weight"), std::nullopt);
  EXPECT_EQ(hf_name_from_gguf("rope_freqs.weight"), std::nullopt);
  for (const char* g : {"blk.3.attn_k.bias", "blk.29.ffn_down.weight", "output_norm.weight", "blk.1.attn_output.weight"})
    EXPECT_EQ(gguf_name_from_hf(hf_name_from_gguf(g).value()), g);
}

TEST(GgufNames, RotaryPermutationIsABijectionPairingHalves) {
  const std::int64_t rows = 3 * 8, heads = 3;
  std::vector<int> seen(rows, 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t g = hf_row_to_gguf(r, rows, heads);
    ++seen[g];
    EXPECT_EQ(gguf_row_to_hf(g, rows, heads), r);
  }
  for (int s : seen) EXPECT_EQ(s, 1);
  // HF rows i and i + d/2 of a head (a rotary pair) are adjacent in GGUF.
  EXPECT_EQ(hf_row_to_gguf(8 + 1, rows, heads), 8 + 2);
  EXPECT_EQ(hf_row_to_gguf(8 + 4 + 1, rows, heads), 8 + 3);
}

class GgufRoundTrip : public ::testing::Test {
 protected:
  std::filesystem::path dir_ = test::scratch_dir("rt");
  test::TinyLlama model_;
  void TearDown() override { std::filesystem::remove_all(dir_); }
};

TEST_F(GgufRoundTrip, F32ReadsBackExactlyInHfLayout) {
  auto path = dir_ / "tiny.gguf";
  model_.write(path, GgmlType::kF32);
  auto r = open_gguf(path);
  ASSERT_EQ(r->tensors().size(), model_.tensors().size());
  for (const TensorInfo& want : model_.tensors()) {
    const TensorInfo& got = r->require(want.name);
    EXPECT_EQ(got.shape, want.shape) << want.name;
    EXPECT_EQ(got.dtype, "F32");
    std::vector<float> v(static_cast<std::size_t>(got.numel()));
    r->read_slice(want.name, Slice::all(got), ElemType::kF32, v.data());
    for (std::int64_t i = 0; i < got.rows(); ++i)
      for (std::int64_t c = 0; c < got.cols(); ++c)
        ASSERT_EQ(v[i * got.cols() + c], synth_value(want.name, i, c)) << want.name << " " << i << "," << c;
  }
}

TEST_F(GgufRoundTrip, QuantisedSlicesEqualTheWholeTensor) {
  auto path = dir_ / "tiny_q41.gguf";
  model_.write(path, GgmlType::kQ4_1);
  auto r = open_gguf(path);
  const std::string name = "model.layers.1.self_attn.k_proj.weight";
  const TensorInfo& t = r->require(name);
  EXPECT_EQ(t.dtype, "Q4_1");
  std::vector<float> all(static_cast<std::size_t>(t.numel()));
  r->read_slice(name, Slice::all(t), ElemType::kF32, all.data());
  // Row-parallel and column-parallel shards with boundaries off the 32-element blocks.
  for (Slice s : {Slice{0, t.rows(), 0, t.cols()}, Slice{5, 17, 0, t.cols()}, Slice{0, t.rows(), 7, 45},
                  Slice{3, 4, 31, 33}, Slice{t.rows() - 1, t.rows(), 0, 1}}) {
    std::vector<float> part(static_cast<std::size_t>(s.rows() * s.cols()));
    r->read_slice(name, s, ElemType::kF32, part.data());
    for (std::int64_t i = 0; i < s.rows(); ++i)
      for (std::int64_t c = 0; c < s.cols(); ++c)
        ASSERT_EQ(part[i * s.cols() + c], all[(s.row_begin + i) * t.cols() + s.col_begin + c]);
  }
  // Quantised values are close to the originals, with the rotary rows un-permuted.
  for (std::int64_t i = 0; i < t.rows(); ++i)
    for (std::int64_t c = 0; c < t.cols(); ++c)
      ASSERT_NEAR(all[i * t.cols() + c], synth_value(name, i, c), 0.25f * 2 / 15 + 1e-2f) << i << "," << c;
  // bf16 output is the f32 output rounded.
  std::vector<std::uint16_t> bf(static_cast<std::size_t>(t.numel()));
  r->read_slice(name, Slice::all(t), ElemType::kBF16, bf.data());
  for (std::size_t k = 0; k < bf.size(); ++k) {
    std::uint32_t u = static_cast<std::uint32_t>(bf[k]) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    ASSERT_NEAR(f, all[k], std::fabs(all[k]) / 128 + 1e-6f);
  }
}

TEST_F(GgufRoundTrip, EveryWritableTypeLoads) {
  for (GgmlType type : {GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    auto path = dir_ / "t.gguf";
    model_.write(path, type);
    auto r = open_gguf(path);
    const std::string name = "model.layers.0.self_attn.q_proj.weight";
    const TensorInfo& t = r->require(name);
    EXPECT_EQ(t.dtype, type_traits(type).name);
    std::vector<float> v(static_cast<std::size_t>(t.numel()));
    r->read_slice(name, Slice::all(t), ElemType::kF32, v.data());
    for (std::int64_t i = 0; i < t.rows(); ++i)
      ASSERT_NEAR(v[i * t.cols() + 3], synth_value(name, i, 3), 0.04f) << type_traits(type).name << " row " << i;
    // Norms stay F32 whatever the weight type.
    EXPECT_EQ(r->require("model.norm.weight").dtype, "F32");
  }
}

TEST_F(GgufRoundTrip, ConfigJsonCarriesTheArchitecture) {
  auto path = dir_ / "tiny.gguf";
  model_.write(path, GgmlType::kQ8_0);
  auto cfg = nlohmann::json::parse(open_gguf(path)->config_json().value());
  EXPECT_EQ(cfg["hidden_size"], model_.hidden);
  EXPECT_EQ(cfg["num_attention_heads"], model_.heads);
  EXPECT_EQ(cfg["num_key_value_heads"], model_.kv_heads);
  EXPECT_EQ(cfg["num_hidden_layers"], model_.layers);
  EXPECT_EQ(cfg["intermediate_size"], model_.ff);
  EXPECT_EQ(cfg["vocab_size"], model_.vocab);
  EXPECT_EQ(cfg["head_dim"], model_.head_dim());
  EXPECT_EQ(cfg["max_position_embeddings"], 512);
  EXPECT_NEAR(cfg["rms_norm_eps"].get<double>(), 1e-6, 1e-12);
  EXPECT_NEAR(cfg["rope_theta"].get<double>(), 50000.0, 1e-3);
  EXPECT_EQ(cfg["tie_word_embeddings"], false);
}

TEST_F(GgufRoundTrip, BadSliceAndMissingTensorNameTheFile) {
  auto path = dir_ / "tiny.gguf";
  model_.write(path, GgmlType::kF32);
  auto r = open_gguf(path);
  float buf[4];
  try {
    r->read_slice("model.norm.weight", Slice{0, 1, 60, 70}, ElemType::kF32, buf);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("model.norm.weight"), std::string::npos) << e.what();
  }
  try {
    r->read_slice("model.nope.weight", Slice{0, 1, 0, 1}, ElemType::kF32, buf);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("model.nope.weight"), std::string::npos);
  }
}

TEST_F(GgufRoundTrip, MetadataOfEveryTypeRoundTrips) {
  Value arr;
  arr.type = ValueType::kArray;
  arr.elem_type = ValueType::kArray;
  arr.items = {Value::of_i32s({1, -2, 3}), Value::of_i32s({})};
  Value u8; u8.type = ValueType::kU8; u8.u = 200;
  Value i16; i16.type = ValueType::kI16; i16.i = -300;
  Value f64; f64.type = ValueType::kF64; f64.f = 0.125;
  Value i64; i64.type = ValueType::kI64; i64.i = -(1LL << 40);
  auto path = dir_ / "meta.gguf";
  model_.write(path, GgmlType::kF32,
               {{"t.u8", u8}, {"t.i16", i16}, {"t.f64", f64}, {"t.i64", i64}, {"t.bool", Value::of_bool(true)},
                {"t.strs", Value::of_strings({"a", "", "ü€"})}, {"t.nested", arr}});
  auto f = GgufFile::open(path);
  EXPECT_EQ(f->require("t.u8").as_int("u8"), 200);
  EXPECT_EQ(f->require("t.i16").as_int("i16"), -300);
  EXPECT_EQ(f->require("t.f64").as_double("f64"), 0.125);
  EXPECT_EQ(f->require("t.i64").as_int("i64"), -(1LL << 40));
  EXPECT_TRUE(f->require("t.bool").as_bool("bool"));
  EXPECT_EQ(f->require("t.strs").as_array("s").at(2).as_string("s"), "ü€");
  const auto& nested = f->require("t.nested").as_array("n");
  ASSERT_EQ(nested.size(), 2u);
  EXPECT_EQ(nested[0].as_array("n0").at(1).as_int("x"), -2);
  EXPECT_TRUE(nested[1].as_array("n1").empty());
  EXPECT_EQ(f->require("general.architecture").as_string("arch"), "llama");
  EXPECT_THROW(f->require("t.u8").as_string("u8"), Error);
  EXPECT_THROW(f->require("no.such.key"), Error);
}

}  // namespace
}  // namespace trellis::runtime::gguf
