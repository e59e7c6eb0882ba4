// Validation against reality: measured runs (from `trellis run` sweeps, see
// sim/scripts/plan_validate.sh) compared with the planner's predictions for the same
// layouts. The measurements file:
//
//   { "schema": "trellis.measurements.v1",
//     "runs": [ { "pp": 1, "tp": 2, "batch": 4, "variant": "standard", "microbatches": 1,
//                 "prompt_len": 64, "gen_len": 32, "cluster": "hosts=2,nics=1x1g-eth",
//                 "ranks_per_host": 2, "shared_cores": 2, "tokens_per_s": 123.4, "tpot_ms": 31.0,
//                 "tokens_per_s_reps": [120.1, 123.4, 140.0], "tpot_ms_reps": [...],
//                 "background_cpu_share_reps": [0.01, 0.0, 0.2] }, ... ] }
//
// tokens_per_s is what `trellis run` reports: generated tokens over the wall time of the
// generation, prefill included (the planner's tokens_per_s); tpot_ms its mean TPOT.
//
// "cluster" (a synthetic spec) is optional: without it a run is predicted on the request's
// cluster. "microbatches", "prompt_len", "gen_len" default to 1 and the request's lengths.
// A malformed file throws kCorruptInput naming the file and the field.
#pragma once

#include <string>
#include <vector>

#include "trellis/sim/planner.hpp"

namespace trellis::sim {

class Calibration;

struct Measurement {
  int p = 1, t = 1, batch = 1, microbatches = 1;
  // How the run split its layers: "even" (every run before --layer-split existed; the
  // default when the field is absent) or "auto" (trellis run's default since).
  bool head_aware_split = false;
  Variant variant = Variant::kStandard;
  int prompt_len = 0, gen_len = 0;  // 0: the request's
  std::string cluster;               // synthetic spec, or "" for the request's cluster
  int ranks_per_host = 0;            // CPU ranks per host of that cluster (0: NUMA nodes)
  int shared_cores = 0;              // >0: every rank ran on these cores of one machine
                                     // (emulated hosts); they share them (departure 11)
  double tokens_per_s = 0;
  double tpot_s = 0;
  double ttft_s = 0;  // optional (0: not measured): mean time to first token, shown beside the prediction
  // Optional: every repetition behind the (median) figures above, to state the noise floor.
  std::vector<double> tokens_per_s_reps, tpot_s_reps;
  // Optional, per repetition: the share of the machine's CPU that niced (nice > 0) processes
  // took while it ran (0..1): other sessions' builds, which this shared machine runs at
  // nice 10; so the noise can be set beside how busy the machine was.
  std::vector<double> background_cpu_share_reps;
};

struct ValidationRow {
  Measurement measured;
  Prediction predicted;
  double tokens_error = 0;  // (predicted - measured) / measured
  double tpot_error = 0;
};

struct ValidationReport {
  std::vector<ValidationRow> rows;
  double median_abs_error = 0;  // over both metrics of every row
  double p90_abs_error = 0;
  // How far single repetitions fall from their row's median, |rep - median| / median over
  // both metrics (0 when the file has no repetitions): the measurements' own noise, which
  // bounds how closely any model can be shown to agree.
  double median_rep_deviation = 0, p90_rep_deviation = 0;
  int repetitions = 0;
  // Niced background CPU share over every repetition that recorded it (-1: none did).
  double median_background_share = -1, p90_background_share = -1;
  // Per workload (batch, lengths, cluster): did the predicted best layout measure within
  // 5% of the measured best?
  int top_pick_groups = 0, top_pick_ok = 0;
  std::vector<std::string> notes;
};

std::vector<Measurement> parse_measurements(const std::string& json_text, const std::string& origin);
std::vector<Measurement> load_measurements(const std::string& path);

// Predicts every measured layout with the request's settings (its cluster, or the run's
// own synthetic cluster with the same calibration) and compares.
ValidationReport validate(const PlanRequest& request, const std::vector<Measurement>& runs,
                          const Calibration* calibration = nullptr);

// The table: one row per run with measured vs predicted tokens/s and TPOT and the errors,
// then median and p90 |error| and the top-pick result.
std::string format_validation(const ValidationReport& report);

}  // namespace trellis::sim
