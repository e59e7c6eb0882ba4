// SWIFT self-speculative decoding in the planner: an estimate, not a measurement.
//
// SWIFT (Xia et al., ICLR 2025; ../shared/papers/swift.txt) drafts tokens with the target
// model itself, skipping a fraction r of its sub-layers, and verifies them in one full
// forward. Its appendix B.3 gives the expected wall-time speedup of decoding as Eq. (6):
//
//   E(speedup) = M * alpha / ((M - 1) * c + alpha),   c = 1 - r,
//
// with M the mean generated length (tokens per target forward), alpha the token acceptance
// rate (accepted drafts / draft steps) and c the cost of a draft forward relative to a full
// one. The planner divides every layout's decode time per token by it (TPOT, decode
// throughput); prefill is unchanged. The paper measures batch 1; at large batches a decode
// step is less memory-bound and the real gain is smaller, which Eq. (6) does not model.
//
// The runtime computes the same formula (runtime/swift/speedup.hpp), but sim may not depend
// on runtime (tests/check_layering.py), so it is written here once more.
//
// Pure arithmetic; thread-safe.
#pragma once

#include <string>

#include "trellis/sim/cost_model.hpp"

namespace trellis::sim {

// Defaults of `trellis plan --swift`: what trellis measured, SmolLM2-135M at batch 1 over
// 200 chat prompts of up to 64 tokens with drafting never turned off (docs/swift.md,
// "Measured"): M 2.19, alpha 0.87 at r = 0.2 — which Eq. (6) makes 1.05x. A 135M model has little
// layer sparsity; the paper's 13B-70B models reach M 3-8, alpha 0.9-1.0 at r 0.45-0.5
// (Table 4): give those with --swift-m/--swift-alpha/--swift-r for such a model.
inline constexpr double kSwiftDefaultM = 2.19;      // mean generated length
inline constexpr double kSwiftDefaultAlpha = 0.87;  // acceptance rate
inline constexpr double kSwiftDefaultR = 0.2;       // share of sub-layers the draft skips

struct SwiftEstimate {
  double m = kSwiftDefaultM;          // M >= 1
  double alpha = kSwiftDefaultAlpha;  // alpha in (0, 1]
  double r = kSwiftDefaultR;          // r in [0, 1)
};

// Throws Error(kInvalidArgument) naming the value and its flag when one is out of range or
// not a number, e.g. "--swift-alpha: the acceptance rate must be in (0, 1] (got 1.5)".
void check_swift_estimate(const SwiftEstimate& e);

// Eq. (6) for `e` (checked first: throws as check_swift_estimate() does). 1 for M = 1 (no drafts
// accepted ever: plain decoding).
double swift_speedup(const SwiftEstimate& e);

// One line for the plan's header: "SWIFT decode: estimate from Eq. (6) with M=2.50, α=0.90,
// r=0.20 (not measured on this cluster): decode time per token divided by 1.071, prefill
// unchanged". Throws as check_swift_estimate() does.
std::string describe_swift(const SwiftEstimate& e);

// Applies the estimate to a feasible prediction of workload `w`: tpot_s divided by the
// speedup, decode_tokens_per_s multiplied by it, tokens_per_s recomputed from TTFT (kept)
// and the new TPOT as the cost model computes it; `dominant` says so. Breakdowns are per
// forward and stay. Throws as check_swift_estimate() does.
void apply_swift(const SwiftEstimate& e, const Workload& w, Prediction& p);

}  // namespace trellis::sim
