// How a job's decoder layers are split over its pipeline stages (setting run.layer_split,
// `--layer-split`): the model shape that placement cuts into stages.
//
// The last stage also multiplies by the LM head every step: a vocabulary x hidden matrix
// that, for small models with large vocabularies, costs as much as many layers (SmolLM2-135M:
// its tied 49,152 x 576 head has the parameters of 8 of its layers). An even split leaves
// that stage the slowest and every other stage waiting on it. `auto` weighs the head in
// layers by parameters — the work per token of a step that keeps several microbatches in
// flight, which is when the balance of stages matters (one microbatch: the stages take
// turns). Bytes would weigh a Q8_0 head against Q4_1 layers 1.7x heavier, right for a
// memory-bound batch-1 step but measured wrong for the batched one (docs/benchmarks.md,
// "Layers per stage").
#pragma once

#include <string_view>

#include "trellis/runtime/checkpoint/reader.hpp"
#include "trellis/runtime/model/config.hpp"
#include "trellis/topology/placement.hpp"

namespace trellis::runtime {

// The LM head's (plus final norm's) parameters over one decoder layer's average.
double head_cost_in_layers(const CheckpointReader& reader, const ModelConfig& cfg);

// The shape placement needs, with `setting` applied: "auto" (head_cost from the checkpoint),
// "even", or a comma list of p layer counts. Throws kInvalidArgument naming `what` for a
// malformed list; placement checks the list against p and the layer count.
topology::ModelShape stage_model_shape(const CheckpointReader& reader, const ModelConfig& cfg,
                                       std::string_view setting, std::string_view what);

}  // namespace trellis::runtime
