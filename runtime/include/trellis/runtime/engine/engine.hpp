// The engine: pipelined generation over a p x t grid of ranks with SiPipe's techniques.
//
// Roles (one process per rank; threads inside):
//  * forward executor (every rank, the caller's thread): per iteration takes the prepared
//    input, receives the previous stage's hidden state (stage > 0), runs this stage's blocks
//    (the TP all-reduces are inside), then streams the hidden state to the same TP index of
//    the next stage, or, on the last stage, hands its vocabulary shard of the logits to the
//    sampler (transposed to the column-wise layout).
//  * CPU executor (every rank, --tsem): reads scheduling outputs from the host's ring
//    channel and prepares iteration i+1 into the other input version while the forward of i
//    runs (TokenSafe, SiPipe §5.2). Without TSEM the forward executor prepares inline.
//  * sampler (last stage, TP index 0, --cpu-sampler): receives the t logits shards of each
//    iteration straight into their rows of one column-wise buffer (no all-gather), samples
//    with a thread pool and incremental penalties (§5.1), sends tokens to the scheduler.
//    Without it, the last stage's forward executor samples inline (naive PP).
//  * scheduler (rank 0): continuous batching over p microbatch groups; dispatches p
//    iterations, then iteration n+p when the tokens of n are back (§4.2).
//  * relay (lowest rank of every host but rank 0's): copies scheduling outputs that arrive
//    over the transport into its host's ring (SiPipe's per-host BIC replica, §6).
// Stage hand-off: transport::StageSender/StageReceiver in structure-aware mode (--sat;
// receives posted ahead from the batch sizes in the scheduling outputs already read) or the
// baseline mode (--no-sat); between CUDA stages of one host, CUDA IPC (stage_handoff.hpp:
// device slots exchanged once, a ready signal per iteration).
//
// Errors: a bad request fails alone (Scheduler); a thread that fails stops this rank's
// engine with its error; every wait is bounded by `deadline` and names the peer waited for.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "trellis/core/clock.hpp"
#include "trellis/runtime/engine/stage_handoff.hpp"
#include "trellis/runtime/scheduler/scheduler.hpp"
#include "trellis/runtime/trace/trace.hpp"
#include "trellis/runtime/workload/workload.hpp"
#include "trellis/transport/bootstrap.hpp"
#include "trellis/transport/link.hpp"

namespace trellis::runtime {

class LiveQueue;

// One iteration's input to a stage, as the CPU executor prepares it (one of the two TSEM
// versions). Vectors keep their capacity between iterations, so steady state allocates
// nothing; a GPU build binds these buffers to captured graphs per (version, batch size).
struct StageInput {
  std::int64_t iteration = -1;
  int group = 0;
  bool stop = false;
  std::vector<std::int32_t> tokens;     // all input tokens, sequence after sequence
  std::vector<std::int32_t> positions;  // position of every token
  std::vector<std::int32_t> slots;      // per sequence: KV slot
  std::vector<std::int32_t> starts;     // per sequence: position of its first token
  std::vector<std::int32_t> lengths;    // per sequence: tokens in this iteration
  std::vector<std::int32_t> fresh;      // per sequence: 1 on its first iteration
  std::vector<std::int32_t> prompt;     // per sequence: 1 when its tokens are prompt tokens
  std::vector<std::int32_t> sampled;    // per sequence: 1 when a token is drawn for it (a
                                        // prefill chunk before the last is not)
  std::vector<std::int32_t> columns;    // per sequence: its sampler column in the group
  std::vector<SamplingParams> params;   // per sequence: settings (meaningful when fresh)
  // SWIFT (runtime/swift; schedule.hpp): per sequence whether every token gets a logits row
  // and top candidates come back instead of a sample; its token tree (offset into `parents`,
  // or -1 for a chain) with K/V start and visible prefix; the iteration's skip set and the
  // KV moves to apply before it.
  std::vector<std::int32_t> candidates;
  std::vector<std::int32_t> tree_offsets, kv_pos, prefix;
  std::vector<std::int32_t> parents;
  std::vector<std::uint8_t> skip;
  std::vector<KvCopy> moves;
  int n_tokens() const { return static_cast<int>(tokens.size()); }
  int n_seqs() const { return static_cast<int>(slots.size()); }
  int n_sampled() const;   // sequences that draw a token
  int logit_rows() const;  // rows of logits: 1 per sampled sequence, every token of a candidates one
};

// What a stage computes; the Llama adapter (make_llama_stage) is the real one. Called from
// the forward executor only.
class StageCompute {
 public:
  virtual ~StageCompute() = default;
  virtual int hidden_size() const = 0;
  virtual int vocab_size() const = 0;
  // This rank's vocabulary rows [begin, end) of the logits (last stage).
  virtual int vocab_begin() const = 0;
  virtual int vocab_end() const = 0;
  // Runs this stage's blocks on x[T, H] (in place; stage 0 embeds in.tokens first and ignores
  // x's contents). Records a span per block on `trace`.
  virtual void forward(const StageInput& in, float* x, Tracer& trace) = 0;
  // Last stage: this rank's logits for the last token of every sampled sequence and every
  // token of a candidates one, row-major [logit_rows, vocab_end - vocab_begin]. Not called
  // when there are no rows.
  virtual void logits(const StageInput& in, const float* x, float* out) = 0;
  // Two-phase logits for a stage that computes asynchronously (a GPU; SiPipe §5.1):
  // start_logits enqueues the LM head and the copy of its rows to host memory in `slot`
  // (0 or 1) and returns at once; finish_logits waits for that copy and returns the rows, as
  // logits() writes them, valid until the slot's next start. The engine starts the next
  // microbatch's forward in between when its input is already there, so the copy and the
  // sampler hand-off overlap GPU work. Only called when logits_async() is true.
  virtual bool logits_async() const { return false; }
  virtual void start_logits(const StageInput& in, const float* x, int slot);
  virtual const float* finish_logits(int slot);
  // The device stage hand-off (stage_handoff.hpp). A stage whose hidden state lives on a
  // CUDA GPU gives the GPU and the cudaStream_t its ops run on; -1 / nullptr: a host stage.
  virtual int cuda_gpu() const { return -1; }
  virtual void* cuda_stream() const { return nullptr; }
  // With `in` set, forward() takes x from device_hidden() (filled by the engine on the stream
  // before it) instead of from host memory; with `out`, it leaves x there and does not copy it
  // to host memory. Only called on a stage whose cuda_gpu() >= 0.
  virtual void set_device_hidden_io(bool in, bool out) {
    (void)in;
    (void)out;
  }
  // The device buffer of the hidden state, [rows, hidden_size()] f32, grown to `rows` if
  // needed (never shrunk or moved otherwise); forward() of `rows` tokens uses this same
  // buffer. The returned pointer is the base of its allocation (the CUDA IPC hand-off exports
  // it once, grown for the largest iteration, and the previous stage writes into it).
  virtual void* device_hidden(int rows) {
    (void)rows;
    return nullptr;
  }
  // Called when the forward executor is about to wait for its next input: a stage may do the
  // next step's host work now, on a guess of that input (a GPU stage fills the other CUDA graph
  // of its pair with every sequence one token further, run.graph_prefill), while its device
  // still runs this step. It must not change what the steps already enqueued compute, and a
  // wrong guess may cost only time: forward() checks the guess against the input it gets.
  virtual void prepare_next(Tracer& trace) { (void)trace; }
};

// Where every rank sits. rank_of[stage * tp + k] = world rank; host_of[world rank] = host id.
struct EngineGrid {
  int pp = 1, tp = 1;
  std::vector<int> rank_of;
  std::vector<int> host_of;
  int stage_of(int rank) const;
  int tp_of(int rank) const;
  int rank_at(int stage, int k) const { return rank_of[static_cast<std::size_t>(stage * tp + k)]; }
  int sampler_rank() const { return rank_at(pp - 1, 0); }
  static EngineGrid contiguous(int pp, int tp, std::vector<int> host_of = {});
};

// The peers `rank` exchanges messages with (stage neighbours, sampler, scheduler, relays);
// symmetric over the grid, for transport::connect.
std::vector<int> engine_peers(const EngineGrid& grid, int rank);

// How the engine's threads wait for each other (setting run.host_waits): block on condition
// variables and sleep between polls (cores left to other ranks), or poll and yield for the
// first ~20 ms of a wait, then block (a wake-up in about a microsecond instead of tens; an
// idle server does not keep cores busy). auto: spin where the stages run on CUDA GPUs and
// this rank has at least 4 cores of its own (its forward thread waits on the GPU, not the
// CPU); block otherwise.
enum class HostWaits { kAuto, kBlock, kSpin };
HostWaits parse_host_waits(std::string_view name, std::string_view what);
// Whether auto spins for a rank on CUDA GPUs (`cuda`) with `host_ranks` ranks on its host;
// `why` says how many cores it counted.
bool host_waits_spin(HostWaits mode, bool cuda, int host_ranks, std::string* why);

struct EngineOptions {
  bool cpu_sampler = true;  // SiPipe §5.1; false: sample inline on the last stage
  bool tsem = true;         // §5.2; false: prepare inputs inline before each forward
  bool sat = true;          // §5.3; false: structure-unaware stage transfers
  // How each stage boundary hands over the hidden state (comm.stage_handoff): CUDA IPC
  // between CUDA stages of one host under auto, the host path otherwise (stage_handoff.hpp).
  StageHandoff stage_handoff = StageHandoff::kAuto;
  // How the two GPU streams of a CUDA IPC boundary order their work (comm.handoff_signal).
  HandoffSignal handoff_signal = HandoffSignal::kAuto;
  HostWaits host_waits = HostWaits::kAuto;  // run.host_waits
  int sampler_threads = 2;
  // Logits rows one iteration may have (SWIFT verifies trees and scores drafts: many rows per
  // sequence); at least scheduler.max_seqs_per_group.
  int max_logit_rows = 0;
  SchedulerConfig scheduler;  // groups must equal pp
  Millis deadline{30000};     // longest any single wait
  std::uint32_t ring_slots = 16;
  std::uint32_t ring_slot_bytes = 1u << 20;
  std::string job = "job";    // unique per job: names the shared-memory channels
  bool keep_trace = false;
  const std::atomic<bool>* stop = nullptr;  // set (e.g. by SIGINT): stop admitting, drain, exit
  // pid of every world rank on this host (0: on another host or unknown). The engine checks
  // them every 100 ms, so a dead neighbour is named even while no wait faces it.
  std::vector<std::int64_t> host_pids;
  // The ranks whose heartbeats stopped (Bootstrap::silent_ranks), checked with host_pids
  // every 100 ms: a rank stopped on another host, or one behind a cut link, is then named
  // first-hand within the deadline, not by whichever wait on it (or on a rank waiting on it)
  // times out first. Unset: not checked.
  std::function<std::vector<transport::Bootstrap::SilentRank>()> silent_ranks;
  // The progress thread's sleep between passes over the links (setting
  // run.progress_interval_us). Each pass wakes a thread that shares the cores with the
  // forward; see docs/runtime.md, "Time to first token".
  std::chrono::microseconds progress_interval{50};
  // While no send is in flight the thread backs off, doubling its sleep up to this (setting
  // run.progress_idle_us), and wakes as soon as a send or receive is posted. Equal to
  // progress_interval: the fixed pace of old.
  std::chrono::microseconds progress_idle_max{1000};
  // Serving (every rank): the scheduler may stay idle for any time, sending heartbeats
  // (ScheduleOutput::kIdle) every deadline/3; waits for upstream work are then bounded by
  // the time since the last heartbeat instead of since the wait began.
  bool serving = false;
  // Rank 0 when serving: requests come from here instead of `requests` (not owned).
  LiveQueue* live = nullptr;
  // Rank 0, batch runs: called on the scheduler thread once per request, as soon as it is
  // over (finished, failed, rejected or cancelled), with its final result; `trellis run
  // --out` writes the line there, so what finished survives a rank that dies later. It
  // runs between iterations, so it should be quick; an exception fails the run.
  std::function<void(const Request&, const RequestResult&)> on_finished;
};

struct EngineResult {
  // Rank 0 only: per request, as the scheduler saw it, plus wait/reject notes.
  std::vector<RequestResult> results;
  std::vector<std::string> notes;
  bool interrupted = false;  // stopped by EngineOptions::stop before all requests finished
  double start_s = 0, wall_s = 0;
  std::uint64_t iterations = 0;
  std::optional<SwiftReport> swift;  // rank 0, when the run could draft
};

// Runs the engine on this rank until the scheduler says stop. `links` reaches every peer of
// engine_peers(grid, rank) and may be used from several threads (the engine serialises its
// calls). `requests` matter on rank 0 only. `tracer` receives this rank's spans.
EngineResult run_engine(int rank, const EngineGrid& grid, transport::Transport& links, StageCompute& stage,
                        const std::vector<Request>& requests, const EngineOptions& options, Tracer& tracer);

}  // namespace trellis::runtime
