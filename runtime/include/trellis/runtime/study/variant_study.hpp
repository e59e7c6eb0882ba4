// The variant study (`trellis study variants`): times every communication-reducing model
// variant (model/variants.hpp) over a set of batch sizes on one tensor-parallel group and
// reports them the way Ladder Residual's Tables 2 and 6 do — prefill latency, decode
// latency, tokens/s, % speedup over `standard`, and the share of the no-communication
// bound reached, (t_standard - t_v) / (t_standard - t_nocomm).
//
// What one measurement is: for a batch of B sequences, a prefill of B x prompt_len tokens
// followed by gen_len decode steps (one token per sequence), each step running the
// variant's layers, the final norm and the local LM head, and (for every variant but
// nocomm) the logits all-gather sampling would need. Decode tokens are fixed synthetic ids
// (not sampled), so every variant does the same work whatever its outputs. Each repeat's
// prefill time and mean decode-step time are maxed across ranks (the slowest rank is the
// step time), and the median over repeats is reported. Warm-up repeats are not counted.
//
// nocomm removes every TP communication: its outputs are WRONG on purpose, it is the upper
// bound of the study only, and every table, CSV row and chart labels it so.
//
// Threading: measure_variant() is collective over the model's TP group and the world (every
// rank calls it with the same arguments in the same order); the rest is pure.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "trellis/core/clock.hpp"
#include "trellis/runtime/model/llama.hpp"
#include "trellis/runtime/model/variants.hpp"
#include "trellis/transport/bootstrap.hpp"
#include "trellis/transport/progress.hpp"

namespace trellis::runtime {

// The label every report gives nocomm.
inline constexpr const char* kNoCommLabel = "upper bound, outputs wrong";

struct StudyPoint {
  std::string variant;  // to_string(Variant), or the label given (e.g. "ladder@coop")
  std::string layers;   // "A-B" (inclusive) the variant applies to, "all" for the whole model
  bool exact = true;    // false for nocomm
  int batch = 0;
  int prompt_len = 0, gen_len = 0;
  double prefill_s = 0;  // median over repeats of the slowest rank's prefill
  double decode_s = 0;   // median over repeats of the slowest rank's mean decode step
  int all_reduces_prefill = 0, all_reduces_decode = 0;  // per forward, from the runner
  // Where a decode step's wall time went (medians over repeats of the per-step mean, each
  // the largest over ranks): CPU time of the calling (compute) thread and of the whole
  // process (progress threads, kernel workers, MPI's threads included), and the calling
  // thread's voluntary (it blocked or slept) and involuntary (it was preempted) context
  // switches. wall - thread CPU is time the compute thread did not run: waiting on a peer,
  // or runnable but without a core.
  double decode_thread_cpu_s = 0, decode_process_cpu_s = 0;
  double decode_vol_switches = 0, decode_invol_switches = 0;
  // Tests of ladder's in-flight all-reduces per prefill (medians, largest rank) made by the
  // background progress thread and from inside the kernels (cooperative progress), in the
  // log line and JSON of the study (not the CSV); 0 for
  // the other variants.
  double prefill_background_tests = 0, prefill_cooperative_tests = 0;
  // CPU time of the compute thread during the prefill (median, largest rank; log and JSON):
  // beside prefill_s it tells wire time (hideable) from CPU spent on communication (not).
  double prefill_thread_cpu_s = 0;
  // Ladder: the share of its waits (one per all-reduce but the last of a span) that found the
  // all-reduce already complete after the next module, in the prefill and over the decode
  // steps (medians, smallest rank; log and JSON). NaN for variants without such waits.
  double prefill_hidden_waits = 0, decode_hidden_waits = 0;
  // Filled by derive_study():
  double tokens_per_s = 0;         // end to end: B * gen_len / (prefill + gen_len * decode)
  double decode_tokens_per_s = 0;  // B / decode_s
  double speedup_pct = 0;          // tokens/s over standard's at the same batch, in %
  double prefill_bound_share = 0;  // (t_std - t_v) / (t_std - t_nocomm); NaN when undefined
  double decode_bound_share = 0;
};

// Where this rank sits when the study runs with pipeline stages (--pp P): world rank
// stage * tp + tp_rank; stage s holds an even share of the layers (the first
// num_layers % pp stages one more). Each stage's TP group runs the variant on its layers;
// the hidden state goes to the same TP rank of the next stage over the bootstrap's
// point-to-point messages (the same cost for every variant), and the last stage sends each
// step's tokens back to the first, so the stages run one forward at a time like a decode
// without micro-batching.
struct StagePlace {
  int tp = 0, pp = 1;  // tp = 0: not set (one stage, the model's own group)
  int stage = 0, tp_rank = 0;
  int first_layer = 0, last_layer = 0;
  // Throws kInvalidArgument when pp is not in [1, num_layers].
  static StagePlace of(int world_rank, int tp, int pp, int num_layers);
};

struct StudyRun {
  int prompt_len = 16, gen_len = 8;
  int repeats = 3;  // timed repeats (median taken)
  int warmup = 1;   // untimed repeats before them
  Millis deadline{60000};
  transport::ProgressOptions progress;  // how ladder's async all-reduces are driven
  // lp's per-layer shards (the paper's placement) are loaded from here with these options;
  // nullptr: lp runs head-sharded (variants.hpp).
  const CheckpointReader* reader = nullptr;
  LoadOptions load;
  StagePlace place;  // default: one stage holding the whole model
  // Control for the scheduler's treatment of a process with a periodically waking thread:
  // every variant (ladder included) runs beside a ProgressThread with `wake_interval` that
  // drives a request which never completes, i.e. a thread that wakes but moves nothing.
  // Why (measured, docs/variants.md): on a machine whose cores are shared with other
  // sessions' work, a rank whose process has a waking thread (ladder's progress thread)
  // takes its core back from other tasks at each wake, where a rank without one loses it for
  // whole time slices (and its caches with it); that alone made ladder look faster than
  // nocomm. A coarse interval (1 ms) gives every variant that protection at a negligible
  // cost; a fine one (20 us) costs the compute thread ~15% of its core.
  bool wake_control = false;
  std::chrono::microseconds wake_interval{1000};
  // measure_interleaved only, parallel to its specs (empty: none): per spec, the row's label
  // (empty: the variant's name) and how its ladder all-reduces are driven (unset: `progress`),
  // so that ways of driving ladder are compared within one interleaved run.
  struct PerSpec {
    std::string label;
    std::optional<transport::ProgressOptions> progress;
  };
  std::vector<PerSpec> per_spec;
  std::string label;  // measure_variant: the point's variant label (empty: to_string(kind))
};

// Times one variant at one batch size. `model` must hold run.place's layers (the whole model
// without stages) with at least `batch` KV-cache slots of prompt_len + gen_len positions.
// Collective over the world. Prefill and decode times are the slowest rank's, i.e. with
// stages the whole pipeline's; the all-reduce counts are summed over the stages.
StudyPoint measure_variant(LlamaModel& model, const VariantSpec& spec, int batch, const StudyRun& run,
                           transport::Bootstrap& world);

// Times every spec at one batch size, interleaved: each warm-up and each timed repeat runs
// every spec once (one measure_variant call with one repeat) before the next repeat starts,
// and the medians are taken per spec afterwards. On a machine whose cores are shared with
// other work the CPU a rank gets comes in phases of seconds; interleaving makes every
// variant see the same phases, where timing one variant's repeats back to back does not.
// Returns one point per spec, in order. Collective.
std::vector<StudyPoint> measure_interleaved(LlamaModel& model, const std::vector<VariantSpec>& specs, int batch,
                                            const StudyRun& run, transport::Bootstrap& world);

// Fills the derived fields of every point from the `standard` and `nocomm` points of the same
// batch size (speedup and shares stay NaN when the batch has no such point, or when
// t_std - t_nocomm is not positive: communication too cheap to measure).
void derive_study(std::vector<StudyPoint>& points);

// Text tables, one per batch size (Ladder Residual Table 2/6 layout), headed by `title`.
std::string format_study_tables(const std::vector<StudyPoint>& points, const std::string& title);
// CSV with a header row; one row per point; nocomm's `note` column says kNoCommLabel.
std::string format_study_csv(const std::vector<StudyPoint>& points);
// A self-contained SVG grouped bar chart: one group per batch size, one bar per variant,
// bar height = end-to-end tokens/s relative to standard at that batch (standard = 1).
std::string format_study_svg(const std::vector<StudyPoint>& points, const std::string& title);

}  // namespace trellis::runtime
