// A job set up for generation: everything trellis run and trellis serve share below the
// launcher (see job.hpp), split out of generate() so both drive the same engine.
#include "trellis/runtime/engine/job.hpp"

#include <sched.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "trellis/core/error.hpp"
#include "trellis/core/process.hpp"
#include "trellis/core/progress.hpp"
#include "trellis/kernels/library.hpp"
#include "trellis/runtime/checkpoint/reader.hpp"
#include "trellis/runtime/engine/device.hpp"
#include "trellis/runtime/engine/layer_split.hpp"
#include "trellis/runtime/engine/llama_stage.hpp"
#include "trellis/runtime/engine/warmup.hpp"
#include "trellis/runtime/model/synthetic.hpp"
#include "trellis/runtime/swift/settings.hpp"
#include "trellis/topology/discovery.hpp"
#include "trellis/transport/collectives.hpp"
#include "trellis/transport/nccl_group.hpp"
#include "trellis/transport/selection.hpp"

namespace trellis::runtime {
namespace {

// Routes each peer to the transport its link class asked for.
class MultiTransport final : public transport::Transport {
 public:
  transport::Backend backend() const override { return transport::Backend::kMpi; }
  transport::Capabilities capabilities() const override { return {}; }
  transport::Link& link(int peer) override {
    auto it = route_.find(peer);
    if (it == route_.end()) throw_error(ErrorCode::kInvalidArgument, "engine links: rank {} was never connected", peer);
    return it->second->link(peer);
  }
  void progress() override {
    for (auto& t : owned_) t->progress();
  }
  void add(std::unique_ptr<transport::Transport> t, const std::vector<int>& peers) {
    for (int p : peers) route_[p] = t.get();
    owned_.push_back(std::move(t));
  }

 private:
  std::vector<std::unique_ptr<transport::Transport>> owned_;
  std::map<int, transport::Transport*> route_;
};

topology::Topology gather(transport::Bootstrap& world, Deadline deadline) {
  auto mine = topology::discover_local_host();
  topology::AllgatherFn fn = [&](const std::string& text) { return transport::allgather_strings(world, text, deadline); };
  return topology::gather_topology(mine, world.rank(), static_cast<int>(::getpid()), allowed_cpus(), fn);
}

std::unique_ptr<transport::Transport> connect_links(transport::Bootstrap& world, const Config& config,
                                                   const EngineGrid& grid, const topology::Placement& pl,
                                                   const topology::Topology& topo) {
  auto policy = transport::SelectionPolicy::from_config(config);
  // Every rank derives every rank's links, so all agree on which backends to connect.
  std::map<transport::Backend, std::vector<int>> mine;
  std::set<transport::Backend> used;
  for (int r = 0; r < world.size(); ++r) {
    for (int peer : engine_peers(grid, r)) {
      auto b = transport::choose_for_pair(pl, topo, r, peer, policy).backend;
      used.insert(b);
      if (r == world.rank()) mine[b].push_back(peer);
    }
  }
  if (world.rank() == 0) {
    // Once per run, so nobody has to grep per-rank logs to learn whether the fast path is in
    // use: the policy's choice per TP group and stage boundary (as `trellis topo` shows it),
    // then what this job actually connects, counted over every rank's engine links.
    std::map<transport::Backend, int> pairs;
    for (int r = 0; r < world.size(); ++r)
      for (int peer : engine_peers(grid, r))
        if (r < peer) ++pairs[transport::choose_for_pair(pl, topo, r, peer, policy).backend];
    std::string connected;
    for (auto [b, n] : pairs) connected += fmt::format("{}{} x {}", connected.empty() ? "" : ", ", transport::to_string(b), n);
    spdlog::info("links (--transport {}):\n{}  connected rank pairs: {}", policy.describe(),
                 transport::format_link_plan(transport::plan_links(pl, policy)), connected.empty() ? "none" : connected);
  }
  auto multi = std::make_unique<MultiTransport>();
  for (auto b : used) {
    auto peers = mine[b];
    multi->add(transport::connect(b, world, peers, config), peers);
    spdlog::debug("rank {}: {} link(s) over {}", world.rank(), peers.size(), transport::to_string(b));
  }
  return multi;
}

std::string make_job_token(transport::Bootstrap& world, Deadline deadline) {
  std::string tok;
  if (world.rank() == 0) tok = fmt::format("{:x}{:x}", static_cast<unsigned>(::getpid()), std::random_device{}());
  std::vector<std::byte> b(tok.size());
  if (!tok.empty()) std::memcpy(b.data(), tok.data(), tok.size());
  world.broadcast(b, 0, deadline);
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

// SWIFT's settings and whether this job can draft at all. run.swift on a job that cannot is
// refused with the reason before anything loads; otherwise a job that can draft still lets
// prompts ask for it with their "swift" field.
SwiftConfig swift_config(const Config& config, const ModelConfig& cfg, const VariantSpec& variant, bool use_gpu) {
  SwiftConfig c;
  c.enabled = config.get_bool("run.swift");
  auto& s = c.settings;
  s.gamma = static_cast<int>(config.get_int("swift.gamma"));
  s.bayes_interval = static_cast<int>(config.get_int("swift.bayes_interval"));
  s.max_steps = static_cast<int>(config.get_int("swift.max_steps"));
  s.patience = static_cast<int>(config.get_int("swift.patience"));
  s.target_matchness = config.get_double("swift.target_matchness");
  s.skip_ratio = config.get_double("swift.skip_ratio");
  s.epsilon = config.get_double("swift.epsilon");
  s.max_draft = static_cast<int>(config.get_int("swift.max_draft"));
  s.reenter_acceptance = config.get_double("swift.reenter_acceptance");
  s.ratio_tolerance = config.get_double("swift.ratio_tolerance");
  s.ratio_step = config.get_double("swift.ratio_step");
  s.min_skip_ratio = config.get_double("swift.min_skip_ratio");
  s.acceptance_window = static_cast<int>(config.get_int("swift.acceptance_window"));
  s.min_speedup = config.get_double("swift.min_speedup");
  s.speedup_window = static_cast<int>(config.get_int("swift.speedup_window"));
  s.seed = static_cast<std::uint64_t>(config.get_int("swift.seed"));
  c.max_tree = static_cast<int>(config.get_int("swift.max_tree"));
  c.calibration_steps = static_cast<int>(config.get_int("swift.calibration_steps"));
  c.num_layers = cfg.num_layers;
  swift::validate(s);  // names the setting out of range (skip_ratio must be inside (0, 1), ...)
  std::string why;
  if (variant.kind != Variant::kStandard)
    why = fmt::format("the {} variant rewires the residual stream; SWIFT drafts the standard model",
                      to_string(variant.kind));
  else if (use_gpu)
    why = "the GPU backend has no token-tree attention kernel yet; run SWIFT with --device cpu";
  else if (config.get_string("model.weights_format") == "native")
    why = "model.weights_format=native multiplies block-quantised weights with a kernel for one row and another "
          "for several, which round differently, so a verified token could differ from plain decoding; use "
          "model.weights_format=dequant (the default)";
  else {
    try {
      swift::check_model_skippable(cfg.num_layers, s);
    } catch (const Error& e) {
      why = e.what();
    }
  }
  c.allowed = why.empty();
  c.invariant = c.enabled || config.get_bool("kernels.batch_invariant");
  if (c.enabled && !c.allowed) throw_error(ErrorCode::kUnsupported, "--swift: {}", why);
  return c;
}

std::string tp_collectives_mode(const Config& config) {
  std::string mode = config.get_string("comm.tp_collectives");
  if (mode != "auto" && mode != "nccl" && mode != "host")
    throw_error(ErrorCode::kInvalidArgument, "comm.tp_collectives: '{}' is not one of auto, nccl, host", mode);
  return mode;
}

// The TP all-reduce of a GPU model (comm.tp_collectives): NCCL in GPU memory when every rank
// of each TP group has a GPU of its own, else staged through host memory with the reason
// logged. Collective over the world: every rank builds every stage's communicator in order.
void setup_device_collectives(transport::Bootstrap& world, const Config& config, PreparedJob& j, bool use_gpu,
                              Deadline setup) {
  const std::string mode = tp_collectives_mode(config);
  const auto& grid = j.grid;
  const int me = world.rank(), stage = grid.stage_of(me);
  if (!use_gpu || grid.tp == 1) {
    if (mode == "nccl" && grid.tp > 1)
      throw_error(ErrorCode::kUnsupported, "comm.tp_collectives=nccl: the model runs on the CPU (--device), NCCL needs GPU tensors");
    j.tp_collectives = grid.tp == 1 ? "none (one rank per stage)" : "host memory (a CPU model)";
    return;  // nothing to say on a CPU run: its groups are logged above
  }
  std::vector<int> gpus;
  for (const auto& g : transport::allgather_strings(world, std::to_string(j.ctx->gpu()), setup)) gpus.push_back(std::stoi(g));
  std::string why;
  for (int s = 0; s < grid.pp && why.empty(); ++s) {
    std::vector<int> members;
    for (int k = 0; k < grid.tp; ++k) members.push_back(grid.rank_at(s, k));
    why = transport::nccl_group_obstacle(members, grid.host_of, gpus);
    if (!why.empty()) why = fmt::format("TP group of stage {}: {}", s, why);
  }
  if (why.empty() && !transport::nccl_group_built()) why = "this build has no NCCL";
  if (mode == "host") why = "comm.tp_collectives=host";
  if (!why.empty()) {
    if (mode == "nccl") throw_error(ErrorCode::kUnsupported, "comm.tp_collectives=nccl cannot run this layout: {}", why);
    j.tp_collectives = fmt::format("staged through host memory ({})", why);
  } else {
    const bool no_nvlink = config.get_bool("comm.no_nvlink");
    for (int s = 0; s < grid.pp; ++s) {
      std::vector<int> members;
      for (int k = 0; k < grid.tp; ++k) members.push_back(grid.rank_at(s, k));
      auto g = transport::make_nccl_group(world, members, j.ctx->gpu(), j.ctx->cuda_stream(),
                                          config.get_duration("comm.deadline_ms"), no_nvlink);
      if (s == stage) j.device_tp = std::move(g);
    }
    j.model->use_device_group(*j.device_tp);
    j.tp_collectives = fmt::format("{}{}", j.device_tp->describe(), no_nvlink ? ", NCCL_P2P_DISABLE=1 (--no-nvlink)" : "");
  }
  if (me == 0) spdlog::info("TP all-reduce of GPU tensors: {}", j.tp_collectives);
}

}  // namespace

PreparedJob::~PreparedJob() = default;

std::unique_ptr<PreparedJob> prepare_job(transport::Bootstrap& world, const Config& config, const GenerateOptions& o) {
  auto j = std::make_unique<PreparedJob>();
  const Deadline setup = Deadline::after(config.get_duration("comm.connect_timeout_ms") * 3);
  // A rank that goes silent (a link cut, a stopped process) is named first-hand after half
  // the deadline, by the world collective waiting on it during the start-up below and by the
  // engine's watchdog later (bootstrap.hpp): before the waits on it time out at the deadline,
  // as a stopped host-mate is.
  world.watch_liveness(config.get_duration("comm.deadline_ms") / 2);
  const double t_begin = now_seconds();
  check_layout_ranks(o.pp, o.tp, world.size());
  (void)tp_collectives_mode(config);  // a bad value is refused before anything is loaded
  const HostWaits host_waits = parse_host_waits(config.get_string("run.host_waits"), "run.host_waits");
  // The device, before anything is read: --device cuda without a GPU is refused here on every
  // rank, naming the CUDA runtime's reason. One device for the whole job (auto takes the CPU
  // unless every rank sees a GPU), because a TP group's ranks must agree on their buffers.
  const DeviceChoice device_choice = parse_device_choice(config.get_string("run.device"), "run.device (--device)");
  kernels::CudaKernelsInfo cuda_info;
  if (device_choice != DeviceChoice::kCpu) cuda_info = kernels::cuda_kernels_info();
  std::string device_refusal;
  try {
    (void)bind_device(device_choice, cuda_info, 0);
  } catch (const Error& e) {
    device_refusal = e.what();
  }
  if (world.any(!device_refusal.empty(), setup))
    throw_error(ErrorCode::kUnsupported, "{}",
                device_refusal.empty() ? std::string("--device cuda: another rank has no usable GPU (its error names why)")
                                       : fmt::format("rank {}: {}", world.rank(), device_refusal));
  const bool use_gpu = device_choice != DeviceChoice::kCpu && !world.any(cuda_info.gpus.empty(), setup);
  // The model: a checkpoint directory, or a synthetic preset generated in memory.
  auto& reader = j->reader;
  auto& cfg = j->cfg;
  if (!o.model_dir.empty()) {
    reader = open_checkpoint(o.model_dir);
    auto text = reader->config_json();
    if (!text) throw_error(ErrorCode::kNotFound, "{}: no config.json", reader->describe());
    cfg = parse_model_config(*text, reader->describe() + "/config.json");
  } else {
    cfg = model_preset(o.preset);
    const std::string& d = o.preset_dtype;
    if (d != "f32" && d != "bf16" && d != "f16")
      throw_error(ErrorCode::kInvalidArgument, "--preset-dtype {}: expected f32, bf16 or f16", d);
    reader = make_synthetic_reader(cfg, d == "f32" ? "F32" : d == "bf16" ? "BF16" : "F16", o.seed);
  }
  // Checked before anything is loaded: a variant the model or layout cannot host fails here.
  const VariantSpec variant = j->variant = parse_variant_spec(o.variant, o.variant_layers, cfg.num_layers);
  validate_variant(variant, cfg, o.tp);
  const SwiftConfig swift = swift_config(config, cfg, variant, use_gpu);
  // Topology -> placement -> grid.
  // A status line on rank 0's terminal through the phases that take seconds (quiet otherwise).
  Progress progress("start-up", 4, world.rank() == 0 && o.progress);
  progress.step("topology and placement");
  j->topo = gather(world, setup);
  const auto& topo = j->topo;
  topology::PlaceOptions popt;
  popt.kind = topology::RankKind::kCpu;
  j->placement = topology::place(
      stage_model_shape(*reader, cfg, config.get_string("run.layer_split"), "run.layer_split (--layer-split)"), topo,
      o.pp, o.tp, popt);
  const auto& pl = j->placement;
  auto& grid = j->grid;
  grid.pp = o.pp;
  grid.tp = o.tp;
  for (int s = 0; s < o.pp; ++s)
    for (int k = 0; k < o.tp; ++k) grid.rank_of.push_back(pl.rank_at(s, k));
  for (const auto& rp : pl.ranks) grid.host_of.push_back(rp.host);
  const int me = world.rank(), stage = grid.stage_of(me);
  if (o.pin_cores && !pl.ranks[static_cast<std::size_t>(me)].cores.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : pl.ranks[static_cast<std::size_t>(me)].cores) CPU_SET(c, &set);
    sched_setaffinity(0, sizeof set, &set);
  }
  // Links, then one TP group per stage (collective: every rank builds each in order).
  progress.step("links and TP groups");
  j->links = connect_links(world, config, grid, pl, topo);
  auto& tp_group = j->tp_group;
  const auto link_plan = transport::plan_links(pl, transport::SelectionPolicy::from_config(config));
  for (int s = 0; s < o.pp; ++s) {
    std::vector<int> members;
    for (int k = 0; k < o.tp; ++k) members.push_back(grid.rank_at(s, k));
    // --transport also steers the TP all-reduce (unless comm.coll_algorithm names one).
    auto go = transport::follow_transport(transport::GroupOptions::from_config(config),
                                          link_plan.tp_groups[static_cast<std::size_t>(s)]);
    auto g = o.tp == 1 ? (s == stage ? transport::make_single_group(me) : nullptr)
                       : transport::make_group(world, members, go, config, grid.host_of);
    if (s == stage) tp_group = std::move(g);
  }
  // The collective algorithm each TP group settled on (make_group picks it from the members'
  // hosts and the comm.coll_* settings), logged once beside the links.
  auto algos = transport::allgather_strings(world, tp_group->describe(), setup);
  if (me == 0)
    for (int s = 0; s < o.pp; ++s)
      spdlog::info("TP group of stage {} all-reduce: {}", s, algos[static_cast<std::size_t>(grid.rank_at(s, 0))]);
  const double t_connected = now_seconds();
  j->tracer = std::make_unique<Tracer>(!o.trace.empty());
  auto& tracer = *j->tracer;
  j->timed = make_timed_group(*tp_group, tracer);
  auto& timed = j->timed;
  // This rank's shard.
  auto& eo = j->eo;
  eo.cpu_sampler = o.cpu_sampler;
  eo.tsem = o.tsem;
  eo.host_waits = host_waits;
  eo.sat = o.sat;
  eo.sampler_threads = static_cast<int>(config.get_int("run.sampler_threads"));
  eo.deadline = config.get_duration("comm.deadline_ms");
  eo.ring_slot_bytes = static_cast<std::uint32_t>(config.get_size("run.channel_slot_bytes"));
  if (me < static_cast<int>(topo.ranks.size())) {
    eo.host_pids.assign(topo.ranks.size(), 0);
    for (const auto& r : topo.ranks)
      if (r.host == topo.ranks[static_cast<std::size_t>(me)].host && r.rank >= 0 &&
          r.rank < static_cast<int>(topo.ranks.size()))
        eo.host_pids[static_cast<std::size_t>(r.rank)] = r.pid;
  }
  eo.silent_ranks = [&world] { return world.silent_ranks(); };
  eo.keep_trace = !o.trace.empty();
  eo.progress_interval = std::chrono::microseconds(std::max<std::int64_t>(1, config.get_int("run.progress_interval_us")));
  eo.progress_idle_max = std::chrono::microseconds(std::max<std::int64_t>(1, config.get_int("run.progress_idle_us")));
  eo.stop = o.stop;
  auto& sc = eo.scheduler;
  sc.groups = o.pp;
  sc.max_seqs_per_group = std::max<int>(1, static_cast<int>((config.get_int("run.max_seqs") + o.pp - 1) / o.pp));
  sc.max_context = static_cast<int>(std::min<std::int64_t>(config.get_int("run.max_context"), cfg.max_position_embeddings));
  sc.max_iteration_tokens = static_cast<int>(config.get_int("run.max_iteration_tokens"));
  sc.prefill_chunk = static_cast<int>(config.get_int("run.prefill_chunk"));
  if (sc.prefill_chunk > sc.max_iteration_tokens)
    throw_error(ErrorCode::kInvalidArgument,
                "run.prefill_chunk (--prefill-chunk) of {} tokens is more than an iteration holds "
                "(run.max_iteration_tokens {})", sc.prefill_chunk, sc.max_iteration_tokens);
  sc.swift = swift;
  sc.swift.tp = o.tp;
  // A SWIFT iteration has a logits row per tree node or scored token of each sequence.
  if (swift.allowed)
    eo.max_logit_rows = sc.max_seqs_per_group * std::max(swift.settings.gamma, swift.max_tree);
  auto layers = pl.layers_per_stage();
  if (me == 0 && o.pp > 1)
    spdlog::info("layers per stage {}: {}", fmt::join(layers, "/"),
                 !pl.model.split.empty() ? std::string("as run.layer_split gives them")
                 : pl.model.head_cost > 0
                     ? fmt::format("the last stage's LM head has the parameters of {:.1f} layers "
                                   "(run.layer_split=auto)", pl.model.head_cost)
                     : std::string("even (run.layer_split=even; auto would weigh the LM head)"));
  LoadOptions lo;
  lo.first_layer = 0;
  for (int s = 0; s < stage; ++s) lo.first_layer += layers[static_cast<std::size_t>(s)];
  lo.last_layer = lo.first_layer + layers[static_cast<std::size_t>(stage)];
  lo.max_slots = o.pp * sc.max_seqs_per_group;
  lo.max_seq_len = sc.max_context;
  // Two buffers of the largest forward (max_iteration_tokens rows), at most the setting.
  lo.window_bytes = std::min<std::size_t>(config.get_size("comm.coll_shm_window"),
                                          2 * static_cast<std::size_t>(sc.max_iteration_tokens) *
                                              static_cast<std::size_t>(cfg.hidden_size) * sizeof(float));
  // native keeps GGUF Q4_1/Q8_0 blocks quantised (llama.cpp's arithmetic, faster); the default
  // dequant is the one whose tokens are identical across layouts.
  lo.weights_format = parse_weights_format(config.get_string("model.weights_format"), "model.weights_format");
  if (use_gpu) {
    // Bind to the GPU of this rank's place among its host's ranks (as the NCCL link does).
    int local = 0;
    for (int r = 0; r < me; ++r) local += grid.host_of[static_cast<std::size_t>(r)] == grid.host_of[static_cast<std::size_t>(me)];
    const DeviceBinding bind = bind_device(DeviceChoice::kCuda, cuda_info, local);
    spdlog::log(me == 0 ? spdlog::level::info : spdlog::level::debug, "rank {}: device cuda, {}", me, bind.reason);
    j->ctx = std::make_unique<kernels::Context>(kernels::Device::kCuda, bind.gpu);
    j->ctx->set_graph_one_copy(config.get_bool("kernels.graph_one_copy"));
  } else {
    if (me == 0 && device_choice == DeviceChoice::kAuto && !cuda_info.gpus.empty())
      spdlog::info("device: cpu (--device auto and not every rank sees a GPU)");
    const int spin_us = static_cast<int>(config.get_int("kernels.spin_us"));
    j->ctx = std::make_unique<kernels::Context>(cpu_context(config));
    // Ranks of one host that together run more kernel threads than it has CPUs (unbound ranks,
    // each taking every core): a spinning worker would hold a core another rank's thread
    // needs, so they sleep at once instead.
    int local_ranks = 0;
    for (int h : grid.host_of) local_ranks += h == grid.host_of[static_cast<std::size_t>(me)];
    const int host_cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (spin_us > 0 && j->ctx->pool().spin_us() > 0 && local_ranks * j->ctx->threads() > host_cpus) {
      spdlog::debug("rank {}: {} ranks x {} kernel threads on {} CPUs: kernel workers sleep without spinning", me,
                    local_ranks, j->ctx->threads(), host_cpus);
      j->ctx = std::make_unique<kernels::Context>(cpu_context(config, 0));
    }
    // SWIFT verifies a token inside a tree of several rows; it must get the logits plain
    // decoding gives it alone (kernels/context.hpp).
    if (config.get_bool("kernels.batch_invariant") || swift.enabled) {
      j->ctx->set_batch_invariant(true);
      if (me == 0) spdlog::info("kernels: batch-invariant matmuls{}", swift.enabled ? " (run.swift)" : "");
    }
  }
  progress.step(fmt::format("loading each rank's shard (rank 0: layers {}-{})", lo.first_layer, lo.last_layer - 1));
  j->model = std::make_unique<LlamaModel>(*reader, cfg, *timed, *j->ctx, lo);
  auto& model = *j->model;
  if (me == 0 && !model.weight_pages().empty()) spdlog::info("rank 0: {}", model.weight_pages());
  if (me == 0 && o.tp > 1)
    spdlog::info("TP all-reduce buffers: {}",
                 model.window_rows() > 0
                     ? fmt::format("a registered window, all-reduced in place for forwards of up to {} tokens "
                                   "(comm.coll_shm_window)",
                                   model.window_rows())
                     : lo.window_bytes == 0
                         ? std::string("private, copied through the group (comm.coll_shm_window=0)")
                         : fmt::format("private, copied through the group ({} has no shared memory to register)",
                                       tp_group->describe()));
  setup_device_collectives(world, config, *j, use_gpu, setup);
  VariantOptions vo;  // lp loads the paper's per-layer shards from the same checkpoint
  vo.progress = transport::ProgressOptions::from_config(config);
  vo.reader = reader.get();
  vo.load = lo;
  LlamaStageOptions so;
  so.cuda_graphs = config.get_bool("run.cuda_graphs");
  so.graph_prefill = config.get_bool("run.graph_prefill");
  if (use_gpu && world.rank() == 0)
    spdlog::info("cuda graphs: {}", !so.cuda_graphs ? "off (run.cuda_graphs=false)"
                                    : o.tp > 1   ? "off (a TP all-reduce goes through host memory, which a graph cannot hold)"
                                    : variant.kind != Variant::kStandard
                                        ? "off (the variant's wiring is run op by op)"
                                        : so.graph_prefill
                                        ? "decode steps replayed per batch size, each filled while the step before runs"
                                        : "decode steps replayed per batch size (filled after the tokens: "
                                          "run.graph_prefill=false)");
  j->stage = make_llama_stage(model, variant, config.get_duration("comm.deadline_ms"), std::move(vo), so);
  if (world.rank() == 0 && !variant_is_exact(variant.kind))
    spdlog::warn("model variant nocomm on layers {}-{}: every TP all-reduce removed, outputs are WRONG on purpose "
                 "(the communication-free upper bound)", variant.range_first, variant.range_last - 1);
  else if (world.rank() == 0 && variant.kind != Variant::kStandard)
    spdlog::info("model variant {} on layers {}-{}", to_string(variant.kind), variant.range_first,
                 variant.range_last - 1);
  // KV budget in token positions: the tightest rank decides (every rank holds every
  // running sequence's KV for its layers).
  const double kv_per_token = 2.0 * (lo.last_layer - lo.first_layer) * model.layout().kv_heads * cfg.head_dim * 4.0;
  double tokens = static_cast<double>(config.get_size("run.kv_budget")) / std::max(1.0, kv_per_token);
  tokens = -world.max(-tokens, setup);
  sc.kv_budget_tokens = std::min<std::int64_t>(static_cast<std::int64_t>(tokens),
                                               static_cast<std::int64_t>(lo.max_slots) * sc.max_context);
  eo.job = make_job_token(world, setup);
  const double t_loaded = now_seconds();
  // Start-up work that the first request would otherwise pay inside its TTFT (see
  // warmup.hpp), done here, before the scheduler's clock starts. The TP group runs it
  // together (its all-reduces); stages run theirs independently.
  WarmupShape ws;
  ws.prefill_tokens = static_cast<int>(std::max<std::int64_t>(
      0, std::min(config.get_int("run.warmup_tokens"), static_cast<std::int64_t>(sc.max_iteration_tokens))));
  ws.decode_rows = sc.max_seqs_per_group;
  ws.slots = lo.max_slots;
  ws.max_context = sc.max_context;
  ws.first_stage = stage == 0;
  ws.last_stage = stage == o.pp - 1;
  progress.step("warm-up");
  const WarmupTimes warm = warm_up_stage(*j->stage, ws);
  progress.done();
  tracer.reset();  // the warm-up's all-reduces are not the run's
  StartupTimes startup{t_connected - t_begin, t_loaded - t_connected, warm.total_s(), warm.prefill_s, ws.prefill_tokens};
  j->startup = startup;
  j->me = me;
  j->stage_index = stage;
  j->hosts = static_cast<int>(topo.hosts.size());
  return j;
}

}  // namespace trellis::runtime
