#include "trellis/runtime/scheduler/scheduler.hpp"

#include <algorithm>

#include "trellis/core/error.hpp"

namespace trellis::runtime {

std::optional<std::string> admission_error(const SchedulerConfig& c, const Request& r) {
  const auto prompt = static_cast<std::int64_t>(r.prompt.size());
  if (prompt == 0) return std::string("the prompt is empty (it needs at least one token)");
  if (prompt >= c.max_context)
    return fmt::format("prompt of {} tokens does not fit the context of {} (no room for a new token)", prompt,
                       c.max_context);
  if (c.prefill_chunk <= 0 && prompt > c.max_iteration_tokens)
    return fmt::format("prompt of {} tokens exceeds the {} tokens one iteration may hold (a prefill chunk, "
                       "--prefill-chunk, lets longer prompts in)", prompt, c.max_iteration_tokens);
  const std::int64_t need = std::min<std::int64_t>(prompt + r.sampling.max_tokens, c.max_context);
  if (need > c.kv_budget_tokens)
    return fmt::format("needs {} KV positions (prompt {} + max_tokens {}) but the KV budget holds {}; it can never fit",
                       need, prompt, r.sampling.max_tokens, c.kv_budget_tokens);
  return std::nullopt;
}

Scheduler::Scheduler(SchedulerConfig config, std::vector<Request> requests)
    : cfg_(config), requests_(std::move(requests)) {
  if (cfg_.groups < 1 || cfg_.max_seqs_per_group < 1 || cfg_.kv_budget_tokens < 1 || cfg_.max_context < 2)
    throw_error(ErrorCode::kInvalidArgument,
                "scheduler: groups {} seqs/group {} KV budget {} tokens context {} must all be positive", cfg_.groups,
                cfg_.max_seqs_per_group, cfg_.kv_budget_tokens, cfg_.max_context);
  if (cfg_.prefill_chunk < 0 || cfg_.prefill_chunk > cfg_.max_iteration_tokens)
    throw_error(ErrorCode::kInvalidArgument,
                "prefill chunk of {} tokens must be 0 (whole prompts) or 1..{} (run.max_iteration_tokens)",
                cfg_.prefill_chunk, cfg_.max_iteration_tokens);
  if (cfg_.swift.allowed) swift_.emplace(cfg_.swift);
  groups_.resize(static_cast<std::size_t>(cfg_.groups));
  for (auto& g : groups_) g.column_used.assign(static_cast<std::size_t>(cfg_.max_seqs_per_group), false);
  const int slots = cfg_.groups * cfg_.max_seqs_per_group;
  for (int s = slots - 1; s >= 0; --s) free_slots_.push_back(s);
  results_.resize(requests_.size());
  wait_reported_.assign(requests_.size(), false);
  for (std::size_t i = 0; i < requests_.size(); ++i) {
    if (requests_[i].id != static_cast<std::int64_t>(i))
      throw_error(ErrorCode::kInternal, "scheduler: request ids must be 0..n-1 in order (got {} at {})",
                  requests_[i].id, i);
    enqueue(i);
  }
}

void Scheduler::enqueue(std::size_t i) {
  const auto& r = requests_[i];
  results_[i].id = r.id;
  std::string reject = r.error;
  if (reject.empty())
    if (auto why = admission_error(cfg_, r)) reject = *why;
  if (!reject.empty()) {
    results_[i].status = RequestStatus::kFailed;
    results_[i].reason = reject;
    notes_.push_back(fmt::format("request {} rejected: {}", r.name, reject));
  } else {
    waiting_.push_back(r.id);
    ++open_;
    if (swift_)
      if (auto why = swift_->refusal(r)) notes_.push_back(fmt::format("request {}: {}", r.name, *why));
  }
}

bool Scheduler::add(Request r, double now) {
  if (r.id != static_cast<std::int64_t>(requests_.size()))
    throw_error(ErrorCode::kInternal, "scheduler: added request has id {}, expected {}", r.id, requests_.size());
  if (cancelled_) r.error = cancel_reason_;
  requests_.push_back(std::move(r));
  results_.emplace_back();
  wait_reported_.push_back(false);
  enqueue(requests_.size() - 1);
  auto& res = results_.back();
  if (res.status == RequestStatus::kFailed) res.finished_s = now;
  return res.status != RequestStatus::kFailed;
}

void Scheduler::abort(std::int64_t id, const std::string& reason, double now) {
  if (id < 0 || id >= static_cast<std::int64_t>(requests_.size())) return;
  auto& res = results_[static_cast<std::size_t>(id)];
  if (res.status == RequestStatus::kFinished || res.status == RequestStatus::kFailed) return;
  auto w = std::find(waiting_.begin(), waiting_.end(), id);
  if (w != waiting_.end()) {
    waiting_.erase(w);
    res.status = RequestStatus::kFailed;
    res.reason = reason;
    res.finished_s = now;
    --open_;
    return;
  }
  for (auto& g : groups_)
    for (std::size_t i = 0; i < g.running.size(); ++i)
      if (g.running[i].id == id) {
        if (g.in_flight) g.running[i].abort_reason = reason;
        else finish(g, i, RequestStatus::kFailed, reason, now);
        return;
      }
}

void Scheduler::forget(std::int64_t id) {
  if (id < 0 || id >= static_cast<std::int64_t>(requests_.size())) return;
  auto& res = results_[static_cast<std::size_t>(id)];
  if (res.status != RequestStatus::kFinished && res.status != RequestStatus::kFailed) return;
  std::vector<std::int32_t>().swap(requests_[static_cast<std::size_t>(id)].prompt);
  std::vector<std::int32_t>().swap(res.output);
}

int Scheduler::running_count() const {
  int n = 0;
  for (const auto& g : groups_) n += static_cast<int>(g.running.size());
  return n;
}

std::int64_t Scheduler::reservation(const Request& r) const {
  const auto base =
      std::min<std::int64_t>(static_cast<std::int64_t>(r.prompt.size()) + r.sampling.max_tokens, cfg_.max_context);
  // A drafting sequence also uses scratch positions past its length (never more than the
  // budget: one that does not fit drafts only while its scratch stays inside the context).
  if (swift_ && swift_->wants(r))
    return std::min<std::int64_t>(base + swift_->scratch_positions(), std::max(base, cfg_.kv_budget_tokens));
  return base;
}

int Scheduler::first_chunk(const Request& r) const {
  const auto prompt = static_cast<int>(r.prompt.size());
  return cfg_.prefill_chunk > 0 ? std::min(prompt, cfg_.prefill_chunk) : prompt;
}

bool Scheduler::prompt_finished(const Running& run) const {
  return run.prompt_done >= static_cast<std::int32_t>(requests_[static_cast<std::size_t>(run.id)].prompt.size());
}

int Scheduler::next_tokens(const Running& run) const {
  const auto prompt = static_cast<int>(requests_[static_cast<std::size_t>(run.id)].prompt.size());
  if (run.prompt_done >= prompt) return 1;
  const int left = prompt - run.prompt_done;
  return cfg_.prefill_chunk > 0 ? std::min(left, cfg_.prefill_chunk) : left;
}

bool Scheduler::admit_into(Group& g, double now, int& tokens_left) {
  if (waiting_.empty()) return false;
  auto col = std::find(g.column_used.begin(), g.column_used.end(), false);
  if (col == g.column_used.end()) return false;
  const auto& r = requests_[static_cast<std::size_t>(waiting_.front())];
  auto need = reservation(r);
  if (first_chunk(r) > tokens_left) return false;
  if (kv_used_ + need > cfg_.kv_budget_tokens) {
    if (!wait_reported_[static_cast<std::size_t>(r.id)]) {
      wait_reported_[static_cast<std::size_t>(r.id)] = true;
      notes_.push_back(fmt::format("request {} waits: KV cache full ({} of {} positions reserved, it needs {})",
                                   r.name, kv_used_, cfg_.kv_budget_tokens, need));
    }
    return false;
  }
  waiting_.pop_front();
  *col = true;
  kv_used_ += need;
  tokens_left -= first_chunk(r);
  Running run{r.id, free_slots_.back(), static_cast<std::int32_t>(col - g.column_used.begin()), 0, need};
  free_slots_.pop_back();
  g.running.push_back(run);
  auto& res = results_[static_cast<std::size_t>(r.id)];
  res.status = RequestStatus::kRunning;
  res.admitted_s = now;
  return true;
}

std::optional<ScheduleOutput> Scheduler::schedule(int gi, double now) {
  auto& g = groups_.at(static_cast<std::size_t>(gi));
  if (g.in_flight) throw_error(ErrorCode::kInternal, "scheduler: group {} already has an iteration in flight", gi);
  if (cancelled_) {
    // Sequences whose iteration already completed are dropped here, not run again.
    while (!g.running.empty()) finish(g, g.running.size() - 1, RequestStatus::kFailed, cancel_reason_, now);
    return std::nullopt;
  }
  // SWIFT sequences take turns with the others (a draft's skip set applies to a whole
  // iteration); without others they have every iteration.
  if (swift_ && g.swift_turn)
    if (auto s = schedule_swift(g, gi, now)) return s;
  // The iteration's token limit: decode steps first (one token each), then the running
  // prompts' next chunks in admission order (a chunk shrinks to what is left, and a prompt
  // with nothing left waits for the next iteration), then new admissions.
  int tokens_left = cfg_.max_iteration_tokens;
  for (const auto& run : g.running) tokens_left -= prompt_finished(run) && !drafting(run) ? 1 : 0;
  std::vector<int> take(g.running.size());
  for (std::size_t i = 0; i < g.running.size(); ++i) {
    if (prompt_finished(g.running[i])) {
      take[i] = drafting(g.running[i]) ? 0 : 1;
      continue;
    }
    take[i] = std::max(0, std::min(next_tokens(g.running[i]), tokens_left));
    tokens_left -= take[i];
  }
  while (admit_into(g, now, tokens_left)) {
  }
  for (std::size_t i = take.size(); i < g.running.size(); ++i) take.push_back(next_tokens(g.running[i]));
  if (g.running.empty()) return std::nullopt;
  if (std::all_of(take.begin(), take.end(), [](int t) { return t == 0; }) && swift_)
    if (auto s = schedule_swift(g, gi, now)) return s;
  ScheduleOutput s;
  s.iteration = next_iteration_++;
  s.group = gi;
  g.swift_turn = true;
  g.scheduled_at = now;
  g.pure_decode = true;
  for (std::size_t i = 0; i < g.running.size(); ++i) {
    auto& run = g.running[i];
    if (take[i] == 0) continue;  // a prompt chunk that did not fit this iteration
    const auto& r = requests_[static_cast<std::size_t>(run.id)];
    ScheduledSeq q;
    q.id = run.id;
    q.slot = run.slot;
    q.column = run.column;
    q.pos = run.len;
    const auto prompt = static_cast<std::int32_t>(r.prompt.size());
    if (run.prompt_done < prompt) {
      q.first = run.prompt_done == 0;
      q.prompt = true;
      if (q.first) q.params = r.sampling;
      q.n_tokens = take[i];
      const auto begin = r.prompt.begin() + run.prompt_done;
      s.tokens.insert(s.tokens.end(), begin, begin + q.n_tokens);
      run.prompt_done += q.n_tokens;
      q.sample = run.prompt_done == prompt;  // only the last chunk yields a token
    } else {
      q.n_tokens = 1;
      s.tokens.push_back(run.next_token);
    }
    g.pure_decode = g.pure_decode && !q.prompt;
    if (swift_) {
      const auto owed = swift_->take_moves(run.id);
      s.moves.insert(s.moves.end(), owed.begin(), owed.end());
    }
    run.len += q.n_tokens;
    s.seqs.push_back(q);
  }
  g.in_flight = true;
  return s;
}

bool Scheduler::drafting(const Running& run) const {
  if (!swift_ || !prompt_finished(run) || !run.abort_reason.empty()) return false;
  const auto& r = requests_[static_cast<std::size_t>(run.id)];
  return swift_->wants(r) && swift_->drafting(view(run), cfg_.max_context);
}

SwiftControl::SeqView Scheduler::view(const Running& run) const {
  const auto i = static_cast<std::size_t>(run.id);
  return {run.id, run.slot, run.column, run.len, run.next_token, &requests_[i].prompt, &results_[i].output};
}

std::optional<ScheduleOutput> Scheduler::schedule_swift(Group& g, int gi, double now) {
  std::vector<SwiftControl::SeqView> views;
  for (const auto& run : g.running)
    if (drafting(run)) views.push_back(view(run));
  ScheduleOutput s;
  if (views.empty() || !swift_->plan(views, s, now)) return std::nullopt;
  s.iteration = next_iteration_++;
  s.group = gi;
  g.in_flight = true;
  g.swift_turn = false;
  g.scheduled_at = now;
  g.pure_decode = false;
  return s;
}

void Scheduler::commit_tokens(Group& g, std::int64_t id, std::span<const std::int32_t> tokens, double now) {
  const auto& req = requests_[static_cast<std::size_t>(id)];
  auto& res = results_[static_cast<std::size_t>(id)];
  for (auto t : tokens) {
    auto it = std::find_if(g.running.begin(), g.running.end(), [&](const Running& r) { return r.id == id; });
    if (it == g.running.end()) throw_error(ErrorCode::kInternal, "scheduler: sequence {} is not running", id);
    it->next_token = t;
    res.output.push_back(t);
    if (res.first_token_s < 0) res.first_token_s = now;
    auto idx = static_cast<std::size_t>(it - g.running.begin());
    const auto& stops = req.sampling.stop_ids;
    // The same end rules as a plain step, token by token: a SWIFT commit of several tokens
    // stops at the first stop token or at max_tokens and drops the rest.
    if (std::find(stops.begin(), stops.end(), t) != stops.end()) return finish(g, idx, RequestStatus::kFinished, "stop", now);
    if (static_cast<int>(res.output.size()) >= req.sampling.max_tokens)
      return finish(g, idx, RequestStatus::kFinished, "max_tokens", now);
    if (it->len >= cfg_.max_context) return finish(g, idx, RequestStatus::kFinished, "length", now);
  }
}

std::optional<SwiftReport> Scheduler::swift_report() const {
  if (!swift_) return std::nullopt;
  return swift_->report();
}

void Scheduler::finish(Group& g, std::size_t index, RequestStatus status, std::string reason, double now) {
  auto run = g.running[index];
  if (swift_) swift_->drop(run.id);
  g.column_used[static_cast<std::size_t>(run.column)] = false;
  free_slots_.push_back(run.slot);
  kv_used_ -= run.reserved;
  auto& res = results_[static_cast<std::size_t>(run.id)];
  res.status = status;
  res.reason = std::move(reason);
  res.finished_s = now;
  g.running.erase(g.running.begin() + static_cast<std::ptrdiff_t>(index));
  --open_;
}

void Scheduler::complete(const ScheduleOutput& s, std::span<const std::int32_t> tokens, double now,
                         std::span<const std::int32_t> cand_tokens, std::span<const float> cand_probs) {
  auto& g = groups_.at(static_cast<std::size_t>(s.group));
  if (!g.in_flight || static_cast<int>(tokens.size()) != s.n_sampled())
    throw_error(ErrorCode::kInternal, "scheduler: iteration {} completed with {} tokens, expected {}", s.iteration,
                tokens.size(), s.n_sampled());
  g.in_flight = false;
  const double round_trip = now - g.scheduled_at;
  if (swift_ && !s.seqs.empty() && s.seqs.front().candidates) {
    const auto commits = swift_->complete(s, cand_tokens, cand_probs, round_trip, now);
    for (const auto& q : s.seqs) {  // aborts that waited for this iteration
      auto it = std::find_if(g.running.begin(), g.running.end(), [&](const Running& r) { return r.id == q.id; });
      if (it != g.running.end() && !it->abort_reason.empty())
        finish(g, static_cast<std::size_t>(it - g.running.begin()), RequestStatus::kFailed, it->abort_reason, now);
    }
    for (const auto& c : commits) {
      auto it = std::find_if(g.running.begin(), g.running.end(), [&](const Running& r) { return r.id == c.id; });
      if (it == g.running.end()) continue;
      it->len += c.kv_advance;
      commit_tokens(g, c.id, c.tokens, now);
    }
    for (auto& n : swift_->take_notes()) notes_.push_back(std::move(n));
    if (cancelled_)
      while (!g.running.empty()) finish(g, g.running.size() - 1, RequestStatus::kFailed, cancel_reason_, now);
    return;
  }
  if (swift_ && g.pure_decode) swift_->observe_plain(round_trip, static_cast<int>(s.seqs.size()));
  std::size_t k = 0;
  for (const auto& q : s.seqs) {
    if (!q.sample) {
      // A prefill chunk yields no token; a cancel waiting for it takes effect now.
      auto it = std::find_if(g.running.begin(), g.running.end(), [&](const Running& r) { return r.id == q.id; });
      if (it != g.running.end() && !it->abort_reason.empty())
        finish(g, static_cast<std::size_t>(it - g.running.begin()), RequestStatus::kFailed, it->abort_reason, now);
      continue;
    }
    auto t = tokens[k++];
    auto it = std::find_if(g.running.begin(), g.running.end(), [&](const Running& r) { return r.id == q.id; });
    if (it == g.running.end()) throw_error(ErrorCode::kInternal, "scheduler: sequence {} is not running", q.id);
    if (!it->abort_reason.empty()) {
      finish(g, static_cast<std::size_t>(it - g.running.begin()), RequestStatus::kFailed, it->abort_reason, now);
      continue;
    }
    commit_tokens(g, q.id, std::span(&t, 1), now);
  }
  if (cancelled_)
    while (!g.running.empty()) finish(g, g.running.size() - 1, RequestStatus::kFailed, cancel_reason_, now);
}

void Scheduler::cancel(const std::string& reason, double now) {
  if (cancelled_) return;
  cancelled_ = true;
  cancel_reason_ = reason;
  for (auto id : waiting_) {
    auto& res = results_[static_cast<std::size_t>(id)];
    res.status = RequestStatus::kFailed;
    res.reason = reason;
    res.finished_s = now;
    --open_;
  }
  waiting_.clear();
  for (auto& g : groups_)
    if (!g.in_flight)
      while (!g.running.empty()) finish(g, g.running.size() - 1, RequestStatus::kFailed, reason, now);
}

bool Scheduler::done() const { return open_ == 0; }

std::vector<std::string> Scheduler::take_notes() {
  std::vector<std::string> out;
  out.swap(notes_);
  return out;
}

}  // namespace trellis::runtime
