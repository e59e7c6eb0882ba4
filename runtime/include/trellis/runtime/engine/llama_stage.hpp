// The engine's view of the real model: a StageCompute over a LlamaModel shard (this rank's
// layers and TP slice), and a Group decorator that records every all-reduce on the trace.
#pragma once

#include <memory>

#include "trellis/runtime/engine/engine.hpp"
#include "trellis/runtime/model/llama.hpp"
#include "trellis/runtime/model/variants.hpp"
#include "trellis/transport/group.hpp"

namespace trellis::runtime {

// Wraps `model` (which must outlive the result). forward() embeds on stage 0, then runs each
// of the rank's layers as the standard block, recording one "block" span per layer.
// A model on a GPU (model.device() == kCuda) keeps the hidden state on the device for the
// whole stage: forward() copies the engine's host x in (stage > 0) and back out (all but the
// last stage) with synchronous copies; on the last stage x stays on the device and logits()
// reads the hidden state its last forward() left there (its x argument is not read), copying
// the logits to the host `out` before it returns (or, start_logits/finish_logits, through
// pinned memory on a copy stream while the next forward is enqueued).
std::unique_ptr<StageCompute> make_llama_stage(LlamaModel& model);
// How a GPU stage runs its ops. cuda_graphs: replay the decode forward (one token per
// sequence, standard wiring, one TP rank) as CUDA graphs (kernels/graph.hpp), a pair per
// batch size captured the second time the size comes; false runs every op eagerly (the
// ablation, setting run.cuda_graphs / --no-cuda-graphs). No effect on a CPU stage.
// graph_prefill: with graphs, fill the next decode step's graph while the GPU runs this one
// (StageCompute::prepare_next), so that only the sampled tokens are written in between steps
// (setting run.graph_prefill).
struct LlamaStageOptions {
  bool cuda_graphs = true;
  bool graph_prefill = true;
};

// The same with a communication-reducing variant's residual wiring (variants.hpp) over
// this stage's layers; `deadline` bounds each wait on an asynchronous all-reduce. `opts`:
// ladder's progress thread, and for lp the checkpoint its per-layer shards load from.
std::unique_ptr<StageCompute> make_llama_stage(LlamaModel& model, const VariantSpec& variant, Millis deadline,
                                               VariantOptions opts = {}, LlamaStageOptions stage = {});

// A Group that forwards to `inner` and records an "all-reduce" span (lane forward) for each
// synchronous all-reduce and for the wait of each asynchronous one. Both must outlive it.
std::unique_ptr<transport::Group> make_timed_group(transport::Group& inner, Tracer& trace);

}  // namespace trellis::runtime
