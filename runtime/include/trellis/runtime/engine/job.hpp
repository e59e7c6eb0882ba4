// A job set up for generation, shared by `trellis run` (generate.hpp) and `trellis serve`:
// topology -> placement -> per-link backends -> TP groups -> this rank's shard -> warm-up.
// prepare_job() is collective over the world (every rank calls it with the same options);
// afterwards run_engine() can be called on the pieces it holds.
#pragma once

#include <memory>
#include <string>

#include "trellis/core/config.hpp"
#include "trellis/kernels/context.hpp"
#include "trellis/runtime/checkpoint/reader.hpp"
#include "trellis/runtime/engine/engine.hpp"
#include "trellis/runtime/engine/generate.hpp"
#include "trellis/runtime/model/config.hpp"
#include "trellis/runtime/model/llama.hpp"
#include "trellis/runtime/model/variants.hpp"
#include "trellis/runtime/trace/metrics.hpp"
#include "trellis/runtime/trace/trace.hpp"
#include "trellis/topology/placement.hpp"
#include "trellis/topology/topology.hpp"
#include "trellis/transport/bootstrap.hpp"
#include "trellis/transport/collectives.hpp"

namespace trellis::runtime {

// Members are declared in the order they are built; each may refer to the ones above it.
struct PreparedJob {
  std::unique_ptr<CheckpointReader> reader;
  ModelConfig cfg;
  VariantSpec variant;
  topology::Topology topo;
  topology::Placement placement;
  EngineGrid grid;
  std::unique_ptr<transport::Transport> links;
  std::unique_ptr<transport::Group> tp_group;
  std::unique_ptr<Tracer> tracer;
  std::unique_ptr<transport::Group> timed;  // tp_group, tracing its all-reduces into tracer
  std::unique_ptr<kernels::Context> ctx;
  // A GPU model's TP all-reduce in GPU memory (NCCL; comm.tp_collectives), or null when it is
  // staged through tp_group. Between ctx and model: it goes after the model, before the stream.
  std::unique_ptr<transport::Group> device_tp;
  std::string tp_collectives;  // what the TP all-reduce of device tensors runs on, and why
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<StageCompute> stage;
  EngineOptions eo;  // scheduler limits (KV budget, context) filled; stop/live/serving not
  StartupTimes startup;  // this rank's own phases
  int me = 0, stage_index = 0, hosts = 1;
  ~PreparedJob();
};

// Uses o.model_dir/preset/seed/variant/variant_layers/pp/tp/pin_cores/cpu_sampler/tsem/sat
// and o.trace (whether events are kept). kInvalidArgument when pp x tp is not the world.
std::unique_ptr<PreparedJob> prepare_job(transport::Bootstrap& world, const Config& config, const GenerateOptions& o);

}  // namespace trellis::runtime
