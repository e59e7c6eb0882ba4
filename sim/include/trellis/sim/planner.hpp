// The planner: enumerates every layout of a model on a cluster — replicas d, pipeline
// degree p, TP degree t (d*p*t = the devices used), decode microbatches m (powers of two and
// p x powers of two up to the batch), prefill chunk, variant, precision, batch, and for MoE
// models the expert-parallel degree ep (1, or a x t with a dividing d) — predicts
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
#include "trellis/sim/swift_estimate.hpp"

namespace trellis::sim {

enum class ModelKind { kRefined, kAppendix };

// What the ranking maximises. goodput: generated tokens/s of requests that meet the SLOs
// (a layout's predicted TTFT and TPOT hold for all its requests, so its goodput is its
// throughput when it meets both SLOs and 0 otherwise); throughput: tokens/s, SLOs only as
// given; latency: the shortest request (TTFT + gen x TPOT) among layouts meeting the SLOs.
enum class Objective { kGoodput, kThroughput, kLatency };
std::string_view to_string(Objective o);
// "goodput", "throughput", "latency"; anything else throws kInvalidArgument listing them.
Objective parse_objective(std::string_view name);

// The SLOs `trellis plan` applies under --objective goodput|latency when none are given:
// interactive chat serving. TTFT 2 s is MLPerf Inference's Server target for Llama-2-70B,
// Llama-3.1-8B, Mixtral and DeepSeek-R1; TPOT 50 ms (20 tokens/s per user, faster than
// reading) lies between MLPerf's interactive targets (30 ms 8B, 40 ms 70B, 80 ms 405B).
// docs/planner.md ("Objective and default SLOs") has the sources.
constexpr double kDefaultSloTtftS = 2.0;
constexpr double kDefaultSloTpotS = 0.050;

// Prompt tokens per iteration the planner tries by default (`--prefill-chunk`): 0 = whole
// prompts (the wave of a batch arriving together), and chunks as vLLM and Sarathi-Serve use
// them (Sarathi's token budgets are 512-2048; vLLM's default max_num_batched_tokens was 512
// for chunked prefill). Chunks at least as long as the prompt are one option (all alike).
inline const std::vector<int>& default_prefill_chunks() {
  static const std::vector<int> v = {0, 256, 512, 1024, 2048};
  return v;
}

struct PlanRequest {
  ModelSpec model;
  ClusterView cluster;
  int devices = 0;                  // devices to use; 0 = every rank of the cluster
  std::vector<int> batches = {1, 4, 16, 64, 256};  // concurrent sequences per replica
  std::vector<Variant> variants = all_variants();
  Workload work;                    // prompt/gen lengths and element sizes (batch ignored)
  // Number formats to enumerate (a plan dimension); empty: `work`'s element sizes as given.
  std::vector<Precision> precisions;
  // Prefill chunk sizes to enumerate (a plan dimension; Layout::prefill_chunk), tokens >= 0.
  // Chunks of at least the prompt's length collapse into one option; the appendix model
  // plans whole prompts only.
  std::vector<int> prefill_chunks = default_prefill_chunks();
  Objective objective = Objective::kGoodput;
  std::optional<double> slo_tpot_s;
  std::optional<double> slo_ttft_s;
  PipelineTechniques techniques;
  HostCosts host;
  Efficiency efficiency;
  CpuSharing cpu;                   // CPU hosts with measured matmul rates (calibration)
  double compute_scale = 1;         // from calibration
  double memory_scale = 1;
  double lp_fraction = 0.8;
  // MoE models: the busiest EP rank's routed tokens over the mean (cost_model.hpp).
  double expert_imbalance = kDefaultExpertImbalance;
  ModelKind kind = ModelKind::kRefined;
  bool replicas = true;             // also consider d > 1 data-parallel replicas
  // Plan every layout with `trellis run --layer-split auto` (Layout::head_aware_split);
  // false: the even split, trellis run's default.
  bool head_aware_split = false;
  // SWIFT self-speculative decoding (swift_estimate.hpp): every layout's TPOT is divided by
  // Eq. (6)'s speedup and its decode throughput multiplied by it; TTFT is kept. An estimate.
  std::optional<SwiftEstimate> swift;
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
  int tp_hosts = 1;                 // hosts (NVLink domains) the TP group spans
  std::string ep_link;              // the EP group's all-to-all link ("-" for ep = 1)
  int ep_hosts = 1;                 // hosts (NVLink domains) the EP group spans
  Precision precision = Precision::kBf16;
  // The variant differs from the one the model was trained as: the plan is only valid for a
  // checkpoint trained for it (nocomm: never, its outputs are wrong).
  bool needs_trained_model = false;
  double request_latency_s = 0;     // TTFT + gen_len x TPOT
  // How far it misses (1 = meets): the worst of TTFT / SLO and TPOT / SLO, or for a layout
  // that does not fit, memory needed / usable. 0 for shape problems.
  double miss = 1;
};

// A winner whose TP group spans hosts, explained: what crossing the fabric costs it and what
// it gains over the best layout whose TP stays inside a host (or NVLink domain).
struct TpAcrossHosts {
  int hosts = 0;                    // hosts (or NVLink domains) one TP group spans
  std::string link;                 // the fabric ("ib-ndr")
  double link_bandwidth = 0;        // per rank, bytes/s (its share of the host's NICs)
  double inter_s = 0;               // fabric part of the all-reduces per decode step
  double step_s = 0;                // the winner's decode step (TPOT)
  const char* domain = "host";      // "host" or "NVLink domain"
  std::optional<Candidate> alternative;  // best layout with TP in a host (may miss the SLO)
  double gain = 0;                  // winner / alternative in the objective's metric, - 1
  std::string line;                 // the explanation, one line
};

struct PlanResult {
  std::vector<Candidate> ranked;    // feasible and within the SLO, best first
  std::vector<Candidate> rejected;  // infeasible or missing the SLO, with the reason
  std::vector<Candidate> bounds;    // feasible nocomm layouts: upper bounds, never ranked
  // Every feasible candidate (ranked, bounds, and those that fit but miss the SLO), for the
  // Pareto chart; pointers into the lists above. Not stored: copying every candidate once
  // more took a fifth of a large search.
  std::vector<const Candidate*> feasible() const;
  long evaluated = 0;
  std::string binding_constraint;   // when `ranked` is empty: what stopped every layout
  std::vector<Candidate> closest;   // when `ranked` is empty: the best misses, least miss first
  std::string why;                  // one line: why the winner wins
  std::optional<TpAcrossHosts> tp_across_hosts;  // when the winner's TP group spans hosts
  std::vector<std::string> warnings;
};

// Whether `a` ranks before `b` under the objective (both within the SLO).
bool ranks_before(Objective o, const Candidate& a, const Candidate& b);

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
std::vector<const Candidate*> pareto_front(const std::vector<const Candidate*>& all, std::optional<Variant> variant);

// A hand-written SVG: throughput (tokens/s) against TPOT (ms), one series per variant
// (its Pareto frontier), like Ladder Residual's Figure 4.
std::string pareto_svg(const PlanResult& result, const std::string& title);

}  // namespace trellis::sim
