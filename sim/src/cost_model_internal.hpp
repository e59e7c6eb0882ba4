// Private to sim/: the pieces of predict() split across cost_model.cpp (per-stage physics)
// and cost_model_pipeline.cpp (memory, feasibility, the pipeline loop).
#pragma once

#include <string>
#include <vector>

#include "trellis/sim/cost_model.hpp"

namespace trellis::sim {

Memory memory_per_device(const ModelInputs& in, const std::vector<int>& split);
// Empty when the layout can host the model's shape, else the constraint that failed.
std::string shape_problem(const ModelInputs& in);
// Fills TTFT, TPOT, throughput, breakdowns and the dominant term.
void assemble(const ModelInputs& in, const std::vector<int>& split, Prediction& out);

// What one forward of one microbatch computes: decode steps, whole prompts, or prompt chunks
// riding with decode steps (chunked prefill). The linear layers see `tokens` rows; attention
// FLOPs are 4 x tokens x ctx x q_dim; the KV cache moves `kv_positions` positions per layer.
struct StepWork {
  double seqs = 0;          // sequences sampled after the step (LM head rows, sampler, input prep)
  double tokens = 0;        // tokens through the linear layers
  double ctx = 0;           // positions one token attends to, on average
  double kv_positions = 0;  // KV-cache positions read or written per layer
};
// `seqs` decode steps over caches of `ctx` positions: each reads its cache.
StepWork decode_work(double seqs, double ctx);
// `seqs` whole prompts of `prompt` tokens: causal attention over half the prompt on average;
// the cache is written once (the prompt's own keys are read from on-chip tiles).
StepWork prefill_work(double seqs, double prompt);
// `decode` decode steps over `ctx` positions plus `chunks` prompt chunks of `chunk` tokens of
// `prompt`-token prompts. A chunk attends to the prompt before it and to itself: over the
// chunks of a prompt, half the prompt on average; it reads that prefix from the cache and
// writes its own positions.
StepWork mixed_work(double decode, double ctx, double chunks, double chunk, double prompt);

namespace detail {
// One stage's forward time for one microbatch (layers + exposed TP comm + LM head on the
// last stage). Fills `b` (compute and comm terms) when given; `send` and `meta` receive the
// boundary transfer and the metadata cost (0 on the last stage).
double stage_forward(const ModelInputs& in, int stage, int first, int n, const StepWork& w, Breakdown* b,
                     double* send, double* meta);
double sampling_time(const ModelInputs& in, double seqs, bool on_cpu);

// One stage's share of one microbatch's step: its forward, its send to the next stage, the
// metadata it exchanges, and its cycle (the time it is occupied per microbatch).
struct StageStep {
  double forward = 0, send = 0, meta = 0, cycle = 0, prep_exposed = 0, sampling = 0;
  Breakdown terms;
};
// One step of `w` on every stage (p entries).
std::vector<StageStep> steps(const ModelInputs& in, const std::vector<int>& split, const StepWork& w);
// Time for one microbatch of `seqs` sampled sequences to go around the loop once: every
// stage's forward and send, sampling, input preparation not hidden, the engine's step, the
// tokens' way back.
double loop_latency(const ModelInputs& in, const std::vector<StageStep>& st, double seqs);
}  // namespace detail

// The prefill side of a prediction (cost_model_prefill.cpp), after the decode period is known.
// Whole prompts (prefill_chunk 0): the wave of B prompts arriving together; chunked: the
// steady state of continuous batching, chunks riding with decode steps. Sets TTFT, the
// prefill breakdown and fields, and for chunks the TPOT they inflate. `dec` is the decode
// step of one microbatch, `period` the decode period without chunks.
void assemble_prefill(const ModelInputs& in, const std::vector<int>& split,
                      const std::vector<detail::StageStep>& dec, double period, Prediction& out);

// How a prompt of the workload is chunked, and how many prompts are in their prefill at once
// in one microbatch group of `seqs` sequences (Little's law over a sequence's life: K chunk
// iterations, then gen - 1 decode steps). docs/planner.md, "Chunked prefill".
struct ChunkPlan {
  int iterations = 1;         // K = ceil(prompt / C): a prompt's chunk iterations
  double tokens = 0;          // mean tokens per chunk: prompt / K
  double in_prefill = 0;      // n = seqs K / (K + gen - 1): prompts in prefill at once
  double share = 0;           // f = min(1, n): share of the group's iterations carrying a chunk
  double per_iteration = 0;   // q = max(1, n): chunks in an iteration that carries any
};
ChunkPlan chunk_plan(const Workload& w, int chunk, double seqs);

// Mixture of experts and MLA (cost_model_moe.cpp).
namespace detail {
// The first layer of stage `stage` under `split` (layers per stage).
int first_layer_of_stage(const std::vector<int>& split, int stage);
// Attention parameters one of t TP ranks holds (MLA: the down-projections on every rank).
double attention_params_per_rank(const ModelSpec& m, int t);
// One MoE layer's MLP block held by one rank: E/ep whole experts (ep > 1) or 1/t of each
// (ep = 1), 1/t of the shared experts, the whole router.
double moe_block_params_per_rank(const ModelInputs& in);
// Parameters one rank holds of layers [first, first + n) (attention, norms, MLP or MoE).
double stage_params_per_rank(const ModelInputs& in, int first, int n);
// KV-cache bytes of one token in one layer on one rank (MLA: the whole latent on each).
double kv_bytes_per_token_layer_per_rank(const ModelInputs& in);
// Per-rank width w of the attention core: its FLOPs are 4 x tokens x context x w.
double attention_core_width(const ModelSpec& m, int t);
// Per-rank intermediate activations per token of the widest MLP (dense or MoE).
double mlp_activation_width(const ModelInputs& in);
// One MoE block on one rank for `tokens` tokens of the replica's microbatch.
struct MoeWork {
  double linear_flops = 0;     // router, shared experts, the routed pairs this rank computes
  double bytes = 0;            // weights of the experts touched + activations
  double streamed_params = 0;  // weights read (router, shared share, experts touched)
  double alltoall_bytes = 0;   // what this rank sends in one all-to-all (dispatch or combine)
};
MoeWork moe_block_work(const ModelInputs& in, double tokens);
// Empty when the layout can split the model's experts, else why not.
std::string moe_shape_problem(const ModelInputs& in);
}  // namespace detail

}  // namespace trellis::sim
