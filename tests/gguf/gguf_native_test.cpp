// Quantised weights kept as stored (WeightsFormat::kNative): read_slice_raw returns the
// stored blocks of exactly the rows and columns asked for (Q/K rotary order undone), refuses
// plain types and slices off block boundaries, and a model loaded native computes what the
// dequantised model computes up to the 8-bit activation rounding, holding ~6x fewer bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "gguf/gguf_test_util.hpp"
#include "trellis/core/error.hpp"
#include "trellis/kernels/quant.hpp"
#include "trellis/runtime/checkpoint/gguf_reader.hpp"
#include "trellis/runtime/model/config.hpp"
#include "trellis/runtime/model/llama.hpp"
#include "trellis/runtime/model/synthetic.hpp"
#include "trellis/transport/group.hpp"

namespace trellis::runtime {
namespace {

class GgufNative : public ::testing::Test {
 protected:
  std::filesystem::path dir_ = test::scratch_dir("native");
  std::filesystem::path path_ = dir_ / "tiny-q4_1.gguf";
  ModelConfig cfg_ = model_preset("tiny");

  void SetUp() override {
    auto src = make_synthetic_reader(cfg_, "F32", 3);
    gguf::write_llama_gguf(path_, to_config_json(cfg_), src->tensors(),
                           [&](const TensorInfo& t, float* dst) { src->read_slice(t.name, Slice::all(t), ElemType::kF32, dst); },
                           gguf::GgmlType::kQ4_1);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
};

TEST_F(GgufNative, RawSlicesAreTheStoredBlocksOfTheRowsAsked) {
  auto r = open_gguf(path_);
  const std::string q = "model.layers.1.self_attn.q_proj.weight";
  const TensorInfo& t = r->require(q);
  ASSERT_EQ(t.dtype, "Q4_1");
  const std::int64_t rows = t.rows(), cols = t.cols();
  // Rows [3, 7) x columns [32, 64): raw blocks dequantised equal the converted read.
  const Slice s{3, 7, 32, 64};
  std::vector<kernels::BlockQ4_1> raw(static_cast<std::size_t>(s.rows()));
  r->read_slice_raw(q, s, raw.data());
  std::vector<float> want(static_cast<std::size_t>(s.rows() * s.cols())), got(want.size());
  r->read_slice(q, s, ElemType::kF32, want.data());
  for (std::int64_t i = 0; i < s.rows(); ++i)
    kernels::dequantize_row(kernels::DType::kQ4_1, &raw[static_cast<std::size_t>(i)], got.data() + i * 32, 32);
  EXPECT_EQ(got, want);
  // Errors name the file and the tensor.
  std::vector<std::byte> buf(static_cast<std::size_t>(rows * cols));
  try {
    r->read_slice_raw(q, {0, 1, 16, 48}, buf.data());
    ADD_FAILURE() << "a slice off the block boundaries was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(q), std::string::npos) << e.what();
  }
  try {
    r->read_slice_raw("model.norm.weight", {0, 1, 0, 64}, buf.data());
    ADD_FAILURE() << "an F32 tensor was read as blocks";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find(path_.filename().string()), std::string::npos) << e.what();
  }
}

TEST_F(GgufNative, NativeModelMatchesDequantisedUpToActivationRounding) {
  auto r = open_gguf(path_);
  auto group = transport::make_single_group(0);
  kernels::Context ctx(2);
  LoadOptions deq, nat;
  deq.weight_dtype = nat.weight_dtype = ElemType::kF32;
  nat.weights_format = WeightsFormat::kNative;
  deq.max_seq_len = nat.max_seq_len = 32;
  LlamaModel a(*r, cfg_, *group, ctx, deq), b(*r, cfg_, *group, ctx, nat);
  EXPECT_FALSE(a.has_quantized_weights());
  EXPECT_TRUE(b.has_quantized_weights());
  // Q4_1 is 5 bits per weight against 32: the linears shrink about 6x (norms stay f32).
  EXPECT_LT(b.weight_bytes() * 5, a.weight_bytes());
  Batch p;
  for (int i = 0; i < 12; ++i) p.tokens.push_back((i * 37 + 5) % static_cast<int>(cfg_.vocab_size));
  p.seqs = {SeqChunk{0, 0, 12}};
  p.all_logits = true;
  std::vector<float> la = a.forward(p), lb = b.forward(p);
  ASSERT_EQ(la.size(), lb.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < la.size(); ++i) {
    num += (la[i] - lb[i]) * (la[i] - lb[i]);
    den += la[i] * la[i];
  }
  // 8-bit activations: a few percent of the logits' norm, not more (a wrong block layout or
  // row order would give O(1)).
  EXPECT_LT(std::sqrt(num / den), 0.05) << "relative RMS difference";
  EXPECT_GT(std::sqrt(num / den), 0.0) << "native should not be the dequantised path";
}

TEST(WeightsFormat, ParsesItsTwoSpellings) {
  EXPECT_EQ(parse_weights_format("native"), WeightsFormat::kNative);
  EXPECT_EQ(parse_weights_format("dequant"), WeightsFormat::kDequant);
  EXPECT_EQ(to_string(WeightsFormat::kNative), "native");
  EXPECT_THROW(parse_weights_format("q4", "--weights-format"), Error);
}

}  // namespace
}  // namespace trellis::runtime
