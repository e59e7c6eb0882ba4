// How a stage boundary hands the hidden state to the next stage (setting comm.stage_handoff,
// `--stage-handoff`):
//  * host: the sending stage copies it to host memory, transport::StageSender streams it over
//    the neighbours' link, the receiver copies it back onto its device (CPU stages: the only
//    path, without the copies).
//  * cuda-ipc (SiPipe §5.3 on one host): the receiving rank exports its own device hidden
//    state (the buffer its forward and its CUDA graphs read, allocated once for the largest
//    iteration) and two interprocess events, as CUDA IPC handles sent to the sender once at
//    start over the host link. Per iteration the sender copies its device hidden state
//    straight into it on its compute stream (the one copy of a hand-off) and records
//    "filled", then sends an 8-byte ready signal (no shapes: the receiver knows the rows from
//    its own schedule); the receiver's stream waits on that event before its forward. When
//    the receiver has enqueued everything that uses the hand-off it records "consumed" and
//    sends an 8-byte credit, and the sender's next copy waits for that event (the argument is
//    in stage_handoff.cpp).
//  * auto: cuda-ipc where both ranks of a boundary run CUDA stages on one host, host
//    elsewhere (across hosts, UCX with CUDA memory is not implemented: host path).
// How the two GPU streams of a cuda-ipc boundary order their work (comm.handoff_signal):
// `event` uses the two interprocess events above; `stream-value` has the streams write and
// wait on two 32-bit words in the receiver's device memory (the driver's stream memory
// operations: "filled = n + 1" behind the copy, "consumed = n + 1" behind the last use), which
// takes the event API off the path; `auto` is stream-value where the driver offers it, event
// otherwise. The host messages (ready, credit) and their deadlines are the same for both.
// The CUDA calls live in engine/cuda_handoff.cpp (CUDA builds; engine/cuda_handoff_none.cpp
// says "built without CUDA" otherwise). Every host wait has a deadline and a failure names
// the rank, its peer and the link; every IPC handle is closed on every exit path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "trellis/core/clock.hpp"
#include "trellis/transport/link.hpp"

namespace trellis::runtime {

struct EngineGrid;

enum class StageHandoff { kAuto, kHost, kCudaIpc };
// "auto", "host", "cuda-ipc"; throws kInvalidArgument naming `what` and the valid names.
StageHandoff parse_stage_handoff(std::string_view name, std::string_view what);
std::string_view to_string(StageHandoff h);

enum class HandoffSignal { kAuto, kEvent, kStreamValue };
// "auto", "event", "stream-value"; throws kInvalidArgument naming `what` and the valid names.
HandoffSignal parse_handoff_signal(std::string_view name, std::string_view what);
std::string_view to_string(HandoffSignal s);

// Whether this build can use CUDA IPC, and why not ("built without CUDA: ...").
bool cuda_ipc_built();
std::string cuda_ipc_why_not();

// The path of one boundary: stage `stage` -> stage + 1 at TP index `k`.
struct HandoffPlan {
  int stage = 0, k = 0, from = 0, to = 0;  // world ranks
  bool cuda_ipc = false;
  std::string reason;
  std::string describe() const;  // "stage hand-off 0 -> 1 (rank 0 -> rank 2): cuda-ipc (...)"
};

// Every boundary of the grid. `cuda_stages`: the job's stages run on CUDA GPUs (one device
// kind for the whole job, so both sides of a boundary agree). A mode of cuda-ipc that a
// boundary cannot use throws kUnsupported naming the boundary and why (a CPU stage, ranks on
// different hosts, a build without CUDA). Deterministic: every rank computes the same plan.
std::vector<HandoffPlan> plan_stage_handoffs(const EngineGrid& grid, StageHandoff mode, bool cuda_stages);

// Before anything loads: cuda-ipc on a build without CUDA or with run.device=cpu (`device`)
// can already be refused (pp > 1 only: one stage has no boundary).
void refuse_stage_handoff_early(StageHandoff mode, int pp, std::string_view device);

// Waits for a request with a deadline, naming `what` on failure (the engine's wait adds its
// failure flag; the default is Request::wait).
using HandoffWait = std::function<void(transport::Request&, Deadline, const std::string& what)>;

// One side of a CUDA IPC boundary. connect() runs the set-up exchange over `link` (the host
// link between the two ranks): the receiver allocates and exports, the sender opens and
// answers. Both sides return nullptr, together, when the set-up failed and `required` is
// false (auto falls back to the host path; `why` says what failed); with `required` they
// throw naming the rank, the peer and the failure.
class CudaIpcSender {
 public:
  struct Setup {
    transport::Link* link = nullptr;
    int rank = 0;           // this rank (for messages)
    int gpu = 0;            // this rank's CUDA device
    std::size_t bytes = 0;  // the largest hand-off this side will send
    bool required = false;  // comm.stage_handoff=cuda-ipc
    HandoffWait wait;       // empty: Request::wait
    // comm.handoff_signal: the receiver picks the signal and the sender follows it. A signal
    // named (not auto) makes a failed set-up an error on both sides, as `required` does.
    HandoffSignal signal = HandoffSignal::kAuto;
  };
  static std::unique_ptr<CudaIpcSender> connect(const Setup& s, Deadline deadline, std::string* why);
  ~CudaIpcSender();
  // Enqueues the copy of `bytes` from device memory `src` into the peer's hidden state on
  // `stream` (a cudaStream_t), behind the peer's last use of the previous hand-off, then
  // signals it. Waits (host) only for the credit of the previous hand-off, i.e. until the
  // receiver's host has enqueued everything that uses it.
  void send(const void* src, std::size_t bytes, void* stream, Deadline deadline);
  // After the last send: waits for the last credit and `stream`, closes the IPC handles, then
  // tells the receiver, which may then let its buffer go.
  void finish(void* stream, Deadline deadline);
  std::size_t sent() const;
  HandoffSignal signal() const;  // the one in use: event or stream-value

  struct Impl;

 private:
  explicit CudaIpcSender(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class CudaIpcReceiver {
 public:
  struct Setup {
    transport::Link* link = nullptr;
    int rank = 0;
    int gpu = 0;
    std::size_t bytes = 0;  // the largest hand-off the sender may send
    bool required = false;
    HandoffWait wait;
    // Where hand-offs land: device memory of `gpu`, the base of its own allocation (the IPC
    // handle maps whole allocations), at least `bytes`, neither freed nor moved until
    // finish() returned or this object is gone.
    void* dst = nullptr;
    HandoffSignal signal = HandoffSignal::kAuto;  // auto: stream-value where usable, else event
  };
  static std::unique_ptr<CudaIpcReceiver> connect(const Setup& s, Deadline deadline, std::string* why);
  ~CudaIpcReceiver();
  // Marks the previous hand-off as used (everything enqueued on `stream` so far) and credits
  // it; waits (host) for the next ready signal; enqueues on `stream` the wait for its copy.
  // Then `dst` holds `bytes` of it for whatever is enqueued next on `stream`.
  void receive(std::size_t bytes, void* stream, Deadline deadline);
  // After the last receive (and everything using it enqueued): credits it, waits for the
  // sender's end message (its handles are closed), then releases the events.
  void finish(void* stream, Deadline deadline);
  std::size_t received() const;
  HandoffSignal signal() const;
  const std::string& signal_reason() const;  // why this signal ("comm.handoff_signal=auto; ...")

  struct Impl;

 private:
  explicit CudaIpcReceiver(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// `trellis bench handoff`: two ranks of one host on CUDA devices hand `bytes` back and forth
// through CUDA IPC, once per signal (event, then stream-value where both ranks can use it):
// `iters` ping-pongs (rank_in_pair 0 starts), then `iters` one-way hand-offs timed from the
// sender's call to the receiver's host seeing the bytes land (one host: one monotonic clock).
// Then rank 0 alone times a plain cudaMemcpyAsync device -> device of the same bytes plus a
// stream synchronize, and the host path's two copies. Medians in seconds, on rank 0; throws
// kUnsupported with the reason without CUDA.
struct HandoffTimes {
  double half_round_trip_s = 0;  // half a ping-pong: two dependent hand-offs, one synchronize
  double one_way_s = 0;          // sender's send() called -> receiver's stream synchronized
  bool verified = false;         // the bytes arrived intact
};
struct HandoffBench {
  HandoffTimes event, stream_value;
  std::string stream_value_missing;  // why stream_value did not run ("" when it did)
  double memcpy_s = 0;     // cudaMemcpyAsync D2D + cudaStreamSynchronize of the same bytes (rank 0 only, the
                           // other process idle)
  double host_copy_s = 0;  // the host path's two copies: device -> host + host -> device
  bool verified = false;   // every run's bytes arrived intact
};
HandoffBench bench_cuda_handoff(transport::Link& link, int rank, int rank_in_pair, int gpu, std::size_t bytes,
                                int iters, int warmup, Deadline deadline);

}  // namespace trellis::runtime
