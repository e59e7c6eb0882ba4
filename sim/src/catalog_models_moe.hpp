// Private to sim/: the mixture-of-experts and MLA half of the model catalog
// (catalog_models_moe.cpp): its catalog entries and the config.json fields it reads.
#pragma once

#include <nlohmann/json.hpp>

#include <string_view>
#include <vector>

#include "trellis/sim/catalog.hpp"

namespace trellis::sim::detail {

// DeepSeek-V3, Mixtral-8x22B, Qwen3-235B-A22B, Qwen3-30B-A3B from their public config.json.
const std::vector<ModelSpec>& moe_models();

// Fills m.moe and m.mla from a config.json (after the dense fields are read). Throws
// kCorruptInput for a malformed value and kInvalidArgument, naming the field, for a field
// about experts, routing or latent attention the planner does not model.
void read_experts_and_mla(const nlohmann::json& j, ModelSpec& m, std::string_view origin);

// Which layers are MoE, as MoeShape::moe_before (prefix counts): the first `first_dense` are
// dense; after them every layer i with (i - offset) % step == 0, where offset is 0 for
// DeepSeek's moe_layer_freq and -1 for Qwen's decoder_sparse_step ((i + 1) % step == 0);
// layers listed in `dense` stay dense.
std::vector<int> moe_layer_pattern(int layers, int first_dense, int step, int offset,
                                    const std::vector<int>& dense = {});

}  // namespace trellis::sim::detail
