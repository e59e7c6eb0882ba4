// Internal to runtime/engine: the Engine class, one per rank (engine.hpp says what its threads
// do). Its members are defined in engine.cpp (threads, schedule, forward loop) and
// engine_output.cpp (the last stage's logits and the tokens going back to rank 0).
#pragma once

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <thread>

#include "engine_internal.hpp"
#include "trellis/core/process.hpp"
#include "trellis/runtime/engine/engine.hpp"
#include "trellis/runtime/engine/token_safe.hpp"
#include "trellis/runtime/trace/metrics.hpp"
#include "trellis/transport/stream.hpp"

namespace trellis::runtime::detail {

class Engine {
 public:
  Engine(int rank, const EngineGrid& grid, transport::Transport& links, StageCompute& stage,
         const std::vector<Request>& requests, const EngineOptions& opt, Tracer& trace)
      : rank_(rank), grid_(grid), links_(links), stage_(stage), requests_(requests), opt_(opt), trace_(trace),
        stage_idx_(grid.stage_of(rank)), k_(grid.tp_of(rank)), tsem_(fmt::format("rank {} input buffers", rank)) {
    first_ = stage_idx_ == 0;
    last_ = stage_idx_ == grid.pp - 1;
    deferred_logits_ = last_ && stage.logits_async() && opt.cpu_sampler && opt.tsem;
    sampler_rank_ = grid.sampler_rank();
    host_ = grid.host_of[static_cast<std::size_t>(rank)];
    auto leaders = host_leaders(grid);
    for (int l : leaders)
      if (grid.host_of[static_cast<std::size_t>(l)] == host_) leader_ = l;
    for (int r = 0; r < static_cast<int>(grid.host_of.size()); ++r) {
      if (grid.host_of[static_cast<std::size_t>(r)] != host_) continue;
      if (r == rank) consumer_index_ = host_ranks_;
      ++host_ranks_;
    }
    if (opt.scheduler.groups != grid.pp)
      throw_error(ErrorCode::kInvalidArgument, "engine: {} scheduler groups for {} pipeline stages", opt.scheduler.groups,
                  grid.pp);
    {
      std::string why;
      spin_ = host_waits_spin(opt.host_waits, stage.cuda_gpu() >= 0, host_ranks_, &why);
      tsem_.set_spin(spin_);
      sampler_q_.set_spin(spin_);
      local_logits_q_.set_spin(spin_);
      tokens_q_.set_spin(spin_);
      if (rank == 0) spdlog::info("rank 0: engine threads wait by {} ({})", spin_ ? "spinning" : "blocking", why);
    }
    auto [vb, ve] = vocab_range(stage.vocab_size(), grid.tp, k_);
    if (last_ && (stage.vocab_begin() != vb || stage.vocab_end() != ve))
      throw_error(ErrorCode::kInternal, "rank {}: LM head holds vocabulary [{}, {}), the engine expects [{}, {})", rank,
                  stage.vocab_begin(), stage.vocab_end(), vb, ve);
    // The producer of this host's ring creates it before any thread starts; consumers wait
    // for it to appear (bounded by the deadline).
    // The device choice is one for the whole job (prepare_job), so this rank's stage tells
    // every boundary's: all ranks compute the same plan, and a cuda-ipc that cannot be is
    // refused on every rank alike, before any thread starts.
    handoffs_ = plan_stage_handoffs(grid, opt.stage_handoff, stage.cuda_gpu() >= 0);
    if (rank == 0)
      for (const auto& p : handoffs_) spdlog::info("{}", p.describe());
    if (rank == leader_)
      ring_out_ = ShmRing::create(ring_name(opt, leader_, host_), opt.ring_slots, opt.ring_slot_bytes,
                                  static_cast<std::uint32_t>(host_ranks_));
  }

  EngineResult run();

 private:
  Deadline deadline() const { return Deadline::after(opt_.deadline); }
  // Waits on this rank's own threads get longer: when a peer dies, the wait that faces the
  // peer expires first and names it; the starved local waits are only symptoms.
  Deadline local_deadline() const { return Deadline::after(opt_.deadline * 3 / 2); }
  // Waits for the next scheduling output depend on rank 0's scheduler, which itself waits up
  // to deadline() on the ranks that feed it: waiting longer lets rank 0's error, which names
  // the failing peer, end the job first instead of a message that blames rank 0.
  Deadline upstream_deadline() const { return Deadline::after(opt_.deadline * 2); }
  bool take_schedule(ScheduleOutput& out, Lane lane);
  // Serving: a server may idle for hours, so a wait for upstream work that times out is
  // retried while the scheduler's heartbeats (read by take_schedule) keep arriving; a
  // scheduler silent for twice the deadline still fails the wait.
  template <typename F>
  auto upstream_wait(F f) {
    for (;;) {
      try {
        return f();
      } catch (const Error& e) {
        const auto silent = std::chrono::nanoseconds(now_ns() - last_heard_ns_.load());
        if (!opt_.serving || e.code() != ErrorCode::kTimeout || failed_.failed || silent > opt_.deadline * 2) throw;
      }
    }
  }
  std::vector<StageShare> live_shares(const TokensMsg* got);
  void cpu_executor();
  void forward_executor();
  void last_stage_output(const StageInput& in, const float* x, std::int64_t it);
  // The logits of iteration `it` (counted by this executor) to the sampler: its own queue on
  // the sampler rank, else a send; `in` only for the inline sampler.
  void deliver_logits(std::int64_t it, std::int64_t iteration, const StageInput* in);
  void wait_logits_send(std::int64_t it);
  void finish_pending_logits();
  // The tokens `st` sampled for `iteration` (and its SWIFT candidates), to the scheduler.
  int max_logit_rows() const { return std::max(opt_.scheduler.max_seqs_per_group, opt_.max_logit_rows); }
  void send_tokens(std::int64_t iteration, const SamplerStage& st, const std::vector<std::int32_t>& tokens);
  void sampler_thread();
  void scheduler_thread();
  void relay_thread();
  void progress_loop(const std::atomic<bool>& finished);
  void check_heartbeats(const std::vector<transport::Bootstrap::SilentRank>& silent) const;
  void publish(const ScheduleOutput& s, std::vector<transport::RequestPtr>& pending,
               std::vector<std::vector<std::byte>>& bufs);
  void post_ahead();
  // CUDA IPC set-up of this rank's boundaries that the plan gives it (upstream first, so the
  // set-ups complete in a chain from stage 0), and their orderly end after the last
  // iteration (the sender closes its handles before the receiver frees).
  void connect_device_handoffs();
  void finish_device_handoffs();
  template <typename F>
  std::thread spawn(const char* name, F f) {
    return std::thread([this, name, f] {
      try {
        f();
      } catch (...) {
        spdlog::debug("rank {}: {} thread failed", rank_, name);
        failed_.set(std::current_exception());
        tsem_.close();
      }
    });
  }

  int rank_;
  const EngineGrid& grid_;
  LockedTransport links_;
  StageCompute& stage_;
  const std::vector<Request>& requests_;
  const EngineOptions& opt_;
  Tracer& trace_;
  int stage_idx_, k_;
  bool first_ = false, last_ = false;
  int sampler_rank_ = 0, host_ = 0, leader_ = 0, host_ranks_ = 0, consumer_index_ = 0;
  FailureFlag failed_;
  TokenSafe<StageInput> tsem_;
  std::unique_ptr<ShmRing> ring_out_, ring_in_;
  std::deque<ScheduleOutput> lookahead_;
  std::vector<std::byte> msg_;
  Queue<std::int32_t> rows_ahead_;           // batch sizes read but not yet posted (stage > 0)
  Queue<ScheduleOutput> sampler_q_;          // scheduling outputs for the sampler thread
  Queue<std::vector<float>> local_logits_q_; // this rank's logits shard for the sampler thread
  Queue<TokensMsg> tokens_q_;  // sampler -> scheduler (same rank)
  bool spin_ = false;          // run.host_waits: the queues, TSEM and the ring poll instead of blocking
  std::unique_ptr<transport::StageReceiver> receiver_;
  std::unique_ptr<transport::StageSender> sender_;
  std::vector<HandoffPlan> handoffs_;             // every boundary of the grid
  std::unique_ptr<CudaIpcReceiver> ipc_in_;      // from the previous stage, on the device
  std::unique_ptr<CudaIpcSender> ipc_out_;       // to the next stage, on the device
  std::unique_ptr<SamplerStage> inline_sampler_;
  std::uint64_t posted_ = 0, received_ = 0;
  std::vector<float> lrows_;
  std::vector<float> lcols_[2];
  transport::RequestPtr logits_req_[2];
  // Two-phase logits (StageCompute::logits_async): with the CPU sampler and token-safe inputs
  // only (the inline sampler needs the input, which the next acquire may reuse).
  bool deferred_logits_ = false;
  struct PendingLogits {
    std::int64_t it, iteration;
    int rows;
  };
  std::optional<PendingLogits> pending_logits_;
  std::mutex token_send_mu_;
  std::deque<std::pair<std::vector<std::byte>, transport::RequestPtr>> token_sends_;
  EngineResult result_;
  std::atomic<std::int64_t> last_heard_ns_{now_ns()};
  double engine_start_s_ = now_seconds();
  std::optional<StageShare> last_stage_share_;
  std::unique_ptr<StageStatsReceiver> stats_in_;  // rank 0, serving, pp > 2
};

}  // namespace trellis::runtime::detail
