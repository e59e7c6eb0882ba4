// The SWIFT study (`trellis study swift`): each task's prompts generated twice with the same
// model, layout and settings — plain decoding, then SWIFT self-speculative decoding — and
// reported the way the SWIFT paper's Table 4 does (mean generated length M, acceptance rate
// α, Eq. (6)'s expected speedup), beside the measured wall-clock speedup, the skip set, the
// optimisation's steps and share of time, drafting and verification shares, whether the
// auto-off rule fired, and whether the greedy outputs of the two runs are identical (SWIFT's
// correctness promise). The SVG is the paper's Figure 6 (left): matchness and speedup over
// time, one panel per task.
//
// Everything here is pure formatting and comparison on values the launcher collected
// (launchers/cmd_study_swift.cpp runs the generations); no model, no MPI. Thread-safe.
#pragma once

#include <cstdint>
#include <istream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "trellis/runtime/scheduler/swift_control.hpp"

namespace trellis::runtime {

// The greedy outputs of the same prompts from two runs, compared request by request.
struct OutputComparison {
  int requests = 0;   // requests compared (both runs finished them)
  int differing = 0;  // requests whose tokens differ, or that one run lacks or failed
  int unmatched = 0;  // of those, the ones not compared (one run lacks or failed them)
  int failed = 0;     // requests both runs failed (not compared)
  std::string first;  // the first difference, e.g. "request r3: token 5 of 32 differs (plain 17, SWIFT 90)"
  // Identical: something was compared and nothing differs.
  bool identical() const { return requests > 0 && differing == 0; }
};

// Compares two `--out` files (JSONL, one line per request in request order: "id", "status",
// "tokens"; runtime/engine/generate.hpp). Lines are matched by position and must carry the
// same id. A line that is not such an object throws Error(kCorruptInput) naming `what` and
// the line. Reads both streams to the end.
OutputComparison compare_outputs(std::istream& plain, std::istream& swift, std::string_view what);

// One task of the study: a prompts file, run plain and with SWIFT.
struct SwiftTaskResult {
  std::string task;                    // the prompts file's stem ("summarisation")
  std::string prompts;                 // the file
  int requests = 0;
  std::int64_t plain_tokens = 0, swift_tokens = 0;  // generated tokens
  double plain_wall_s = 0, swift_wall_s = 0;        // generation phase, start-up excluded
  double plain_tokens_per_s = 0, swift_tokens_per_s = 0;
  std::optional<SwiftReport> swift;    // nothing when the SWIFT run could not draft
  OutputComparison outputs;
  std::vector<std::string> notes;      // failures and notes of either run, "plain run: ..." / "SWIFT run: ..."

  // SWIFT tokens/s over plain tokens/s (0 when the plain run produced nothing).
  double speedup() const;
  // Eq. (6) with this task's M, α and r = skipped / sub-layers; nothing when the run did not
  // verify anything (M or α undefined).
  std::optional<double> expected_speedup() const;
};

struct SwiftStudy {
  std::string title;  // model, layout, settings
  std::vector<SwiftTaskResult> tasks;
  // Whether every task's outputs are identical.
  bool all_identical() const;
};

// The table: one row per task and a "mean" row (the paper averages tasks the same way),
// then each task's skip set and notes, a legend, and, when any task's outputs differ, a
// block of lines starting "ERROR:" that names the task and the first difference.
std::string format_swift_table(const SwiftStudy& s);

// CSV: a header and one row per task; the columns are fixed (tests/study check them):
// task,prompts,requests,plain_tokens,swift_tokens,plain_tokens_per_s,swift_tokens_per_s,
// speedup,M,alpha,expected_speedup,skipped,sub_layers,skip_set,best_matchness,opt_steps,
// opt_stop,restarts,opt_share,draft_share,verify_share,measured_speedup,turned_off,
// off_reason,identical,differing,compared
// Numbers without a value are empty; text fields are quoted.
std::string format_swift_csv(const SwiftStudy& s);

// JSON text: {"title", "all_identical", "tasks": [{every CSV field, "timeline": [[t_s,
// matchness, speedup], ...], "first_difference", "notes"}]}; absent values are null.
std::string format_swift_json(const SwiftStudy& s);

// The Figure 6 chart: one panel per task, x = seconds since the task's first SWIFT
// iteration, left axis matchness (best so far, a line), right axis speedup (verify points,
// a second line), the optimisation phase (runs of optimisation points) shaded, speedup 1
// and the task's measured wall-clock speedup as dashed lines. A panel whose outputs differ says
// so in red in its title. Long timelines are thinned to at most `max_points` per series.
std::string format_swift_svg(const SwiftStudy& s, int max_points = 400);

}  // namespace trellis::runtime
