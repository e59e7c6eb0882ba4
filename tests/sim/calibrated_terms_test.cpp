// The calibrated terms added for the validation's third round (docs/planner.md departures
// 13 and 14): the measured all-reduce curve by message size, and linear-layer rates measured
// through the whole forward at the TP shard's own shapes with the attention they include.
// Hand-built numbers, so every expectation is computed by hand.
#include <gtest/gtest.h>

#include "calibration_errors.hpp"
#include "sim_fixtures.hpp"
#include "trellis/core/error.hpp"
#include "trellis/sim/calibration.hpp"

namespace trellis::sim {
namespace {

std::string error_of(const std::string& text) { return testing::calibration_error_of(text); }

TEST(AllreduceCurve, InterpolatesMeasuredPointsAndFallsBackToTheFitBeyondThem) {
  GroupLinks g;
  g.ranks = 2;
  g.measured_alpha_s = 100e-6;
  g.measured_bus_bandwidth = 1e8;
  g.measured_curve = {{1024, 10e-6}, {4096, 40e-6}, {65536, 100e-6}};
  EXPECT_DOUBLE_EQ(allreduce_time(g, 8), 10e-6);      // below the smallest point: its latency
  EXPECT_DOUBLE_EQ(allreduce_time(g, 1024), 10e-6);
  EXPECT_DOUBLE_EQ(allreduce_time(g, 2560), 25e-6);   // halfway between 1 KiB and 4 KiB
  EXPECT_DOUBLE_EQ(allreduce_time(g, 34816), 70e-6);  // halfway between 4 KiB and 64 KiB
  // beyond the largest point: alpha + 2 (t-1)/t bytes / bus = 100 us + 1 MiB / 1e8
  EXPECT_DOUBLE_EQ(allreduce_time(g, 1048576), 100e-6 + 1048576 / 1e8);
  g.ranks = 1;
  EXPECT_EQ(allreduce_time(g, 4096), 0);
}

TEST(AllreduceCurve, IsTheFastestAlgorithmAtEachSizeAndNeverFallsWithSize) {
  const Calibration c = Calibration::parse(R"({"schema": "trellis.calibration.v1",
      "allreduce": [{"class": "tcp", "algorithm": "ring", "ranks": 2, "alpha_us": 175, "bus_bandwidth_GBps": 0.07,
                     "samples": [{"bytes": 256, "seconds": 175e-6}, {"bytes": 4096, "seconds": 108e-6},
                                 {"bytes": 65536, "seconds": 179e-6}]},
                    {"class": "tcp", "algorithm": "mpi", "ranks": 2, "alpha_us": 366, "bus_bandwidth_GBps": 0.06,
                     "samples": [{"bytes": 65536, "seconds": 150e-6}, {"bytes": 256, "seconds": 366e-6}]},
                    {"class": "tcp", "algorithm": "MPI_Allreduce", "ranks": 2, "alpha_us": 1, "bus_bandwidth_GBps": 1,
                     "samples": [{"bytes": 256, "seconds": 1e-6}]}]})",
                                           "cal.json");
  const auto curve = c.allreduce_curve(LinkKind::kTcp, 2);
  ASSERT_EQ(curve.size(), 3u);
  // 256 B: ring 175 us, but 4 KiB measured 108 us, so 256 B costs at most that;
  // 4 KiB: ring 108; 64 KiB: mpi's 150 beats ring's 179. The MPI_Allreduce peer is skipped.
  EXPECT_DOUBLE_EQ(curve[0].second, 108e-6);
  EXPECT_DOUBLE_EQ(curve[1].second, 108e-6);
  EXPECT_DOUBLE_EQ(curve[2].second, 150e-6);
  EXPECT_TRUE(c.allreduce_curve(LinkKind::kTcp, 4).empty());
  EXPECT_NE(error_of(R"({"schema": "trellis.calibration.v1", "allreduce": [{"class": "tcp", "algorithm": "ring",
                         "ranks": 2, "alpha_us": 1, "bus_bandwidth_GBps": 1, "samples": [{"bytes": 8}]}]})")
                .find("allreduce[0].samples[0].seconds"),
            std::string::npos);
}

TEST(AllreduceCurve, ReachesTheLayoutsThroughTheClusterView) {
  const Calibration c = Calibration::parse(R"({"schema": "trellis.calibration.v1",
      "allreduce": [{"class": "shm", "algorithm": "shm", "ranks": 2, "alpha_us": 4, "bus_bandwidth_GBps": 3,
                     "samples": [{"bytes": 256, "seconds": 4e-6}, {"bytes": 16384, "seconds": 6e-6}]}]})",
                                           "cal.json");
  topology::Topology topo = testing::gpu_cluster(1, 0, "", 0, 0);
  for (int i = 0; i < 2; ++i) topo.hosts[0].numa_nodes.push_back(topology::NumaNode{i, 0, 8ull << 30, {}});
  const LayoutLinks l = layout_links(make_cluster_view(topo, "", &c), 1, 2);
  ASSERT_EQ(l.tp.measured_curve.size(), 2u);
  EXPECT_DOUBLE_EQ(allreduce_time(l.tp, 8320), 5e-6);  // halfway: 4 + (6 - 4) / 2 us
}

// 2 threads; tp=1 points: 1e9 params/s at M=1, 0.5e9 at M=16, context 96 decode / 32 prefill
// at M=64; tp=2 points (the half-width shard): 0.8e9 at M=1, 0.4e9 at M=16.
CpuSharing forward_curve() {
  return testing::two_core_sharing(1e10, {{2, 1, 1e9, 1, 96}, {2, 16, 0.5e9, 1, 96}, {2, 64, 0.25e9, 1, 32},
                                          {2, 1, 0.8e9, 2, 96}, {2, 16, 0.4e9, 2, 96}});
}

TEST(ForwardCurve, ALayoutReadsThePointsOfItsOwnTpShard) {
  const CpuSharing c = forward_curve();
  EXPECT_DOUBLE_EQ(cpu_seconds_per_param(c, 1, 2, 1), 1e-9);
  EXPECT_DOUBLE_EQ(cpu_seconds_per_param(c, 1, 2, 2), 1.25e-9);   // 1 / 0.8e9
  EXPECT_DOUBLE_EQ(cpu_seconds_per_param(c, 16, 2, 2), 2.5e-9);   // 1 / 0.4e9
  EXPECT_DOUBLE_EQ(cpu_seconds_per_param(c, 1, 2, 4), 1.25e-9);   // t=4: the largest measured shard <= 4
  EXPECT_DOUBLE_EQ(cpu_seconds_per_param(c, 1, 1, 2), 2.5e-9);    // one core: 2-thread rate x 2 (time-shared)
  CpuSharing only2 = c;
  only2.matmul.erase(only2.matmul.begin(), only2.matmul.begin() + 3);
  EXPECT_DOUBLE_EQ(cpu_seconds_per_param(only2, 1, 2, 1), 1.25e-9);  // no tp=1 points: the smallest shard measured
}

TEST(ForwardCurve, ContextIsThatOfTheNearestMeasuredRows) {
  const CpuSharing c = forward_curve();
  EXPECT_DOUBLE_EQ(cpu_curve_context(c, 1, 1), 96);
  EXPECT_DOUBLE_EQ(cpu_curve_context(c, 8, 1), 96);    // log-nearest to 16
  EXPECT_DOUBLE_EQ(cpu_curve_context(c, 512, 1), 32);  // prefill rows: the prefill point
  CpuSharing kernels = c;
  for (auto& p : kernels.matmul) p.context = 0;
  EXPECT_DOUBLE_EQ(cpu_curve_context(kernels, 1, 1), 0);
}

// One TP=2 rank's linear parameters of a model: its half of every matrix and of the vocab.
struct Shard2 {
  double params;
  explicit Shard2(const ModelSpec& m)
      : params(m.layers * (m.layer_params() - 2.0 * m.hidden) / 2 + static_cast<double>(m.vocab) * m.hidden / 2) {}
};

struct ForwardOnCpu : ::testing::Test {
  ModelSpec model = load_model("llama-3.2-1b");
  ClusterView host = make_cluster_view(testing::gpu_cluster(1, 4), "cpu");
  ModelInputs at(int t, int batch, int prompt, int gen) {
    ModelInputs in = testing::inputs(model, host, 1, t, 1, Variant::kStandard, batch);
    in.cpu = forward_curve();
    in.ranks_per_host = t;
    in.work.weight_bytes = in.work.kv_bytes = in.work.act_bytes = 4;
    in.work.prompt_len = prompt;
    in.work.gen_len = gen;
    return in;
  }
};

TEST_F(ForwardOnCpu, AttentionInsideTheMeasuredContextIsNotChargedTwice) {
  // prompt 64 + gen 64: decode context 64 + 32 = 96, all inside the curve; every linear
  // parameter at M=1 costs 1 ns and nothing else is added
  const Prediction p = predict(at(1, 1, 64, 64));
  ASSERT_TRUE(p.feasible) << p.reason;
  // (the two RMSNorm weight vectors per layer are not matrices)
  const double params =
      model.layers * (model.layer_params() - 2.0 * model.hidden) + static_cast<double>(model.vocab) * model.hidden;
  EXPECT_NEAR(p.decode.compute, params * 1e-9, 1e-6 * params * 1e-9);
  // prompt 1024 + gen 64: context 1056, of which 960 positions per row are beyond the curve:
  // 4 x 960 x q_dim FLOPs per layer (q_dim = 2048) at the host's 1e10 FLOP/s, the KV reads of those
  // positions take less time than their arithmetic here (1e12 B/s), so max() is the FLOPs
  const Prediction longer = predict(at(1, 1, 1024, 64));
  const double attn = model.layers * 4.0 * 960 * 2048 / 1e10;
  EXPECT_NEAR(longer.decode.compute - p.decode.compute, attn, 1e-6 * attn);
  // the same workload with a kernel-only curve (context 0) charges the attention over all
  // 1056 positions and the activations besides: more than the forward curve's
  ModelInputs kernel_only = at(1, 1, 1024, 64);
  for (auto& pt : kernel_only.cpu.matmul) pt.context = 0;
  EXPECT_GT(predict(kernel_only).decode.compute - p.decode.compute, attn * 1056 / 960);
}

TEST_F(ForwardOnCpu, RanksBusyAtOnceReadTheRatesMeasuredWithAsManyCopies) {
  // t=2, one microbatch: 2 ranks busy. Without points of 2 copies, each rank gets one core:
  // the tp=2 rate at 2 threads (0.8e9) time-shared to 1 core: 2.5 ns per parameter.
  ModelInputs in = at(2, 1, 64, 64);
  const Shard2 s{model};
  const Prediction shared = predict(in);
  EXPECT_NEAR(shared.decode.compute, s.params * 2.5e-9, 1e-6 * s.params * 2.5e-9);
  // 2 copies of the tp=2 shard measured at once, 2 threads each: 0.2e9 params/s per copy at
  // M=1, so 5 ns per parameter, read as measured (no division of the cores on top)
  in.cpu.matmul.push_back({2, 1, 0.2e9, 2, 96, 2});
  in.cpu.matmul.push_back({2, 16, 0.1e9, 2, 96, 2});
  EXPECT_TRUE(cpu_has_concurrent_curve(in.cpu, 2, 2));
  EXPECT_FALSE(cpu_has_concurrent_curve(in.cpu, 2, 4));
  EXPECT_FALSE(cpu_has_concurrent_curve(in.cpu, 1, 2));
  const Prediction measured = predict(in);
  EXPECT_NEAR(measured.decode.compute, s.params * 5e-9, 1e-6 * s.params * 5e-9);
  EXPECT_THROW(cpu_seconds_per_param(in.cpu, 1, 2, 2, 3), Error);  // 3 copies were not measured
}

TEST(ForwardCurve, CalibrationReadsShardAndContext) {
  const Calibration c = Calibration::parse(
      R"({"schema": "trellis.calibration.v1", "compute": {"flops": 4e10, "memory_bandwidth": 1e10,
          "matmul": [{"threads": 1, "rows": 1, "params_per_s": 2e9, "tp": 2, "context": 95.5},
                     {"threads": 1, "rows": 4, "params_per_s": 1e9}]}})",
      "cal.json");
  ASSERT_TRUE(c.compute());
  EXPECT_EQ(c.compute()->matmul[0].tp, 2);
  EXPECT_DOUBLE_EQ(c.compute()->matmul[0].context, 95.5);
  EXPECT_EQ(c.compute()->matmul[1].tp, 1);
  EXPECT_EQ(c.compute()->matmul[1].concurrent, 1);
  EXPECT_DOUBLE_EQ(c.compute()->matmul[1].context, 0);
  EXPECT_NE(error_of(R"({"schema": "trellis.calibration.v1", "compute": {"flops": 1, "memory_bandwidth": 1,
                         "matmul": [{"threads": 1, "rows": 1, "params_per_s": 1, "tp": 0}]}})")
                .find("compute.matmul[0].tp"),
            std::string::npos);
}

}  // namespace
}  // namespace trellis::sim
