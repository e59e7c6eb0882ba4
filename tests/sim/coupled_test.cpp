// Departure 16 (docs/planner.md): ranks that co-run read rates measured with the ranks coupled
// as the layout couples them — TP groups in lock step with their all-reduce, pipeline stages
// computing at once (`trellis bench model` under mpirun) — in place of a division of the
// cores or independent copies. Hand-built numbers; every expectation computed by hand.
#include <gtest/gtest.h>

#include "calibration_errors.hpp"
#include "sim_fixtures.hpp"
#include "trellis/core/error.hpp"
#include "trellis/sim/calibration.hpp"

namespace trellis::sim {
namespace {

// 2 cores, 2 kernel threads per rank. Alone: tp=1 1e9 params/s at M=1, 0.5e9 at M=16; tp=2
// shard 0.8e9 and 0.4e9 (context 96, so decode attention is inside the rate).
CpuSharing solo_curve() {
  return testing::two_core_sharing(
      1e10, {{2, 1, 1e9, 1, 96}, {2, 16, 0.5e9, 1, 96}, {2, 1, 0.8e9, 2, 96}, {2, 16, 0.4e9, 2, 96}});
}

// A point measured as a pp x tp layout with `concurrent` ranks computing at once.
MatmulPoint coupled(double rows, double rate, int tp, int concurrent, int pp = 1) {
  MatmulPoint p{2, rows, rate, tp, 96, concurrent};
  p.coupled = true;
  p.pp = pp;
  return p;
}

struct Coupled : ::testing::Test {
  ModelSpec model = load_model("llama-3.2-1b");
  ClusterView host = make_cluster_view(testing::gpu_cluster(1, 4), "cpu");
  // Linear parameters of one rank of a TP group of t (its share of every matrix and the vocab).
  double rank_params(int t) const {
    return (model.layers * (model.layer_params() - 2.0 * model.hidden) + static_cast<double>(model.vocab) * model.hidden) /
           t;
  }
  ModelInputs at(int p, int t, int m, int batch) {
    ModelInputs in = testing::inputs(model, host, p, t, m, Variant::kStandard, batch);
    in.cpu = solo_curve();
    in.ranks_per_host = p * t;
    in.work.weight_bytes = in.work.kv_bytes = in.work.act_bytes = 4;
    in.work.prompt_len = 64;
    in.work.gen_len = 64;
    return in;
  }
};

TEST_F(Coupled, ATpPairInLockStepReadsItsOwnRatesBeforeCopiesAndDivision) {
  ModelInputs in = at(1, 2, 1, 1);
  // Division (departure 11): two busy ranks, one core each: the 2-thread rate time-shared, 2.5 ns.
  const double alone = predict(in).decode.compute;
  EXPECT_NEAR(alone, rank_params(2) * 2.5e-9, 1e-6 * alone);
  // Two independent copies (departure 15): 0.5e9 per copy, 2 ns per parameter.
  in.cpu.matmul.push_back({2, 1, 0.5e9, 2, 96, 2});
  const double copies = predict(in).decode.compute;
  EXPECT_NEAR(copies, rank_params(2) * 2e-9, 1e-6 * copies);
  // The pair in lock step measured 0.25e9 per rank: 4 ns per parameter, read as measured.
  in.cpu.matmul.push_back(coupled(1, 0.25e9, 2, 2));
  EXPECT_TRUE(cpu_has_concurrent_curve(in.cpu, 2, 2, true));
  const double lock_step = predict(in).decode.compute;
  EXPECT_NEAR(lock_step, rank_params(2) * 4e-9, 1e-6 * lock_step);
  // The all-reduces are still charged from the link, not from the rate: unchanged by the points.
  EXPECT_DOUBLE_EQ(predict(in).decode.tp_comm, predict(at(1, 2, 1, 1)).decode.tp_comm);
}

TEST_F(Coupled, PipelinesReadThePointsOfTheirMicrobatchesInFlight) {
  ModelInputs two = at(2, 1, 2, 2);  // two microbatches of 1: both stages compute at once
  two.cpu.matmul.push_back(coupled(1, 0.4e9, 1, 2, 2));
  EXPECT_FALSE(cpu_has_concurrent_curve(two.cpu, 1, 2, true, 1));  // 2 stages are not a TP pair
  // Each stage holds half the layers; the slowest stage (the last, with the LM head) costs
  // its parameters at 2.5 ns: 8 layers + LM head of the 16-layer model.
  const double last = (8 * (model.layer_params() - 2.0 * model.hidden) + static_cast<double>(model.vocab) * model.hidden);
  const double c = predict(two).decode.compute;
  EXPECT_NEAR(c, last * 2.5e-9, 1e-6 * c);
  // One microbatch: the stages take turns, one rank busy: without a point measured that way,
  // the solo rate (1 ns) with all cores ...
  ModelInputs one = at(2, 1, 1, 1);
  one.cpu.matmul = two.cpu.matmul;
  const double solo = predict(one).decode.compute;
  EXPECT_NEAR(solo, last * 1e-9, 1e-6 * solo);
  // ... and with one (the waiting stage took CPU from the computing one: 0.8e9), 1.25 ns.
  one.cpu.matmul.push_back(coupled(1, 0.8e9, 1, 1, 2));
  const double turns = predict(one).decode.compute;
  EXPECT_NEAR(turns, last * 1.25e-9, 1e-6 * turns);
  // A single rank (1x1) never reads coupled points.
  ModelInputs alone = at(1, 1, 1, 1);
  alone.cpu.matmul = one.cpu.matmul;
  alone.cpu.matmul.push_back(coupled(1, 0.1e9, 1, 1, 2));
  const double whole = (16 * (model.layer_params() - 2.0 * model.hidden) + static_cast<double>(model.vocab) * model.hidden);
  EXPECT_NEAR(predict(alone).decode.compute, whole * 1e-9, 1e-6 * whole * 1e-9);
}

TEST_F(Coupled, PointsStandOnlyForTheGroupSizeAndHostTheyWereMeasuredIn) {
  CpuSharing c = solo_curve();
  c.matmul.push_back(coupled(1, 0.25e9, 2, 4, 2));  // two TP pairs at once (2x2, two microbatches)
  EXPECT_TRUE(cpu_has_concurrent_curve(c, 2, 4, true, 2));
  EXPECT_FALSE(cpu_has_concurrent_curve(c, 4, 4, true, 1));  // a TP group of 4 is another lock step
  EXPECT_FALSE(cpu_has_concurrent_curve(c, 2, 2, true, 2));  // 2x2 with one microbatch: not measured
  EXPECT_FALSE(cpu_has_concurrent_curve(c, 2, 4, true, 4));  // 4x2 with four pairs busy is another layout
  EXPECT_DOUBLE_EQ(cpu_seconds_per_param(c, 1, 2, 2, 4, true, 2), 4e-9);
  EXPECT_THROW(cpu_seconds_per_param(c, 1, 2, 4, 4, true, 1), Error);
  // A TP pair across two hosts waits in the kernel, not by polling a shared core: the
  // in-host lock step does not stand for it, the division does.
  ModelInputs in = at(1, 2, 1, 1);
  in.cpu.matmul.push_back(coupled(1, 0.25e9, 2, 2));
  in.links.tp.hosts = 2;
  const double across = predict(in).decode.compute;
  EXPECT_NEAR(across, rank_params(2) * 2.5e-9, 1e-6 * across);
}

TEST(CoupledCalibration, ReadsTheFlagAndNamesABadOne) {
  const Calibration c = Calibration::parse(
      R"({"schema": "trellis.calibration.v1", "compute": {"flops": 4e10, "memory_bandwidth": 1e10,
          "matmul": [{"threads": 2, "rows": 1, "params_per_s": 2e9, "tp": 2, "concurrent": 4, "coupled": true, "pp": 2},
                     {"threads": 2, "rows": 1, "params_per_s": 3e9, "tp": 2, "concurrent": 2}]}})",
      "cal.json");
  ASSERT_TRUE(c.compute());
  EXPECT_TRUE(c.compute()->matmul[0].coupled);
  EXPECT_EQ(c.compute()->matmul[0].pp, 2);
  EXPECT_FALSE(c.compute()->matmul[1].coupled);
  EXPECT_EQ(c.compute()->matmul[1].pp, 1);
  const auto bad = [](const std::string& point) {
    return testing::calibration_error_of(R"({"schema": "trellis.calibration.v1", "compute": {"flops": 1,
        "memory_bandwidth": 1, "matmul": [)" + point + "]}}");
  };
  EXPECT_NE(bad(R"({"threads": 2, "rows": 1, "params_per_s": 1, "coupled": "yes"})").find("compute.matmul[0].coupled"),
            std::string::npos);
  // 3 busy ranks cannot be whole TP groups of 2; 4 cannot be busy in one stage of 2
  EXPECT_NE(bad(R"({"threads": 2, "rows": 1, "params_per_s": 1, "tp": 2, "concurrent": 3, "coupled": true, "pp": 2})")
                .find("compute.matmul[0].concurrent"),
            std::string::npos);
  EXPECT_NE(bad(R"({"threads": 2, "rows": 1, "params_per_s": 1, "tp": 2, "concurrent": 4, "coupled": true})")
                .find("compute.matmul[0].concurrent"),
            std::string::npos);
}

}  // namespace
}  // namespace trellis::sim
