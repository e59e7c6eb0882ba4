// `trellis bench handoff`: the latency of one stage hand-off of a decode iteration's hidden
// state through CUDA IPC (the runtime's own CudaIpcSender/Receiver, ready signals over a
// shared-memory link), against a plain device -> device cudaMemcpy of the same bytes and the
// host path's two copies, measured in the same run (issue 18: "within 1.2x"). Two ranks of
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
  const double ratio = b.memcpy_s > 0 ? b.handoff_s / b.memcpy_s : 0;
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
                        {"handoff_us", b.handoff_s * 1e6},
                        {"memcpy_d2d_us", b.memcpy_s * 1e6},
                        {"host_path_copies_us", b.host_copy_s * 1e6},
                        {"ratio_to_memcpy", ratio},
                        {"within_1_2x", ratio > 0 && ratio <= 1.2},
                        {"verified", ok}};
    std::cout << versioned_json(j) << "\n";
  } else {
    std::cout << fmt::format("stage hand-off of {} ({} x {} f32) on {}, 2 processes, medians of {}:\n",
                             format_bytes(static_cast<double>(bytes)), o.rows, o.hidden, gpu, iters)
              << fmt::format("  CUDA IPC hand-off (copy, event, ready signal; half a round trip) {}\n",
                             format_seconds(b.handoff_s))
              << fmt::format("  cudaMemcpyAsync device -> device + synchronize                  {}  (ratio {:.2f})\n",
                             format_seconds(b.memcpy_s), ratio)
              << fmt::format("  host path: device -> host + host -> device (pinned)             {}\n",
                             format_seconds(b.host_copy_s))
              << fmt::format("  data {}\n", ok ? "verified" : "CORRUPT");
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
