// SWIFT on the scheduler: which iterations a self-speculating sequence needs, and what their
// results mean (paper: ../shared/papers/swift.txt §4; design: docs/swift.md).
//
// A SWIFT sequence never takes a plain decode step once it runs. Each cycle is
//   [optimise]  one draft forward with a candidate skip set over the last γ committed tokens
//               (their new K/V go to scratch positions past the sequence), scored by Eq. (4)
//               matchness; only while the run's optimiser has not finished, once the
//               sequence has generated more than γ tokens, and once per decoding step of the
//               whole stream (one sequence scores for all);
//   draft x j   one token per iteration with the best skip set, until the draft's top-1
//               probability falls below ε or N_D tokens (or the tree would not fit);
//   verify      one forward of the full model over the token tree (input token + the draft
//               chain + each position's next-best candidates, SeqChunk::parents) whose K/V
//               land at the sequence's next positions; greedy acceptance of the longest
//               matching path, plus the target's own next token.
// The accepted path's K/V are already in place for the chain; an accepted alternative (a
// leaf) is moved into place by a KV move carried by the sequence's next iteration. Positions
// past the committed length are scratch, overwritten before they are read.
//
// One optimiser and one skip set per run (the paper's "input stream"). Drafts and
// optimisation steps skip sub-layers, so an iteration holds one kind only: the scheduler
// alternates SWIFT iterations with plain ones when a group also has other sequences.
//
// The plain decode step time is calibrated from the run's first pure decode iterations (the
// first few tokens of a SWIFT run decode plainly for it); the speedup judged by the auto-off
// rule is (plain step time x tokens committed) / (time of SWIFT iterations), per window of
// swift.speedup_window tokens (see judge()).
//
// Threading: the scheduler's thread only.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "trellis/runtime/scheduler/schedule.hpp"
#include "trellis/runtime/swift/optimizer.hpp"
#include "trellis/runtime/swift/settings.hpp"
#include "trellis/runtime/swift/tree.hpp"
#include "trellis/runtime/workload/request.hpp"

namespace trellis::runtime {

struct SwiftConfig {
  bool enabled = false;       // --swift: requests without a "swift" field draft
  bool allowed = false;       // the run can draft at all (a layout and model that support it)
  bool invariant = true;      // the kernels are batch-invariant (kernels.batch_invariant or run.swift)
  swift::SwiftSettings settings;
  int num_layers = 0;
  int max_tree = 64;          // tree nodes verified per sequence at most (swift.max_tree)
  int calibration_steps = 4;  // plain decode iterations timed before drafting starts
  int tp = 1;                 // TP ranks per stage (a skipped sub-layer saves an all-reduce when > 1)
};

// What the summary, --json and `trellis study swift` report (paper appendix B.3).
struct SwiftReport {
  std::int64_t draft_steps = 0;    // draft forwards (tokens drafted)
  std::int64_t accepted = 0;       // drafted tokens the target accepted
  std::int64_t verify_passes = 0;  // target forwards over a tree
  std::int64_t committed = 0;      // tokens produced by verify passes (accepted + bonus)
  std::int64_t opt_steps = 0;      // optimisation forwards
  std::int64_t plain_steps = 0;    // plain decode iterations timed for the calibration
  std::int64_t reductions_saved = 0;  // TP all-reduces the drafts' skipped sub-layers did not do
  std::int64_t sublayers_skipped = 0; // sub-layer computations left out (drafts and optimisation)
  std::int64_t alternatives = 0;   // accepted tree alternatives (each moved into place in the KV cache)
  int restarts = 0;                // re-entries into optimisation
  double skip_ratio = 0;           // r at the end (lowered while acceptance stayed low)
  int ratio_lowered = 0;           // times r was lowered
  double opt_s = 0, draft_s = 0, verify_s = 0;  // iteration round trips by kind
  double plain_step_s = 0;         // calibrated plain decode time per token (median)
  std::string skip_set;            // best skip set found (swift::describe)
  int skipped = 0, sub_layers = 0;
  double best_matchness = -1;
  std::string stop_reason;         // why optimisation ended ("" while it runs)
  bool turned_off = false;         // the auto-off rule fired
  std::string off_reason;
  struct Point {
    double t_s;           // since the first SWIFT iteration
    double matchness;     // best so far (-1 before any)
    double instance_speedup;  // of the cycle that ended then (0 for optimisation points)
  };
  std::vector<Point> timeline;     // Figure 6's series
  // M: tokens per target forward; α: accepted drafts per draft step; Eq. (6)-style measured
  // speedup of the SWIFT iterations against the calibrated plain step.
  double mean_generated_length() const { return verify_passes ? double(committed) / verify_passes : 0; }
  double acceptance_rate() const { return draft_steps ? double(accepted) / draft_steps : 0; }
  double optimisation_share() const;
  double measured_speedup() const;
};

class SwiftControl {
 public:
  explicit SwiftControl(SwiftConfig cfg);

  // Whether `r` should draft (its "swift" field or --swift; greedy without penalties only).
  bool wants(const Request& r) const;
  // Why `r` asked for SWIFT but cannot draft, or nothing.
  std::optional<std::string> refusal(const Request& r) const;
  // KV positions a drafting sequence uses past its committed length.
  int scratch_positions() const;
  // Logits rows one sequence's SWIFT iteration may have.
  int max_rows_per_seq() const { return scratch_positions(); }

  // A running sequence as the scheduler sees it.
  struct SeqView {
    std::int64_t id;
    std::int32_t slot, column, len;  // len: committed tokens in the KV cache
    std::int32_t next_token;         // the last committed token, not yet in the cache
    const std::vector<std::int32_t>* prompt;
    const std::vector<std::int32_t>* output;
  };
  // Whether `v` drafts now (SWIFT on for it, calibrated, not turned off, room for scratch).
  bool drafting(const SeqView& v, std::int32_t max_context) const;
  // Appends one SWIFT iteration for some of `seqs` (all drafting) to `s`: seqs, tokens, skip
  // set and KV moves. Returns false when none of them has SWIFT work.
  bool plan(std::span<const SeqView> seqs, ScheduleOutput& s, double now);
  // Results of a SWIFT iteration: per sequence the committed tokens, in order.
  struct Commit {
    std::int64_t id;
    std::vector<std::int32_t> tokens;  // accepted drafts then the bonus token
    std::int32_t kv_advance;           // positions that became committed (root + accepted)
  };
  std::vector<Commit> complete(const ScheduleOutput& s, std::span<const std::int32_t> cand_tokens,
                               std::span<const float> cand_probs, double round_trip_s, double now);
  // A plain iteration of `tokens` decode steps only took `round_trip_s` (calibration: the
  // plain cost of one token is round_trip_s / tokens, so the rule compares like with like
  // at any batch).
  void observe_plain(double round_trip_s, int tokens);
  // The sequence left (finished, aborted): its state goes.
  void drop(std::int64_t id) { seqs_.erase(id); }
  // KV moves the sequence still owes the cache (an accepted alternative), for a plain
  // iteration that carries it instead (drafting just turned off, or no room for scratch):
  // a move must go out with the sequence's next iteration of whatever kind.
  std::vector<KvCopy> take_moves(std::int64_t id);
  // Notes for the log (optimisation finished, re-entered, auto-off).
  std::vector<std::string> take_notes();
  SwiftReport report() const;

 private:
  enum class Action { kNone, kOptimise, kDraft, kVerify };
  struct SeqState {
    std::vector<swift::DraftStep> steps;  // this cycle's drafts
    std::vector<KvCopy> moves;            // to carry with the next iteration
    swift::TokenTree tree;                // the tree in flight
    swift::SkipSet candidate;             // the candidate in flight
    std::int32_t opt_last = -1;           // the committed token after the scored window
  };
  Action next_action(const SeqView& v, SeqState& st) const;
  void add_seq(ScheduleOutput& s, const SeqView& v, SeqState& st, std::int32_t pos,
               std::span<const std::int32_t> tokens);
  void judge(double now);
  void lower_ratio(double alpha);

  SwiftConfig cfg_;
  std::optional<swift::LayerSkipOptimizer> opt_;
  std::map<std::int64_t, SeqState> seqs_;
  std::vector<double> plain_samples_;
  SwiftReport rep_;
  double t0_ = -1;
  bool opt_due_ = true;       // an optimisation step is due before the next decoding step
  bool early_done_ = false;  // the early auto-off look happened
  // Windows of the auto rules: drafts and accepts since the last acceptance check; tokens
  // and SWIFT time since the last speedup check.
  std::int64_t win_drafts_ = 0, win_accepted_ = 0, win_tokens_ = 0;
  double win_time_ = 0, win_accel_time_ = 0;
  std::vector<std::string> notes_;
  double ratio_ = 0;  // the skip ratio the optimiser's budget was made from
};

}  // namespace trellis::runtime
