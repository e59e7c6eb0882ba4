// Pieces shared by the engine's threads (private to runtime/engine).
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "locked_transport.hpp"
#include "trellis/core/error.hpp"
#include "trellis/runtime/engine/engine.hpp"
#include "trellis/runtime/engine/live.hpp"
#include "trellis/runtime/ipc/shm_ring.hpp"
#include "trellis/runtime/sampling/sampler.hpp"

namespace trellis::runtime::detail {

// Message tags on the engine's links (the stage streams use transport::kStreamTagBase up).
inline constexpr std::uint32_t kTagSchedule = 0x100;  // rank 0 -> relays on other hosts
inline constexpr std::uint32_t kTagLogits = 0x200;    // last-stage TP ranks -> sampler rank
inline constexpr std::uint32_t kTagTokens = 0x300;    // sampler rank -> rank 0
inline constexpr std::uint32_t kTagStats = 0x400;     // serving: middle stages' TP rank 0 -> rank 0

// Failures of this rank's engine threads; the others stop at their next wait. When a peer
// dies, several threads time out: the ones waiting on the peer (scope job/link) say what
// happened, the ones waiting on a local queue (scope rank) only that they were starved, so
// rethrow() prefers the first error that is not rank-scoped.
struct FailureFlag {
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::vector<std::exception_ptr> errors;
  void set(std::exception_ptr e) {
    std::lock_guard lock(mu);
    errors.push_back(e);
    failed = true;
  }
  void rethrow() {
    std::lock_guard lock(mu);
    if (errors.empty()) return;
    for (auto& e : errors) {
      try {
        std::rethrow_exception(e);
      } catch (const Error& err) {
        if (err.scope() != ErrorScope::kRank) throw;
      } catch (...) {
        throw;
      }
    }
    std::rethrow_exception(errors.front());
  }
};

// A queue between two threads of one rank; pop() waits with a deadline and gives up early
// when the rank failed. It blocks on a condition variable, or with set_spin(true) polls and
// yields for up to kSpinWindow first (run.host_waits: a wake-up within a microsecond, at the
// price of a busy core; a longer wait, e.g. an idle server, then blocks).
inline constexpr std::chrono::milliseconds kSpinWindow{20};
template <typename T>
class Queue {
 public:
  void set_spin(bool spin) { spin_ = spin; }
  void push(T v) {
    {
      std::lock_guard lock(mu_);
      q_.push_back(std::move(v));
    }
    cv_.notify_all();
  }
  T pop(Deadline deadline, const FailureFlag& failed, const std::string& what) {
    std::unique_lock lock(mu_);
    const auto spin_until = Clock::now() + kSpinWindow;
    while (q_.empty()) {
      if (failed.failed)
        throw_scoped(ErrorScope::kRank, ErrorCode::kPeerFailed, "{}: another engine thread failed", what);
      if (deadline.expired()) throw_scoped(ErrorScope::kRank, ErrorCode::kTimeout, "{}: nothing arrived in time", what);
      if (spin_ && Clock::now() < spin_until) {
        lock.unlock();
        std::this_thread::yield();
        lock.lock();
      } else {
        cv_.wait_for(lock, std::chrono::milliseconds(20));
      }
    }
    T v = std::move(q_.front());
    q_.pop_front();
    return v;
  }
  std::optional<T> try_pop() {
    std::lock_guard lock(mu_);
    if (q_.empty()) return std::nullopt;
    T v = std::move(q_.front());
    q_.pop_front();
    return v;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<T> q_;
  bool spin_ = false;  // set before the threads start
};

// The sampler's message to the scheduler: one iteration's tokens and, for live metrics, the
// sampler rank's time shares so far (wire: i64 iteration, i32 n, i32 has_shares, n x i32
// tokens, [3 x f64 busy/comm/wait fractions]).
// SWIFT: candidates per logits row of a `candidates` sequence (the paper's largest top-k band).
inline constexpr int kSwiftTopK = 10;

struct TokensMsg {
  std::int64_t iteration = -1;
  std::vector<std::int32_t> tokens;
  // SWIFT: kSwiftTopK (token, probability) pairs per logits row of the iteration's candidates
  // sequences, in row order, most probable first (softmax at temperature 1).
  std::vector<std::int32_t> cand_tokens;
  std::vector<float> cand_probs;
  bool has_shares = false;
  double busy = 0, comm = 0, wait = 0;
};
void pack_tokens(const TokensMsg& m, std::vector<std::byte>& out);
TokensMsg unpack_tokens(std::span<const std::byte> in, int sampler_rank);
inline std::size_t max_tokens_msg(int max_seqs, int max_candidate_rows) {
  return 20 + 4 * static_cast<std::size_t>(max_seqs) + 8 * static_cast<std::size_t>(kSwiftTopK) * max_candidate_rows + 24;
}

// What the scheduler loops need from the engine (scheduler_loop.cpp).
struct SchedulerIO {
  std::function<void(const ScheduleOutput&)> publish;        // to every rank
  std::function<TokensMsg(const ScheduleOutput&)> receive;   // waits for the tokens of s
  std::function<void(std::string)> note;                     // wait/reject notes
  // Per-stage shares for LiveQueue::update, with the sampler's latest message (or nullptr).
  std::function<std::vector<StageShare>(const TokensMsg*)> shares;
  // A SWIFT iteration completed: its span on the scheduler lane ("swift draft" ...).
  std::function<void(const char* name, std::int64_t start_ns, std::int64_t iteration)> swift_span;
};
struct SchedulerRun {
  std::vector<RequestResult> results;
  std::optional<SwiftReport> swift;
  std::uint64_t iterations = 0;
  bool interrupted = false;
  double start_s = 0, wall_s = 0;
};
// trellis run: `requests` to the end (or until opt.stop).
SchedulerRun run_batch_scheduler(const EngineOptions& opt, const std::vector<Request>& requests, SchedulerIO& io);
// trellis serve: requests from `live` until it is shut down; heartbeats while idle.
SchedulerRun run_live_scheduler(const EngineOptions& opt, LiveQueue& live, SchedulerIO& io);

// Serving: a middle stage's time shares for rank 0's /metrics (stage 0 is rank 0, the last
// stage's shares come with the tokens). Its TP rank 0 sends them at most once a second and a
// last time when the stage stops; rank 0 polls without blocking while it serves and, after
// the stop message, waits for every stage's last one, so no receive is left posted.
class StageStatsSender {
 public:
  StageStatsSender(transport::Link& to_rank0, const Tracer& trace, double start_s);
  void maybe_send(Deadline deadline, const FailureFlag& failed);
  void send_last(Deadline deadline, const FailureFlag& failed);

 private:
  void send(bool last, Deadline deadline, const FailureFlag& failed);
  transport::Link& link_;
  const Tracer& trace_;
  double start_s_, last_sent_s_ = 0;
  std::vector<std::byte> buf_;
  transport::RequestPtr req_;
};

class StageStatsReceiver {
 public:
  // (stage, the link from its TP rank 0), middle stages only.
  explicit StageStatsReceiver(std::vector<std::pair<int, transport::Link*>> stages);
  // Appends the latest shares of every stage heard from so far.
  void poll(std::vector<StageShare>& shares);
  void drain(Deadline deadline, const FailureFlag& failed);

 private:
  struct From {
    int stage = 0;
    transport::Link* link = nullptr;
    std::vector<std::byte> buf;
    transport::RequestPtr req;
    StageShare share;
    bool heard = false, done = false;
  };
  bool take(From& f);
  std::vector<From> from_;
};

// Lowest rank of each host: rank 0 on its own host, the relay (ring producer) elsewhere.
std::vector<int> host_leaders(const EngineGrid& g);

// Vocabulary rows of TP rank k: chunks of ceil(V / t), as the vocab-parallel LM head splits.
std::pair<int, int> vocab_range(int vocab, int tp, int k);

// Fills `in` (keeping capacities) from a scheduling output.
void prepare_input(const ScheduleOutput& s, StageInput& in);

// Waits for a request, polling; names `what` on timeout and stops when the rank failed.
void wait_request(transport::Request& r, Deadline deadline, const FailureFlag& failed, const std::string& what);

// Name of host `host`'s scheduling ring in job `opt.job`, created by world rank `leader`.
// It carries the leader's pid (core/shm_names.hpp) so that a later start can remove it if
// the job dies before every consumer attached; the leader's pid is opt.host_pids[leader],
// or this process's when the engine runs every rank in one process (tests).
std::string ring_name(const EngineOptions& opt, int leader, int host);

// Top `k` (token, softmax probability) of columns [b0, b1) of zt (vocab x batch,
// column-wise), most probable first, appended to tokens/probs as kSwiftTopK entries per
// column (-1/0 pad). k = 1: the arg-max only, probability not computed (1).
void top_candidates(const float* zt, int vocab, int batch, int b0, int b1, int k, std::vector<std::int32_t>& tokens,
                    std::vector<float>& probs);

// The sampler's answers to SWIFT iterations, per group and column (swift_rows.cpp): top
// candidates for greedy sequences, speculative sampling for sampled ones.
class SwiftRows {
 public:
  SwiftRows(int vocab, int groups, int max_cols);
  // A new sequence in (group, col): its own random stream, no kept draft distributions.
  void bind(int group, int col, const SamplingParams& p);
  // kSwiftTopK (token, probability) entries per logits row of the SWIFT iteration `in`
  // (zt: vocab x batch, its rows), see swift_rows.cpp.
  void answer(const StageInput& in, const PenaltyState& state, const float* zt, int batch,
              std::vector<std::int32_t>& tokens, std::vector<float>& probs);

 private:
  struct Col {
    std::mt19937_64 rng;
    std::vector<std::vector<float>> q;  // this cycle's draft distributions, in order
  };
  void column(const float* zt, int batch, int b);  // z_ = column b
  int vocab_;
  std::vector<std::vector<Col>> cols_;
  std::vector<float> z_;
  std::vector<std::int32_t> idx_;
};

// The sampling side of the last stage: p penalty states, the sampler pool, the column-wise
// logits buffer whose row blocks receive the TP shards. Used by the sampler thread
// (--cpu-sampler) or inline by the forward executor.
class SamplerStage {
 public:
  // max_cols: sequences per group (sampler columns); max_rows: logits rows per iteration.
  SamplerStage(int rank, const EngineGrid& grid, transport::Link* const* shard_links, int vocab, int max_cols,
               int max_rows, int threads, const EngineOptions& opt, const FailureFlag& failed, Tracer& trace, Lane lane);
  // Samples iteration `in`; `local` is this rank's shard, column-wise [vocab_local x
  // n_sampled]. Returns one token per sampled sequence (none for a prefill chunk before the
  // last), in order.
  const std::vector<std::int32_t>& run(const StageInput& in, const float* local);
  // After run(): the candidates of its `candidates` rows (TokensMsg), empty when it had none.
  const std::vector<std::int32_t>& candidate_tokens() const { return cand_tokens_; }
  const std::vector<float>& candidate_probs() const { return cand_probs_; }

 private:
  int rank_;
  const EngineGrid& grid_;
  std::vector<transport::Link*> shard_links_;  // per TP index (nullptr for self)
  int vocab_;
  const EngineOptions& opt_;
  const FailureFlag& failed_;
  Tracer& trace_;
  Lane lane_;
  std::vector<PenaltyState> states_;
  Sampler sampler_;
  LogitsColumns zt_;
  std::vector<std::int32_t> columns_, out_;  // state columns of the sampled sequences; tokens
  std::vector<std::int32_t> cand_tokens_;
  std::vector<float> cand_probs_;
  SwiftRows swift_;
};

}  // namespace trellis::runtime::detail
