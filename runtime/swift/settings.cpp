#include "trellis/runtime/swift/settings.hpp"

#include <cmath>
#include <string_view>

#include "trellis/core/error.hpp"

namespace trellis::runtime::swift {
namespace {

void require_at_least(std::string_view name, long long value, long long lo) {
  if (value < lo) throw_error(ErrorCode::kInvalidArgument, "swift.{} must be >= {} (got {})", name, lo, value);
}

void require_int_range(std::string_view name, long long value, long long lo, long long hi) {
  if (value < lo || value > hi) {
    throw_error(ErrorCode::kInvalidArgument, "swift.{} must be in [{}, {}] (got {})", name, lo, hi, value);
  }
}

// `open_lo`/`open_hi` choose ( or [ on each side. Written as !(inside) so NaN is refused too.
void require_real_range(std::string_view name, double value, double lo, double hi, bool open_lo, bool open_hi) {
  const bool lo_ok = open_lo ? value > lo : value >= lo;
  const bool hi_ok = open_hi ? value < hi : value <= hi;
  if (!(lo_ok && hi_ok)) {
    throw_error(ErrorCode::kInvalidArgument, "swift.{} must be in {}{}, {}{} (got {})", name, open_lo ? "(" : "[", lo,
                hi, open_hi ? ")" : "]", value);
  }
}

}  // namespace

void validate(const SwiftSettings& s) {
  require_int_range("gamma", s.gamma, 1, 1024);
  require_at_least("bayes_interval", s.bayes_interval, 1);
  require_at_least("max_steps", s.max_steps, 0);
  require_at_least("patience", s.patience, 1);
  require_real_range("target_matchness", s.target_matchness, 0.0, 1.0, true, false);
  require_real_range("skip_ratio", s.skip_ratio, 0.0, 1.0, true, true);
  require_real_range("epsilon", s.epsilon, 0.0, 1.0, false, false);
  require_int_range("max_draft", s.max_draft, 1, 64);
  require_real_range("reenter_acceptance", s.reenter_acceptance, 0.0, 1.0, false, false);
  require_at_least("acceptance_window", s.acceptance_window, 1);
  require_real_range("ratio_tolerance", s.ratio_tolerance, 0.0, 1.0, false, false);
  require_real_range("ratio_step", s.ratio_step, 0.0, 1.0, true, true);
  require_real_range("min_skip_ratio", s.min_skip_ratio, 0.0, 1.0, true, true);
  if (!(s.min_speedup >= 0.0) || !std::isfinite(s.min_speedup)) {
    throw_error(ErrorCode::kInvalidArgument, "swift.min_speedup must be a finite number >= 0 (got {})", s.min_speedup);
  }
  require_at_least("speedup_window", s.speedup_window, 1);
}

int skip_budget(int num_layers, const SwiftSettings& s) {
  return static_cast<int>(std::lround(s.skip_ratio * 2.0 * num_layers));
}

void check_model_skippable(int num_layers, const SwiftSettings& s) {
  // With 1-3 layers, skipping any sub-layer removes a third or more of the model: the draft
  // is too unlike the target for self-speculation to pay off, and the first and last
  // layers (which the uniform initial set keeps) would be all there is.
  if (num_layers < 4) {
    throw_error(ErrorCode::kUnsupported,
                "SWIFT needs a model with at least 4 layers to draft by skipping sub-layers (this one has {})",
                num_layers);
  }
  const int sub_layers = 2 * num_layers;
  const int k = skip_budget(num_layers, s);
  if (k < 1 || k >= sub_layers) {
    throw_error(ErrorCode::kUnsupported,
                "swift.skip_ratio {} skips {} of the {} sub-layers of a {}-layer model; it must skip at least 1 and "
                "fewer than all",
                s.skip_ratio, k, sub_layers, num_layers);
  }
}

int count_skipped(const SkipSet& z) {
  int n = 0;
  for (const std::uint8_t v : z) n += v != 0 ? 1 : 0;
  return n;
}

std::string describe(const SkipSet& z) {
  std::string attn;
  std::string mlp;
  for (std::size_t i = 0; i < z.size(); ++i) {
    if (z[i] == 0) continue;
    std::string& out = (i % 2 == 0) ? attn : mlp;
    if (!out.empty()) out += ',';
    out += std::to_string(i / 2);
  }
  return "attn " + (attn.empty() ? std::string("-") : attn) + " mlp " + (mlp.empty() ? std::string("-") : mlp);
}

}  // namespace trellis::runtime::swift
