// SWIFT's context-based layer-set optimisation (§4.1): which sub-layers the draft skips.
//
// The engine drives one LayerSkipOptimizer per input stream, one step before each decoding
// step while !finished():
//
//   SkipSet z = opt.propose();       // a candidate with exactly skip_budget() sub-layers off
//   double m = <matchness of z>;     // Eq. (4): share of the last γ generated tokens that
//                                    // the model skipping z predicts greedily (one forward)
//   opt.report(z, m);                // updates best(), counters and the stop state
//
// and drafts with best() meanwhile and afterwards. Proposals (Eq. 2): step o (1-based within
// the current optimisation round) is suggested by Gaussian-process Bayesian optimisation when
// o % bayes_interval == 0 and at least two sets have been scored, otherwise at random with
// the budget: half the time a random unseen single swap of best() (local refinement, which
// uniform sampling cannot do on a non-additive score), else uniformly among all such sets. Before any score exists, best() is the uniform set
// (uniform_skip_set) with matchness -1; the first proposal of a round whose best is unscored
// is best() itself, so the starting point is measured rather than dropped.
//
// Stopping (appendix B.2): best_matchness() >= target_matchness, `patience` consecutive
// steps without a strictly better matchness, or max_steps steps. report() after finished()
// is still recorded (history and best) but does not restart the round.
//
// Determinism: the sequence of proposals is a function of the settings' seed and the scores
// reported. Threading: one thread at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "trellis/runtime/swift/settings.hpp"

namespace trellis::runtime::swift {

// The skip set used before any optimisation: skip_budget sub-layers spread evenly over the
// layers, keeping the first and last layer whole when the budget allows; where a layer gets
// one skipped sub-layer, attention and MLP alternate from one such layer to the next.
// Requires num_layers >= 1 and 0 <= budget <= 2 * num_layers.
SkipSet uniform_skip_set(int num_layers, int budget);

class LayerSkipOptimizer {
 public:
  // Validates the settings (validate()) and the model (check_model_skippable()).
  LayerSkipOptimizer(int num_layers, const SwiftSettings& s);

  // The best set so far and its matchness (-1 while unscored in this round).
  const SkipSet& best() const { return best_; }
  double best_matchness() const { return best_matchness_; }

  // The next candidate to score; see the file comment. Calling it twice without report()
  // gives two candidates for the same step.
  SkipSet propose();

  // One optimisation step done: z (size 2L, any number skipped) scored `matchness` in
  // [0, 1]. Throws kInvalidArgument otherwise. A strictly higher matchness replaces best().
  // A set whose skip count is not the current budget (proposed before set_budget) is kept
  // in the history only: it is not a step and cannot become best().
  void report(const SkipSet& z, double matchness);

  bool finished() const { return !stop_reason().empty(); }
  // "" while running; else "matchness 0.9688 >= 0.95", "300 steps without improvement" or
  // "1000 steps" (checked in that order).
  std::string stop_reason() const;
  // Steps reported in the current round.
  int steps() const { return steps_; }

  // Re-enters optimisation (the acceptance rate fell, e.g. on a new kind of input): keeps the
  // history (the GP still learns from it) and best(), resets steps, patience and finished.
  // best_matchness() becomes -1: the old score was measured on a context that no longer
  // applies, so it would block every new candidate from replacing a stale best. The first
  // proposal after restart() is best() itself, so the incumbent is rescored on the new
  // context before challengers are compared with it.
  void restart();

  // Changes how many sub-layers every candidate skips (the engine lowers r while acceptance
  // stays low: the paper's footnote 3). best() keeps the sub-layers it skipped, minus (or
  // plus) randomly chosen ones; then a new round starts as restart() does. Only sets of the
  // new budget train the GP from then on (matchness is not comparable across budgets).
  // Throws kInvalidArgument unless 1 <= budget < 2L.
  void set_budget(int budget);

  // Introspection for logs and tests.
  int num_layers() const { return num_layers_; }
  int budget() const { return budget_; }
  int history_size() const { return static_cast<int>(history_.size()); }
  int bayes_proposals() const { return bayes_proposals_; }  // proposals that came from the GP
  bool last_proposal_was_bayes() const { return last_was_bayes_; }

 private:
  // Plain element-wise order. (std::less on byte vectors lowers to memcmp, which trips a
  // false -Wstringop-overread in GCC 12 at -O3.)
  struct SetLess {
    bool operator()(const SkipSet& a, const SkipSet& b) const;
  };
  struct Scored {
    SkipSet z;
    double matchness;
    int skipped;  // count_skipped(z): the budget it was proposed under
  };
  SkipSet random_set();
  std::optional<SkipSet> random_swap_of_best();
  SkipSet bayes_set();
  std::vector<int> training_indices() const;

  int num_layers_, sub_layers_, budget_;
  SwiftSettings settings_;
  std::mt19937_64 rng_;
  std::vector<Scored> history_;
  std::set<SkipSet, SetLess> seen_;  // every set ever reported, so the GP does not re-propose them
  SkipSet best_;
  double best_matchness_ = -1.0;
  int steps_ = 0;
  int stale_ = 0;  // steps since best_matchness_ last rose
  int bayes_proposals_ = 0;
  bool last_was_bayes_ = false;
};

}  // namespace trellis::runtime::swift
