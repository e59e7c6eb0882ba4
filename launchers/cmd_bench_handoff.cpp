// `trellis bench handoff`: the latency of one stage hand-off of a decode iteration's hidden
// state through CUDA IPC (the runtime's own CudaIpcSender/Receiver, ready signals over a
// shared-memory link), with each GPU signal (events, stream values), one way and as half a
// ping-pong, against a plain device -> device cudaMemcpy + synchronize of the same bytes and
// the host path's two copies, measured in the same run (issue 18: "within 1.2x"). Two ranks of
// one host under mpirun, each on a CUDA GPU (local rank modulo the visible GPUs, so one GPU
// serves both); refused with the reason otherwise.
#include <spdlog/spdlog.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "json_output.hpp"
#include "trellis/core/error.hpp"
#include "trellis/core/strings.hpp"
#include "trellis/kernels/library.hpp"
#include "trellis/runtime/engine/device.hpp"
#include "trellis/runtime/engine/stage_handoff.hpp"
#include "trellis/transport/collectives.hpp"

namespace trellis::launchers {
namespace {

struct HandoffOptions {
  int hidden = 4096;  // f32 values per row (Llama 3 8B's hidden size)
  int rows = 1;       // rows per hand-off: a decode step of this many sequences
  int iters = 0;      // 0: setting bench.iters
  bool json = false;
};

int run_handoff(Session& s, const HandoffOptions& o) {
  if (!runtime::cuda_ipc_built()) {
    if (s.is_root()) spdlog::error("bench handoff: cannot use CUDA IPC: {}", runtime::cuda_ipc_why_not());
    return 1;
  }
  if (!s.require_world(s.size() == 2,
                       fmt::format("bench handoff needs 2 ranks on one host; this job has {}. Run it as "
                                   "mpirun -np 2 trellis bench handoff",
                                   s.size())))
    return 1;
  auto& w = s.world();
  const auto hosts = transport::allgather_strings(w, w.hostname(), s.deadline());
  if (!s.require_world(hosts[0] == hosts[1],
                       fmt::format("bench handoff: CUDA IPC needs both ranks on one host (rank 0 on {}, rank 1 on {})",
                                   hosts[0], hosts[1])))
    return 1;
  const auto info = kernels::cuda_kernels_info();
  std::string refusal;
  runtime::DeviceBinding bind;
  try {
    bind = runtime::bind_device(runtime::DeviceChoice::kCuda, info, s.rank());
  } catch (const Error& e) {
    refusal = e.what();
  }
  if (w.any(!refusal.empty(), s.deadline())) {
    if (!refusal.empty()) spdlog::error("bench handoff: rank {}: {}", s.rank(), refusal);
    else if (s.is_root()) spdlog::error("bench handoff: the other rank has no usable GPU (its error names why)");
    return 1;
  }
  const std::size_t bytes = static_cast<std::size_t>(o.hidden) * static_cast<std::size_t>(o.rows) * sizeof(float);
  const int iters = o.iters > 0 ? o.iters : static_cast<int>(s.config.get_int("bench.iters"));
  const int warmup = static_cast<int>(s.config.get_int("bench.warmup"));
  const int peer = 1 - s.rank();
  auto links = transport::connect(transport::Backend::kShm, w, {peer}, s.config);
  const auto deadline = Deadline::after(s.config.get_duration("comm.deadline_ms") + std::chrono::seconds(iters / 100));
  const auto b = runtime::bench_cuda_handoff(links->link(peer), s.rank(), s.rank(), bind.gpu, bytes, iters, warmup,
                                             deadline);
  const bool ok = !w.any(!b.verified, s.deadline());
  if (!s.is_root()) return ok ? 0 : 1;
  const bool values = b.stream_value_missing.empty();
  // The engine's signal under comm.handoff_signal=auto: stream values where both ranks can.
  const runtime::HandoffTimes& engine = values ? b.stream_value : b.event;
  auto ratio = [&](double t) { return b.memcpy_s > 0 ? t / b.memcpy_s : 0.0; };
  const std::string gpu = bind.gpu < static_cast<int>(info.gpus.size())
                              ? info.gpus[static_cast<std::size_t>(bind.gpu)].name
                              : std::string("?");
  if (o.json) {
    nlohmann::json j = {{"gpu", gpu},
                        {"binding", bind.reason},
                        {"bytes", bytes},
                        {"rows", o.rows},
                        {"hidden", o.hidden},
                        {"iters", iters},
                        {"event_half_round_trip_us", b.event.half_round_trip_s * 1e6},
                        {"event_one_way_us", b.event.one_way_s * 1e6},
                        {"memcpy_d2d_us", b.memcpy_s * 1e6},
                        {"host_path_copies_us", b.host_copy_s * 1e6},
                        {"engine_signal", values ? "stream-value" : "event"},
                        {"ratio_one_way_to_memcpy", ratio(engine.one_way_s)},
                        {"ratio_half_round_trip_to_memcpy", ratio(engine.half_round_trip_s)},
                        {"within_1_2x_one_way", ratio(engine.one_way_s) > 0 && ratio(engine.one_way_s) <= 1.2},
                        {"verified", ok}};
    if (values) {
      j["stream_value_half_round_trip_us"] = b.stream_value.half_round_trip_s * 1e6;
      j["stream_value_one_way_us"] = b.stream_value.one_way_s * 1e6;
    } else {
      j["stream_value_missing"] = b.stream_value_missing;
    }
    std::cout << versioned_json(j) << "\n";
  } else {
    auto row = [&](const char* what, double t) {
      return fmt::format("  {:<62} {:>10}  ({:.2f}x the memcpy)\n", what, format_seconds(t), ratio(t));
    };
    std::cout << fmt::format("stage hand-off of {} ({} x {} f32) on {}, 2 processes, medians of {}:\n",
                             format_bytes(static_cast<double>(bytes)), o.rows, o.hidden, gpu, iters)
              << row("CUDA IPC, events: one way (send -> receiver synchronized)", b.event.one_way_s)
              << row("CUDA IPC, events: half a round trip", b.event.half_round_trip_s);
    if (values)
      std::cout << row("CUDA IPC, stream values: one way", b.stream_value.one_way_s)
                << row("CUDA IPC, stream values: half a round trip", b.stream_value.half_round_trip_s);
    else
      std::cout << fmt::format("  CUDA IPC, stream values: not run ({})\n", b.stream_value_missing);
    std::cout << fmt::format("  {:<62} {:>10}\n", "cudaMemcpyAsync device -> device + synchronize",
                             format_seconds(b.memcpy_s))
              << fmt::format("  {:<62} {:>10}\n", "host path: device -> host + host -> device (pinned)",
                             format_seconds(b.host_copy_s))
              << fmt::format("  engine signal (comm.handoff_signal=auto): {}; data {}\n",
                             values ? "stream-value" : "event", ok ? "verified" : "CORRUPT");
  }
  if (!ok) spdlog::error("bench handoff: the bytes arrived corrupted");
  return ok ? 0 : 1;
}

}  // namespace

Action define_bench_handoff(CLI::App& sub) {
  auto o = std::make_shared<HandoffOptions>();
  sub.add_option("--hidden", o->hidden, "f32 values per row (the model's hidden size)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  sub.add_option("--rows", o->rows, "Rows per hand-off (a decode step of this many sequences)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  sub.add_option("--iters", o->iters, "Timed round trips (default: setting bench.iters)")->check(CLI::NonNegativeNumber);
  sub.add_flag("--json", o->json, "Print JSON");
  return [o](Session& s) { return run_handoff(s, *o); };
}

}  // namespace trellis::launchers
