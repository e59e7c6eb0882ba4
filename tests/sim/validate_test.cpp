// The validation path: measurements equal to the predictions give zero error and the right
// top pick; a measured best that the model ranks low is reported; malformed files name the
// field.
#include <gtest/gtest.h>

#include "sim_fixtures.hpp"
#include "trellis/core/error.hpp"
#include "trellis/sim/validate.hpp"

namespace trellis::sim {
namespace {

PlanRequest cpu_request() {
  PlanRequest r;
  r.model = load_model("smollm2-135m");
  r.cluster = make_cluster_view(testing::gpu_cluster(1, 4));
  r.work.prompt_len = 64;
  r.work.gen_len = 32;
  return r;
}

Measurement run(int p, int t, Variant v, int batch) {
  Measurement m;
  m.p = p, m.t = t, m.variant = v, m.batch = batch;
  return m;
}

TEST(Validate, PerfectMeasurementsHaveZeroErrorAndTheRightPick) {
  PlanRequest r = cpu_request();
  std::vector<Measurement> runs = {run(1, 1, Variant::kStandard, 4), run(1, 3, Variant::kStandard, 4),
                                   run(3, 1, Variant::kStandard, 4), run(3, 1, Variant::kParallel, 4)};
  for (auto& m : runs) {
    Candidate c = evaluate(r, 1, Layout{m.p, m.t, 1, m.variant, 0.8}, m.batch, layout_links(r.cluster, m.p, m.t));
    ASSERT_TRUE(c.prediction.feasible) << c.prediction.reason;
    m.tokens_per_s = c.prediction.tokens_per_s;
    m.tpot_s = c.prediction.tpot_s;
  }
  ValidationReport rep = validate(r, runs);
  EXPECT_NEAR(rep.median_abs_error, 0, 1e-12);
  EXPECT_NEAR(rep.p90_abs_error, 0, 1e-12);
  EXPECT_EQ(rep.top_pick_groups, 1);
  EXPECT_EQ(rep.top_pick_ok, 1);
  // Make the slowest-predicted layout the measured best: the pick is now wrong and said so.
  std::size_t worst = 0;
  for (std::size_t i = 1; i < runs.size(); ++i)
    if (runs[i].tokens_per_s < runs[worst].tokens_per_s) worst = i;
  runs[worst].tokens_per_s *= 100;
  ValidationReport bad = validate(r, runs);
  EXPECT_EQ(bad.top_pick_ok, 0);
  EXPECT_GT(bad.p90_abs_error, 0.2);
  EXPECT_FALSE(bad.notes.empty());
  EXPECT_NE(format_validation(bad).find("median |error|"), std::string::npos);
}

TEST(Validate, MalformedMeasurementsNameTheField) {
  try {
    parse_measurements(R"({"schema": "trellis.measurements.v1", "runs": [{"pp": 1, "tp": 2, "batch": 4,
                           "tokens_per_s": 10}]})", "m.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("runs[0].tpot_ms"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_measurements(R"({"runs": []})", "m.json"), Error);
  EXPECT_THROW(parse_measurements(R"({"schema": "trellis.measurements.v1", "runs": [{"pp": 1, "tp": 1, "batch": 1,
      "tokens_per_s": 1, "tpot_ms": 1, "variant": "turbo"}]})", "m.json"), Error);
}

// A run says how it split its layers; absent means even (every run recorded before the
// option); anything but even or auto is refused naming the field.
TEST(Validate, RunsSayWhichLayerSplitTheyUsed) {
  const auto runs = parse_measurements(
      R"({"schema": "trellis.measurements.v1", "runs": [
          {"pp": 2, "tp": 1, "batch": 4, "tokens_per_s": 100, "tpot_ms": 10},
          {"pp": 2, "tp": 1, "batch": 4, "tokens_per_s": 100, "tpot_ms": 10, "layer_split": "auto"},
          {"pp": 2, "tp": 1, "batch": 4, "tokens_per_s": 100, "tpot_ms": 10, "layer_split": "even"}]})",
      "m.json");
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_FALSE(runs[0].head_aware_split);
  EXPECT_TRUE(runs[1].head_aware_split);
  EXPECT_FALSE(runs[2].head_aware_split);
  for (const char* bad : {R"("balanced")", "1", "null"}) {
    try {
      parse_measurements(std::string(R"({"schema": "trellis.measurements.v1", "runs": [{"pp": 2, "tp": 1, "batch": 4,
                             "tokens_per_s": 1, "tpot_ms": 1, "layer_split": )") + bad + "}]}",
                         "m.json");
      ADD_FAILURE() << "layer_split " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("runs[0].layer_split"), std::string::npos) << e.what();
    }
  }
}

TEST(Validate, RepetitionsGiveTheMeasurementNoiseFloor) {
  const auto runs = parse_measurements(
      R"({"schema": "trellis.measurements.v1", "runs": [{"pp": 1, "tp": 1, "batch": 4, "tokens_per_s": 100,
          "tpot_ms": 10, "tokens_per_s_reps": [80, 100, 120], "tpot_ms_reps": [10, 10, 15]}]})",
      "m.json");
  ASSERT_EQ(runs[0].tpot_s_reps.size(), 3u);
  EXPECT_DOUBLE_EQ(runs[0].tpot_s_reps[2], 15e-3);
  ValidationReport rep = validate(cpu_request(), runs);
  // deviations: 0.2, 0, 0.2, 0, 0, 0.5 -> median 0.1
  EXPECT_NEAR(rep.median_rep_deviation, 0.1, 1e-12);
  EXPECT_EQ(rep.repetitions, 3);
  EXPECT_NE(format_validation(rep).find("measurement noise"), std::string::npos);
  EXPECT_THROW(parse_measurements(R"({"schema": "trellis.measurements.v1", "runs": [{"pp": 1, "tp": 1, "batch": 1,
                   "tokens_per_s": 1, "tpot_ms": 1, "tpot_ms_reps": [1, "x"]}]})", "m.json"),
               Error);
}

TEST(Validate, MeasuredTtftIsShownBesideThePrediction) {
  const auto runs = parse_measurements(
      R"({"schema": "trellis.measurements.v1", "runs": [{"pp": 1, "tp": 1, "batch": 4, "tokens_per_s": 100,
          "tpot_ms": 10, "ttft_ms": 123.4}]})",
      "m.json");
  EXPECT_DOUBLE_EQ(runs[0].ttft_s, 0.1234);
  const std::string table = format_validation(validate(cpu_request(), runs));
  EXPECT_NE(table.find("meas TTFT"), std::string::npos);
  EXPECT_NE(table.find("123.4ms"), std::string::npos);
}

TEST(Validate, BackgroundCpuShareIsReportedBesideTheNoise) {
  const auto runs = parse_measurements(
      R"({"schema": "trellis.measurements.v1", "runs": [{"pp": 1, "tp": 1, "batch": 4, "tokens_per_s": 100,
          "tpot_ms": 10, "tokens_per_s_reps": [100, 100], "tpot_ms_reps": [10, 10],
          "background_cpu_share_reps": [0.0, null, 0.5]}]})",
      "m.json");
  ASSERT_EQ(runs[0].background_cpu_share_reps.size(), 2u);  // null: not recorded
  EXPECT_EQ(format_validation(validate(cpu_request(), runs)).find("meas TTFT"), std::string::npos);  // not measured
  ValidationReport rep = validate(cpu_request(), runs);
  EXPECT_NEAR(rep.median_background_share, 0.25, 1e-12);
  EXPECT_NEAR(rep.p90_background_share, 0.45, 1e-12);
  EXPECT_NE(format_validation(rep).find("niced background processes (builds) took 25.0%"), std::string::npos);
  try {
    parse_measurements(R"({"schema": "trellis.measurements.v1", "runs": [{"pp": 1, "tp": 1, "batch": 1,
                           "tokens_per_s": 1, "tpot_ms": 1, "background_cpu_share_reps": [2]}]})", "m.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("runs[0].background_cpu_share_reps[0]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace trellis::sim
