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

namespace detail {
// One stage's forward time for one microbatch (layers + exposed TP comm + LM head on the
// last stage). Fills `b` (compute and comm terms) when given; `send` and `meta` receive the
// boundary transfer and the metadata cost (0 on the last stage).
double stage_forward(const ModelInputs& in, int stage, int n, double seqs, double tokens, double ctx,
                     bool prefill, Breakdown* b, double* send, double* meta);
double sampling_time(const ModelInputs& in, double seqs, bool on_cpu);
}  // namespace detail

}  // namespace trellis::sim
