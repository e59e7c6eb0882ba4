// Files trellis makes: synthetic checkpoints (the ones `trellis make-model` generates)
// written as GGUF and read back through open_gguf give the same config and the same
// values as the in-memory synthetic reader, for Llama (rotary rows reordered on disk, Llama 3
// rope scaling) and Qwen2 (biases, tied embeddings, no reordering).
#include <gtest/gtest.h>

#include "gguf/gguf_test_util.hpp"
#include "trellis/runtime/checkpoint/gguf_reader.hpp"
#include "trellis/runtime/checkpoint/gguf_writer.hpp"
#include "trellis/runtime/model/config.hpp"
#include "trellis/runtime/model/synthetic.hpp"

namespace trellis::runtime {
namespace {

class GgufSynthetic : public ::testing::TestWithParam<const char*> {
 protected:
  std::filesystem::path dir_ = test::scratch_dir("synth");
  void TearDown() override { std::filesystem::remove_all(dir_); }
};

TEST_P(GgufSynthetic, WrittenAndReadBackEqualsTheSource) {
  ModelConfig cfg = model_preset(GetParam());
  auto src = make_synthetic_reader(cfg, "F32", 7);
  auto path = dir_ / "model.gguf";
  gguf::write_llama_gguf(path, to_config_json(cfg), src->tensors(),
                         [&](const TensorInfo& t, float* dst) {
                           src->read_slice(t.name, Slice::all(t), ElemType::kF32, dst);
                         },
                         gguf::GgmlType::kF32);
  auto r = open_gguf(path);
  ModelConfig back = parse_model_config(r->config_json().value(), path.string());
  EXPECT_EQ(to_config_json(back), to_config_json(cfg));
  ASSERT_EQ(r->tensors().size(), src->tensors().size());
  for (const TensorInfo& t : src->tensors()) {
    const TensorInfo& g = r->require(t.name);
    ASSERT_EQ(g.shape, t.shape) << t.name;
    std::vector<float> a(static_cast<std::size_t>(t.numel())), b(a.size());
    src->read_slice(t.name, Slice::all(t), ElemType::kF32, a.data());
    r->read_slice(t.name, Slice::all(g), ElemType::kF32, b.data());
    ASSERT_EQ(a, b) << t.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, GgufSynthetic, ::testing::Values("tiny", "tiny-qwen2"));

}  // namespace
}  // namespace trellis::runtime
