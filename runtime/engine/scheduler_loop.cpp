// The scheduler thread's loops (rank 0): a fixed request list (trellis run) or requests
// arriving through a LiveQueue (trellis serve). The engine gives them its I/O (publish a
// scheduling output, wait for the tokens of one); the loops own the batching decisions.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <set>

#include "engine_internal.hpp"
#include "trellis/core/clock.hpp"

namespace trellis::runtime::detail {

// Layout: {i64 iteration, i32 n tokens, i32 has shares, i32 c candidate entries}, n x i32
// tokens, c x i32 candidate tokens, c x f32 probabilities, [3 x f64 shares].
void pack_tokens(const TokensMsg& m, std::vector<std::byte>& out) {
  const auto n = static_cast<std::int32_t>(m.tokens.size());
  const auto c = static_cast<std::int32_t>(m.cand_tokens.size());
  const std::int32_t has = m.has_shares ? 1 : 0;
  out.resize(20 + 4 * m.tokens.size() + 8 * m.cand_tokens.size() + (m.has_shares ? 24 : 0));
  std::byte* p = out.data();
  std::memcpy(p, &m.iteration, 8);
  std::memcpy(p + 8, &n, 4);
  std::memcpy(p + 12, &has, 4);
  std::memcpy(p + 16, &c, 4);
  p += 20;
  if (n > 0) std::memcpy(p, m.tokens.data(), 4 * m.tokens.size());
  p += 4 * m.tokens.size();
  if (c > 0) {
    std::memcpy(p, m.cand_tokens.data(), 4 * m.cand_tokens.size());
    std::memcpy(p + 4 * m.cand_tokens.size(), m.cand_probs.data(), 4 * m.cand_tokens.size());
  }
  p += 8 * m.cand_tokens.size();
  if (m.has_shares) {
    const double sh[3] = {m.busy, m.comm, m.wait};
    std::memcpy(p, sh, sizeof sh);
  }
}

TokensMsg unpack_tokens(std::span<const std::byte> in, int sampler_rank) {
  TokensMsg m;
  std::int32_t n = -1, has = 0, c = -1;
  if (in.size() >= 20) {
    std::memcpy(&m.iteration, in.data(), 8);
    std::memcpy(&n, in.data() + 8, 4);
    std::memcpy(&has, in.data() + 12, 4);
    std::memcpy(&c, in.data() + 16, 4);
  }
  const std::size_t want = 20 + 4 * static_cast<std::size_t>(std::max(n, 0)) +
                           8 * static_cast<std::size_t>(std::max(c, 0)) + (has == 1 ? 24 : 0);
  if (n < 0 || c < 0 || (has != 0 && has != 1) || in.size() != want)
    throw_error(ErrorCode::kCorruptInput, "scheduler: malformed tokens message of {} bytes from the sampler on rank {}",
                in.size(), sampler_rank);
  const std::byte* p = in.data() + 20;
  m.tokens.resize(static_cast<std::size_t>(n));
  if (n > 0) std::memcpy(m.tokens.data(), p, 4 * static_cast<std::size_t>(n));
  p += 4 * static_cast<std::size_t>(n);
  m.cand_tokens.resize(static_cast<std::size_t>(c));
  m.cand_probs.resize(static_cast<std::size_t>(c));
  if (c > 0) {
    std::memcpy(m.cand_tokens.data(), p, 4 * static_cast<std::size_t>(c));
    std::memcpy(m.cand_probs.data(), p + 4 * static_cast<std::size_t>(c), 4 * static_cast<std::size_t>(c));
  }
  p += 8 * static_cast<std::size_t>(c);
  if (has == 1) {
    double sh[3];
    std::memcpy(sh, p, sizeof sh);
    m.has_shares = true;
    m.busy = sh[0];
    m.comm = sh[1];
    m.wait = sh[2];
  }
  return m;
}

namespace {

// Dispatch state shared by both loops: which groups have an iteration in flight, in order.
class Dispatcher {
 public:
  Dispatcher(int groups, Scheduler& sched, SchedulerIO& io) : busy_(static_cast<std::size_t>(groups)), sched_(sched), io_(io) {}

  // Gives every idle group its next iteration, if it has one.
  void dispatch_idle() {
    for (int g = 0; g < static_cast<int>(busy_.size()); ++g) {
      if (busy_[static_cast<std::size_t>(g)]) continue;
      if (auto s = sched_.schedule(g, now_seconds())) {
        io_.publish(*s);
        busy_[static_cast<std::size_t>(g)] = true;
        inflight_.push_back(std::move(*s));
        published_ns_.push_back(now_ns());
      }
    }
    for (auto& n : sched_.take_notes()) io_.note(std::move(n));
  }
  // Waits for the oldest iteration's tokens and hands them to the scheduler; returns it.
  ScheduleOutput complete_oldest(TokensMsg& got) {
    ScheduleOutput s = std::move(inflight_.front());
    inflight_.pop_front();
    const std::int64_t published = published_ns_.front();
    published_ns_.pop_front();
    got = io_.receive(s);
    if (got.iteration != static_cast<std::int64_t>(s.iteration))
      throw_error(ErrorCode::kCorruptInput, "scheduler: tokens for iteration {} arrived while {} was expected",
                  got.iteration, s.iteration);
    sched_.complete(s, got.tokens, now_seconds(), got.cand_tokens, got.cand_probs);
    busy_[static_cast<std::size_t>(s.group)] = false;
    if (io_.swift_span && !s.seqs.empty() && s.seqs.front().candidates)
      io_.swift_span(s.skip.empty() ? "swift verify" : s.seqs.front().parents.empty() ? "swift draft" : "swift optimise",
                     published, static_cast<std::int64_t>(s.iteration));
    return s;
  }
  bool idle() const { return inflight_.empty(); }
  std::size_t in_flight() const { return inflight_.size(); }

 private:
  std::vector<bool> busy_;
  std::deque<ScheduleOutput> inflight_;
  std::deque<std::int64_t> published_ns_;
  Scheduler& sched_;
  SchedulerIO& io_;
};

}  // namespace

namespace {

// Hands every request to EngineOptions::on_finished once, as soon as it is over. Requests
// end in three places: rejected when the scheduler is built, at the iteration that
// produces their last token (or carries their abort), and on cancel; each is looked at
// then, so a run of many requests never rescans them all per iteration.
class FinishedReporter {
 public:
  FinishedReporter(const EngineOptions& opt, const Scheduler& sched)
      : callback_(opt.on_finished), sched_(sched), reported_(callback_ ? sched.results().size() : 0, false) {}
  void check(std::int64_t id) {
    if (!callback_) return;
    const auto i = static_cast<std::size_t>(id);
    const auto& r = sched_.results()[i];
    if (reported_[i] || (r.status != RequestStatus::kFinished && r.status != RequestStatus::kFailed)) return;
    reported_[i] = true;
    callback_(sched_.requests()[i], r);
  }
  void check(const ScheduleOutput& s) {
    for (const auto& q : s.seqs) check(q.id);
  }
  void check_all() {
    for (std::size_t i = 0; i < reported_.size(); ++i) check(static_cast<std::int64_t>(i));
  }

 private:
  const std::function<void(const Request&, const RequestResult&)>& callback_;
  const Scheduler& sched_;
  std::vector<bool> reported_;
};

}  // namespace

SchedulerRun run_batch_scheduler(const EngineOptions& opt, const std::vector<Request>& requests, SchedulerIO& io) {
  SchedulerRun out;
  out.start_s = now_seconds();
  Scheduler sched(opt.scheduler, requests);
  FinishedReporter finished(opt, sched);
  finished.check_all();  // rejected before they ran
  Dispatcher d(opt.scheduler.groups, sched, io);
  d.dispatch_idle();
  TokensMsg got;
  while (!d.idle()) {
    if (opt.stop && opt.stop->load() && !sched.cancelled()) {
      spdlog::warn("interrupted: finishing the {} iterations in flight, then stopping every rank", d.in_flight());
      sched.cancel("interrupted before it finished", now_seconds());
      out.interrupted = true;
      finished.check_all();  // the waiting ones failed now
    }
    finished.check(d.complete_oldest(got));
    d.dispatch_idle();
  }
  if (!sched.done()) throw_error(ErrorCode::kInternal, "scheduler: nothing in flight but requests remain");
  finished.check_all();  // anything that ended outside an iteration
  out.results = sched.results();
  out.swift = sched.swift_report();
  out.iterations = sched.iterations_scheduled();
  out.wall_s = now_seconds() - out.start_s;
  return out;
}

namespace {

// What the live loop has told the front end about each open request.
class LiveReporter {
 public:
  LiveReporter(Scheduler& sched, LiveQueue& live) : sched_(sched), live_(live) {}
  void opened(std::int64_t id) { sent_[id] = 0; }
  void aborted(std::int64_t id) { aborted_.insert(id); }
  // Emits the new tokens of `id` and, when it is over, its final event.
  void report(std::int64_t id, double now) {
    auto it = sent_.find(id);
    if (it == sent_.end()) return;
    const auto& res = sched_.results()[static_cast<std::size_t>(id)];
    LiveEvent e;
    e.id = id;
    e.time_s = now;
    e.tokens.assign(res.output.begin() + static_cast<std::ptrdiff_t>(std::min(it->second, res.output.size())),
                    res.output.end());
    it->second = res.output.size();
    const bool over = res.status == RequestStatus::kFinished || res.status == RequestStatus::kFailed;
    if (over) {
      e.finished = true;
      if (res.status == RequestStatus::kFinished) {
        e.finish_reason = res.reason == "stop" ? "stop" : "length";  // max_tokens and context are both "length"
      } else {
        e.failed = !aborted_.count(id) && !sched_.cancelled();
        e.finish_reason = res.reason;
      }
    }
    if (e.tokens.empty() && !e.finished) return;
    live_.emit(e);
    if (over) {
      sent_.erase(it);
      aborted_.erase(id);
      sched_.forget(id);
    }
  }
  // Final events for everything that ended outside an iteration (aborts, shutdown).
  void report_all(double now) {
    std::vector<std::int64_t> ids;
    for (auto& [id, n] : sent_) ids.push_back(id);
    for (auto id : ids) report(id, now);
  }

 private:
  Scheduler& sched_;
  LiveQueue& live_;
  std::map<std::int64_t, std::size_t> sent_;  // open id -> tokens already emitted
  std::set<std::int64_t> aborted_;
};

}  // namespace

SchedulerRun run_live_scheduler(const EngineOptions& opt, LiveQueue& live, SchedulerIO& io) {
  SchedulerRun out;
  out.start_s = now_seconds();
  Scheduler sched(opt.scheduler, {});
  Dispatcher d(opt.scheduler.groups, sched, io);
  LiveReporter rep(sched, live);
  // A third of the deadline: the ranks' waits for the next scheduling output (bounded by
  // twice the deadline) then always see one in time, even with a heartbeat lost to load.
  const auto beat = std::max<Millis>(Millis(10), opt.deadline / 3);
  auto last_publish = Clock::now();
  LiveQueue::Inbox in;
  TokensMsg got;
  std::vector<StageShare> stages;
  live.set_ready(opt.scheduler);
  for (;;) {
    // No work at all: sleep on the queue until some arrives or a heartbeat is due. With
    // requests running or waiting, only look (their next iteration goes out at once).
    const bool no_work = d.idle() && sched.running_count() + sched.waiting_count() == 0;
    const auto since = std::chrono::duration_cast<Millis>(Clock::now() - last_publish);
    live.take(in, no_work ? std::max(Millis(0), beat - since) : Millis(0));
    const double now = now_seconds();
    for (auto& r : in.added) {
      const auto id = r.id;
      rep.opened(id);
      sched.add(std::move(r), now);
      rep.report(id, now);  // a request the scheduler refused ends here
    }
    for (auto& [id, why] : in.cancelled) {
      rep.aborted(id);
      sched.abort(id, why, now);
    }
    if (in.shutdown && !sched.cancelled()) {
      spdlog::info("serve: shutting down ({} running, {} waiting are cancelled)", sched.running_count(),
                   sched.waiting_count());
      sched.cancel(in.shutdown_reason, now);
    }
    rep.report_all(now);
    const std::size_t before = d.in_flight();
    d.dispatch_idle();
    if (d.in_flight() != before) last_publish = Clock::now();
    if (d.idle()) {
      if (in.shutdown) break;
      if (Clock::now() - last_publish >= beat) {
        ScheduleOutput hb;
        hb.flags = ScheduleOutput::kIdle;
        hb.iteration = sched.iterations_scheduled();
        io.publish(hb);
        last_publish = Clock::now();
      }
      live.update(sched.running_count(), sched.waiting_count(), sched.kv_used_tokens(), sched.iterations_scheduled(),
                  io.shares ? io.shares(nullptr) : std::vector<StageShare>{});
      continue;
    }
    const ScheduleOutput done = d.complete_oldest(got);
    const double t = now_seconds();
    for (const auto& q : done.seqs) rep.report(q.id, t);
    std::optional<LiveStats::Swift> sw;
    if (auto r = sched.swift_report())
      sw = LiveStats::Swift{r->verify_passes, r->draft_steps, r->accepted, r->opt_steps, r->turned_off};
    live.update(sched.running_count(), sched.waiting_count(), sched.kv_used_tokens(), sched.iterations_scheduled(),
                io.shares ? io.shares(&got) : std::vector<StageShare>{}, sw);
  }
  out.swift = sched.swift_report();
  out.iterations = sched.iterations_scheduled();
  out.wall_s = now_seconds() - out.start_s;
  return out;
}

}  // namespace trellis::runtime::detail
