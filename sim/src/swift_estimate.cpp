#include "trellis/sim/swift_estimate.hpp"

#include <fmt/format.h>

#include <cmath>

#include "trellis/core/error.hpp"

namespace trellis::sim {

void check_swift_estimate(const SwiftEstimate& e) {
  // Written so that NaN fails every test.
  if (!(e.m >= 1) || !std::isfinite(e.m))
    throw_error(ErrorCode::kInvalidArgument, "--swift-m: the mean generated length M must be >= 1 (got {})", e.m);
  if (!(e.alpha > 0 && e.alpha <= 1))
    throw_error(ErrorCode::kInvalidArgument, "--swift-alpha: the acceptance rate must be in (0, 1] (got {})", e.alpha);
  if (!(e.r >= 0 && e.r < 1))
    throw_error(ErrorCode::kInvalidArgument, "--swift-r: the layer skip ratio must be in [0, 1) (got {})", e.r);
}

double swift_speedup(const SwiftEstimate& e) {
  check_swift_estimate(e);
  // Eq. (6) of the SWIFT paper (appendix B.3): M alpha / ((M - 1) c + alpha), c = 1 - r.
  const double c = 1 - e.r;
  return e.m * e.alpha / ((e.m - 1) * c + e.alpha);
}

std::string describe_swift(const SwiftEstimate& e) {
  return fmt::format("SWIFT decode: estimate from Eq. (6) with M={:.2f}, α={:.2f}, r={:.2f} (not measured on this "
                     "cluster): decode time per token divided by {:.3f}, prefill unchanged",
                     e.m, e.alpha, e.r, swift_speedup(e));
}

void apply_swift(const SwiftEstimate& e, const Workload& w, Prediction& p) {
  const double speedup = swift_speedup(e);
  p.tpot_s /= speedup;
  p.decode_tokens_per_s *= speedup;
  p.tokens_per_s = w.batch * static_cast<double>(w.gen_len) / (p.ttft_s + w.gen_len * p.tpot_s);
  p.dominant += fmt::format("; SWIFT estimate: TPOT / {:.3f} (Eq. 6)", speedup);
}

}  // namespace trellis::sim
