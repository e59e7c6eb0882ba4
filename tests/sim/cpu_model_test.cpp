// The CPU-host terms of the refined model (departures 11 and 12 in docs/planner.md): the
// measured matmul curve interpolated in rows and cores, the ranks that share the cores,
// what that does to PP and TP layouts, and the engine's per-iteration overhead. Hand-built
// curves with round numbers, so every expectation is computed by hand.
#include <gtest/gtest.h>

#include "sim_fixtures.hpp"
#include "trellis/core/error.hpp"
#include "trellis/sim/calibration.hpp"
#include "trellis/sim/validate.hpp"

namespace trellis::sim {
namespace {

// 1 thread: 1e9 params/s at M=1, 0.5e9 at M=4, 0.1e9 at M=64 (FLOP-bound beyond).
// 2 threads: twice as fast at every M.
CpuSharing two_core_host() {
  CpuSharing c = testing::two_core_sharing(1e12);  // attention core: negligible at these sizes
  for (int t : {1, 2})
    for (auto [rows, rate] : {std::pair{1.0, 1e9}, {4.0, 0.5e9}, {64.0, 0.1e9}})
      c.matmul.push_back(MatmulPoint{t, rows, rate * t});
  return c;
}

TEST(CpuModel, CurveIsLinearInRowsBetweenMeasuredPointsAndFlopBoundBeyond) {
  const CpuSharing c = two_core_host();
  EXPECT_DOUBLE_EQ(cpu_seconds_per_param(c, 1, 1), 1e-9);
  EXPECT_DOUBLE_EQ(cpu_seconds_per_param(c, 4, 1), 2e-9);
  // halfway between M=1 (1 ns) and M=4 (2 ns)
  EXPECT_DOUBLE_EQ(cpu_seconds_per_param(c, 2.5, 1), 1.5e-9);
  // beyond the largest measured M: proportional to rows (128 = 2 x 64 -> 2 x 10 ns)
  EXPECT_DOUBLE_EQ(cpu_seconds_per_param(c, 128, 1), 20e-9);
}

TEST(CpuModel, CoresBetweenThreadCountsInterpolateAndFewerThanOneTimeShare) {
  const CpuSharing c = two_core_host();
  EXPECT_DOUBLE_EQ(cpu_seconds_per_param(c, 1, 2), 0.5e-9);
  EXPECT_DOUBLE_EQ(cpu_seconds_per_param(c, 1, 1.5), 0.75e-9);
  EXPECT_DOUBLE_EQ(cpu_seconds_per_param(c, 1, 0.5), 2e-9);  // half a core: twice the 1-thread time
  EXPECT_DOUBLE_EQ(cpu_seconds_per_param(c, 1, 8), 0.5e-9);  // no faster than the most threads measured
  CpuSharing empty = c;
  empty.matmul.clear();
  EXPECT_THROW(cpu_seconds_per_param(empty, 1, 1), Error);
}

TEST(CpuModel, MoreCoresAreNeverSlowerThanFewerMeasuredThreads) {
  CpuSharing c = two_core_host();
  // a 2-thread measurement slower than the 1-thread one (threads waiting on each other
  // under load): a rank with 2 cores gets the 1-thread rate
  for (auto& p : c.matmul)
    if (p.threads == 2) p.params_per_s /= 4;  // 2 threads at half the 1-thread rate
  EXPECT_DOUBLE_EQ(cpu_seconds_per_param(c, 1, 2), 1e-9);
  EXPECT_DOUBLE_EQ(cpu_seconds_per_param(c, 1, 1.5), 1e-9);
  EXPECT_DOUBLE_EQ(cpu_seconds_per_param(c, 1, 0.5), 2e-9);
}

TEST(CpuModel, BusyRanksAreTheTpGroupsOfTheStagesHoldingAMicrobatch) {
  CpuSharing c = two_core_host();
  EXPECT_EQ(cpu_busy_ranks(c, Layout{1, 1, 1}, 1), 1);
  EXPECT_EQ(cpu_busy_ranks(c, Layout{2, 1, 1}, 1), 1);  // one microbatch: one stage at a time
  EXPECT_EQ(cpu_busy_ranks(c, Layout{2, 1, 2}, 1), 2);
  EXPECT_EQ(cpu_busy_ranks(c, Layout{2, 2, 2}, 1), 4);
  EXPECT_EQ(cpu_busy_ranks(c, Layout{1, 2, 1}, 1), 2);
  c.one_machine = false;  // real hosts: only the ranks placed on one host share its cores
  EXPECT_EQ(cpu_busy_ranks(c, Layout{2, 2, 2}, 2), 2);
}

struct SmallOnCpu : ::testing::Test {
  ModelSpec model = load_model("llama-3.2-1b");
  ClusterView host = make_cluster_view(testing::gpu_cluster(1, 4), "cpu");
  ModelInputs at(int p, int t, int m, int batch) {
    ModelInputs in = testing::inputs(model, host, p, t, m, Variant::kStandard, batch);
    in.cpu = two_core_host();
    in.ranks_per_host = p * t;
    in.work.weight_bytes = in.work.kv_bytes = in.work.act_bytes = 4;
    in.work.prompt_len = 64;
    in.work.gen_len = 32;
    return in;
  }
};

TEST_F(SmallOnCpu, OneRankDecodeIsTheMeasuredCurveTimesItsParameters) {
  const Prediction p = predict(at(1, 1, 1, 1));
  ASSERT_TRUE(p.feasible) << p.reason;
  const double params = model.layers * model.layer_params() + static_cast<double>(model.vocab) * model.hidden;
  // every linear layer at M=1 with both cores: 0.5 ns per parameter
  EXPECT_NEAR(p.decode.compute, params * 0.5e-9, 0.02 * params * 0.5e-9);
}

TEST_F(SmallOnCpu, PipelineWithOneMicrobatchGivesEachStageTheWholeHost) {
  const Prediction one = predict(at(1, 1, 1, 1));
  const Prediction two = predict(at(2, 1, 1, 1));
  // the two stages run one after the other, each with both cores: about the same step
  EXPECT_NEAR(two.tpot_s, one.tpot_s, 0.1 * one.tpot_s);
  // with two microbatches both stages compute at once on one core each: each stage's
  // half of the layers takes as long as all of them on two cores
  const Prediction full = predict(at(2, 1, 2, 2));
  EXPECT_GT(full.decode.compute, 0.8 * one.decode.compute);
}

TEST_F(SmallOnCpu, TensorParallelRanksShareTheCores) {
  const Prediction one = predict(at(1, 1, 1, 1));
  const Prediction tp2 = predict(at(1, 2, 1, 1));
  // each rank holds half the weights but gets one core (1 ns/param instead of 0.5): the
  // compute per step is about that of one rank with both cores, not half of it
  EXPECT_GT(tp2.decode.compute, 0.9 * one.decode.compute);
  EXPECT_LT(tp2.decode.compute, 1.1 * one.decode.compute);
}

TEST_F(SmallOnCpu, BusyRanksTogetherStreamNoFasterThanTheHostBandwidth) {
  ModelInputs in = at(1, 2, 1, 1);
  // a 1-thread curve that alone would stream 4 GB/s per rank (1e9 f32 params/s) on a host
  // measured at 4 GB/s in all: the two ranks together are capped at the host's rate
  in.cpu.host_memory_bandwidth = 4e9;
  const Prediction capped = predict(in);
  in.cpu.host_memory_bandwidth = 1e12;
  const Prediction uncapped = predict(in);
  EXPECT_GT(capped.decode.compute, 1.9 * uncapped.decode.compute);
}

TEST_F(SmallOnCpu, MeasuredStepOverheadAddsToEveryIteration) {
  ModelInputs in = at(1, 1, 1, 4);
  const Prediction base = predict(in);
  in.host.step_overhead_s = 1e-3;
  in.host.step_overhead_per_seq_s = 1e-4;
  const Prediction with = predict(in);
  EXPECT_NEAR(with.tpot_s - base.tpot_s, 1e-3 + 4 * 1e-4, 1e-9);
}

TEST(CpuModel, CalibrationReadsTheMatmulCurveAndTheRuntimeSection) {
  const Calibration c = Calibration::parse(
      R"({"schema": "trellis.calibration.v1",
          "compute": {"device": "cpu", "flops": 4e10, "memory_bandwidth": 1e10, "cores": 2, "threads_per_rank": 2,
                      "matmul": [{"threads": 1, "rows": 1, "params_per_s": 2e9},
                                 {"threads": 2, "rows": 16, "params_per_s": 1e9}]},
          "runtime": {"step_overhead_us": 250, "step_overhead_per_seq_us": 20}})",
      "cal.json");
  ASSERT_TRUE(c.compute());
  EXPECT_EQ(c.compute()->cores, 2);
  ASSERT_EQ(c.compute()->matmul.size(), 2u);
  EXPECT_DOUBLE_EQ(c.compute()->matmul[1].rows, 16);
  ASSERT_TRUE(c.runtime());
  EXPECT_DOUBLE_EQ(c.runtime()->step_overhead_s, 250e-6);
  EXPECT_DOUBLE_EQ(c.runtime()->step_overhead_per_seq_s, 20e-6);
}

TEST(CpuModel, MalformedMatmulOrRuntimeNamesTheField) {
  auto error_of = [](const std::string& text) -> std::string {
    try {
      Calibration::parse(text, "cal.json");
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(error_of(R"({"schema": "trellis.calibration.v1", "compute": {"flops": 1, "memory_bandwidth": 1,
                         "matmul": [{"threads": 1, "rows": 1, "params_per_s": "x"}]}})")
                .find("compute.matmul[0].params_per_s"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"schema": "trellis.calibration.v1", "runtime": {"step_overhead_us": -1}})")
                .find("runtime.step_overhead_us"),
            std::string::npos);
}

TEST(CpuModel, MeasurementsCarryTheSharedCores) {
  const auto runs = parse_measurements(
      R"({"schema": "trellis.measurements.v1", "runs": [{"pp": 2, "tp": 1, "batch": 4, "microbatches": 2,
          "shared_cores": 2, "tokens_per_s": 10, "tpot_ms": 5}]})",
      "m.json");
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].shared_cores, 2);
  EXPECT_EQ(runs[0].microbatches, 2);
}

}  // namespace
}  // namespace trellis::sim
