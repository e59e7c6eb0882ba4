// The planner's refined cost model: predicts TTFT, TPOT, throughput and memory per device of
// one layout (p stages x t TP ranks, m microbatches, a model variant) on one description of
// the links. It starts from SiPipe's Appendix A (appendix.hpp) and departs from it where
// the appendix is too coarse; docs/planner.md lists each departure. In short:
//  * compute per layer is a roofline (FLOPs vs bytes moved) per module, not one constant C;
//    decode at small batch is bound by reading weights and KV cache;
//  * every communication is alpha + bytes/bandwidth on the link class it really uses (TP
//    group links and each stage boundary separately, from the placement), with a
//    hierarchical all-reduce when a TP group spans hosts;
//  * prefill (TTFT) and decode (TPOT) are separate;
//  * the decode loop is closed: a microbatch's next token needs its previous one, so the
//    period is max(loop latency, m x slowest stage) and the bubble falls out of it;
//  * SiPipe's bubble terms (GPU sampling on the last stage, input preparation, metadata
//    round trips) are charged unless its techniques are switched on;
//  * variants change how many all-reduces block (standard 2/layer, parallel 1, desync2 1,
//    desync4 1/2, lp 1 on paired layers, ladder 2 but overlapped with the next module,
//    nocomm 0);
//  * mixtures of experts: a MoE layer holds E/ep whole experts per rank (ep > 1) or 1/t of
//    each (ep = 1), reads only the experts the batch touches, and with ep > 1 moves its
//    tokens to their experts and back by two all-to-alls; MLA caches one latent per token
//    (docs/planner.md, "MoE and MLA");
//  * memory per device (weights + KV cache + activations + reserve) is checked against
//    the device memory and the layout rejected with the numbers.
// Pure functions over values; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "trellis/core/variant.hpp"
#include "trellis/sim/calibration.hpp"
#include "trellis/sim/catalog.hpp"

namespace trellis::sim {

// The communication-reducing model variants: one definition in core (core/variant.hpp).
using trellis::Variant;
using trellis::all_variants;
using trellis::parse_variant;
using trellis::to_string;
using trellis::variant_is_exact;

// One link as the model charges it: alpha per step, bandwidth per direction for this
// rank's share of the port. `calibrated` says the numbers came from a measurement.
struct LinkCost {
  LinkKind kind = LinkKind::kSameProcess;
  std::string name;        // catalog key or "calibrated:<class>"
  double alpha_s = 0;
  double bandwidth = 1;    // bytes/s
  bool calibrated = false;
  double max_calibrated_bytes = 0;  // largest message measured (0: not calibrated)
};

// How the t ranks of one TP group are connected: `ranks_per_host` ranks share a host over
// `intra`; groups spanning `hosts` hosts also use `inter` (each rank's share of the NICs).
struct GroupLinks {
  int ranks = 1;
  int hosts = 1;
  LinkCost intra;
  LinkCost inter;
  // A measured all-reduce for exactly this group size and link class (calibration), used
  // in place of the alpha-beta formula: alpha + 2 (t-1)/t bytes / bus bandwidth.
  double measured_alpha_s = 0;
  double measured_bus_bandwidth = 0;  // 0: not measured
  std::string measured_algorithm;
  // Measured time by message size (ascending bytes, seconds; the fastest algorithm at each
  // size). Within its range it replaces the fit: interpolated linearly between points, the
  // smallest point's time below it; beyond the largest, the fit. Departure 13.
  std::vector<std::pair<double, double>> measured_curve;
};

// How the `ranks` of one expert-parallel group reach each other (the all-to-all of a MoE
// layer): `per_domain` of them share a host or NVLink domain over `intra`, the others are
// reached across `hosts` domains over `inter`, each rank's share of its host's NICs.
struct EpLinks {
  int ranks = 1;
  int hosts = 1;
  int per_domain = 1;
  LinkCost intra;
  LinkCost inter;
};

// Links one layout uses: its TP group and its p-1 stage boundaries (rank j of stage i sends
// to rank j of stage i+1; `boundaries[i]` is that pair's link share).
struct LayoutLinks {
  EpLinks ep;                  // the expert-parallel group (MoE layouts with ep > 1)
  GroupLinks tp;
  std::vector<LinkCost> boundaries;
  std::vector<bool> boundary_crosses_host;
};

// The work one engine instance serves: `batch` concurrent sequences, each a prompt of
// `prompt_len` tokens followed by `gen_len` generated tokens. Bytes per element of weights,
// KV cache and activations (2 for bf16; 4 for the f32 CPU path).
struct Workload {
  int batch = 1;
  int prompt_len = 1024;
  int gen_len = 512;
  double weight_bytes = 2;
  double kv_bytes = 2;
  double act_bytes = 2;
  // Linear layers (the weight GEMMs) run on the FP8 tensor cores (dense_flops_fp8); the
  // attention core, norms and all-reduces stay 16-bit. Set with weight_bytes = kv_bytes = 1.
  bool fp8_linear = false;
};

// Number formats a plan may use for weights and KV cache. bf16: 2 bytes, the 16-bit tensor
// cores. fp8: e4m3 weights and KV cache (1 byte each, per-tensor scales), linear layers on
// the FP8 tensor cores, activations and all-reduces in bf16; only on devices with FP8
// tensor cores. f32: the CPU path (4 bytes everywhere).
enum class Precision { kBf16, kFp8, kF32 };
std::string_view to_string(Precision p);
// "bf16", "fp8", "f32"; anything else throws kInvalidArgument listing them.
Precision parse_precision(std::string_view name);
// The workload's element sizes for a precision (batch and lengths kept).
Workload with_precision(Workload w, Precision p);

// SiPipe's three techniques (sipipe.txt section 5); each one removes a bubble term.
struct PipelineTechniques {
  bool cpu_sampling = true;      // sampling off the last stage's critical path
  bool token_safe = true;        // input preparation overlapped with the previous forward
  bool structure_aware = true;   // no per-iteration metadata exchange; async stage sends
};

// Host-side costs that no datasheet gives; defaults are assumptions documented in
// docs/planner.md, replaced by calibration when measured.
// The defaults are chosen to reproduce what SiPipe measured for vLLM on H100 (section 3.1):
// a last stage 22-40% heavier from sampling, a 12-19% input-preparation gap per stage (the
// middle of both at Figure 3's Qwen-2.5-72B P4^2 and the paper's default batch of 512;
// docs/planner.md, "vLLM's host costs"), 1.4-2.6 ms of synchronisation around stage
// transfers; and its CPU samplers finishing B=256 x V=151,643 logits in the 1-2 ms
// decoding slack (section 5.1).
struct HostCosts {
  double input_prep_s = 500e-6;          // per stage per iteration, fixed part
  double input_prep_per_seq_s = 10.7e-6;    // per sequence in the microbatch
  double gpu_sample_fixed_s = 1e-3;      // per sampling call on the device (launches, penalties, sync)
  double gpu_sample_passes = 75;         // passes over f32 logits (penalties, softmax, sort for top-k/p)
  double cpu_sample_rate = 2e10;         // logits elements per second across the sampler threads
  double metadata_s = 500e-6;            // serialise + deserialise per-iteration metadata
  int metadata_round_trips = 2;          // extra round trips without structure-aware sends
  double reserve_bytes = 1.5 * 1024 * 1024 * 1024.0;  // runtime context, comm buffers
  double memory_utilisation = 0.95;      // share of device memory the engine may use
  int prefill_chunk_tokens = 8192;       // prompt tokens prefilled at once (activation memory)
  double step_overhead_s = 0;            // the engine's own cost per iteration (calibration;
                                         // 0 = none beyond the terms above)
  double step_overhead_per_seq_s = 0;    // plus this per sequence of the microbatch
};

// CPU hosts: the ranks placed on a host share its cores, and a linear layer's speed depends
// on how many rows it multiplies and how many cores its rank gets. When `enabled` (a
// calibration with measured matmul rates), linear layers cost params x seconds-per-param
// measured at (rows, threads) instead of the roofline, and the cores are divided among the
// ranks busy at the same time: the t ranks of each stage that holds a microbatch, i.e.
// t x min(m, p) ranks, capped by the ranks placed on the shared cores. A rank never gets
// more cores than its kernel threads. docs/planner.md, departure 11.
struct CpuSharing {
  bool enabled = false;
  double cores = 1;             // cores the ranks share
  int threads_per_rank = 0;     // kernel threads per rank (0: all cores)
  bool one_machine = false;     // every rank of the layout runs on these cores (emulated hosts)
  std::vector<MatmulPoint> matmul;  // measured rates; at least one point when enabled
  double host_flops = 0;        // whole host, for the attention core (scores, values)
  double host_memory_bandwidth = 0;  // whole host: KV-cache and activation traffic, and the
                                     // cap on the busy ranks' weight streaming together
};


// Efficiency of the roofline ceilings actually reached by inference kernels.
struct Efficiency {
  double compute = 0.6;   // share of dense peak FLOP/s in GEMMs
  double memory = 0.8;    // share of peak memory bandwidth in streaming reads
};

struct Layout {
  int p = 1;
  int t = 1;
  int microbatches = 1;
  Variant variant = Variant::kStandard;
  double lp_fraction = 0.8;   // share of layers in LP pairs (the paper pairs layers 4-29 of 32)
  // Expert parallelism (MoE models). 1: each routed expert is split over the stage's t ranks
  // like a dense MLP. ep = a x t (a >= 1): the routed experts of a stage are spread whole over
  // the ep ranks of that stage in `a` neighbouring replicas (attention stays data-parallel
  // across the replicas and TP-t inside each), E/ep experts per rank; tokens reach their
  // experts by an all-to-all (dispatch) and come back by another (combine).
  int ep = 1;
  // Prompt tokens prefilled per iteration of a microbatch group (`trellis run/serve
  // --prefill-chunk`). 0: whole prompts, modelled as the wave of `batch` prompts arriving
  // together. C > 0: the steady state of continuous batching, each new prompt prefilled C
  // tokens per iteration of its group in the same forward as the group's decode steps, its
  // first token after ceil(prompt / C) iterations. docs/planner.md, "Chunked prefill".
  int prefill_chunk = 0;
  // Microbatches the wave's prompts are split into (whole prompts only); 0: the count in
  // {powers of two, p x powers of two} <= batch with the shortest TTFT.
  int prefill_microbatches = 0;
  // Layers per stage. false: the even split (`trellis run`'s default, and vLLM's and
  // TensorRT-LLM's). true: as `trellis run --layer-split auto` splits them: the last stage
  // takes fewer layers to make up for its LM head (weighed in parameters held per rank).
  bool head_aware_split = false;
};

// The assumed load imbalance of expert parallelism: the busiest of the ep ranks gets this
// many times the mean number of routed tokens (and expert weights to read). An assumption,
// not a measurement: docs/planner.md ("MoE and MLA") says why 1.2.
constexpr double kDefaultExpertImbalance = 1.2;

// Everything one prediction needs.
struct ModelInputs {
  const ModelSpec* model = nullptr;
  const DeviceSpec* device = nullptr;
  Workload work;
  Layout layout;
  LayoutLinks links;
  PipelineTechniques techniques;
  HostCosts host;
  Efficiency efficiency;
  CpuSharing cpu;             // CPU hosts with measured matmul rates (else roofline)
  int ranks_per_host = 1;     // ranks of this layout on one host (core sharing)
  double compute_scale = 1;   // calibration: measured / catalog compute throughput
  double memory_scale = 1;    // calibration: measured / catalog memory bandwidth
  double expert_imbalance = kDefaultExpertImbalance;  // busiest EP rank / mean (>= 1; ep > 1 only)
};

// Seconds per microbatch spent in each term, on the slowest stage of one decode step.
struct Breakdown {
  double compute = 0;           // layers + lm head (roofline)
  double compute_memory_bound = 0;  // share of `compute` where bytes, not FLOPs, bind
  double tp_comm = 0;           // all-reduce time left exposed
  double tp_comm_hidden = 0;    // all-reduce time hidden under compute (ladder)
  double logits_gather = 0;     // vocab-parallel logits gathered for the sampler (last stage)
  double boundary = 0;          // stage send (plus metadata without SAT)
  double sampling = 0;          // on the critical path
  double input_prep = 0;        // on the critical path
  double bubble = 0;            // per period: time the bottleneck stage idles because fewer
                                // microbatches are in flight than the pipeline's depth needs
                                // (0 for p = 1: one stage has no pipeline to fill)
  double host_gap = 0;          // per period: time the bottleneck stage idles while the loop
                                // waits for host work between steps (sampling, input
                                // preparation of stage 0, the engine's step, token return)
  double tp_comm_inter = 0;     // the part of tp_comm spent crossing the fabric (TP groups
                                // spanning hosts: the inter-host all-reduce of each shard)
  double ep_comm = 0;           // MoE all-to-alls (dispatch + combine) of the stage's MoE layers
};

struct Memory {
  double weights = 0;
  double kv_cache = 0;
  double activations = 0;
  double reserve = 0;
  double total() const { return weights + kv_cache + activations + reserve; }
};

struct Prediction {
  bool feasible = true;
  std::string reason;           // why not feasible, with numbers
  double ttft_s = 0;            // whole prompts: the last prompt of the wave gets its first
                                // token; chunked: a new request's mean time to first token
  double tpot_s = 0;            // time per output token in steady decode (chunks included)
  double decode_tokens_per_s = 0;
  double tokens_per_s = 0;      // generated tokens / (TTFT + gen_len x TPOT), batch-wide
  Memory memory;                // on the fullest device
  std::vector<int> layers_per_stage;  // the split predicted (stage_split)
  double capacity = 0;          // usable bytes per device
  Breakdown decode;             // per decode step of one microbatch, on the slowest stage
  Breakdown prefill;            // per prefill microbatch, on the slowest stage
  std::string dominant;         // one line: which term bounds the decode period
  std::vector<std::string> warnings;  // e.g. a message size outside the calibrated range
  // Prefill (docs/planner.md, "Chunked prefill").
  int prefill_microbatches = 0; // whole prompts: microbatches of the wave (0 when chunked)
  int prefill_iterations = 1;   // iterations of its group until a prompt's first token
  double prefill_fill_drain_s = 0;  // whole prompts: time the slowest stage idles while the
                                    // wave fills and drains the pipeline (0 for p = 1)
  double chunk_share = 0;       // chunked: share of a group's iterations that carry a chunk
  double chunk_step_s = 0;      // chunked: period of an iteration carrying a chunk (the gap
                                // between two tokens of a sequence then)
  double interference_s = 0;    // chunked: what the chunks add to TPOT over decode alone
};

// Time of one all-reduce of `bytes` over a TP group (0 for one rank): the measured curve
// where it reaches `bytes`, else the calibrated fit when the group has one; otherwise Rabenseifner
// (reduce-scatter + all-gather, 2 ceil(log2 t) steps) within a host; hierarchical
// (intra-host reduce-scatter, inter-host all-reduce of the shard, intra all-gather) across.
double allreduce_time(const GroupLinks& g, double bytes);
// The inter-host part of allreduce_time: the all-reduce of each rank's shard across the hosts
// at its share of the NICs (0 for a group inside one host; all of it when the group's time
// is a measurement over the fabric).
double allreduce_inter_time(const GroupLinks& g, double bytes);
// Time of one all-to-all in which each rank of an EP group sends `bytes` in all, spread
// evenly over the group's ranks (itself included, so (ep-1)/ep of it leaves the rank): the
// share for peers in its domain over `intra` and the share for the others over `inter`, both
// at once, each one alpha (all sends are posted together). 0 for one rank.
double alltoall_time(const EpLinks& g, double bytes);
// Expected distinct experts of `experts` that `tokens` tokens touch when each picks `top_k`
// of them at random: experts x (1 - (1 - top_k/experts)^tokens).
double experts_touched(int experts, int top_k, double tokens);
// Time of a point-to-point transfer: alpha + bytes / bandwidth.
double transfer_time(const LinkCost& l, double bytes);
// Roofline time of `flops` and `bytes` on the device at the given efficiencies.
double roofline_time(const DeviceSpec& d, const Efficiency& e, double flops, double bytes, bool f32);

// Seconds per weight parameter of a linear layer multiplying `rows` rows on a rank that gets
// `cores` cores: the measured curve of the nearest thread counts, linear in rows between
// measured rows (beyond the largest, FLOP-bound: proportional to rows), linear in cores
// between measured thread counts, and slowed by 1/cores below the smallest (time-sharing);
// never slower than a smaller measured thread count that fits in `cores`. Only the points of
// one TP shard are read: those measured at the largest tp <= `tp` (else the smallest tp),
// and of them those measured with `concurrent` copies at once (departure 15), or with
// `coupled`, those measured as a layout of exactly `pp` stages of `tp` ranks with
// `concurrent` ranks computing at once (departure 16).
double cpu_seconds_per_param(const CpuSharing& c, double rows, double cores, int tp = 1, int concurrent = 1,
                             bool coupled = false, int pp = 1);
// Whether the curve has points of the TP shard `tp` reads measured with exactly `concurrent`
// copies running at once (or, `coupled`, as a pp x tp layout with `concurrent` ranks busy).
bool cpu_has_concurrent_curve(const CpuSharing& c, int tp, int concurrent, bool coupled = false, int pp = 1);
// Attention positions per row that the curve read at (`rows`, `tp`) already includes (the
// context of the point nearest in rows, log scale; 0 for kernel-only points). Departure 14.
double cpu_curve_context(const CpuSharing& c, double rows, int tp = 1);
// Ranks computing at the same time on the shared cores for a layout (>= 1).
int cpu_busy_ranks(const CpuSharing& c, const Layout& l, int ranks_per_host);

// Layers per stage: an even split, the first L mod p stages one layer more.
std::vector<int> layers_per_stage(int layers, int p);
// Layers per stage of a layout: the even split, or (Layout::head_aware_split) the split that
// `trellis run --layer-split auto` makes (topology::split_layers with the LM head's
// parameters per rank over a layer's).
std::vector<int> stage_split(const ModelInputs& in);

// Predicts one layout. Infeasible layouts (memory, heads not divisible by t, layers < p,
// microbatches > batch) come back with feasible=false and a reason naming the numbers.
Prediction predict(const ModelInputs& in);

}  // namespace trellis::sim
