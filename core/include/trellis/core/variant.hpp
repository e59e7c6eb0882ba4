// The model variants trellis runs (runtime/model/variants.hpp) and plans (sim/cost_model.hpp):
// one definition, so a name means the same thing to `trellis run`, `study` and `plan`.
//   standard  sequential blocks, 2 TP all-reduces per layer (Megatron)
//   parallel  attention and MLP side by side, 1 all-reduce per layer (GPT-J style)
//   ladder    Ladder Residual: each all-reduce overlaps the next module's compute
//   desync2/4 Desynced Residual: one all-reduce per 2 or 4 layers' worth of modules
//   lp        Layer Parallelism: consecutive layer pairs split across the TP group
//   nocomm    every TP all-reduce removed: the communication-free bound (outputs WRONG)
#pragma once

#include <string_view>
#include <vector>

namespace trellis {

enum class Variant { kStandard, kParallel, kLadder, kDesync2, kDesync4, kLayerParallel, kNoComm };

std::string_view to_string(Variant v);
// "standard", "parallel", "ladder", "desync2", "desync4", "lp", "nocomm"; anything else throws
// kInvalidArgument listing the valid names.
Variant parse_variant(std::string_view name);
std::vector<Variant> all_variants();
// False for nocomm: its outputs are not the model's.
bool variant_is_exact(Variant v);

}  // namespace trellis
