// LiveQueue: the thread-safe door between a front end (the HTTP server of `trellis serve`)
// and the engine's scheduler thread on rank 0, for requests that arrive while it runs.
//
// Front end side (any thread):
//  * submit() checks a request against the engine's limits (context, KV budget, tokens per
//    iteration: the reasons a request can never run, answered at once) and the queue bound
//    (max_waiting: a full queue is refused, never grown), then queues it. The engine takes
//    it at its next iteration boundary; from then on `sink` receives the request's tokens
//    as they are sampled, and one final event with the finish reason.
//  * cancel() ends a request early (client gone, stop string seen): a waiting request is
//    dropped, a running one leaves its group and frees its KV reservation at the next
//    iteration boundary (at once when its group has nothing in flight). Its sink gets a
//    final event (finish_reason "cancelled" unless the caller named another).
//  * begin_drain() refuses new submissions (kStopping); shutdown() also lets the engine
//    stop once nothing is open: it cancels what is still open with the given reason, then
//    tells every rank to stop.
//  * stats() is a consistent snapshot for /metrics and /health.
//
// Engine side (the scheduler thread only): set_ready() publishes the limits and opens the
// door; take() collects what arrived; emit() delivers events (sinks run on the scheduler
// thread: they must only hand the event on, never block); set_failed() fails every open
// request with the engine's error and refuses new ones.
//
// Threading: every public member is safe to call from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "trellis/runtime/scheduler/scheduler.hpp"
#include "trellis/runtime/workload/request.hpp"

namespace trellis::runtime {

// One step of one request's life, as the front end sees it.
struct LiveEvent {
  std::int64_t id = 0;
  std::vector<std::int32_t> tokens;  // tokens sampled since the last event (usually one)
  bool finished = false;             // last event of this request
  // When finished: "stop" (a stop id was sampled), "length" (max_tokens or the context),
  // "cancelled" (or the reason given to cancel()), or, with failed set, the error.
  std::string finish_reason;
  bool failed = false;
  double time_s = 0;  // engine clock (core/clock.hpp now_seconds()) when it happened
};
using LiveSink = std::function<void(const LiveEvent&)>;

// Per-stage time shares since the engine started (stage 0 and the last stage are measured
// on their TP rank 0: rank 0 and the sampler rank).
struct StageShare {
  int stage = 0;
  double busy = 0, comm = 0, wait = 0;  // fractions of wall time
};

struct LiveStats {
  bool ready = false;      // set_ready() was called: every rank has loaded and warmed up
  bool draining = false;   // begin_drain() or shutdown() was called
  bool failed = false;     // the engine failed; `failure` says why
  std::string failure;
  int running = 0, waiting = 0;
  std::int64_t kv_used_tokens = 0, kv_budget_tokens = 0;
  std::uint64_t submitted = 0, finished = 0, cancelled = 0, rejected = 0;
  std::uint64_t prompt_tokens = 0, generated_tokens = 0, iterations = 0;
  std::vector<StageShare> stages;
  // SWIFT's counters (run.swift): verify passes, drafts, accepted drafts, optimisation
  // steps, and whether the auto-off rule fired; absent when the run cannot draft.
  struct Swift {
    std::int64_t verify_passes = 0, draft_steps = 0, accepted = 0, opt_steps = 0;
    bool turned_off = false;
  };
  std::optional<Swift> swift;
};

class LiveQueue {
 public:
  struct Limits {
    int max_waiting = 256;  // queued (not yet running) requests; beyond it submit() says kFull
  };
  explicit LiveQueue(Limits limits);

  enum class Admit { kAccepted, kRejected, kFull, kStopping, kNotReady, kFailed };
  struct Submitted {
    Admit status = Admit::kAccepted;
    std::int64_t id = -1;  // when accepted
    std::string reason;    // otherwise: why, naming the limit
  };
  // `r.id` is assigned here; `r.error` must be empty; `r.sampling` already validated.
  Submitted submit(Request r, LiveSink sink);
  void cancel(std::int64_t id, std::string reason = "cancelled");
  void begin_drain();
  void shutdown(std::string reason = "server shutting down");
  LiveStats stats() const;
  // The engine's limits once ready (max_context, kv budget, iteration tokens).
  std::optional<SchedulerConfig> limits() const;

  // ---- engine side (scheduler thread) ----
  struct Inbox {
    std::vector<Request> added;
    std::vector<std::pair<std::int64_t, std::string>> cancelled;
    bool shutdown = false;
    std::string shutdown_reason;
  };
  void set_ready(const SchedulerConfig& limits);
  // Moves what arrived into `in` (cleared first); waits up to `wait` when nothing has.
  void take(Inbox& in, std::chrono::milliseconds wait);
  void emit(const LiveEvent& e);
  void update(int running, int waiting, std::int64_t kv_used, std::uint64_t iterations,
              std::vector<StageShare> stages, std::optional<LiveStats::Swift> swift = std::nullopt);
  void set_failed(const std::string& what);

 private:
  Limits limits_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<SchedulerConfig> engine_;
  std::map<std::int64_t, LiveSink> sinks_;  // open requests
  std::vector<Request> added_;
  std::vector<std::pair<std::int64_t, std::string>> cancelled_;
  std::int64_t next_id_ = 0;
  bool draining_ = false, shutdown_ = false;
  std::string shutdown_reason_;
  LiveStats stats_;
};

}  // namespace trellis::runtime
