// Tensor parallelism at t = 2 (2 MPI ranks): every rank loads only its shard, and the
// gathered logits equal a t = 1 model computed on the same rank, for prefill and decode,
// f32 and bf16 weights, with and without biases / tied embeddings, and a vocabulary that
// does not divide evenly.
#include <mpi.h>

#include <cstring>
#include <map>
#include <mutex>

#include "model_test_util.hpp"
#include "trellis/kernels/ops.hpp"
#include "trellis/core/config.hpp"
#include "trellis/transport/bootstrap.hpp"
#include "trellis/transport/collectives.hpp"
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

namespace {

// Records how many elements of each tensor a model asked for.
class CountingReader final : public CheckpointReader {
 public:
  explicit CountingReader(const CheckpointReader& inner) : inner_(inner) {}
  std::string describe() const override { return inner_.describe(); }
  const std::vector<TensorInfo>& tensors() const override { return inner_.tensors(); }
  const TensorInfo* find(std::string_view name) const override { return inner_.find(name); }
  void read_slice(std::string_view name, const Slice& s, ElemType out, void* dst) const override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      read_[std::string(name)] += s.rows() * s.cols();
    }
    inner_.read_slice(name, s, out, dst);
  }
  std::optional<std::string> config_json() const override { return inner_.config_json(); }
  std::int64_t read(const std::string& name) const { return read_.count(name) ? read_.at(name) : 0; }

 private:
  const CheckpointReader& inner_;
  mutable std::mutex mu_;
  mutable std::map<std::string, std::int64_t> read_;
};

}  // namespace

TEST(ModelTp, EachRankReadsOnlyItsShard) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  auto cfg = model_preset("tiny");
  auto inner = make_synthetic_reader(cfg, "BF16", 3);
  CountingReader reader(*inner);
  kernels::Context ctx(2);  // the loader reads rows on several threads
  auto tp = transport::make_mpi_group(world(), everyone(), Millis(60000));
  LoadOptions o;
  o.max_seq_len = 16;
  LlamaModel m(reader, cfg, *tp, ctx, o);
  for (const auto& t : inner->tensors()) {
    const bool replicated = t.shape.size() == 1;  // norms
    EXPECT_EQ(reader.read(t.name), replicated ? t.numel() : t.numel() / 2) << t.name;
  }
}

TEST(ModelTp, AsyncAllReduceWiringEqualsStandardLayer) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  auto cfg = model_preset("tiny");
  auto reader = make_synthetic_reader(cfg, "F32", 9);
  kernels::Context ctx(1);
  auto tp = transport::make_mpi_group(world(), everyone(), Millis(60000));
  LoadOptions o;
  o.max_seq_len = 16;
  LlamaModel a(*reader, cfg, *tp, ctx, o), b(*reader, cfg, *tp, ctx, o);
  Batch batch;
  batch.tokens = prompt(5, cfg.vocab_size, 3);
  batch.seqs = {{0, 0, 5}};
  const auto H = cfg.hidden_size;
  auto xa = kernels::Tensor::empty(kernels::DType::kF32, {5, H}), xb = kernels::Tensor::empty(kernels::DType::kF32, {5, H});
  auto part = kernels::Tensor::empty(kernels::DType::kF32, {5, H});
  a.run_stage(batch, xa);
  // The same block composed by hand from the steps, with the asynchronous all-reduce.
  b.embed(batch, xb);
  for (int l = 0; l < cfg.num_layers; ++l) {
    b.attention_partial(l, batch, xb, part);
    b.all_reduce_async(part)->wait(Deadline::after(Millis(60000)));
    kernels::add(ctx, xb, part, xb);
    b.mlp_partial(l, xb, part);
    b.all_reduce_async(part)->wait(Deadline::after(Millis(60000)));
    kernels::add(ctx, xb, part, xb);
  }
  std::vector<float> va(xa.ptr<float>(), xa.ptr<float>() + 5 * H), vb(xb.ptr<float>(), xb.ptr<float>() + 5 * H);
  EXPECT_EQ(va, vb);
}

// The shm group with a registered window (LoadOptions::window_bytes): the partial sums live in
// memory both ranks map and every all-reduce runs zero-copy; the stage output is bit for bit
// the copying path's (same summation order), for prefill and for a forward too large for the
// window, which falls back to private scratch.
TEST(ModelTp, RegisteredWindowEqualsCopyingPathBitForBit) {
  if (world().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  auto cfg = model_preset("tiny");
  auto reader = make_synthetic_reader(cfg, "F32", 17);
  kernels::Context ctx(1);
  Config config;
  transport::GroupOptions go;
  go.algorithm = transport::Algorithm::kShm;
  auto tp = transport::make_group(world(), everyone(), go, config);
  LoadOptions o;
  o.max_seq_len = 64;
  o.max_slots = 2;
  LoadOptions ow = o;
  const std::int64_t H = cfg.hidden_size, fits = 8;
  ow.window_bytes = static_cast<std::size_t>(2 * fits * H) * sizeof(float);
  LlamaModel copying(*reader, cfg, *tp, ctx, o), windowed(*reader, cfg, *tp, ctx, ow);
  EXPECT_FALSE(copying.window_fits(1));
  EXPECT_TRUE(windowed.window_fits(fits));
  EXPECT_FALSE(windowed.window_fits(fits + 1));
  // The buffers really are the window: an all-reduce on one is the zero-copy operation.
  auto rb = windowed.reduce_buffer(0, fits);
  for (std::int64_t i = 0; i < fits * H; ++i) rb.ptr<float>()[i] = 1.0f;
  auto req = windowed.all_reduce_async(rb);
  EXPECT_NE(req->describe().find("registered window"), std::string::npos) << req->describe();
  req->wait(Deadline::after(Millis(60000)));
  EXPECT_EQ(rb.ptr<float>()[fits * H - 1], 2.0f);
  int slot = 0;
  for (std::int64_t T : {fits, fits + 5}) {
    Batch batch;
    batch.tokens = prompt(T, cfg.vocab_size, 3);
    batch.seqs = {{slot++, 0, T}};
    auto xa = kernels::Tensor::empty(kernels::DType::kF32, {T, H}), xb = kernels::Tensor::empty(kernels::DType::kF32, {T, H});
    copying.run_stage(batch, xa);
    windowed.run_stage(batch, xb);
    EXPECT_EQ(std::memcmp(xa.ptr<float>(), xb.ptr<float>(), static_cast<std::size_t>(T * H) * sizeof(float)), 0)
        << T << " rows";
  }
}
