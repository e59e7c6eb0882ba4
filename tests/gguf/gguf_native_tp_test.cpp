// WeightsFormat::kNative under tensor parallelism (t = 2, 2 MPI ranks): each rank keeps only
// its shard of the Q4_1 blocks (row slices of Q/K/V and gate/up; block-aligned column slices
// of O; a down_proj shard whose columns do not start on a 32-element block falls back to
// dequantised weights), and the gathered logits match a t = 1 native model within the
// 8-bit activation rounding (not bit for bit: the row-parallel sums are added in another
// order, and quantised activations amplify that; docs/model-smollm2.md).
#include <mpi.h>

#include <unistd.h>

#include <cmath>

#include "gguf/gguf_test_util.hpp"
#include "trellis/runtime/checkpoint/gguf_reader.hpp"
#include "trellis/runtime/model/config.hpp"
#include "trellis/runtime/model/llama.hpp"
#include "trellis/runtime/model/synthetic.hpp"
#include "trellis/transport/bootstrap.hpp"
#include "trellis/transport/group.hpp"

using namespace trellis;
using namespace trellis::runtime;

namespace {

double rel_rms(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += static_cast<double>(a[i]) * a[i];
  }
  return std::sqrt(num / den);
}

TEST(GgufNativeTp, ShardedQuantisedWeightsMatchOneRank) {
  static auto world = transport::make_mpi_bootstrap();
  ASSERT_EQ(world->size(), 2);
  const ModelConfig cfg = model_preset("tiny");  // intermediate 160: 80 per rank, off the blocks
  // One file for both ranks: rank 0 writes it, the barrier publishes it.
  int tag = static_cast<int>(::getpid());
  MPI_Bcast(&tag, 1, MPI_INT, 0, MPI_COMM_WORLD);  // rank 0's pid names the file for both
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("trellis_native_tp_" + std::to_string(tag) + ".gguf");
  if (world->rank() == 0) {
    auto src = make_synthetic_reader(cfg, "F32", 5);
    gguf::write_llama_gguf(path, to_config_json(cfg), src->tensors(),
                           [&](const TensorInfo& t, float* dst) { src->read_slice(t.name, Slice::all(t), ElemType::kF32, dst); },
                           gguf::GgmlType::kQ4_1);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  {
    auto reader = open_gguf(path);
    kernels::Context ctx(1);
    auto tp = transport::make_mpi_group(*world, {0, 1}, Millis(60000));
    auto single = transport::make_single_group(world->rank());
    LoadOptions o;
    o.max_seq_len = 32;
    o.weight_dtype = ElemType::kF32;
    o.weights_format = WeightsFormat::kNative;
    LlamaModel sharded(*reader, cfg, *tp, ctx, o), whole(*reader, cfg, *single, ctx, o);
    EXPECT_TRUE(sharded.has_quantized_weights());
    EXPECT_LT(sharded.weight_bytes(), whole.weight_bytes());
    Batch b;
    for (int i = 0; i < 9; ++i) b.tokens.push_back((i * 53 + 7) % static_cast<int>(cfg.vocab_size));
    b.seqs = {SeqChunk{0, 0, 9}};
    b.all_logits = true;
    EXPECT_LT(rel_rms(sharded.forward(b), whole.forward(b)), 0.05);
    std::int64_t pos = 9;
    for (int step = 0; step < 3; ++step, ++pos) {
      std::int32_t tok = 11 + step;
      auto d = Batch::decode({&tok, 1}, {&pos, 1});
      EXPECT_LT(rel_rms(sharded.forward(d), whole.forward(d)), 0.05) << "decode step " << step;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world->rank() == 0) std::filesystem::remove(path);
}

}  // namespace
