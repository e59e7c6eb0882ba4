// Communication-reducing model variants (Ladder Residual paper §3, §5; Layer Parallelism
// paper §3-4), composed from LlamaModel's per-module steps. Each variant changes only how
// the residual stream is wired and where tensor-parallel all-reduces happen:
//
//   standard  x += AR(A(x));  x += AR(F(x))                       2 all-reduces per layer
//   parallel  x += AR(A(x) + F(x))   (both modules read x)         1 per layer
//   ladder    module m reads the residual without module m-1's output, whose all-reduce
//             is still in flight (AR_async), and adds it once done  2 per layer, overlapped
//   desync2   every rank adds its own partial outputs to a local residual; only the last
//             module of each group of 2 modules synchronises:
//             x += AR(sum of the group's local partial outputs)    1 per layer
//   desync4   the same with groups of 4 modules (2 layers)         1 per 2 layers
//   lp        consecutive layer pairs (k, k+1):
//             u = x + AR(A_k(x) + A_k+1(x));  x = u + AR(F_k(u) + F_k+1(u))   1 per layer
//   nocomm    every all-reduce removed: each rank keeps its own partial sums. Its outputs
//             are WRONG on purpose (the communication-free upper bound of the Ladder
//             Residual study); reports label it.
//
// A variant applies to layers [range_first, range_last) of the model (the paper adapts,
// e.g., the upper half of Llama-3.1-8B); other layers run `standard`. Ladder and desync
// groups never span the edge of the range or of a pipeline stage: pending reductions are
// completed and the residual re-synchronised there.
//
// Desynced Residual: the paper says the dropped all-reduces leave each rank with "its own
// attention output" and that the residual is "re-synchronized at the next AllReduce". The
// only wiring where one all-reduce re-synchronises the residual is summing the group's
// local partial outputs, which is what this implements; at t = 1 it equals `standard`.
//
// Layer Parallelism placement (the paper's §3-4: "each layer of a pair on its own subset of
// the GPUs"): for every pair (k, k+1) the TP ranks [0, t/2) hold layer k and the ranks
// [t/2, t) hold layer k+1, each layer's heads and MLP columns split t/2 ways (so t must be
// even and the heads, KV heads and intermediate size divisible by t/2). Each rank computes
// its layer's partial sum; one all-reduce over all t ranks then sums the t/2 shards of A_k
// and the t/2 shards of A_k+1 at once, i.e. A_k(x) + A_k+1(x) (equations 6-7 of the
// paper's appendix); the MLPs likewise. The runner loads these layer shards itself from
// the checkpoint (VariantOptions::reader), apart from `model`'s t-way shards, which the
// layers outside the lp stretch (and the other variants of a study) use. At t = 1 one
// rank evaluates both layers (the single-process reference). Without a reader at t > 1
// the runner falls back to `model`'s head-sharded layers (every rank 1/t of both layers:
// same math and all-reduces, not the paper's placement); lp_placement() says which.
//
// Threading: as LlamaModel (one thread; every TP member makes the same calls).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "trellis/core/clock.hpp"
#include "trellis/core/variant.hpp"
#include "trellis/runtime/model/llama.hpp"
#include "trellis/transport/progress.hpp"

namespace trellis::runtime {

// The variant names live in core (one definition for run, study and plan).
using trellis::Variant;
using trellis::all_variants;
using trellis::parse_variant;
using trellis::to_string;
using trellis::variant_is_exact;

struct VariantSpec {
  Variant kind = Variant::kStandard;
  int range_first = 0;   // first model layer the variant applies to
  int range_last = -1;   // exclusive; -1: num_layers
};

// Parses "A-B" (inclusive, as the CLI's --ladder-layers/--lp-layers) into [A, B+1).
VariantSpec parse_variant_spec(std::string_view name, std::string_view layers, int num_layers);

// Checks that the variant can run on this model and TP degree; throws kInvalidArgument
// naming the constraint (e.g. lp needs an even number of layers in its range).
void validate_variant(const VariantSpec& spec, const ModelConfig& cfg, int tp);

struct VariantOptions {
  // How ladder's in-flight all-reduces are driven (a background progress thread by default).
  transport::ProgressOptions progress;
  // lp at t > 1: the checkpoint the paper's per-layer shards are loaded from (must outlive
  // the constructor only), with these options (slots, sequence length, weight type; the
  // layer range is set per layer). nullptr: head-sharded fallback (see above).
  const CheckpointReader* reader = nullptr;
  LoadOptions load;
};

class VariantRunner {
 public:
  // `model` must outlive the runner. `deadline` bounds each wait on an async all-reduce.
  // opts.progress: ladder's in-flight all-reduces are driven by a background progress
  // thread (transport/progress.hpp) and/or, with `cooperative`, by the next module's kernels
  // through the kernels' progress hook (installed on the calling thread while a ladder span
  // runs); with neither, they move only when the runner waits for them. opts.reader: see Layer Parallelism above; the lp
  // shards cover the pairs of model's stage (run_layers must be given the stage's bounds).
  VariantRunner(LlamaModel& model, VariantSpec spec, Millis deadline, VariantOptions opts = {});
  ~VariantRunner();

  // Runs this stage's layers on x[T, H] (embedding first on stage 0) with the variant's
  // wiring. Afterwards x holds the stage output (synchronised across the TP group, except
  // for nocomm).
  void run_stage(const Batch& batch, const kernels::TensorView& x);
  // Runs model layers [first, last) (within the stage) on x; what run_stage loops over.
  void run_layers(const Batch& batch, const kernels::TensorView& x, int first, int last);

  const VariantSpec& spec() const { return spec_; }
  // What drives ladder's in-flight all-reduces (its test counts, for tests and reports).
  const transport::ProgressThread& progress() const { return progress_; }
  // All-reduces issued by the last run (tests assert the count each variant promises).
  int all_reduces() const { return all_reduces_; }
  // Ladder, over the runner's lifetime: waits on an in-flight all-reduce after the next
  // module, and how many of them found it already complete (fully hidden behind the module).
  std::uint64_t ladder_waits() const { return ladder_waits_; }
  std::uint64_t ladder_waits_complete() const { return ladder_waits_complete_; }
  // lp: "layer" (the paper's placement: this rank holds one layer of each pair), "heads"
  // (fallback: 1/t of both layers), "single" (t = 1); "" for other variants.
  std::string_view lp_placement() const;
  // lp with the paper's placement: the layer of the pair starting at `pair_first` this rank
  // holds, or -1 when it holds none (not a pair start, or not the paper's placement).
  int lp_layer_held(int pair_first) const;

 private:
  bool in_range(int layer) const;
  kernels::TensorView buf(int which, std::int64_t rows);
  void reduce(const kernels::TensorView& t);
  void ladder_span(const Batch& batch, const kernels::TensorView& x, int first, int last);
  void desync_span(const Batch& batch, const kernels::TensorView& x, int first, int last, int group);
  void lp_pair(const Batch& batch, const kernels::TensorView& x, int layer);
  void load_lp_shards(const VariantOptions& opts);
  // Each lp pair's start in this stage, in order (as run_layers walks them).
  std::vector<int> lp_pair_starts() const;
  void parallel_layer(const Batch& batch, const kernels::TensorView& x, int layer);
  void nocomm_layer(const Batch& batch, const kernels::TensorView& x, int layer);

  LlamaModel& m_;
  VariantSpec spec_;
  Millis deadline_;
  int all_reduces_ = 0;
  std::uint64_t ladder_waits_ = 0, ladder_waits_complete_ = 0;
  std::vector<kernels::Tensor> bufs_;
  transport::ProgressThread progress_;
  // lp, paper's placement: a group that only says "rank r of t/2" (no communication), and
  // per pair start the one-layer model holding this rank's shard of its layer of the pair.
  std::unique_ptr<transport::Group> lp_shard_group_;
  std::vector<std::pair<int, std::unique_ptr<LlamaModel>>> lp_models_;
};

}  // namespace trellis::runtime
