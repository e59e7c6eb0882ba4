// The engine's threads on one rank (see engine.hpp for the roles).
#include "engine_class.hpp"

#include <sched.h>

namespace trellis::runtime {

namespace detail {


bool Engine::take_schedule(ScheduleOutput& out, Lane lane) {
  if (!ring_in_) {
    Tracer::Span span(trace_, lane, TraceCat::kWait, "wait schedule");
    ring_in_ = ShmRing::open(ring_name(opt_, leader_, host_), static_cast<std::uint32_t>(consumer_index_), deadline(),
                             &failed_.failed);
  }
  auto accept = [&] {
    auto s = deserialize_schedule(msg_, ring_in_->name().c_str());
    last_heard_ns_ = now_ns();
    if (s.idle()) return;  // a server's heartbeat: nothing to run
    if (stage_idx_ > 0 && !s.stop()) rows_ahead_.push(s.n_tokens());
    if (rank_ == sampler_rank_ && opt_.cpu_sampler) sampler_q_.push(s);
    lookahead_.push_back(std::move(s));
  };
  while (lookahead_.empty()) {
    Tracer::Span span(trace_, lane, TraceCat::kWait, "wait schedule");
    bool got;
    try {
      got = ring_in_->read(msg_, rank_ == 0 ? local_deadline() : upstream_deadline(), &failed_.failed, spin_);
    } catch (const Error& e) {
      // On rank 0 the scheduler is a thread of this process, and its own error names the cause;
      // so does the error of the thread that failed this rank when the wait was cancelled.
      // So is a failure of rank 0 relayed by the channel (the ring's kRank).
      const bool symptom = rank_ == 0 || failed_.failed || e.scope() == ErrorScope::kRank;
      throw_scoped(symptom ? ErrorScope::kRank : ErrorScope::kJob, e.code(),
                   "rank {}: no scheduling output from rank 0 (the scheduler){}: {}", rank_,
                   leader_ == 0 ? "" : fmt::format(" (relayed by rank {})", leader_), e.what());
    }
    if (!got) throw_error(ErrorCode::kPeerFailed, "rank {}: the scheduling channel closed before a stop message", rank_);
    accept();
  }
  // Everything already dispatched is read now, so the forward executor can post receives
  // for those iterations ahead of time (structure-aware transmission needs only the size).
  while (!lookahead_.back().stop() && ring_in_->try_read(msg_)) accept();
  // (an idle message read here leaves lookahead_ as it was)
  out = std::move(lookahead_.front());
  lookahead_.pop_front();
  return !out.stop();
}

void Engine::cpu_executor() {
  ScheduleOutput s;
  while (take_schedule(s, Lane::kCpuPrep)) {
    StageInput* buf;
    {
      Tracer::Span span(trace_, Lane::kCpuPrep, TraceCat::kWait, "wait input", static_cast<std::int64_t>(s.iteration));
      buf = &tsem_.cpu_acquire(local_deadline());
    }
    if (failed_.failed) return;
    {
      Tracer::Span span(trace_, Lane::kCpuPrep, TraceCat::kPrep, "prepare input", static_cast<std::int64_t>(s.iteration));
      prepare_input(s, *buf);
    }
    tsem_.cpu_publish();
  }
  tsem_.close();
}

void Engine::post_ahead() {
  if (!receiver_) {
    // The CUDA IPC receiver knows the rows from the input itself; nothing is posted ahead.
    while (rows_ahead_.try_pop()) {
    }
    return;
  }
  while (posted_ < received_ + 2) {
    auto rows = rows_ahead_.try_pop();
    if (!rows) return;
    receiver_->post(static_cast<std::size_t>(*rows));
    ++posted_;
  }
}

void Engine::connect_device_handoffs() {
  const HandoffWait wait = [this](transport::Request& r, Deadline d, const std::string& what) {
    wait_request(r, d, failed_, what);
  };
  const bool required = opt_.stage_handoff == StageHandoff::kCudaIpc;
  // Sized for the largest iteration: a prefill of max_iteration_tokens or a decode step of
  // every sequence of a group.
  const int max_rows = std::max(opt_.scheduler.max_iteration_tokens, opt_.scheduler.max_seqs_per_group);
  const std::size_t max_bytes =
      static_cast<std::size_t>(max_rows) * static_cast<std::size_t>(stage_.hidden_size()) * sizeof(float);
  for (const auto& p : handoffs_) {
    if (!p.cuda_ipc || (p.to != rank_ && p.from != rank_)) continue;
    std::string why;
    if (p.to == rank_) {
      // The sender writes straight into this stage's hidden state: grown once to the largest
      // iteration here, so no later forward moves it (device_hidden only grows).
      ipc_in_ = CudaIpcReceiver::connect(
          {&links_.link(p.from), rank_, stage_.cuda_gpu(), max_bytes, required, wait, stage_.device_hidden(max_rows),
           opt_.handoff_signal},
          deadline(), &why);
      if (ipc_in_)
        spdlog::info("rank {}: stage hand-off from rank {}: CUDA IPC, {} signal ({})", rank_, p.from,
                     to_string(ipc_in_->signal()), ipc_in_->signal_reason());
    } else {
      ipc_out_ = CudaIpcSender::connect(
          {&links_.link(p.to), rank_, stage_.cuda_gpu(), max_bytes, required, wait, opt_.handoff_signal}, deadline(),
          &why);
      // Both sides fall back together (the set-up exchange told both); the sender says so.
      if (!ipc_out_) spdlog::warn("stage hand-off {} -> {} (rank {} -> rank {}): host (CUDA IPC set-up failed: {})",
                                  p.stage, p.stage + 1, p.from, p.to, why);
    }
  }
  stage_.set_device_hidden_io(ipc_in_ != nullptr, ipc_out_ != nullptr);
}

void Engine::finish_device_handoffs() {
  if (ipc_out_) {
    ipc_out_->finish(stage_.cuda_stream(), deadline());
    // What ran, not what was planned (rank 0's plan lines): runtime_gpu_run checks it.
    spdlog::info("rank {}: stage hand-off to rank {}: {} iterations through CUDA IPC ({} signal)", rank_,
                 grid_.rank_at(stage_idx_ + 1, k_), ipc_out_->sent(), to_string(ipc_out_->signal()));
  }
  if (ipc_in_) ipc_in_->finish(stage_.cuda_stream(), deadline());
}

void Engine::forward_executor() {
  const int H = stage_.hidden_size();
  const auto mode = opt_.sat ? transport::StreamMode::kStructureAware : transport::StreamMode::kBaseline;
  // The stage outlives this engine (it ran the warm-up before): its hidden state goes back to
  // host memory at its boundaries whichever way this ends.
  struct HostIo {
    StageCompute& st;
    ~HostIo() {
      if (st.cuda_gpu() >= 0) st.set_device_hidden_io(false, false);
    }
  } host_io{stage_};
  connect_device_handoffs();
  if (!first_ && !ipc_in_)
    receiver_ = std::make_unique<transport::StageReceiver>(links_.link(grid_.rank_at(stage_idx_ - 1, k_)), mode);
  if (!last_ && !ipc_out_)
    sender_ = std::make_unique<transport::StageSender>(links_.link(grid_.rank_at(stage_idx_ + 1, k_)), mode);
  const std::size_t row_bytes = static_cast<std::size_t>(H) * sizeof(float);
  const transport::TensorSpec spec{"hidden", "f32", static_cast<std::size_t>(H) * sizeof(float)};
  std::vector<float> x[2];
  transport::RequestPtr sends[2];
  StageInput inline_in;
  ScheduleOutput s;
  std::unique_ptr<StageStatsSender> stats_out;
  if (opt_.serving && k_ == 0 && stage_idx_ > 0 && stage_idx_ < grid_.pp - 1)
    stats_out = std::make_unique<StageStatsSender>(links_.link(0), trace_, engine_start_s_);
  for (std::int64_t it = 0;; ++it) {
    const StageInput* in = nullptr;
    // Nothing to start yet (a decode step waits for the tokens of this one): the stage may fill
    // its next step now, on a guess, while its device still runs this step (prepare_next).
    if (it > 0 && opt_.tsem && !tsem_.forward_ready()) stage_.prepare_next(trace_);
    // Deferred logits are collected before any wait that could depend on them (the next
    // input of a single stage needs the tokens they give); an input already prepared cannot.
    if (pending_logits_ && !tsem_.forward_ready()) finish_pending_logits();
    if (opt_.tsem) {
      Tracer::Span span(trace_, Lane::kForward, TraceCat::kWait, "wait input");
      in = upstream_wait([&] { return tsem_.forward_acquire(local_deadline()); });
      if (!in) break;
    } else {
      if (!take_schedule(s, Lane::kForward)) break;
      Tracer::Span span(trace_, Lane::kForward, TraceCat::kPrep, "prepare input", static_cast<std::int64_t>(s.iteration));
      prepare_input(s, inline_in);
      in = &inline_in;
    }
    auto& buf = x[it & 1];
    if (sends[it & 1]) {
      Tracer::Span span(trace_, Lane::kForward, TraceCat::kSend, "send hidden", in->iteration);
      wait_request(*sends[it & 1], deadline(), failed_, fmt::format("rank {}: hidden-state send", rank_));
      sends[it & 1].reset();
    }
    buf.resize(static_cast<std::size_t>(in->n_tokens()) * static_cast<std::size_t>(H));
    if (receiver_) {
      post_ahead();
      Tracer::Span span(trace_, Lane::kForward, TraceCat::kRecv, "recv hidden", in->iteration,
                        grid_.rank_at(stage_idx_ - 1, k_));
      const auto& views = receiver_->receive(deadline(), &failed_.failed);
      ++received_;
      if (views.size() != 1 || views[0].data.size() != buf.size() * sizeof(float))
        throw_error(ErrorCode::kCorruptInput, "rank {}: hidden state of iteration {} from rank {} has {} bytes, expected {}",
                    rank_, in->iteration, grid_.rank_at(stage_idx_ - 1, k_),
                    views.empty() ? 0 : views[0].data.size(), buf.size() * sizeof(float));
      std::memcpy(buf.data(), views[0].data.data(), views[0].data.size());
    } else if (ipc_in_) {
      Tracer::Span span(trace_, Lane::kForward, TraceCat::kRecv, "recv hidden", in->iteration,
                        grid_.rank_at(stage_idx_ - 1, k_));
      ipc_in_->receive(static_cast<std::size_t>(in->n_tokens()) * row_bytes, stage_.cuda_stream(), deadline());
    }
    {
      Tracer::Span span(trace_, Lane::kForward, TraceCat::kForward, "forward", in->iteration);
      stage_.forward(*in, buf.data(), trace_);
    }
    finish_pending_logits();  // the previous microbatch's rows copied while this one was enqueued
    if (sender_) {
      Tracer::Span span(trace_, Lane::kForward, TraceCat::kSend, "send hidden", in->iteration,
                        grid_.rank_at(stage_idx_ + 1, k_));
      transport::TensorRef ref{spec, buf.data()};
      sends[it & 1] = sender_->send(std::span(&ref, 1), static_cast<std::size_t>(in->n_tokens()));
      if (!opt_.sat) wait_request(*sends[it & 1], deadline(), failed_, fmt::format("rank {}: hidden-state send", rank_));
    } else if (ipc_out_) {
      Tracer::Span span(trace_, Lane::kForward, TraceCat::kSend, "send hidden", in->iteration,
                        grid_.rank_at(stage_idx_ + 1, k_));
      ipc_out_->send(stage_.device_hidden(in->n_tokens()), static_cast<std::size_t>(in->n_tokens()) * row_bytes,
                     stage_.cuda_stream(), deadline());
    } else {
      last_stage_output(*in, buf.data(), it);
    }
    post_ahead();
    if (stats_out) stats_out->maybe_send(deadline(), failed_);
    if (failed_.failed) break;
  }
  if (!failed_.failed) finish_pending_logits();
  if (!failed_.failed) finish_device_handoffs();
  if (stats_out && !failed_.failed) stats_out->send_last(deadline(), failed_);
  for (auto& r : sends)
    if (r) wait_request(*r, deadline(), failed_, fmt::format("rank {}: hidden-state send", rank_));
  for (auto& r : logits_req_)
    if (r) wait_request(*r, deadline(), failed_, fmt::format("rank {}: logits send", rank_));
}

void Engine::sampler_thread() {
  std::vector<transport::Link*> shard_links(static_cast<std::size_t>(grid_.tp), nullptr);
  for (int j = 0; j < grid_.tp; ++j)
    if (j != k_) shard_links[static_cast<std::size_t>(j)] = &links_.link(grid_.rank_at(grid_.pp - 1, j));
  SamplerStage st(rank_, grid_, shard_links.data(), stage_.vocab_size(), opt_.scheduler.max_seqs_per_group, max_logit_rows(),
                  opt_.sampler_threads, opt_, failed_, trace_, Lane::kSampler);
  StageInput in;
  for (;;) {
    ScheduleOutput s;
    {
      Tracer::Span span(trace_, Lane::kSampler, TraceCat::kWait, "wait schedule");
      s = upstream_wait([&] {
        return sampler_q_.pop(local_deadline(), failed_, fmt::format("sampler on rank {}: next scheduling output", rank_));
      });
    }
    if (s.stop()) return;
    prepare_input(s, in);
    std::vector<float> local;
    {
      Tracer::Span span(trace_, Lane::kSampler, TraceCat::kWait, "wait logits", in.iteration);
      local = local_logits_q_.pop(local_deadline(), failed_,
                                  fmt::format("sampler on rank {}: logits of iteration {} from its own LM head", rank_,
                                              in.iteration));
    }
    const auto& toks = st.run(in, local.data());
    send_tokens(in.iteration, st, toks);
  }
}

void Engine::publish(const ScheduleOutput& s, std::vector<transport::RequestPtr>& pending,
                     std::vector<std::vector<std::byte>>& bufs) {
  Tracer::Span span(trace_, Lane::kScheduler, TraceCat::kSchedule, "schedule", static_cast<std::int64_t>(s.iteration));
  std::vector<std::byte> wire;
  serialize(s, wire);
  if (wire.size() > opt_.ring_slot_bytes)
    throw_error(ErrorCode::kResourceExhausted,
                "scheduling output of iteration {} is {} bytes, over the channel slot of {} (raise run.channel_slot_bytes "
                "or lower run.max_batch)",
                s.iteration, wire.size(), opt_.ring_slot_bytes);
  ring_out_->write(wire, deadline(), &failed_.failed);
  // Other hosts: one copy to each host's relay, which replicates it into that host's ring.
  for (std::size_t i = 0; i < pending.size();) {
    if (pending[i]->test()) {
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
      bufs.erase(bufs.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  for (int leader : host_leaders(grid_)) {
    if (grid_.host_of[static_cast<std::size_t>(leader)] == host_) continue;
    bufs.push_back(wire);
    pending.push_back(links_.link(leader).isend(bufs.back(), kTagSchedule));
  }
}

std::vector<StageShare> Engine::live_shares(const TokensMsg* got) {
  const double wall = std::max(1e-9, now_seconds() - engine_start_s_);
  auto own = rank_shares(trace_, wall);
  if (got && got->has_shares) last_stage_share_ = StageShare{grid_.pp - 1, got->busy, got->comm, got->wait};
  std::vector<StageShare> out{{0, own.busy_s / wall, own.comm_s / wall, own.wait_s / wall}};
  if (stats_in_) stats_in_->poll(out);
  if (grid_.pp > 1 && last_stage_share_) out.push_back(*last_stage_share_);
  return out;
}

void Engine::scheduler_thread() {
  std::vector<transport::RequestPtr> pending;
  std::vector<std::vector<std::byte>> bufs;
  std::vector<std::byte> tok_buf(max_tokens_msg(opt_.scheduler.max_seqs_per_group, max_logit_rows()));
  SchedulerIO io;
  io.publish = [&](const ScheduleOutput& s) { publish(s, pending, bufs); };
  io.note = [&](std::string n) {
    spdlog::info("{}", n);
    result_.notes.push_back(std::move(n));
  };
  io.receive = [&](const ScheduleOutput& s) {
    Tracer::Span span(trace_, Lane::kScheduler, TraceCat::kWait, "recv tokens", static_cast<std::int64_t>(s.iteration),
                      sampler_rank_);
    auto what = fmt::format("scheduler on rank 0: tokens of iteration {} from the sampler on rank {} (stage {})",
                            s.iteration, sampler_rank_, grid_.pp - 1);
    if (sampler_rank_ == 0) return tokens_q_.pop(local_deadline(), failed_, what);
    auto req = links_.link(sampler_rank_).irecv(tok_buf, kTagTokens);
    wait_request(*req, deadline(), failed_, what);
    return unpack_tokens(std::span(tok_buf).first(req->bytes()), sampler_rank_);
  };
  io.shares = [&](const TokensMsg* got) { return live_shares(got); };
  io.swift_span = [&](const char* name, std::int64_t start_ns, std::int64_t iteration) {
    trace_.record(Lane::kScheduler, TraceCat::kSchedule, name, start_ns, now_ns(), iteration);
  };
  if (opt_.live && grid_.pp > 2) {
    std::vector<std::pair<int, transport::Link*>> mids;
    for (int m = 1; m < grid_.pp - 1; ++m) mids.emplace_back(m, &links_.link(grid_.rank_at(m, 0)));
    stats_in_ = std::make_unique<StageStatsReceiver>(std::move(mids));
  }
  SchedulerRun run = opt_.live ? run_live_scheduler(opt_, *opt_.live, io) : run_batch_scheduler(opt_, requests_, io);
  ScheduleOutput stop;
  stop.flags = ScheduleOutput::kStop;
  stop.iteration = run.iterations;
  publish(stop, pending, bufs);
  ring_out_->close();
  for (auto& r : pending) wait_request(*r, deadline(), failed_, "scheduler: stop message to a relay");
  if (stats_in_) stats_in_->drain(upstream_deadline(), failed_);
  result_.results = std::move(run.results);
  result_.iterations = run.iterations;
  result_.swift = std::move(run.swift);
  result_.interrupted = run.interrupted;
  result_.start_s = run.start_s;
  result_.wall_s = run.wall_s;
}

void Engine::relay_thread() {
  std::vector<std::byte> buf(opt_.ring_slot_bytes);
  for (;;) {
    transport::RequestPtr req;
    {
      Tracer::Span span(trace_, Lane::kRelay, TraceCat::kWait, "relay");
      req = links_.link(0).irecv(buf, kTagSchedule);
      wait_request(*req, upstream_deadline(), failed_,
                   fmt::format("relay on rank {}: next scheduling output from rank 0 (the scheduler)", rank_));
    }
    auto msg = std::span(buf).first(req->bytes());
    ring_out_->write(msg, deadline(), &failed_.failed);
    if (deserialize_schedule(msg, "relay").stop()) break;
  }
  ring_out_->close();
}

// The communicator's progress loop (SiPipe §4.1): backends such as MPI and UCX move a
// large message only while someone drives them, and the thread that started a send may be
// blocked on something else (the next input) meanwhile; without this, a rendezvous-size
// hidden state would wait for its sender's next test() and the pipeline would stall.
void Engine::progress_loop(const std::atomic<bool>& finished) {
  try {
    // The first pass checks at once: a peer already gone at start is named before any wait.
    auto last_check = Clock::now() - std::chrono::milliseconds(100);
    auto idle_sleep = opt_.progress_interval;
    // When each same-host rank was first seen stopped (SIGSTOP, a debugger); cleared when it
    // runs again.
    std::vector<std::optional<Clock::time_point>> stopped_since(opt_.host_pids.size());
    while (!finished.load(std::memory_order_relaxed) && !failed_.failed) {
      const std::uint64_t posts = links_.post_count();
      links_.progress();
      // Watchdog: a rank whose only partner died may itself be waiting on a live rank
      // that waits on it in turn; checking the host's pids names the dead one at once.
      if (Clock::now() - last_check >= std::chrono::milliseconds(100)) {
        last_check = Clock::now();
        for (std::size_t r = 0; r < opt_.host_pids.size(); ++r) {
          if (static_cast<int>(r) == rank_) continue;
          if (!process_alive(opt_.host_pids[r]))
            throw_error(ErrorCode::kPeerFailed, "rank {}: rank {} (pid {}, same host) died", rank_, r,
                        opt_.host_pids[r]);
          // A stopped rank is alive but answers nothing: the ranks waiting on it, directly or
          // through others, would each blame the peer they wait on at their deadline. Named
          // here at half the deadline, before any wait gives up, it is the one blamed.
          auto& since = stopped_since[r];
          if (!process_stopped(opt_.host_pids[r])) {
            since.reset();
          } else if (!since) {
            since = last_check;
          } else if (last_check - *since >= opt_.deadline / 2) {
            const std::string why = fmt::format(
                "rank {}: rank {} (pid {}, same host) has been stopped for {} ms (process state T: SIGSTOP, Ctrl-Z or "
                "a debugger) and answers nothing", rank_, r, opt_.host_pids[r],
                std::chrono::duration_cast<std::chrono::milliseconds>(last_check - *since).count());
            // Said now: this rank's other threads may sit in a wait that only ends at its own
            // deadline, and by then a rank on another host could have blamed a live peer
            // first (the fault suite saw 3 of 9 right during prefill). The job ends as before.
            spdlog::critical("rank {} failed (peer failed): {}", rank_, why);
            throw_error(ErrorCode::kPeerFailed, "{}", why);
          }
        }
        if (opt_.silent_ranks) check_heartbeats(opt_.silent_ranks());
      }
      // Every pass wakes a thread that shares the cores with the forward, so pass often
      // only while a send is in flight; otherwise back off (doubling) to progress_idle_max
      // and come back at once when anything is posted. Receives alone keep the slow pace:
      // their owners test them when they need the data (docs/runtime.md).
      if (links_.sweep_sends() > 0) {
        idle_sleep = opt_.progress_interval;
        std::this_thread::sleep_for(opt_.progress_interval);
      } else {
        idle_sleep = std::min(idle_sleep * 2, std::max(opt_.progress_idle_max, opt_.progress_interval));
        links_.wait_for_post(posts, idle_sleep);
      }
    }
  } catch (...) {
    failed_.set(std::current_exception());
    tsem_.close();
  }
}

// Rank 0 hears every rank's heartbeat, the others rank 0's (bootstrap.hpp). A silence is
// first-hand evidence, so it is said at once, like a stopped host-mate.
void Engine::check_heartbeats(const std::vector<transport::Bootstrap::SilentRank>& silent) const {
  if (silent.empty()) return;
  std::string ranks;
  double longest = 0;
  for (const auto& s : silent) {
    ranks += fmt::format("{}rank {}", ranks.empty() ? "" : ", ", s.rank);
    longest = std::max(longest, s.seconds);
  }
  const std::string why = fmt::format("rank {}: no heartbeat from {} for {:.1f} s (stopped or hung, or behind a cut "
                                      "link)", rank_, ranks, longest);
  spdlog::critical("rank {} failed (peer failed): {}", rank_, why);
  throw_error(ErrorCode::kPeerFailed, "{}", why);
}

EngineResult Engine::run() {
  std::vector<std::thread> threads;
  const bool relay = rank_ == leader_ && rank_ != 0;
  if (rank_ == 0) threads.push_back(spawn("scheduler", [this] { scheduler_thread(); }));
  if (relay) threads.push_back(spawn("relay", [this] { relay_thread(); }));
  if (rank_ == sampler_rank_ && opt_.cpu_sampler) threads.push_back(spawn("sampler", [this] { sampler_thread(); }));
  if (rank_ == sampler_rank_ && !opt_.cpu_sampler) {
    std::vector<transport::Link*> shard_links(static_cast<std::size_t>(grid_.tp), nullptr);
    for (int j = 0; j < grid_.tp; ++j)
      if (j != k_) shard_links[static_cast<std::size_t>(j)] = &links_.link(grid_.rank_at(grid_.pp - 1, j));
    inline_sampler_ = std::make_unique<SamplerStage>(rank_, grid_, shard_links.data(), stage_.vocab_size(),
                                                     opt_.scheduler.max_seqs_per_group, max_logit_rows(), 0, opt_, failed_, trace_,
                                                     Lane::kForward);
  }
  if (opt_.tsem) threads.push_back(spawn("cpu executor", [this] { cpu_executor(); }));
  std::atomic<bool> finished{false};
  std::thread progress([this, &finished] { progress_loop(finished); });
  try {
    forward_executor();
  } catch (...) {
    failed_.set(std::current_exception());
    tsem_.close();
  }
  for (auto& t : threads) t.join();
  finished = true;
  progress.join();
  try {
    failed_.rethrow();
  } catch (const std::exception& e) {
    // The ranks reading this host's ring would otherwise only see it close early.
    if (ring_out_) ring_out_->fail(fmt::format("rank {}: {}", rank_, e.what()));
    if (opt_.live) opt_.live->set_failed(e.what());  // the server answers 503 naming it
    throw;
  }
  if (rank_ == 0 || relay) ring_out_->wait_drained(deadline());
  {
    std::lock_guard lock(token_send_mu_);
    for (auto& [b, r] : token_sends_) wait_request(*r, deadline(), failed_, fmt::format("rank {}: tokens send", rank_));
  }
  return std::move(result_);
}

}  // namespace detail

void StageCompute::start_logits(const StageInput&, const float*, int) {
  throw_error(ErrorCode::kInternal, "start_logits() on a stage whose logits are not asynchronous");
}
const float* StageCompute::finish_logits(int) {
  throw_error(ErrorCode::kInternal, "finish_logits() on a stage whose logits are not asynchronous");
}

HostWaits parse_host_waits(std::string_view name, std::string_view what) {
  if (name == "auto") return HostWaits::kAuto;
  if (name == "block") return HostWaits::kBlock;
  if (name == "spin") return HostWaits::kSpin;
  throw_error(ErrorCode::kInvalidArgument, "{}: unknown wait style '{}' (valid: auto, block, spin)", what, name);
}

bool host_waits_spin(HostWaits mode, bool cuda, int host_ranks, std::string* why) {
  if (mode != HostWaits::kAuto) {
    if (why) *why = mode == HostWaits::kSpin ? "run.host_waits=spin" : "run.host_waits=block";
    return mode == HostWaits::kSpin;
  }
  // The cores this process may run on (a launcher may have bound it: mpirun binds each rank
  // to one core by default at 2 ranks), and no more than its share of the host's.
  cpu_set_t set;
  CPU_ZERO(&set);
  const int allowed = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  const int online = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int mine = std::min(allowed, online / std::max(1, host_ranks));
  const bool spin = cuda && mine >= 4;
  if (why)
    *why = fmt::format("run.host_waits=auto: {}; {} core(s) for this rank ({} allowed, {} rank(s) on this host)",
                       cuda ? "stages on CUDA GPUs" : "stages on the CPU", mine, allowed, host_ranks);
  return spin;
}

EngineResult run_engine(int rank, const EngineGrid& grid, transport::Transport& links, StageCompute& stage,
                        const std::vector<Request>& requests, const EngineOptions& options, Tracer& tracer) {
  detail::Engine engine(rank, grid, links, stage, requests, options, tracer);
  return engine.run();
}

}  // namespace trellis::runtime
