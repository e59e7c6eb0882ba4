// The planner: enumerates every layout of a model on a cluster — replicas d, pipeline
// degree p, TP degree t (d*p*t = the devices used), microbatches m, variant, batch — predicts
// each with the refined model (or the appendix model, for comparison), drops the infeasible
// ones with their reason, and ranks the rest by throughput under the latency SLO.
//
// plan() is a pure function of its request; it allocates but does no I/O. Thread-safe.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "trellis/sim/catalog.hpp"
#include "trellis/sim/cluster.hpp"
#include "trellis/sim/cost_model.hpp"

namespace trellis::sim {

enum class ModelKind { kRefined, kAppendix };

struct PlanRequest {
  ModelSpec model;
  ClusterView cluster;
  int devices = 0;                  // devices to use; 0 = every rank of the cluster
  std::vector<int> batches = {1, 4, 16, 64, 256};  // concurrent sequences per replica
  std::vector<Variant> variants = all_variants();
  Workload work;                    // prompt/gen lengths and element sizes (batch ignored)
  std::optional<double> slo_tpot_s;
  std::optional<double> slo_ttft_s;
  PipelineTechniques techniques;
  HostCosts host;
  Efficiency efficiency;
  CpuSharing cpu;                   // CPU hosts with measured matmul rates (calibration)
  double compute_scale = 1;         // from calibration
  double memory_scale = 1;
  double lp_fraction = 0.8;
  ModelKind kind = ModelKind::kRefined;
  bool replicas = true;             // also consider d > 1 data-parallel replicas
};

struct Candidate {
  int replicas = 1;
  Layout layout;
  int batch = 1;                    // per replica
  Prediction prediction;
  double total_tokens_per_s = 0;    // replicas x per-replica tokens/s
  std::string slo_miss;             // empty when the SLO holds
  bool boundary_crosses_host = false;
  std::string tp_link;              // the TP group's link ("nvlink4", "ib-ndr across 2 hosts")
};

struct PlanResult {
  std::vector<Candidate> ranked;    // feasible and within the SLO, best first
  std::vector<Candidate> rejected;  // infeasible or missing the SLO, with the reason
  std::vector<Candidate> feasible;  // every feasible candidate (for the Pareto chart)
  std::vector<Candidate> bounds;    // feasible nocomm layouts: upper bounds, never ranked
  long evaluated = 0;
  std::string binding_constraint;   // when `ranked` is empty: what stopped every layout
  std::string why;                  // one line: why the winner wins
  std::vector<std::string> warnings;
};

PlanResult plan(const PlanRequest& request);

// Predicts one layout of the request (also what plan() calls per candidate).
Candidate evaluate(const PlanRequest& request, int replicas, const Layout& layout, int batch,
                   const LayoutLinks& links);

// The appendix model's prediction for the same layout: Appendix A's equations with C from
// the roofline of one unsharded layer, B1/B2/alpha from the links; memory from the refined
// model (the appendix has no memory term).
Prediction predict_appendix(const ModelInputs& in, int hosts_spanned);

// Pareto frontier of candidates: lowest TPOT for a given throughput (per variant when
// `variant` is set), sorted by TPOT.
std::vector<const Candidate*> pareto_front(const std::vector<Candidate>& all, std::optional<Variant> variant);

// A hand-written SVG: throughput (tokens/s) against TPOT (ms), one series per variant
// (its Pareto frontier), like Ladder Residual's Figure 4.
std::string pareto_svg(const PlanResult& result, const std::string& title);

}  // namespace trellis::sim
