#include "trellis/runtime/engine/warmup.hpp"

#include <algorithm>
#include <vector>

#include "trellis/core/clock.hpp"

namespace trellis::runtime {
namespace {

// A StageInput of sequences (slot j, start_pos starts[j], lengths[j] tokens).
StageInput make_input(const std::vector<int>& starts, const std::vector<int>& lengths, int vocab) {
  StageInput in;
  in.iteration = -1;  // never a real iteration: nothing caches on it
  for (std::size_t j = 0; j < lengths.size(); ++j) {
    in.slots.push_back(static_cast<std::int32_t>(j));
    in.starts.push_back(starts[j]);
    in.lengths.push_back(lengths[j]);
    in.fresh.push_back(starts[j] == 0 ? 1 : 0);  // a decode row continues its slot's prefill
    in.prompt.push_back(starts[j] == 0 ? 1 : 0);
    in.sampled.push_back(1);
    in.columns.push_back(static_cast<std::int32_t>(j));
    in.params.emplace_back();
    for (int i = 0; i < lengths[j]; ++i) {
      in.tokens.push_back(static_cast<std::int32_t>((37 * (starts[j] + i) + 11 * static_cast<int>(j) + 5) % vocab));
      in.positions.push_back(starts[j] + i);
    }
  }
  return in;
}

void run_once(StageCompute& stage, const StageInput& in, const WarmupShape& shape, Tracer& quiet) {
  const auto H = static_cast<std::size_t>(stage.hidden_size());
  // A later stage's input is the previous stage's hidden state; any finite values exercise
  // the same code (stage 0 overwrites x with its embedding).
  std::vector<float> x(static_cast<std::size_t>(in.n_tokens()) * H);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * static_cast<float>(static_cast<int>(i % 97) - 48);
  stage.forward(in, x.data(), quiet);
  if (shape.last_stage) {
    std::vector<float> logits(static_cast<std::size_t>(in.n_seqs()) *
                              static_cast<std::size_t>(stage.vocab_end() - stage.vocab_begin()));
    stage.logits(in, x.data(), logits.data());
  }
}

}  // namespace

WarmupTimes warm_up_stage(StageCompute& stage, const WarmupShape& shape) {
  WarmupTimes times;
  if (shape.prefill_tokens <= 0) return times;
  double t0 = now_seconds();
  const int vocab = std::max(1, stage.vocab_size());
  // Leave one position per slot for the decode step.
  const int per_seq = std::max(1, std::min(kWarmupSeqLen, shape.max_context - 1));
  std::vector<int> starts, lengths;
  for (int left = shape.prefill_tokens; left > 0 && static_cast<int>(lengths.size()) < shape.slots; left -= per_seq) {
    starts.push_back(0);
    lengths.push_back(std::min(left, per_seq));
  }
  Tracer quiet(false);
  run_once(stage, make_input(starts, lengths, vocab), shape, quiet);
  times.prefill_s = now_seconds() - t0;
  t0 = now_seconds();
  // One decode step: each row one token after its slot's prefill (or at 0 in a fresh slot).
  std::vector<int> dstarts, dlengths;
  for (int j = 0; j < std::min(shape.decode_rows, shape.slots); ++j) {
    dstarts.push_back(j < static_cast<int>(lengths.size()) ? lengths[static_cast<std::size_t>(j)] : 0);
    dlengths.push_back(1);
  }
  if (!dlengths.empty() && shape.max_context >= 2) run_once(stage, make_input(dstarts, dlengths, vocab), shape, quiet);
  times.decode_s = now_seconds() - t0;
  return times;
}

}  // namespace trellis::runtime
