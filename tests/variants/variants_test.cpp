// Every variant at t = world size (2 or 4 ranks) against a single-process reference of its
// own math: for variants whose math does not depend on t (standard, parallel, ladder, lp)
// the reference is the same variant at t = 1; for Desynced Residual, whose ranks carry
// their own partial sums, the reference simulates the t shards in one process. Also:
// `standard` through the runner equals the plain model, each variant issues the number of
// all-reduces it promises, and nocomm is labelled wrong and really differs.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>

#include "../model/model_test_util.hpp"
#include "trellis/core/config.hpp"
#include "trellis/core/error.hpp"
#include "trellis/kernels/ops.hpp"
#include "trellis/runtime/model/variants.hpp"
#include "trellis/transport/bootstrap.hpp"
#include "trellis/transport/collectives.hpp"
#include "trellis/transport/group.hpp"

using namespace trellis;
using namespace trellis::runtime;
using namespace trellis::runtime::testing;
using kernels::TensorView;

namespace {

transport::Bootstrap& world() {
  static auto w = transport::make_mpi_bootstrap();
  return *w;
}

std::vector<int> everyone() {
  std::vector<int> m;
  for (int i = 0; i < world().size(); ++i) m.push_back(i);
  return m;
}

// Rank r of a t-rank group that never communicates: lets one process hold every shard.
class ShardOnlyGroup final : public transport::Group {
 public:
  ShardOnlyGroup(int r, int t) : r_(r), t_(t), members_{r} {}
  int rank() const override { return r_; }
  int size() const override { return t_; }
  const std::vector<int>& members() const override { return members_; }
  std::string describe() const override { return "shard-only"; }
  void all_reduce(void*, std::size_t, transport::DType) override { fail(); }
  transport::RequestPtr all_reduce_async(void*, std::size_t, transport::DType) override { fail(); }
  void broadcast(void*, std::size_t, int) override { fail(); }
  void all_gather(const void*, void*, std::size_t) override { fail(); }
  void barrier() override { fail(); }

 private:
  [[noreturn]] static void fail() { throw Error(ErrorCode::kInternal, "the shard reference must not communicate"); }
  int r_, t_;
  std::vector<int> members_;
};

ModelConfig test_config() {
  auto cfg = model_preset("tiny");  // 4 layers
  cfg.num_kv_heads = 4;             // so t = 4 can shard KV heads
  return cfg;
}

LoadOptions load_options() {
  LoadOptions o;
  o.max_seq_len = 32;
  o.max_slots = 2;
  o.weight_dtype = ElemType::kF32;
  return o;
}

// The steps every check runs: a 2-sequence prefill, then two decode steps.
std::vector<Batch> steps(const ModelConfig& cfg) {
  Batch b;
  b.tokens = prompt(7, cfg.vocab_size, 1);
  auto p2 = prompt(3, cfg.vocab_size, 2);
  b.tokens.insert(b.tokens.end(), p2.begin(), p2.end());
  b.seqs = {{0, 0, 7}, {1, 0, 3}};
  std::vector<Batch> out{b};
  std::vector<std::int64_t> start = {7, 3};
  for (int s = 0; s < 2; ++s) {
    std::vector<std::int32_t> next = {static_cast<std::int32_t>(5 + s), static_cast<std::int32_t>(50 + s)};
    out.push_back(Batch::decode(next, start));
    for (auto& p : start) ++p;
  }
  return out;
}

std::vector<float> run_variant(LlamaModel& m, VariantRunner& runner, const Batch& b) {
  auto x = kernels::Tensor::empty(kernels::DType::kF32, {b.total_tokens(), m.config().hidden_size});
  runner.run_stage(b, x);
  auto local = kernels::Tensor::empty(kernels::DType::kF32, {b.logit_rows(), m.layout().vocab_local()});
  m.local_logits(b, x, local);
  std::vector<float> full;
  m.gather_logits(local, full);
  return full;
}

// Desynced Residual-nx computed by one process holding all t shards.
std::vector<std::vector<float>> desync_reference(const ModelConfig& cfg, CheckpointReader& reader, int t, int group) {
  kernels::Context ctx(1);
  auto single = transport::make_single_group(0);
  LlamaModel whole(reader, cfg, *single, ctx, load_options());
  std::vector<std::unique_ptr<ShardOnlyGroup>> groups;
  std::vector<std::unique_ptr<LlamaModel>> shards;
  for (int r = 0; r < t; ++r) {
    groups.push_back(std::make_unique<ShardOnlyGroup>(r, t));
    shards.push_back(std::make_unique<LlamaModel>(reader, cfg, *groups.back(), ctx, load_options()));
  }
  std::vector<std::vector<float>> out;
  for (const Batch& b : steps(cfg)) {
    const std::int64_t T = b.total_tokens(), H = cfg.hidden_size;
    auto x = kernels::Tensor::empty(kernels::DType::kF32, {T, H});
    whole.embed(b, x);
    std::vector<kernels::Tensor> local, accum;
    for (int r = 0; r < t; ++r) {
      local.push_back(kernels::Tensor::empty(kernels::DType::kF32, {T, H}));
      accum.push_back(kernels::Tensor::zeros(kernels::DType::kF32, {T, H}));
    }
    auto tmp = kernels::Tensor::empty(kernels::DType::kF32, {T, H});
    int in_group = 0;
    for (int l = 0; l < cfg.num_layers; ++l) {
      for (int module = 0; module < 2; ++module) {
        for (int r = 0; r < t; ++r) {
          if (in_group == 0) {
            std::memcpy(local[r].view().data, x.view().data, static_cast<std::size_t>(T * H) * 4);
            std::memset(accum[r].view().data, 0, static_cast<std::size_t>(T * H) * 4);
          }
          if (module == 0) shards[r]->attention_partial(l, b, local[r], tmp);
          else shards[r]->mlp_partial(l, local[r], tmp);
          kernels::add(ctx, local[r], tmp, local[r]);
          kernels::add(ctx, accum[r], tmp, accum[r]);
        }
        if (++in_group == group || (l == cfg.num_layers - 1 && module == 1)) {
          for (int r = 0; r < t; ++r) kernels::add(ctx, x, accum[r], x);
          in_group = 0;
        }
      }
    }
    auto logits = kernels::Tensor::empty(kernels::DType::kF32, {b.logit_rows(), cfg.vocab_size});
    whole.local_logits(b, x, logits);
    out.emplace_back(logits.ptr<float>(), logits.ptr<float>() + logits.numel());
  }
  return out;
}

// The TP group a check runs over: MPI's (the reference implementation), or make_group's
// shm (in-host) or ring over TCP links (as across hosts), whose async all-reduces the
// progress thread drives from another thread.
enum class GroupKind { kMpi, kShm, kRingTcp };

std::unique_ptr<transport::Group> make_tp_group(GroupKind kind) {
  if (kind == GroupKind::kMpi) return transport::make_mpi_group(world(), everyone(), Millis(60000));
  static Config config;
  transport::GroupOptions o;
  o.deadline = Millis(60000);
  std::vector<int> hosts(static_cast<std::size_t>(world().size()), 0);
  if (kind == GroupKind::kRingTcp) {
    o.algorithm = transport::Algorithm::kRing;
    o.cross_host = transport::Backend::kTcp;
    for (int r = 0; r < world().size(); ++r) hosts[static_cast<std::size_t>(r)] = r;  // one rank per "host"
  }
  return transport::make_group(world(), everyone(), o, config, hosts);
}

// Runs `v` sharded over the world and compares every step with `reference` (or, when
// empty, with the same variant at t = 1). Returns the all-reduce count of the prefill.
// `progress`: the background progress thread; `cooperative`: the kernels' progress hook tests
// ladder's in-flight all-reduce from inside the next module's GEMMs.
// `window`: the sharded model registers a window with its group (LoadOptions::window_bytes),
// so on shm every partial sum is all-reduced in place.
int check_variant(Variant v, const std::vector<std::vector<float>>& reference = {}, GroupKind kind = GroupKind::kMpi,
                  bool progress = true, bool cooperative = false, bool window = false) {
  auto cfg = test_config();
  auto reader = make_synthetic_reader(cfg, "F32", 33);
  kernels::Context ctx(1);
  auto tp = make_tp_group(kind);
  auto single = transport::make_single_group(world().rank());
  LoadOptions lo = load_options();
  if (window) lo.window_bytes = 1 << 20;
  LlamaModel sharded(*reader, cfg, *tp, ctx, lo), whole(*reader, cfg, *single, ctx, load_options());
  if (window) {
    EXPECT_TRUE(sharded.window_fits(16)) << "the steps' batches must fit the window";
  }
  VariantOptions opts;
  opts.progress.enabled = progress;
  opts.progress.cooperative = cooperative;
  opts.progress.cooperative_interval = std::chrono::microseconds(0);  // every poll tests
  opts.reader = reader.get();
  opts.load = load_options();
  VariantRunner rs(sharded, {v, 0, -1}, Millis(60000), opts), rw(whole, {v, 0, -1}, Millis(60000));
  if (v == Variant::kLayerParallel) {
    // The paper's placement: ranks [0, t/2) hold the first layer of every pair, the rest the second.
    EXPECT_EQ(rs.lp_placement(), "layer");
    const int side = world().rank() / (world().size() / 2);
    for (int k = 0; k < cfg.num_layers; k += 2) EXPECT_EQ(rs.lp_layer_held(k), k + side) << "pair " << k;
    EXPECT_EQ(rs.lp_layer_held(1), -1);
    EXPECT_EQ(rw.lp_placement(), "single");
  }
  int prefill_reductions = -1;
  auto all = steps(cfg);
  for (std::size_t i = 0; i < all.size(); ++i) {
    auto got = run_variant(sharded, rs, all[i]);
    if (i == 0) prefill_reductions = rs.all_reduces();
    auto want = reference.empty() ? run_variant(whole, rw, all[i]) : reference[i];
    EXPECT_LT(max_rel_diff(got, want), 1e-4) << to_string(v) << " step " << i << " at t=" << world().size();
  }
  // Without the thread, only the hook can have tested ladder's requests before the waits.
  if (v == Variant::kLadder && cooperative && !progress) {
    EXPECT_GT(rs.progress().cooperative_tests(), 0u);
  }
  if (!cooperative) {
    EXPECT_EQ(rs.progress().cooperative_tests(), 0u);
  }
  // Nobody closes its links while a peer may still be receiving (a ring group's last send can
  // still be on its way when the sender's own part is done): meet on the bootstrap first.
  world().barrier(Deadline::after(Millis(60000)));
  return prefill_reductions;
}

TEST(Variants, StandardRunnerEqualsPlainModel) {
  auto cfg = test_config();
  auto reader = make_synthetic_reader(cfg, "F32", 33);
  kernels::Context ctx(1);
  auto tp = transport::make_mpi_group(world(), everyone(), Millis(60000));
  LlamaModel a(*reader, cfg, *tp, ctx, load_options()), b(*reader, cfg, *tp, ctx, load_options());
  VariantRunner ra(a, {Variant::kStandard, 0, -1}, Millis(60000));
  for (const Batch& s : steps(cfg)) EXPECT_EQ(max_rel_diff(run_variant(a, ra, s), b.forward(s)), 0.0);
}

TEST(Variants, StandardAndParallelMatchTheirMath) {
  EXPECT_EQ(check_variant(Variant::kStandard), 2 * 4);
  EXPECT_EQ(check_variant(Variant::kParallel), 4);
}

TEST(Variants, LadderMatchesItsMathWithAsyncReductions) {
  EXPECT_EQ(check_variant(Variant::kLadder), 2 * 4);
  EXPECT_EQ(check_variant(Variant::kLadder, {}, GroupKind::kMpi, false), 2 * 4);
}

// The progress thread tests the shm and ring groups' requests from a second thread while the
// runner computes; results must not change.
TEST(Variants, LadderWithProgressThreadOverShmAndRing) {
  EXPECT_EQ(check_variant(Variant::kLadder, {}, GroupKind::kShm), 2 * 4);
  EXPECT_EQ(check_variant(Variant::kLadder, {}, GroupKind::kRingTcp), 2 * 4);
  EXPECT_EQ(check_variant(Variant::kLadder, {}, GroupKind::kRingTcp, false), 2 * 4);
}

// Cooperative progress: the kernels' hook tests the in-flight all-reduce from inside the
// next module's matmuls (with and without the thread); the logits must not change.
TEST(Variants, LadderWithCooperativeProgress) {
  EXPECT_EQ(check_variant(Variant::kLadder, {}, GroupKind::kRingTcp, false, true), 2 * 4);
  EXPECT_EQ(check_variant(Variant::kLadder, {}, GroupKind::kRingTcp, true, true), 2 * 4);
  EXPECT_EQ(check_variant(Variant::kLadder, {}, GroupKind::kShm, false, true), 2 * 4);
  EXPECT_EQ(check_variant(Variant::kLadder, {}, GroupKind::kMpi, false, true), 2 * 4);
}

// Every variant with the model's buffers in a registered window of the shm group: ladder's
// two buffers alternate in flight (progress thread, and the kernels' hook), desync reduces
// its accumulator, layer parallelism its summed pair.
TEST(Variants, EveryVariantInARegisteredShmWindow) {
  EXPECT_EQ(check_variant(Variant::kStandard, {}, GroupKind::kShm, true, false, true), 2 * 4);
  EXPECT_EQ(check_variant(Variant::kParallel, {}, GroupKind::kShm, true, false, true), 4);
  EXPECT_EQ(check_variant(Variant::kLadder, {}, GroupKind::kShm, true, false, true), 2 * 4);
  EXPECT_EQ(check_variant(Variant::kLadder, {}, GroupKind::kShm, false, true, true), 2 * 4);
  auto cfg = test_config();
  auto reader = make_synthetic_reader(cfg, "F32", 33);
  EXPECT_EQ(check_variant(Variant::kDesync2, desync_reference(cfg, *reader, world().size(), 2), GroupKind::kShm, true,
                          false, true),
            4);
  EXPECT_EQ(check_variant(Variant::kLayerParallel, {}, GroupKind::kShm, true, false, true), 4);
}

TEST(Variants, LayerParallelPaperPlacementOverShm) { EXPECT_EQ(check_variant(Variant::kLayerParallel, {}, GroupKind::kShm), 4); }

// Without a reader lp falls back to 1/t of both layers per rank: same math, labelled "heads".
TEST(Variants, LayerParallelHeadShardedFallback) {
  auto cfg = test_config();
  auto reader = make_synthetic_reader(cfg, "F32", 33);
  kernels::Context ctx(1);
  auto tp = make_tp_group(GroupKind::kMpi);
  auto single = transport::make_single_group(world().rank());
  LlamaModel sharded(*reader, cfg, *tp, ctx, load_options()), whole(*reader, cfg, *single, ctx, load_options());
  VariantRunner rs(sharded, {Variant::kLayerParallel, 0, -1}, Millis(60000)),
      rw(whole, {Variant::kLayerParallel, 0, -1}, Millis(60000));
  EXPECT_EQ(rs.lp_placement(), "heads");
  EXPECT_EQ(rs.lp_layer_held(0), -1);
  for (const Batch& b : steps(cfg)) EXPECT_LT(max_rel_diff(run_variant(sharded, rs, b), run_variant(whole, rw, b)), 1e-4);
}

TEST(Variants, LayerParallelMatchesItsMath) { EXPECT_EQ(check_variant(Variant::kLayerParallel), 4); }

TEST(Variants, DesyncMatchesShardSimulation) {
  auto cfg = test_config();
  auto reader = make_synthetic_reader(cfg, "F32", 33);
  EXPECT_EQ(check_variant(Variant::kDesync2, desync_reference(cfg, *reader, world().size(), 2)), 4);
  EXPECT_EQ(check_variant(Variant::kDesync4, desync_reference(cfg, *reader, world().size(), 4)), 2);
}

TEST(Variants, NoCommIsLabelledAndReallyDiffers) {
  EXPECT_FALSE(variant_is_exact(Variant::kNoComm));
  auto cfg = test_config();
  auto reader = make_synthetic_reader(cfg, "F32", 33);
  kernels::Context ctx(1);
  auto tp = transport::make_mpi_group(world(), everyone(), Millis(60000));
  LlamaModel m(*reader, cfg, *tp, ctx, load_options()), s(*reader, cfg, *tp, ctx, load_options());
  VariantRunner r(m, {Variant::kNoComm, 0, -1}, Millis(60000));
  auto b = steps(cfg)[0];
  auto got = run_variant(m, r, b);
  // Only the embedding's all-reduce and the logit gather remain; the layers issue none.
  EXPECT_EQ(r.all_reduces(), 0);
  EXPECT_GT(max_rel_diff(got, s.forward(b)), 1e-3);
}

TEST(Variants, RangesAndBadSpecs) {
  auto cfg = test_config();
  auto spec = parse_variant_spec("ladder", "2-3", cfg.num_layers);
  EXPECT_EQ(spec.range_first, 2);
  EXPECT_EQ(spec.range_last, 4);
  EXPECT_THROW(parse_variant("fast"), Error);
  EXPECT_THROW(parse_variant_spec("lp", "3-9", cfg.num_layers), Error);
  EXPECT_THROW(validate_variant({Variant::kLayerParallel, 0, 3}, cfg, 2), Error);  // odd stretch
  EXPECT_THROW(validate_variant({Variant::kLayerParallel, 0, 4}, cfg, 3), Error);  // t odd
  EXPECT_THROW(validate_variant({Variant::kLayerParallel, 0, 4}, cfg, 16), Error);  // 4 KV heads over t/2 = 8
  EXPECT_NO_THROW(validate_variant({Variant::kLayerParallel, 0, 4}, cfg, 8));       // 4 ranks per layer
  // A ladder on the upper half only: layers 0-1 standard (4 reductions) + 2 ladder layers (4).
  auto reader = make_synthetic_reader(cfg, "F32", 33);
  kernels::Context ctx(1);
  auto tp = transport::make_mpi_group(world(), everyone(), Millis(60000));
  LlamaModel m(*reader, cfg, *tp, ctx, load_options());
  VariantRunner r(m, spec, Millis(60000));
  auto got = run_variant(m, r, steps(cfg)[0]);
  EXPECT_EQ(r.all_reduces(), 8);
  EXPECT_FALSE(got.empty());
}

}  // namespace
