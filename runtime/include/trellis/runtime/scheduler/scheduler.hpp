// The scheduler: continuous batching over p microbatch groups with a KV-cache budget.
//
// It runs on one rank and is driven by the engine: schedule(g) builds the next iteration of
// group g (at most one iteration per group in flight; groups take turns, so p microbatches
// are in flight), complete() takes back the tokens sampled for it. Finished sequences leave
// their group and free their KV reservation at once; waiting requests join any group that
// has a free column and fits in the budget (SiPipe §4.2, Orca-style iteration batching).
//
// KV budget. Every rank holds the KV cache of its layers for every running sequence, so the
// budget is counted in token positions: a request reserves prompt + max_tokens positions
// (capped by the context) when it is admitted, so a running sequence never runs out. A
// request that needs more than the whole budget, or whose prompt does not fit the context,
// is rejected with the reason; one that does not fit now waits (FIFO) and the wait is
// reported once with the occupancy.
//
// Prefill. With prefill_chunk = 0 a prompt is prefilled in one iteration. With C > 0 a prompt
// longer than C is prefilled C tokens per iteration of its group, each chunk sharing the
// forward with the decode steps of the group's other sequences (so a long prompt no longer
// stalls them for a whole-prompt forward, and its own first token comes after
// ceil(prompt / C) iterations); only the last chunk is sampled. The iteration's token limit
// counts chunks, so with chunking a prompt may be longer than one iteration holds.
//
// Threading: one thread at a time.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "trellis/runtime/scheduler/schedule.hpp"
#include "trellis/runtime/scheduler/swift_control.hpp"
#include "trellis/runtime/workload/request.hpp"

namespace trellis::runtime {

struct SchedulerConfig {
  int groups = 1;                    // p: microbatch groups (one per pipeline stage)
  int max_seqs_per_group = 8;        // sequences per microbatch (sampler columns)
  std::int64_t kv_budget_tokens = 0; // positions of KV cache every rank can hold
  int max_context = 2048;            // longest sequence (prompt + output)
  int max_iteration_tokens = 4096;   // input tokens per iteration (limits prefill bursts)
  int prefill_chunk = 0;             // prompt tokens per iteration (0: the whole prompt at once);
                                     // at most max_iteration_tokens
  SwiftConfig swift;                 // SWIFT self-speculative decoding (swift_control.hpp)
};

// Why `r` can never run under `limits` (prompt longer than the context, more KV positions
// than the whole budget, more tokens than one iteration holds), or nothing when it can.
// Used by the scheduler and by LiveQueue::submit (engine/live.hpp).
std::optional<std::string> admission_error(const SchedulerConfig& limits, const Request& r);

enum class RequestStatus { kPending, kRunning, kFinished, kFailed };

struct RequestResult {
  std::int64_t id = 0;
  RequestStatus status = RequestStatus::kPending;
  std::string reason;                  // why it failed, or why it stopped ("stop", "length")
  std::vector<std::int32_t> output;    // generated token ids
  double admitted_s = -1, first_token_s = -1, finished_s = -1;  // engine clock
};

class Scheduler {
 public:
  // Requests with a non-empty error start as failed with that reason.
  Scheduler(SchedulerConfig config, std::vector<Request> requests);

  // The next iteration for group `g`, or nothing when the group has no work now (nothing
  // running in it and nothing that may be admitted). `now` (seconds) stamps admissions.
  std::optional<ScheduleOutput> schedule(int g, double now);
  // Tokens sampled for `s` (one per sampled sequence, in order), at time `now`; a SWIFT
  // iteration's results are the candidates of its rows instead (TokensMsg).
  void complete(const ScheduleOutput& s, std::span<const std::int32_t> tokens, double now,
                std::span<const std::int32_t> cand_tokens = {}, std::span<const float> cand_probs = {});

  // Live serving: a request that arrives while the engine runs. Its id must be the next one
  // (requests().size()); a request that can never run fails at once with the reason (see
  // admission_error above). Returns whether it was queued.
  bool add(Request r, double now);
  // Ends one request early (client gone, stop string): a waiting one fails now; a running
  // one leaves its group now when the group has nothing in flight, else when its in-flight
  // iteration completes (the token sampled for it then is dropped). Its KV reservation is
  // freed at that moment. No-op for a request that already finished.
  void abort(std::int64_t id, const std::string& reason, double now);
  // Drops the prompt and output of a finished request (a server keeps running for days).
  void forget(std::int64_t id);
  int running_count() const;
  int waiting_count() const { return static_cast<int>(waiting_.size()); }

  // Stops the run early (Ctrl-C): waiting requests fail with `reason` now, running ones when
  // their in-flight iteration completes (keeping the tokens they have); nothing new starts.
  void cancel(const std::string& reason, double now);
  bool cancelled() const { return cancelled_; }

  bool done() const;  // every request finished or failed
  const std::vector<RequestResult>& results() const { return results_; }
  const std::vector<Request>& requests() const { return requests_; }
  // Wait/reject notes in the order they happened ("request 7 waits: KV cache full ...").
  std::vector<std::string> take_notes();
  std::int64_t kv_used_tokens() const { return kv_used_; }
  std::uint64_t iterations_scheduled() const { return next_iteration_; }
  // SWIFT's figures, when the run can draft.
  std::optional<SwiftReport> swift_report() const;

 private:
  struct Running {
    std::int64_t id;
    std::int32_t slot, column;
    std::int32_t len;        // tokens in the KV cache after the in-flight iteration
    std::int64_t reserved;   // KV positions reserved
    std::int32_t prompt_done = 0;  // prompt tokens scheduled so far (chunked prefill)
    std::int32_t next_token = -1;
    std::string abort_reason;  // set: leaves when its in-flight iteration completes
  };
  struct Group {
    std::vector<Running> running;
    std::vector<bool> column_used;
    bool in_flight = false;
    bool swift_turn = true;        // the next iteration may be a SWIFT one
    double scheduled_at = 0;       // when the iteration in flight was built
    bool pure_decode = false;      // it is plain decode steps only (SWIFT's calibration)
  };
  std::optional<ScheduleOutput> schedule_swift(Group& g, int gi, double now);
  bool drafting(const Running& run) const;  // it takes SWIFT iterations now
  SwiftControl::SeqView view(const Running& run) const;
  void commit_tokens(Group& g, std::int64_t id, std::span<const std::int32_t> tokens, double now);
  bool admit_into(Group& g, double now, int& tokens_left);
  // Input tokens of `run`'s next iteration: its next prompt chunk, or 1 (a decode step).
  int next_tokens(const Running& run) const;
  bool prompt_finished(const Running& run) const;  // its whole prompt has been scheduled
  int first_chunk(const Request& r) const;
  void finish(Group& g, std::size_t index, RequestStatus status, std::string reason, double now);
  std::int64_t reservation(const Request& r) const;
  void enqueue(std::size_t i);

  SchedulerConfig cfg_;
  std::vector<Request> requests_;
  std::vector<RequestResult> results_;
  std::deque<std::int64_t> waiting_;
  std::vector<Group> groups_;
  std::vector<std::int32_t> free_slots_;
  std::vector<bool> wait_reported_;
  std::vector<std::string> notes_;
  std::int64_t kv_used_ = 0;
  std::uint64_t next_iteration_ = 0;
  int open_ = 0;  // requests not yet finished or failed
  bool cancelled_ = false;
  std::string cancel_reason_;
  std::optional<SwiftControl> swift_;
};

}  // namespace trellis::runtime
