// Tensor parallelism at t = 2 (2 MPI ranks): every rank loads only its shard, and the
// gathered logits equal a t = 1 model computed on the same rank, for prefill and decode,
// f32 and bf16 weights, with and without biases / tied embeddings, and a vocabulary that
// does not divide evenly.
#include <mpi.h>

#include "model_test_util.hpp"
#include "trellis/transport/bootstrap.hpp"
#include "trellis/transport/group.hpp"

using namespace trellis;
using namespace trellis::runtime;
using namespace trellis::runtime::testing;

namespace {

transport::Bootstrap& world() {
  static auto w = transport::make_mpi_bootstrap();
  return *w;
}

std::vector<int> everyone() {
  std::vector<int> m(static_cast<std::size_t>(world().size()));
  for (int i = 0; i < world().size(); ++i) m[static_cast<std::size_t>(i)] = i;
  return m;
}

void compare_tp(const ModelConfig& cfg, const std::string& dtype, ElemType wtype) {
  auto reader = make_synthetic_reader(cfg, dtype, 21);
  kernels::Context ctx(1);
  auto tp = transport::make_mpi_group(world(), everyone(), Millis(60000));
  auto single = transport::make_single_group(world().rank());
  LoadOptions o;
  o.max_seq_len = 48;
  o.max_slots = 2;
  o.weight_dtype = wtype;
  LlamaModel sharded(*reader, cfg, *tp, ctx, o), whole(*reader, cfg, *single, ctx, o);
  EXPECT_LT(sharded.weight_bytes(), whole.weight_bytes() * 6 / 10);  // each rank holds ~half
  Batch b;
  b.tokens = prompt(11, cfg.vocab_size, 1);
  auto p2 = prompt(4, cfg.vocab_size, 2);
  b.tokens.insert(b.tokens.end(), p2.begin(), p2.end());
  b.seqs = {{0, 0, 11}, {1, 0, 4}};
  b.all_logits = true;
  EXPECT_LT(max_rel_diff(sharded.forward(b), whole.forward(b)), 1e-5);
  std::vector<std::int64_t> start = {11, 4};
  for (int step = 0; step < 4; ++step) {
    std::vector<std::int32_t> next = {static_cast<std::int32_t>(3 + step), static_cast<std::int32_t>(40 + step)};
    auto d = Batch::decode(next, start);
    EXPECT_LT(max_rel_diff(sharded.forward(d), whole.forward(d)), 1e-5) << "decode step " << step;
    for (auto& s : start) ++s;
  }
}

}  // namespace

TEST(ModelTp, LlamaF32MatchesSingleRank) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  compare_tp(model_preset("tiny"), "F32", ElemType::kF32);
}

TEST(ModelTp, Qwen2Bf16TiedOddVocabMatchesSingleRank) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  auto cfg = model_preset("tiny-qwen2");
  cfg.vocab_size = 383;  // 192 + 191: the last rank's slice is shorter
  compare_tp(cfg, "BF16", ElemType::kBF16);
}

TEST(ModelTp, IndivisibleKvHeadsIsAClearError) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  auto cfg = model_preset("tiny");
  cfg.num_heads = 3;
  cfg.num_kv_heads = 1;
  cfg.hidden_size = 48;
  cfg.head_dim = 16;
  cfg.rope.head_dim = 16;
  auto reader = make_synthetic_reader(cfg, "F32", 1);
  kernels::Context ctx(1);
  auto tp = transport::make_mpi_group(world(), everyone(), Millis(60000));
  expect_error([&] { LlamaModel m(*reader, cfg, *tp, ctx); }, {"num_key_value_heads (1)", "t=2"});
}
