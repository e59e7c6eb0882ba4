// SWIFT's hardware-independent metrics (appendix B.3) and the speedup they predict (Eq. 6).
#pragma once

#include <cstdint>

namespace trellis::runtime::swift {

// Eq. (6): the expected wall-time speedup of the acceleration phase,
//   E(Spd) = M * alpha / ((M - 1) * c + alpha),  c = 1 - r,
// for mean generated length M >= 1, acceptance rate alpha in (0, 1] and skip ratio r in
// [0, 1) (c is the draft's forward cost relative to the target's). Throws kInvalidArgument
// naming the argument otherwise.
double expected_speedup(double M, double alpha, double r);

// Counters for one stream (or a whole run: add them up with +=). Not thread-safe.
struct SwiftStats {
  std::uint64_t draft_steps = 0;       // forward passes of the skipping model that drafted a token
  std::uint64_t accepted_tokens = 0;   // draft tokens the target accepted
  std::uint64_t verify_passes = 0;     // target forward passes that produced tokens
  std::uint64_t generated_tokens = 0;  // tokens those passes produced (accepted + one each)

  // One target pass that verified `drafted` tokens (0 for a plain decoding step) and
  // accepted `accepted` <= drafted of them; it produces accepted + 1 tokens.
  void record_verify(int drafted, int accepted);

  // M: tokens produced per target forward pass; 0 before any pass.
  double mean_generated_length() const;
  // alpha: accepted draft tokens / draft steps; 0 before any draft.
  double acceptance_rate() const;

  SwiftStats& operator+=(const SwiftStats& o);
};

}  // namespace trellis::runtime::swift
