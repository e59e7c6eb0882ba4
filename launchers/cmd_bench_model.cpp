// `trellis bench model`: decode tokens/s at batch 1 of a whole model on this rank,
// against the memory-bandwidth limit measured in the same run (weight bytes streamed per
// token / STREAM triad bandwidth), and beside PyTorch eager running the same checkpoint
// through scripts/reference/torch_reference.py (also in the same run). Under mpirun with
// --batches it times TP groups in lock step and pipeline stages at once (group mode below).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "json_output.hpp"
#include "bench_linears.hpp"
#include "trellis/runtime/engine/device.hpp"
#include "trellis/core/clock.hpp"
#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"
#include "trellis/kernels/bandwidth.hpp"
#include "trellis/kernels/device_bench.hpp"
#include "trellis/kernels/ops.hpp"
#include "trellis/runtime/checkpoint/reader.hpp"
#include "trellis/runtime/model/llama.hpp"
#include "trellis/runtime/model/synthetic.hpp"
#include "trellis/runtime/study/variant_study.hpp"
#include "trellis/transport/collectives.hpp"

namespace trellis::launchers {
namespace {

struct BenchModelOptions {
  std::string preset = "llama-1b";
  std::string model;  // an existing checkpoint instead of the preset
  std::string dtype = "bf16";    // stored dtype of a generated checkpoint
  std::string weights = "bf16";  // trellis's in-memory weight type
  std::string torch_dtypes = "bf16,f32";
  std::string torch_impls = "reference";  // torch_reference.py --impl: reference, hf
  std::string workdir = "/tmp/trellis-bench-model";
  int prompt = 16;
  int steps = 32;
  bool torch = true;
  int torch_steps = 8;
  std::string python = "/usr/bin/python3";
  std::string torch_script;  // default: the source tree's scripts/reference/torch_reference.py
  std::string device = "cpu";
  std::string triad_size = "256MiB";
  std::string read_size = "512MiB";
  bool json = false;
  std::string batches;  // --batches: also time the forward at these batch sizes (calibration)
  int batch_reps = 3;
  int tp = 0;  // group mode (mpirun): ranks per TP group; 0: the whole world
  int microbatches = 0;  // group mode: microbatches in flight through the stages; 0: one per stage
  bool linears = true;  // also time the step's matmuls alone (CPU), interleaved with the steps
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::string ensure_checkpoint(const BenchModelOptions& o) {
  if (!o.model.empty()) return o.model;
  std::string stored = o.dtype == "f32" ? "F32" : "BF16";
  auto dir = std::filesystem::path(o.workdir) / fmt::format("{}-{}-seed1", o.preset, o.dtype);
  if (std::filesystem::exists(dir / "config.json")) return dir.string();
  spdlog::info("writing the {} checkpoint to {} (once; reused by later runs)", o.preset, dir.string());
  double t0 = now_seconds();
  runtime::write_synthetic_checkpoint(dir, runtime::model_preset(o.preset), stored, 1);
  spdlog::info("wrote it in {:.1f} s", now_seconds() - t0);
  return dir.string();
}

// Runs the PyTorch eager decode benchmark; returns its JSON, or null with a reason.
nlohmann::json run_torch(const BenchModelOptions& o, const std::string& dir, int threads, const std::string& dtype,
                         const std::string& impl) {
  std::string script = o.torch_script.empty()
                           ? std::string(TRELLIS_SOURCE_DIR) + "/scripts/reference/torch_reference.py"
                           : o.torch_script;
  std::string cmd =
      fmt::format("{} '{}' bench --model '{}' --prompt {} --steps {} --threads {} --dtype {} --device {} --impl {} 2>&1",
                  o.python, script, dir, o.prompt, o.torch_steps, threads, dtype, o.device, impl);
  spdlog::info("running: {}", cmd);
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return {{"error", "cannot start " + o.python}};
  std::string out, last;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) {
    out += buf;
    std::string line = buf;
    if (!line.empty() && line[0] == '{') last = line;
  }
  int rc = ::pclose(p);
  auto j = nlohmann::json::parse(last, nullptr, false);
  if (rc != 0 || j.is_discarded()) return {{"error", fmt::format("exit status {}: {}", rc, out.substr(0, 400))}};
  j["command"] = cmd.substr(0, cmd.size() - 5);
  return j;
}

// The forward at each batch size B of `o.batches`: B prompts of `o.prompt` tokens prefilled
// in one call, then `o.steps` decode steps of B tokens (median step). The sizes are
// interleaved over `o.batch_reps` rounds so a slow phase of a shared machine hits each
// alike; medians per size. The planner's calibration (sim/scripts/plan_validate.sh) turns
// these into linear-layer rates at the model's own shapes.
nlohmann::json time_batches(const BenchModelOptions& o, const runtime::CheckpointReader& reader,
                            const runtime::ModelConfig& cfg, transport::Group& group, const kernels::Context& ctx,
                            const runtime::LoadOptions& base) {
  std::vector<int> sizes;
  for (auto b : parse_int_list(o.batches, "--batches")) {
    if (b < 1) throw_error(ErrorCode::kInvalidArgument, "--batches: batch sizes must be >= 1 (got {})", b);
    sizes.push_back(static_cast<int>(b));
  }
  runtime::LoadOptions lo = base;
  lo.max_slots = *std::max_element(sizes.begin(), sizes.end());
  runtime::LlamaModel model(reader, cfg, group, ctx, lo);
  std::map<int, std::vector<double>> pre_s, step_s;
  for (int rep = 0; rep < o.batch_reps; ++rep)
    for (int b : sizes) {
      runtime::Batch pre;
      for (int q = 0; q < b; ++q) {
        for (int i = 0; i < o.prompt; ++i)
          pre.tokens.push_back(static_cast<std::int32_t>((i * 37 + q * 11 + 5) % cfg.vocab_size));
        pre.seqs.push_back({q, 0, o.prompt});
      }
      double t0 = now_seconds();
      model.forward(pre);
      pre_s[b].push_back(now_seconds() - t0);
      std::vector<std::int32_t> next(static_cast<std::size_t>(b));
      std::vector<std::int64_t> pos(static_cast<std::size_t>(b), o.prompt);
      std::vector<double> steps;
      for (int k = 0; k < o.steps; ++k) {
        for (int q = 0; q < b; ++q) next[static_cast<std::size_t>(q)] = (k * 13 + q * 7 + 1) % cfg.vocab_size;
        t0 = now_seconds();
        model.forward(runtime::Batch::decode(next, pos));
        steps.push_back(now_seconds() - t0);
        for (auto& p : pos) ++p;
      }
      step_s[b].push_back(median(steps));
    }
  nlohmann::json out = nlohmann::json::array();
  for (int b : sizes)
    out.push_back({{"batch", b}, {"prefill_tokens", b * o.prompt}, {"prefill_s", median(pre_s[b])},
                   {"decode_step_s", median(step_s[b])}, {"decode_context_mean", o.prompt + (o.steps - 1) / 2.0},
                   {"decode_step_s_reps", step_s[b]}});
  return out;
}

// ---- group mode: `mpirun -np N trellis bench model --batches ... [--tp T]` -------------
// The forward of a TP group in lock step with its real all-reduce (transport::make_group, as
// `trellis run` builds it), and with N > T the N/T pipeline stages of the layout, each
// computing its own layers and handing its hidden state to the next stage (the last stage's
// tokens back to stage 0) with --microbatches in flight, as the engine's pipeline does. The planner's calibration reads these as the
// rates of ranks that co-run (departure 16): coupled ranks on shared cores lose more than a
// division of the cores, and independent copies of the forward do not show it.

// One rank's stage of the forward, timed per call: embedding on stage 0, its layers with
// their all-reduces, the LM head and logits gather on the last stage. A later stage reads a
// fixed hidden state as its input (what it received is only waited for: the values do not
// change the time).
class StageStepper {
 public:
  explicit StageStepper(runtime::LlamaModel& m) : m_(m) {}
  std::int64_t hidden() const { return m_.config().hidden_size; }
  // The stage's output hidden state of the last step (what it hands to the next stage).
  std::span<const std::byte> output() const { return std::as_bytes(std::span<const float>(x_)); }
  double step(const runtime::Batch& b) {
    const std::int64_t T = b.total_tokens(), H = m_.config().hidden_size;
    x_.resize(static_cast<std::size_t>(T * H));
    if (!m_.has_embedding())
      for (std::size_t i = 0; i < x_.size(); ++i) x_[i] = 0.01f * static_cast<float>((i * 7919) % 101) - 0.5f;
    auto x = kernels::TensorView::matrix(x_.data(), kernels::DType::kF32, T, H);
    const double t0 = now_seconds();
    m_.run_stage(b, x);
    if (m_.has_lm_head()) {
      local_.resize(static_cast<std::size_t>(b.logit_rows() * m_.layout().vocab_local()));
      auto local = kernels::TensorView::matrix(local_.data(), kernels::DType::kF32, b.logit_rows(),
                                               m_.layout().vocab_local());
      m_.local_logits(b, x, local);
      m_.gather_logits(local, full_);
    }
    return now_seconds() - t0;
  }

 private:
  runtime::LlamaModel& m_;
  std::vector<float> x_, local_, full_;
};

// One all-reduce of `count` floats alone in the group, both ranks ready (median of 10).
double time_allreduce(transport::Group& group, std::size_t count) {
  if (group.size() == 1) return 0;
  std::vector<float> msg(count, 1.0f);
  std::vector<double> t;
  group.barrier();
  for (int k = 0; k < 10; ++k) {
    const double t0 = now_seconds();
    group.all_reduce(msg.data(), msg.size(), transport::DType::kF32);
    t.push_back(now_seconds() - t0);
  }
  return median(t);
}

// Where this rank sits: its stage of `pp`, its place in the stage's TP group of `tp`, and the
// microbatches `m` kept in flight.
struct PipeSeat {
  int pp = 1, tp = 1, stage = 0, tp_rank = 0, m = 1;
  bool first() const { return stage == 0; }
  bool last() const { return stage == pp - 1; }
};

// `rounds` rounds of `seat.m` microbatches of `b` sequences through this rank's stage, as the
// engine's pipeline runs them: a later stage waits for the hidden state of the stage before
// it, stage 0 for the sampled tokens of the last stage (after the first round), and every
// rank of a stage talks to the same TP rank of its neighbours. `len` new tokens per sequence
// (the prompt, or 1 in decode) at positions from `pos`, advancing by one per round. Returns
// the time of each of this rank's forward calls — its waits are not in them, but the CPU
// its waiting partners take while it computes is.
std::vector<double> pipeline_rounds(Session& s, StageStepper& st, const PipeSeat& seat, int b, int len,
                                    std::int64_t pos, int rounds, int vocab) {
  const int prev = (seat.stage - 1) * seat.tp + seat.tp_rank, next = (seat.stage + 1) * seat.tp + seat.tp_rank;
  const int head = seat.tp_rank;  // stage 0's rank that takes this TP rank's tokens back
  std::vector<std::byte> inbox;
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(b));
  std::vector<double> times;
  for (int r = 0; r < rounds; ++r)
    for (int j = 0; j < seat.m; ++j) {
      runtime::Batch batch;
      for (int q = 0; q < b; ++q) {
        for (int i = 0; i < len; ++i) batch.tokens.push_back(static_cast<std::int32_t>((i * 37 + q * 11 + r * 13 + 5) % vocab));
        batch.seqs.push_back({j * b + q, pos + r, len});
      }
      if (!seat.first()) {
        inbox.resize(static_cast<std::size_t>(b) * len * st.hidden() * sizeof(float));
        s.world().recv(prev, j, inbox, s.deadline());
      } else if (r > 0 && seat.pp > 1) {
        s.world().recv((seat.pp - 1) * seat.tp + seat.tp_rank, 1000 + j, std::as_writable_bytes(std::span(tokens)),
                       s.deadline());
      }
      times.push_back(st.step(batch));
      if (!seat.last())
        s.world().send(next, j, st.output(), s.deadline());
      else if (seat.pp > 1 && r + 1 < rounds)
        s.world().send(head, 1000 + j, std::as_bytes(std::span(tokens)), s.deadline());
    }
  return times;
}

// This rank's timings at every size of --batches (sequences per microbatch): prefill and
// decode step (medians over --batch-reps interleaved rounds, every rank of the world starting
// each size together), and one all-reduce of the decode step's (and the prefill's) message
// alone in the TP group (the part of the step the planner charges from the link, not from
// the rate).
nlohmann::json time_group(Session& s, const BenchModelOptions& o, runtime::LlamaModel& model, transport::Group& group,
                          const std::vector<int>& sizes, const PipeSeat& seat) {
  const auto& cfg = model.config();
  StageStepper stage(model);
  std::map<int, std::vector<double>> pre_s, step_s, ar_s, ar_pre_s;
  for (int rep = 0; rep < o.batch_reps; ++rep)
    for (int b : sizes) {
      s.world().barrier(s.deadline());
      pre_s[b].push_back(median(pipeline_rounds(s, stage, seat, b, o.prompt, 0, 1, cfg.vocab_size)));
      s.world().barrier(s.deadline());
      step_s[b].push_back(median(pipeline_rounds(s, stage, seat, b, 1, o.prompt, o.steps, cfg.vocab_size)));
      ar_s[b].push_back(time_allreduce(group, static_cast<std::size_t>(b) * cfg.hidden_size));
      ar_pre_s[b].push_back(time_allreduce(group, static_cast<std::size_t>(b) * o.prompt * cfg.hidden_size));
    }
  // All-reduces in one step of this stage: two per layer, and the embedding's on stage 0.
  const int per_step = group.size() > 1 ? 2 * (model.last_layer() - model.first_layer()) + (model.has_embedding() ? 1 : 0) : 0;
  nlohmann::json out = nlohmann::json::array();
  for (int b : sizes)
    out.push_back({{"batch", b}, {"prefill_tokens", b * o.prompt}, {"prefill_s", median(pre_s[b])},
                   {"decode_step_s", median(step_s[b])}, {"decode_context_mean", o.prompt + (o.steps - 1) / 2.0},
                   {"decode_step_s_reps", step_s[b]}, {"allreduce_s", median(ar_s[b])},
                   {"allreduce_prefill_s", median(ar_pre_s[b])}, {"allreduces_per_step", per_step}});
  return out;
}

int run_bench_group(Session& s, const BenchModelOptions& o) {
  const int tp = o.tp > 0 ? o.tp : s.size();
  if (!s.require_world(s.size() % tp == 0 && !o.batches.empty(),
                       fmt::format("bench model with {} ranks: --tp {} must divide them and --batches is required "
                                   "(the group mode times the forward at those sizes)", s.size(), tp)))
    return 1;
  const int pp = s.size() / tp;
  const PipeSeat seat{pp, tp, s.rank() / tp, s.rank() % tp, o.microbatches > 0 ? o.microbatches : pp};
  if (s.is_root()) ensure_checkpoint(o);  // written once, by one rank
  s.world().barrier(s.deadline());
  const std::string dir = ensure_checkpoint(o);
  auto reader = runtime::open_checkpoint(dir);
  auto cfg = runtime::parse_model_config(reader->config_json().value_or("{}"), dir + "/config.json");
  const auto place = runtime::StagePlace::of(s.rank(), tp, pp, cfg.num_layers);
  kernels::Context ctx = runtime::cpu_context(s.config);
  // One TP group per stage (world ranks stage * tp ... + tp - 1), built as `trellis run`
  // builds them: make_group is collective, so every rank makes every stage's group in order.
  std::unique_ptr<transport::Group> group;
  for (int st = 0; st < pp; ++st) {
    std::vector<int> members;
    for (int i = 0; i < tp; ++i) members.push_back(st * tp + i);
    auto g = tp == 1 ? (st == place.stage ? transport::make_single_group(s.rank()) : nullptr)
                     : transport::make_group(s.world(), members, transport::GroupOptions::from_config(s.config), s.config);
    if (st == place.stage) group = std::move(g);
  }
  std::vector<int> sizes;
  for (auto b : parse_int_list(o.batches, "--batches")) {
    if (b < 1) throw_error(ErrorCode::kInvalidArgument, "--batches: batch sizes must be >= 1 (got {})", b);
    sizes.push_back(static_cast<int>(b));
  }
  runtime::LoadOptions lo;
  lo.first_layer = place.first_layer;
  lo.last_layer = place.last_layer;
  lo.max_slots = seat.m * *std::max_element(sizes.begin(), sizes.end());
  lo.max_seq_len = o.prompt + o.steps + 1;
  lo.window_bytes = s.config.get_size("comm.coll_shm_window");
  lo.weight_dtype = o.weights == "bf16" ? runtime::ElemType::kBF16 : runtime::ElemType::kF32;
  runtime::LlamaModel model(*reader, cfg, *group, ctx, lo);
  nlohmann::json mine = {{"rank", s.rank()}, {"stage", place.stage}, {"tp_rank", place.tp_rank},
                         {"first_layer", place.first_layer}, {"last_layer", place.last_layer},
                         {"embedding", model.has_embedding()}, {"lm_head", model.has_lm_head()},
                         {"allreduce", group->describe()}, {"batches", time_group(s, o, model, *group, sizes, seat)}};
  auto all = transport::allgather_strings(s.world(), mine.dump(), s.deadline());
  if (!s.is_root()) return 0;
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : all) ranks.push_back(nlohmann::json::parse(r));
  nlohmann::json j = {{"model", dir}, {"weights", o.weights}, {"threads", ctx.threads()}, {"world", s.size()},
                      {"tp", tp}, {"pp", pp}, {"microbatches", seat.m}, {"prefill_tokens", o.prompt}, {"steps", o.steps}, {"ranks", ranks}};
  if (o.json) {
    std::cout << versioned_json(j) << "\n";
    return 0;
  }
  std::cout << fmt::format("model {} on {} ranks (tp {} x pp {}, {} microbatches in flight, {} threads each)\n", dir,
                           s.size(), tp, pp, seat.m, ctx.threads());
  for (const auto& r : ranks)
    for (const auto& b : r["batches"])
      std::cout << fmt::format("  rank {} stage {}: batch {:>4}: prefill {:.4f} s, decode step {:.3f} ms, all-reduce {:.1f} us\n",
                               r["rank"].get<int>(), r["stage"].get<int>(), b["batch"].get<int>(),
                               b["prefill_s"].get<double>(), 1e3 * b["decode_step_s"].get<double>(),
                               1e6 * b["allreduce_s"].get<double>());
  return 0;
}

int run_bench_model(Session& s, const BenchModelOptions& o) {
  if (s.size() > 1) {
    if (o.device != "cpu")
      throw_error(ErrorCode::kInvalidArgument, "bench model --device {}: the group mode (under mpirun) times CPU ranks only",
                  o.device);
    return run_bench_group(s, o);
  }
  const bool cuda = o.device == "cuda";
  if (cuda && !o.batches.empty())
    throw_error(ErrorCode::kInvalidArgument, "bench model: --batches times the CPU forward; drop it with --device cuda");
  auto ctxp = cuda ? std::make_unique<kernels::Context>(kernels::Device::kCuda, 0)
                   : std::make_unique<kernels::Context>(runtime::cpu_context(s.config));
  const kernels::Context& ctx = *ctxp;
  const std::string dir = ensure_checkpoint(o);  // after the context: a missing GPU is said first
  auto reader = runtime::open_checkpoint(dir);
  auto cfg = runtime::parse_model_config(reader->config_json().value_or("{}"), dir + "/config.json");
  // The ceilings, measured in this run: on the CPU, STREAM triad and the read-only stream with
  // the decode's threads; on a GPU, a device-to-device copy and the read-only stream there.
  // `triad` holds the copy on a GPU (labelled so below): both count bytes read + written.
  kernels::TriadResult triad, read;
  if (cuda) {
    const kernels::DeviceBandwidth bw =
        kernels::measure_device_bandwidth(ctx, std::max<std::size_t>(parse_size(o.read_size, "--read-size"), 64 << 20), 10);
    triad.median_bytes_per_s = bw.copy_median_bytes_per_s;
    triad.best_bytes_per_s = bw.copy_best_bytes_per_s;
    read.median_bytes_per_s = bw.read_median_bytes_per_s;
    read.best_bytes_per_s = bw.read_best_bytes_per_s;
  } else {
    triad = kernels::measure_triad(ctx, parse_size(o.triad_size, "--triad-size"), 10);
    // The ceiling of a kernel that only reads its weights (triad also writes): same threads.
    read = kernels::measure_read(ctx, parse_size(o.read_size, "--read-size"), 10);
  }

  auto group = transport::make_single_group(0);
  runtime::LoadOptions lo;
  lo.max_seq_len = o.prompt + o.steps + 1;
  lo.window_bytes = s.config.get_size("comm.coll_shm_window");
  lo.weight_dtype = o.weights == "bf16" ? runtime::ElemType::kBF16 : runtime::ElemType::kF32;
  // --weights native, or the model.weights_format setting, keeps GGUF Q4_1/Q8_0 quantised.
  lo.weights_format = runtime::parse_weights_format(
      o.weights == "native" ? std::string("native") : s.config.get_string("model.weights_format"),
      "model.weights_format");
  double t0 = now_seconds();
  runtime::LlamaModel model(*reader, cfg, *group, ctx, lo);
  const double load_s = now_seconds() - t0;

  runtime::Batch pre;
  for (int i = 0; i < o.prompt; ++i) pre.tokens.push_back(static_cast<std::int32_t>((i * 37 + 5) % cfg.vocab_size));
  pre.seqs = {{0, 0, o.prompt}};
  t0 = now_seconds();
  auto logits = model.forward(pre);
  const double prefill_s = now_seconds() - t0;
  std::vector<double> step_s;
  // CPU only: on a GPU the matmuls are enqueued, and a pass would time the launches.
  std::optional<LinearsPass> linears;
  if (o.linears && !cuda) linears.emplace(ctx, model.decode_linears());
  std::int64_t pos = o.prompt;
  for (int k = 0; k < o.steps; ++k) {
    // Greedy next token keeps the run a real decode loop.
    std::int32_t next = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    t0 = now_seconds();
    logits = model.forward(runtime::Batch::decode({&next, 1}, {&pos, 1}));
    step_s.push_back(now_seconds() - t0);
    ++pos;
    // Interleaved step by step, so a slow phase of a shared machine hits both alike; it
    // streams the same weights as the step, so the next step finds the caches as a step left them.
    if (linears) linears->run();
  }
  const double tok_s = 1.0 / median(step_s);
  const double bytes = static_cast<double>(model.decode_bytes_per_token());
  const double limit = triad.median_bytes_per_s / bytes;
  const double read_limit = read.median_bytes_per_s / bytes;
  nlohmann::json batches;
  if (!o.batches.empty()) {
    lo.max_seq_len = o.prompt + o.steps + 1;
    batches = time_batches(o, *reader, cfg, *group, ctx, lo);
  }
  nlohmann::json torch = nlohmann::json::array();
  // PyTorch on a GPU gets its default, every core (its host-side work is threaded too).
  const int torch_threads = cuda ? static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) : ctx.threads();
  if (o.torch)
    for (const auto& impl : split(o.torch_impls, ','))
      for (const auto& d : split(o.torch_dtypes, ','))
        torch.push_back(run_torch(o, dir, torch_threads, d, impl));

  nlohmann::json j = {{"model", dir}, {"params_M", cfg.parameter_count() / 1e6}, {"stored", o.dtype}, {"weights", o.weights},
                      {"quantized_weights", model.has_quantized_weights()},
                      {"threads", ctx.threads()}, {"device", o.device},
                      {cuda ? "copy_GBps_median" : "triad_GBps_median", triad.median_bytes_per_s / 1e9},
                      {cuda ? "copy_GBps_best" : "triad_GBps_best", triad.best_bytes_per_s / 1e9},
                      {"decode_bytes_per_token", bytes},
                      {"limit_tokens_per_s", limit}, {"decode_tokens_per_s", tok_s},
                      {"fraction_of_limit", tok_s / limit}, {"read_GBps_median", read.median_bytes_per_s / 1e9},
                      {"read_GBps_best", read.best_bytes_per_s / 1e9}, {"read_limit_tokens_per_s", read_limit},
                      {"fraction_of_read_limit", tok_s / read_limit}, {"prefill_tokens", o.prompt},
                      {"prefill_s", prefill_s}, {"load_s", load_s}, {"steps", o.steps}, {"torch", torch},
                      {"huge_pages", !cuda && ctx.huge_pages()}, {"weight_pages", model.weight_pages()}};
  if (!o.batches.empty()) j["batches"] = batches;
  if (linears) j["linears"] = linears->report(read.median_bytes_per_s, median(step_s));
  if (o.json) {
    std::cout << versioned_json(j) << "\n";
    return 0;
  }
  std::cout << fmt::format("model {} ({:.0f}M params, {} weights, {}), batch 1, {} decode steps after a {}-token prompt\n",
                           dir, cfg.parameter_count() / 1e6, o.weights,
                           cuda ? fmt::format("GPU {}", ctx.gpu()) : fmt::format("{} threads", ctx.threads()), o.steps,
                           o.prompt);
  std::cout << fmt::format("  read-only stream (median of 10)  {:8.2f} GB/s   (the ceiling of reading the weights)\n",
                           read.median_bytes_per_s / 1e9);
  std::cout << fmt::format("  {} (median of 10)   {:8.2f} GB/s\n", cuda ? "GPU copy (r + w) " : "triad bandwidth ",
                           triad.median_bytes_per_s / 1e9);
  std::cout << fmt::format("  weight bytes per decode token    {:8.1f} MB\n", bytes / 1e6);
  if (!cuda)  // the read and triad buffers ask for the same pages as the weights
    std::cout << fmt::format("  memory                           {}\n", model.weight_pages());
  std::cout << fmt::format("  read limit / triad limit         {:8.2f} / {:.2f} tokens/s\n", read_limit, limit);
  std::cout << fmt::format("  trellis decode (median step)     {:8.2f} tokens/s  = {:.0f}% of the read limit, {:.0f}% of triad's\n",
                           tok_s, 100 * tok_s / read_limit, 100 * tok_s / limit);
  if (j.contains("linears")) {
    const auto& l = j["linears"];
    std::cout << fmt::format("  the step's matmuls alone         {:8.2f} tokens/s  = {:.0f}% of the read limit ({:.1f} MB); "
                             "{:.0f}% of a step is outside them\n",
                             l["tokens_per_s"].get<double>(), 100 * l["fraction_of_read_limit"].get<double>(),
                             l["weight_bytes_per_token"].get<double>() / 1e6,
                             100 * (1 - l["share_of_step"].get<double>()));
    for (const auto& [name, t] : l["by_type"].items())
      std::cout << fmt::format("    {:<5} {:3d} matrices {:7.1f} MB   {:6.3f} ms   = {:.0f}% of the read-only stream\n", name,
                               t["matrices"].get<int>(), t["bytes"].get<double>() / 1e6, 1e3 * t["s"].get<double>(),
                               100 * t["fraction_of_read"].get<double>());
  }
  for (const auto& t : torch) {
    if (t.contains("decode_tokens_per_s"))
      std::cout << fmt::format("  PyTorch eager {:<9}, {:<4}     {:8.2f} tokens/s  (torch {})\n", t.value("impl", "reference"),
                               t.value("dtype", "?"), t["decode_tokens_per_s"].get<double>(), t.value("torch_version", "?"));
    else
      std::cout << fmt::format("  PyTorch eager: {}\n", t.value("error", "not run"));
  }
  if (!o.torch) std::cout << "  PyTorch eager: skipped (--no-torch)\n";
  std::cout << fmt::format("  (prefill of {} tokens {:.3f} s, load {:.1f} s)\n", o.prompt, prefill_s, load_s);
  for (const auto& b : batches)
    std::cout << fmt::format("  batch {:>4}: prefill of {} tokens {:.4f} s, decode step {:.3f} ms\n", b["batch"].get<int>(),
                             b["prefill_tokens"].get<int>(), b["prefill_s"].get<double>(),
                             1e3 * b["decode_step_s"].get<double>());
  return 0;
}

}  // namespace

Action define_bench_model(CLI::App& sub) {
  auto o = std::make_shared<BenchModelOptions>();
  sub.add_option("--preset", o->preset, "Model preset to generate (see make-model --list)")->capture_default_str();
  sub.add_option("--model", o->model, "Use this checkpoint instead of a preset");
  sub.add_option("--dtype", o->dtype, "Stored dtype of a generated checkpoint: bf16 or f32")
      ->check(CLI::IsMember({"bf16", "f32"}))->capture_default_str();
  sub.add_option("--weights", o->weights,
                 "trellis weights in memory: bf16, f32, or native (a GGUF file's Q4_1/Q8_0 kept quantised)")
      ->check(CLI::IsMember({"bf16", "f32", "native"}))->capture_default_str();
  sub.add_option("--torch-dtypes", o->torch_dtypes, "PyTorch runs, comma-separated: bf16, f32")->capture_default_str();
  sub.add_option("--torch-impls", o->torch_impls,
                 "PyTorch implementations, comma-separated: reference (scripts/reference/torch_reference.py's "
                 "forward), hf (transformers' AutoModelForCausalLM, where installed)")
      ->check([](const std::string& v) {
        for (const auto& i : split(v, ','))
          if (i != "reference" && i != "hf") return std::string("unknown implementation '" + i + "' (reference, hf)");
        return std::string();
      })
      ->capture_default_str();
  sub.add_option("--workdir", o->workdir, "Where generated checkpoints are kept")->capture_default_str();
  sub.add_option("--prompt", o->prompt, "Prompt tokens before decoding")->check(CLI::PositiveNumber)->capture_default_str();
  sub.add_option("--steps", o->steps, "Timed decode steps")->check(CLI::PositiveNumber)->capture_default_str();
  sub.add_flag("--torch,!--no-torch", o->torch, "Also time PyTorch eager on the same checkpoint")->capture_default_str();
  sub.add_option("--torch-steps", o->torch_steps, "Timed PyTorch decode steps")->check(CLI::PositiveNumber)->capture_default_str();
  sub.add_option("--python", o->python, "Python with torch")->capture_default_str();
  sub.add_option("--torch-script", o->torch_script,
                 "The PyTorch reference script (default: scripts/reference/torch_reference.py of the source tree)");
  sub.add_option("--device", o->device,
                 "cpu (ceilings: triad and a read stream) or cuda (GPU 0; ceilings: device copy and read stream; "
                 "PyTorch on the GPU too)")
      ->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  sub.add_option("--triad-size", o->triad_size, "Bytes per triad array")->capture_default_str();
  sub.add_option("--read-size", o->read_size, "Bytes of the read-only stream's buffer (the decode's ceiling)")
      ->capture_default_str();
  sub.add_flag("--json", o->json, "Print JSON");
  sub.add_flag("--linears,!--no-linears", o->linears,
               "Also time the decode step's matmuls alone, interleaved with the steps (CPU; JSON 'linears')")
      ->capture_default_str();
  sub.add_option("--batches", o->batches,
                 "Also time prefill and decode of the forward at these batch sizes, e.g. 1,4,16 (JSON 'batches')");
  sub.add_option("--batch-reps", o->batch_reps, "Interleaved rounds over --batches (medians kept)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  sub.add_option("--tp", o->tp,
                 "Under mpirun: ranks per TP group (default: all); the world / tp groups are pipeline stages, "
                 "each timing its own layers at once")
      ->check(CLI::PositiveNumber);
  sub.add_option("--microbatches", o->microbatches,
                 "Under mpirun with stages: microbatches in flight (default: one per stage; 1: the stages take turns)")
      ->check(CLI::PositiveNumber);
  return [o](Session& s) { return run_bench_model(s, *o); };
}

}  // namespace trellis::launchers
