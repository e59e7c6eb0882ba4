// SWIFT self-speculative decoding (Xia et al., ICLR 2025): settings and the skip-set type.
//
// SWIFT drafts with the target model itself, skipping a fraction r of its 2L sub-layers
// (L attention + L MLP). It runs in two phases per input stream:
//  * optimisation (§4.1): before each decoding step one candidate skip set is scored by its
//    matchness — the fraction of the last γ generated tokens the skipping model predicts
//    greedily — and the best set so far is kept (see optimizer.hpp);
//  * acceleration (§4.2): the best set drafts tokens until its confidence drops below ε,
//    each draft is widened by its top-k alternatives into a token tree, and the full model
//    verifies the tree in one forward pass (see tree.hpp, speculative.hpp).
//
// Everything under trellis/runtime/swift/ is pure arithmetic on tokens, probabilities and
// skip sets: no model, no tensor, no thread. Every function is safe to call from several
// threads on different objects; a LayerSkipOptimizer is used by one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trellis::runtime::swift {

// Defaults follow the paper's appendix B.2 unless noted.
struct SwiftSettings {
  int gamma = 32;            // context window: tokens scored per optimisation step (paper γ)
  int bayes_interval = 25;   // β: every β-th proposal comes from GP Bayesian optimisation, others random
  int max_steps = 1000;      // S: optimisation steps at most
  int patience = 300;        // stop after this many steps without a better matchness
  double target_matchness = 0.95;  // stop when the best matchness reaches this
  double skip_ratio = 0.5;   // r: fraction of the 2L sub-layers skipped by every candidate
  double epsilon = 0.8;      // ε: drafting stops when the draft's top-1 probability is below it (a default; the lead will tune)
  int max_draft = 25;        // N_D
  double reenter_acceptance = 0.5; // acceleration re-enters optimisation when the acceptance rate over a window falls below this
  int acceptance_window = 64;      // draft tokens in that window
  // The paper's footnote 3 (LLaMA-3-70B: r lowered from 0.5 to 0.4 while α stayed below a
  // tolerance of 0.7): while optimisation runs, an acceptance window with α below
  // ratio_tolerance lowers r by ratio_step, not below min_skip_ratio. 0 turns it off.
  double ratio_tolerance = 0.7;
  double ratio_step = 0.1;
  double min_skip_ratio = 0.1;
  double min_speedup = 1.0;  // drafting is turned off for a stream when the measured speedup stays below this...
  int speedup_window = 128;  // ...over this many generated tokens
  std::uint64_t seed = 1;
};

// Checks every field; throws Error(kInvalidArgument) naming the first bad setting and its
// allowed range, e.g. "swift.gamma must be >= 1 (got 0)". Ranges: gamma in [1, 1024],
// bayes_interval >= 1, max_steps >= 0, patience >= 1, target_matchness in (0, 1],
// skip_ratio in (0, 1), epsilon in [0, 1], max_draft in [1, 64], reenter_acceptance in
// [0, 1], acceptance_window >= 1, ratio_tolerance in [0, 1], ratio_step in (0, 1),
// min_skip_ratio in (0, 1), min_speedup >= 0, speedup_window >= 1. NaN is refused.
void validate(const SwiftSettings& s);

// Number of sub-layers every candidate skips: round(skip_ratio * 2 * num_layers).
int skip_budget(int num_layers, const SwiftSettings& s);

// Throws Error(kUnsupported) with the reason when a model of num_layers layers cannot draft
// by skipping: fewer than 4 layers, or a skip_ratio whose budget is 0 or all 2L sub-layers.
// Does not call validate().
void check_model_skippable(int num_layers, const SwiftSettings& s);

// A skip set over the 2L sub-layers of an L-layer model: z[2*l] is the attention sub-layer
// of layer l, z[2*l+1] its MLP sub-layer; 1 = skipped (the sub-layer acts as the identity,
// i.e. its residual branch is dropped), 0 = run.
using SkipSet = std::vector<std::uint8_t>;

// Number of skipped sub-layers.
int count_skipped(const SkipSet& z);

// Compact human-readable form with layer indices, e.g. "attn 3,5,7 mlp 2,9"; "attn - mlp -"
// when nothing is skipped.
std::string describe(const SkipSet& z);

}  // namespace trellis::runtime::swift
