// run.layer_split: the LM head weighed in decoder layers by parameters (layer_split.hpp).
#include "trellis/runtime/engine/layer_split.hpp"

#include <charconv>
#include <string>

#include "trellis/core/error.hpp"

namespace trellis::runtime {

double head_cost_in_layers(const CheckpointReader& reader, const ModelConfig& cfg) {
  const TensorInfo* embed = reader.find("model.embed_tokens.weight");
  double layers = 0;
  for (const TensorInfo& t : reader.tensors())
    if (t.name.starts_with("model.layers.")) layers += static_cast<double>(t.numel());
  const TensorInfo* head = cfg.tie_word_embeddings ? embed : reader.find("lm_head.weight");
  if (!head) head = embed;
  if (!head || layers <= 0 || cfg.num_layers < 1) return 0;  // nothing to weigh: an even split
  double h = static_cast<double>(head->numel());
  if (const TensorInfo* norm = reader.find("model.norm.weight")) h += static_cast<double>(norm->numel());
  return h / (layers / cfg.num_layers);
}

topology::ModelShape stage_model_shape(const CheckpointReader& reader, const ModelConfig& cfg,
                                       std::string_view setting, std::string_view what) {
  topology::ModelShape shape{cfg.num_layers, cfg.num_heads, cfg.num_kv_heads};
  if (setting == "auto") {
    shape.head_cost = head_cost_in_layers(reader, cfg);
    return shape;
  }
  if (setting == "even") return shape;
  // A list: whole numbers separated by commas.
  std::string_view rest = setting;
  while (true) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    int n = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), n);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || n < 1)
      throw_error(ErrorCode::kInvalidArgument,
                  "{} '{}': '{}' is not a layer count; give auto, even, or one whole number >= 1 per stage "
                  "such as 22,8",
                  what, setting, item);
    shape.split.push_back(n);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return shape;
}

}  // namespace trellis::runtime
