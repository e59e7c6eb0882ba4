#include "trellis/kernels/rope.hpp"

#include <cmath>
#include <numbers>

#include "cpu/cpu_ops.hpp"
#include "cuda/cuda_ops.hpp"
#include "trellis/core/error.hpp"

namespace trellis::kernels {

std::vector<double> rope_inv_freq(const RopeConfig& cfg) {
  if (cfg.head_dim <= 0 || cfg.head_dim % 2 != 0)
    throw_error(ErrorCode::kInvalidArgument, "rope: head_dim must be positive and even (got {})", cfg.head_dim);
  if (!(cfg.theta > 0)) throw_error(ErrorCode::kInvalidArgument, "rope: rope_theta must be positive (got {})", cfg.theta);
  const int half = cfg.head_dim / 2;
  std::vector<double> inv(static_cast<std::size_t>(half));
  for (int i = 0; i < half; ++i)
    inv[static_cast<std::size_t>(i)] = 1.0 / std::pow(cfg.theta, 2.0 * i / cfg.head_dim);
  if (cfg.scaling == RopeScaling::kNone) return inv;
  if (!(cfg.factor > 0) || !(cfg.low_freq_factor > 0) || !(cfg.high_freq_factor > cfg.low_freq_factor) ||
      cfg.original_max_position_embeddings <= 0)
    throw_error(ErrorCode::kInvalidArgument,
                "rope_scaling (llama3): need factor > 0, 0 < low_freq_factor < high_freq_factor and "
                "original_max_position_embeddings > 0 (got {}, {}, {}, {})",
                cfg.factor, cfg.low_freq_factor, cfg.high_freq_factor, cfg.original_max_position_embeddings);
  // Llama 3: long wavelengths (beyond the original context / low_freq_factor) are slowed by
  // `factor`, short ones (below context / high_freq_factor) kept, the band between blended.
  const auto old_len = static_cast<double>(cfg.original_max_position_embeddings);
  const double low_wavelen = old_len / cfg.low_freq_factor, high_wavelen = old_len / cfg.high_freq_factor;
  for (auto& f : inv) {
    double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen > low_wavelen) {
      f /= cfg.factor;
    } else if (wavelen >= high_wavelen) {
      double smooth = (old_len / wavelen - cfg.low_freq_factor) / (cfg.high_freq_factor - cfg.low_freq_factor);
      f = (1.0 - smooth) * f / cfg.factor + smooth * f;
    }
  }
  return inv;
}

RopeTable::RopeTable(const RopeConfig& cfg, std::int64_t max_positions) : cfg_(cfg), max_positions_(max_positions) {
  if (max_positions <= 0) throw_error(ErrorCode::kInvalidArgument, "rope: max_positions must be positive (got {})", max_positions);
  std::vector<double> inv = rope_inv_freq(cfg);
  const std::size_t half = inv.size();
  cos_.resize(static_cast<std::size_t>(max_positions) * half);
  sin_.resize(cos_.size());
  for (std::int64_t p = 0; p < max_positions; ++p)
    for (std::size_t i = 0; i < half; ++i) {
      double angle = static_cast<double>(p) * inv[i];
      cos_[static_cast<std::size_t>(p) * half + i] = static_cast<float>(std::cos(angle));
      sin_[static_cast<std::size_t>(p) * half + i] = static_cast<float>(std::sin(angle));
    }
}

void apply_rope(const Context& ctx, const RopeTable& table, const TensorView& x, int n_heads,
                std::span<const std::int32_t> positions) {
  ctx.check_device("apply_rope", x);
  if (table.max_positions() == 0) throw_error(ErrorCode::kInvalidArgument, "apply_rope: the RoPE table is empty");
  TensorView m = x.as_matrix();
  if (m.dtype != DType::kF32) throw_error(ErrorCode::kInvalidArgument, "apply_rope: {} must be f32", m.describe());
  if (n_heads <= 0 || m.cols() != static_cast<std::int64_t>(n_heads) * table.head_dim())
    throw_error(ErrorCode::kInvalidArgument, "apply_rope: {} should have {} heads x head_dim {} columns", m.describe(),
                n_heads, table.head_dim());
  if (static_cast<std::int64_t>(positions.size()) != m.rows())
    throw_error(ErrorCode::kInvalidArgument, "apply_rope: {} positions for {} rows of {}", positions.size(), m.rows(),
                m.describe());
  for (std::size_t i = 0; i < positions.size(); ++i)
    if (positions[i] < 0 || positions[i] >= table.max_positions())
      throw_error(ErrorCode::kInvalidArgument, "apply_rope: position {} of row {} is outside the table [0, {})",
                  positions[i], i, table.max_positions());
  if (ctx.device() == Device::kCuda) return cuda::apply_rope(ctx, table, m, n_heads, positions);
  cpu::apply_rope(ctx.pool(), table, m, n_heads, positions);
}

}  // namespace trellis::kernels
