// Rotary position embedding (RoPE), including Llama 3's frequency scaling.
//
// Convention: the HF "rotate_half" layout that HF Llama/Qwen2/Mistral checkpoints are stored
// for: within each head of size d, element i (i < d/2) is rotated with element i + d/2 by the
// angle pos * inv_freq[i]:
//   x'[i]       = x[i] * cos - x[i + d/2] * sin
//   x'[i + d/2] = x[i + d/2] * cos + x[i] * sin
//
// The frequency computation lives here (rope_inv_freq) so the model and the reference script
// only need to agree on RopeConfig, which mirrors config.json's rope fields.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "trellis/kernels/context.hpp"
#include "trellis/kernels/tensor.hpp"

namespace trellis::kernels {

enum class RopeScaling : std::uint8_t {
  kNone,   // plain RoPE
  kLlama3  // rope_scaling.rope_type == "llama3"
};

struct RopeConfig {
  int head_dim = 0;                 // rotated dimension (the whole head)
  double theta = 10000.0;           // rope_theta
  RopeScaling scaling = RopeScaling::kNone;
  // Llama 3 fields (rope_scaling.*), used when scaling == kLlama3.
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::int64_t original_max_position_embeddings = 8192;
};

// inv_freq[i] for i in [0, head_dim/2), computed in double as HF transformers does
// (theta^(-2i/d), then Llama 3's wavelength-dependent scaling and smooth blend).
// Throws kInvalidArgument for an odd or non-positive head_dim or bad Llama 3 fields.
std::vector<double> rope_inv_freq(const RopeConfig& cfg);

// Precomputed cos/sin for positions [0, max_positions); cheap to build (positions x d/2).
// Immutable after construction; safe to share between threads.
class RopeTable {
 public:
  RopeTable() = default;
  RopeTable(const RopeConfig& cfg, std::int64_t max_positions);

  const RopeConfig& config() const { return cfg_; }
  int head_dim() const { return cfg_.head_dim; }
  std::int64_t max_positions() const { return max_positions_; }
  // cos/sin rows of one position: head_dim/2 floats each.
  const float* cos_row(std::int64_t pos) const { return cos_.data() + pos * (cfg_.head_dim / 2); }
  const float* sin_row(std::int64_t pos) const { return sin_.data() + pos * (cfg_.head_dim / 2); }

 private:
  RopeConfig cfg_;
  std::int64_t max_positions_ = 0;
  std::vector<float> cos_, sin_;
};

// Rotates, in place, every head of every row of x: x is [T, n_heads * head_dim] f32 (a row
// stride larger than that is fine, e.g. the q or k part of a fused qkv output); row t is at
// position positions[t]. Throws kInvalidArgument when a position is outside the table or the
// column count is not n_heads * head_dim.
void apply_rope(const Context& ctx, const RopeTable& table, const TensorView& x, int n_heads,
                std::span<const std::int32_t> positions);

}  // namespace trellis::kernels
