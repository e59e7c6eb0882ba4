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
// Layer Parallelism: the paper assigns disjoint GPU subsets to the two layers of a pair.
// Here every rank holds its 1/t head and column share of both layers (the layout the
// checkpoint loader already uses). The math (equations 6-7 of the paper's appendix) and
// the number of all-reduces are the same; only which rank holds which weights differs.
//
// Threading: as LlamaModel (one thread; every TP member makes the same calls).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "trellis/core/clock.hpp"
#include "trellis/runtime/model/llama.hpp"

namespace trellis::runtime {

enum class Variant { kStandard, kParallel, kLadder, kDesync2, kDesync4, kLayerParallel, kNoComm };

std::string_view to_string(Variant v);
// "standard", "parallel", "ladder", "desync2", "desync4", "lp", "nocomm"; throws
// kInvalidArgument listing the valid names.
Variant parse_variant(std::string_view name);
std::vector<Variant> all_variants();
// False for nocomm: its outputs are not the model's.
bool variant_is_exact(Variant v);

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

class VariantRunner {
 public:
  // `model` must outlive the runner. `deadline` bounds each wait on an async all-reduce.
  VariantRunner(LlamaModel& model, VariantSpec spec, Millis deadline);

  // Runs this stage's layers on x[T, H] (embedding first on stage 0) with the variant's
  // wiring. Afterwards x holds the stage output (synchronised across the TP group, except
  // for nocomm).
  void run_stage(const Batch& batch, const kernels::TensorView& x);
  // Runs model layers [first, last) (within the stage) on x; what run_stage loops over.
  void run_layers(const Batch& batch, const kernels::TensorView& x, int first, int last);

  const VariantSpec& spec() const { return spec_; }
  // All-reduces issued by the last run (tests assert the count each variant promises).
  int all_reduces() const { return all_reduces_; }

 private:
  bool in_range(int layer) const;
  kernels::TensorView buf(int which, std::int64_t rows);
  void reduce(const kernels::TensorView& t);
  void ladder_span(const Batch& batch, const kernels::TensorView& x, int first, int last);
  void desync_span(const Batch& batch, const kernels::TensorView& x, int first, int last, int group);
  void lp_pair(const Batch& batch, const kernels::TensorView& x, int layer);
  void parallel_layer(const Batch& batch, const kernels::TensorView& x, int layer);
  void nocomm_layer(const Batch& batch, const kernels::TensorView& x, int layer);

  LlamaModel& m_;
  VariantSpec spec_;
  Millis deadline_;
  int all_reduces_ = 0;
  std::vector<kernels::Tensor> bufs_;
};

}  // namespace trellis::runtime
