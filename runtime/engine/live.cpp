#include "trellis/runtime/engine/live.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "trellis/core/clock.hpp"
#include "trellis/core/error.hpp"

namespace trellis::runtime {

LiveQueue::LiveQueue(Limits limits) : limits_(limits) {
  if (limits_.max_waiting < 1)
    throw_error(ErrorCode::kInvalidArgument, "live queue: max_waiting must be at least 1, got {}", limits_.max_waiting);
}

LiveQueue::Submitted LiveQueue::submit(Request r, LiveSink sink) {
  std::lock_guard lock(mu_);
  if (stats_.failed) return {Admit::kFailed, -1, stats_.failure};
  if (draining_ || shutdown_) return {Admit::kStopping, -1, "the server is shutting down"};
  if (!engine_) return {Admit::kNotReady, -1, "the engine is still loading the model"};
  if (!r.error.empty()) {
    ++stats_.rejected;
    return {Admit::kRejected, -1, r.error};
  }
  if (auto why = admission_error(*engine_, r)) {
    ++stats_.rejected;
    return {Admit::kRejected, -1, *why};
  }
  // Requests handed over but not yet taken count as waiting too, so the bound holds while
  // the scheduler is busy with an iteration.
  const int queued = stats_.waiting + static_cast<int>(added_.size());
  if (queued >= limits_.max_waiting)
    return {Admit::kFull, -1,
            fmt::format("{} requests are already waiting (the queue holds {}); retry later", queued,
                        limits_.max_waiting)};
  r.id = next_id_++;
  if (r.name.empty()) r.name = std::to_string(r.id);
  sinks_.emplace(r.id, std::move(sink));
  ++stats_.submitted;
  stats_.prompt_tokens += r.prompt.size();
  const std::int64_t id = r.id;
  added_.push_back(std::move(r));
  cv_.notify_all();
  return {Admit::kAccepted, id, {}};
}

void LiveQueue::cancel(std::int64_t id, std::string reason) {
  std::lock_guard lock(mu_);
  if (!sinks_.count(id)) return;  // already finished: nothing to free
  cancelled_.emplace_back(id, std::move(reason));
  cv_.notify_all();
}

void LiveQueue::begin_drain() {
  std::lock_guard lock(mu_);
  draining_ = true;
  stats_.draining = true;
}

void LiveQueue::shutdown(std::string reason) {
  std::lock_guard lock(mu_);
  draining_ = shutdown_ = true;
  stats_.draining = true;
  shutdown_reason_ = std::move(reason);
  cv_.notify_all();
}

LiveStats LiveQueue::stats() const {
  std::lock_guard lock(mu_);
  LiveStats s = stats_;
  s.waiting += static_cast<int>(added_.size());
  return s;
}

std::optional<SchedulerConfig> LiveQueue::limits() const {
  std::lock_guard lock(mu_);
  return engine_;
}

void LiveQueue::set_ready(const SchedulerConfig& limits) {
  std::lock_guard lock(mu_);
  engine_ = limits;
  stats_.ready = true;
  stats_.kv_budget_tokens = limits.kv_budget_tokens;
}

void LiveQueue::take(Inbox& in, std::chrono::milliseconds wait) {
  in.added.clear();
  in.cancelled.clear();
  std::unique_lock lock(mu_);
  if (added_.empty() && cancelled_.empty() && !shutdown_)
    cv_.wait_for(lock, wait, [&] { return !added_.empty() || !cancelled_.empty() || shutdown_; });
  in.added.swap(added_);
  in.cancelled.swap(cancelled_);
  in.shutdown = shutdown_;
  in.shutdown_reason = shutdown_reason_;
  stats_.waiting += static_cast<int>(in.added.size());
}

void LiveQueue::emit(const LiveEvent& e) {
  LiveSink sink;
  {
    std::lock_guard lock(mu_);
    auto it = sinks_.find(e.id);
    if (it == sinks_.end()) return;
    stats_.generated_tokens += e.tokens.size();
    if (e.finished) {
      sink = std::move(it->second);
      sinks_.erase(it);
      if (e.failed || e.finish_reason == "stop" || e.finish_reason == "length") ++stats_.finished;
      else ++stats_.cancelled;
    } else {
      sink = it->second;  // a copy: the front end may cancel (and so erase) meanwhile
    }
  }
  // Outside the lock: a sink may call cancel() or stats().
  sink(e);
}

void LiveQueue::update(int running, int waiting, std::int64_t kv_used, std::uint64_t iterations,
                       std::vector<StageShare> stages, std::optional<LiveStats::Swift> swift) {
  std::lock_guard lock(mu_);
  if (swift) stats_.swift = swift;
  stats_.running = running;
  stats_.waiting = waiting;
  stats_.kv_used_tokens = kv_used;
  stats_.iterations = iterations;
  if (!stages.empty()) stats_.stages = std::move(stages);
}

void LiveQueue::set_failed(const std::string& what) {
  std::map<std::int64_t, LiveSink> open;
  {
    std::lock_guard lock(mu_);
    if (stats_.failed) return;
    stats_.failed = true;
    stats_.failure = what;
    open.swap(sinks_);
    added_.clear();
    cancelled_.clear();
    cv_.notify_all();
  }
  const double now = now_seconds();
  for (auto& [id, sink] : open) {
    LiveEvent e;
    e.id = id;
    e.finished = true;
    e.failed = true;
    e.finish_reason = what;
    e.time_s = now;
    sink(e);
  }
}

}  // namespace trellis::runtime
