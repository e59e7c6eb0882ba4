// Warm-up of one rank's stage before the first request: the start-up work a request would
// otherwise pay inside its time to first token (first use of the kernels' code paths and
// thread pool, the model's activation buffers growing to a prefill's size and their page
// faults, the TP group's first all-reduces and whatever its backend sets up lazily, the LM
// head) is done here, at load, and timed separately (RunSummary::startup).
//
// What it runs: one prefill of `prefill_tokens` dummy tokens, split into sequences of at most
// kWarmupSeqLen over KV slots 0.., then one decode step of `decode_rows` sequences, and on
// the last stage the logits of both. The KV entries it writes are never read by a request:
// every sequence writes positions [0, n) of its slot before attention reads them.
//
// Collective over the stage's TP group (every member must call it with the same shape);
// no communication between stages. Call from one thread, before the engine starts.
#pragma once

#include "trellis/runtime/engine/engine.hpp"

namespace trellis::runtime {

struct WarmupShape {
  int prefill_tokens = 0;  // 0: no warm-up
  int decode_rows = 1;
  int slots = 1;           // KV slots the stage holds
  int max_context = 1;     // positions per slot
  bool first_stage = true, last_stage = true;
};
inline constexpr int kWarmupSeqLen = 128;

struct WarmupTimes {
  double prefill_s = 0;  // the dummy prefill (forward + logits on the last stage)
  double decode_s = 0;   // the decode step
  double total_s() const { return prefill_s + decode_s; }
};

// Runs the warm-up described above (all zeros when prefill_tokens is 0). Throws what
// stage.forward()/logits() throw.
WarmupTimes warm_up_stage(StageCompute& stage, const WarmupShape& shape);

}  // namespace trellis::runtime
