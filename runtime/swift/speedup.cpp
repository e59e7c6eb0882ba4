#include "trellis/runtime/swift/speedup.hpp"

#include <cmath>

#include "trellis/core/error.hpp"

namespace trellis::runtime::swift {

double expected_speedup(double M, double alpha, double r) {
  if (!(M >= 1.0) || !std::isfinite(M)) {
    throw_error(ErrorCode::kInvalidArgument, "expected_speedup: mean generated length M must be >= 1 (got {})", M);
  }
  if (!(alpha > 0.0 && alpha <= 1.0)) {
    throw_error(ErrorCode::kInvalidArgument, "expected_speedup: acceptance rate alpha must be in (0, 1] (got {})",
                alpha);
  }
  if (!(r >= 0.0 && r < 1.0)) {
    throw_error(ErrorCode::kInvalidArgument, "expected_speedup: skip ratio r must be in [0, 1) (got {})", r);
  }
  const double c = 1.0 - r;
  return M * alpha / ((M - 1.0) * c + alpha);
}

void SwiftStats::record_verify(int drafted, int accepted) {
  if (drafted < 0 || accepted < 0 || accepted > drafted) {
    throw_error(ErrorCode::kInvalidArgument, "SwiftStats: accepted {} of {} drafted tokens is not possible", accepted,
                drafted);
  }
  draft_steps += static_cast<std::uint64_t>(drafted);
  accepted_tokens += static_cast<std::uint64_t>(accepted);
  verify_passes += 1;
  generated_tokens += static_cast<std::uint64_t>(accepted) + 1;
}

double SwiftStats::mean_generated_length() const {
  return verify_passes == 0 ? 0.0 : static_cast<double>(generated_tokens) / static_cast<double>(verify_passes);
}

double SwiftStats::acceptance_rate() const {
  return draft_steps == 0 ? 0.0 : static_cast<double>(accepted_tokens) / static_cast<double>(draft_steps);
}

SwiftStats& SwiftStats::operator+=(const SwiftStats& o) {
  draft_steps += o.draft_steps;
  accepted_tokens += o.accepted_tokens;
  verify_passes += o.verify_passes;
  generated_tokens += o.generated_tokens;
  return *this;
}

}  // namespace trellis::runtime::swift
