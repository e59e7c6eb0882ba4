// Synthetic checkpoints: deterministic, seeded weights for any ModelConfig, so every test,
// benchmark and study runs with no download.
//
// Every element is a pure function of (seed, tensor name, element index) — a counter-based
// hash, no sequential RNG state — so a tensor-parallel rank can generate exactly its slice
// and get the same numbers as a rank that generates the whole tensor, and the synthetic
// reader (in memory) and the checkpoint written by `trellis make-model` (on disk) agree.
//
// Scaling keeps activations sane through many layers: linear weights are uniform with
// variance 1/fan_in, the two row-parallel outputs (o_proj, down_proj) are further scaled
// by 1/sqrt(2 * num_layers), norm weights are 1 +- 0.1, biases +- 0.1, embeddings +- 1.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "trellis/runtime/checkpoint/reader.hpp"
#include "trellis/runtime/checkpoint/safetensors.hpp"
#include "trellis/runtime/model/config.hpp"

namespace trellis::runtime {

// Named shapes: "tiny" (tests; Llama 3 rope scaling, GQA), "tiny-qwen2" (q/k/v biases, tied
// embeddings), "small", "llama-1b" (hidden 2048, 16 layers, 32 heads, 8 KV heads,
// intermediate 8192, vocab 32000: the largest that fits this 24 GiB machine comfortably).
// Throws kInvalidArgument listing the known names.
ModelConfig model_preset(std::string_view name);
std::vector<std::string> model_preset_names();

// The HF tensor names and full shapes of `cfg`, in checkpoint order, stored as `dtype`
// ("F32", "BF16" or "F16").
std::vector<TensorSpec> model_tensor_specs(const ModelConfig& cfg, const std::string& dtype);

// The f32 value of element `index` of tensor `name` (before rounding to the stored dtype).
float synthetic_value(const ModelConfig& cfg, std::uint64_t seed, std::string_view name, std::uint64_t index);

// An in-memory CheckpointReader that generates slices on demand (no file; config_json()
// returns to_config_json(cfg)). Tensors report `dtype` and values are rounded to it, so the
// reader is bit-identical to the checkpoint written with the same arguments.
std::unique_ptr<CheckpointReader> make_synthetic_reader(const ModelConfig& cfg, const std::string& dtype,
                                                        std::uint64_t seed);

// Writes config.json and the weights (sharded when larger than max_shard_bytes) to `dir`.
// Returns the files written.
std::vector<std::filesystem::path> write_synthetic_checkpoint(const std::filesystem::path& dir,
                                                              const ModelConfig& cfg, const std::string& dtype,
                                                              std::uint64_t seed,
                                                              std::uint64_t max_shard_bytes = 2ull << 30);

}  // namespace trellis::runtime
