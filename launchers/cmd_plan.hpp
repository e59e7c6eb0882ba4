// `trellis plan`'s options and the pieces of the command that live in their own files:
// cmd_plan.cpp (the command, the text and JSON output), cmd_plan_request.cpp (the options
// turned into a sim::PlanRequest: cluster, model, variants, precisions, chunks, calibration)
// and cmd_plan_published.cpp (--validate-published).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "trellis/sim/calibration.hpp"
#include "trellis/sim/planner.hpp"

namespace trellis::launchers {

struct PlanOptions {
  std::string model;
  std::string cluster;
  std::vector<std::string> topo_files;
  std::string gpu;
  int gpus = 0;
  double slo_tpot_ms = -1, slo_ttft_ms = -1;  // < 0: not given (the objective's default)
  std::string objective = "goodput";
  std::string batch = "1,2,4,8,16,32,64,128,256";
  std::string variants;  // empty: the variant the model was trained as
  std::string calibration;
  std::string svg;
  std::string sim_model = "refined";
  std::string dtype = "auto";
  std::string prefill_chunk;  // empty: sim::default_prefill_chunks()
  std::string validate;
  std::string published;  // --validate-published FILE (default: the shipped file)
  bool validate_published = false;
  std::string sbatch;  // FILE, or "-" for stdout
  std::string command_line;  // as typed, for the script's header
  double expert_imbalance = sim::kDefaultExpertImbalance;  // --expert-imbalance
  int prompt_len = 1024, gen_len = 512, top = 10, ranks_per_host = 0;
  bool json = false, no_sipipe = false, no_nvlink = false, no_replicas = false;
  std::string layer_split = "even";  // --layer-split: even or auto (trellis run's setting)
  // --swift, and --swift-m/--swift-alpha/--swift-r as given (empty: not given; any of them
  // turns the SWIFT estimate on, the others keep sim/swift_estimate.hpp's defaults).
  bool swift = false;
  std::string swift_m, swift_alpha, swift_r;
};

// The plan request the options describe (reads the cluster, model and calibration files they
// name); `cores_per_host` and `host_names` (when given) receive the cluster's, for the
// launch lines. Throws trellis::Error naming the flag on bad input.
sim::PlanRequest build_request(const PlanOptions& o, std::optional<sim::Calibration>& cal,
                               int* cores_per_host = nullptr, std::vector<std::string>* host_names = nullptr);

// `--validate-published [FILE]` (cmd_plan_published.cpp).
int run_validate_published(const std::string& file, bool json);

}  // namespace trellis::launchers
