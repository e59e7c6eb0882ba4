// The engine over ranks-as-threads with the test-only stand-in stage (engine_fixture.hpp):
// pipelining, continuous batching, TP shard concatenation, the three techniques and their
// ablations, failures. Token identity across layouts is the correctness criterion.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "engine_fixture.hpp"
#include "trellis/runtime/engine/live.hpp"
#include "trellis/runtime/sampling/sampler.hpp"

using namespace trellis;
using namespace trellis::runtime;
using trellis::test::StandInStage;

namespace {

constexpr int kVocab = 61, kLayers = 4;

std::vector<Request> workload(bool sampled) {
  std::vector<Request> reqs;
  for (int i = 0; i < 11; ++i) {
    Request r;
    r.id = i;
    r.name = fmt::format("q{}", i);
    for (int j = 0; j < 2 + (i * 5) % 7; ++j) r.prompt.push_back((i * 13 + j * 7) % kVocab);
    r.sampling.max_tokens = 3 + i % 6;
    if (sampled && i % 3 != 0) {
      r.sampling.temperature = 0.9f;
      r.sampling.top_k = i % 2 ? 10 : 0;
      r.sampling.top_p = 0.95f;
      r.sampling.seed = 100 + static_cast<std::uint64_t>(i);
      r.sampling.frequency_penalty = 0.4f;
      r.sampling.repetition_penalty = 1.2f;
    } else {
      r.sampling.greedy = true;
    }
    reqs.push_back(r);
  }
  return reqs;
}

struct Run {
  EngineResult result;
  std::vector<std::string> errors;  // per rank, empty when fine
};

std::atomic<int> g_job{0};

Run run_layout(int pp, int tp, const std::vector<Request>& reqs, EngineOptions opt, std::vector<int> hosts = {},
               int skip_rank = -1, bool async_logits = false, std::atomic<int>* async_finishes = nullptr) {
  auto grid = EngineGrid::contiguous(pp, tp, hosts);
  const int n = pp * tp;
  opt.scheduler.groups = pp;
  if (opt.scheduler.kv_budget_tokens == 0) opt.scheduler.kv_budget_tokens = 4096;
  opt.job = fmt::format("t{}-{}", ::getpid(), g_job++);
  opt.ring_slot_bytes = 64 << 10;
  if (opt.deadline == Millis(30000)) opt.deadline = Millis(20000);
  test::InProcHub hub;
  Run run;
  run.errors.resize(static_cast<std::size_t>(n));
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r) {
    if (r == skip_rank) continue;  // a rank that died before doing anything
    ranks.emplace_back([&, r] {
      try {
        test::InProcTransport links(hub, r);
        StandInStage stage(kVocab, kLayers, pp, grid.stage_of(r), tp, grid.tp_of(r),
                           pp * opt.scheduler.max_seqs_per_group);
        stage.set_async_logits(async_logits);
        Tracer tracer(false);
        EngineOptions mine = opt;
        if (r != 0) mine.live = nullptr;  // only rank 0's scheduler reads the live queue
        auto res = run_engine(r, grid, links, stage, reqs, mine, tracer);
        if (async_finishes) *async_finishes += stage.async_finishes();
        if (r == 0) run.result = std::move(res);
      } catch (const std::exception& e) {
        run.errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  return run;
}

EngineOptions base_options() {
  EngineOptions o;
  o.scheduler.max_seqs_per_group = 3;
  o.scheduler.max_context = 64;
  o.sampler_threads = 1;
  return o;
}

std::vector<std::vector<std::int32_t>> outputs(const Run& r) {
  std::vector<std::vector<std::int32_t>> out;
  for (const auto& res : r.result.results) out.push_back(res.output);
  return out;
}

void expect_clean(const Run& r) {
  for (std::size_t i = 0; i < r.errors.size(); ++i) EXPECT_EQ(r.errors[i], "") << "rank " << i;
}

// Greedy generation of one request, one token at a time, straight on a single stand-in.
std::vector<std::int32_t> direct_greedy(const Request& r) {
  StandInStage st(kVocab, kLayers, 1, 0, 1, 0, 1);
  Tracer t(false);
  std::vector<std::int32_t> out;
  std::vector<std::int32_t> feed = r.prompt;
  int pos = 0;
  for (int step = 0; step < r.sampling.max_tokens; ++step) {
    StageInput in;
    in.tokens = feed;
    for (std::size_t j = 0; j < feed.size(); ++j) in.positions.push_back(pos + static_cast<int>(j));
    in.slots = {0};
    in.starts = {pos};
    in.lengths = {static_cast<int>(feed.size())};
    in.fresh = {step == 0 ? 1 : 0};
    std::vector<float> x(feed.size() * StandInStage::kHidden), logits(kVocab);
    st.forward(in, x.data(), t);
    st.logits(in, x.data(), logits.data());
    auto best = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(best);
    pos += static_cast<int>(feed.size());
    feed = {best};
  }
  return out;
}

}  // namespace

TEST(Engine, GreedyIdenticalAcrossLayoutsAndToDirectDecoding) {
  auto reqs = workload(false);
  auto single = run_layout(1, 1, reqs, base_options());
  expect_clean(single);
  ASSERT_EQ(single.result.results.size(), reqs.size());
  for (const auto& res : single.result.results) {
    EXPECT_EQ(res.status, RequestStatus::kFinished) << res.id;
    EXPECT_EQ(res.output, direct_greedy(reqs[static_cast<std::size_t>(res.id)])) << res.id;
  }
  for (auto [pp, tp] : {std::pair{1, 2}, {2, 1}, {2, 2}, {4, 1}}) {
    auto r = run_layout(pp, tp, reqs, base_options());
    expect_clean(r);
    EXPECT_EQ(outputs(r), outputs(single)) << pp << "x" << tp;
  }
}

// A GPU stage's two-phase logits (start, the next forward enqueued, then finish): the
// stand-in checks that every start is finished once and in order; the tokens equal those of
// the synchronous path under every layout, greedy and seeded, and with the CPU sampler or
// token-safe inputs off (where the engine falls back to the synchronous call).
TEST(Engine, TwoPhaseLogitsChangeNoTokenAndNeverDeadlock) {
  for (bool sampled : {false, true}) {
    auto reqs = workload(sampled);
    auto sync = run_layout(1, 1, reqs, base_options());
    expect_clean(sync);
    for (auto [pp, tp] : {std::pair{1, 1}, {1, 2}, {2, 1}, {2, 2}, {4, 1}}) {
      std::atomic<int> finishes{0};
      auto r = run_layout(pp, tp, reqs, base_options(), {}, -1, true, &finishes);
      expect_clean(r);
      EXPECT_EQ(outputs(r), outputs(sync)) << pp << "x" << tp << (sampled ? " sampled" : " greedy");
      EXPECT_GT(finishes.load(), 0) << "the two-phase path ran at " << pp << "x" << tp;
    }
    for (int off = 0; off < 2; ++off) {
      auto opt = base_options();
      (off == 0 ? opt.cpu_sampler : opt.tsem) = false;
      std::atomic<int> finishes{0};
      auto r = run_layout(2, 1, reqs, opt, {}, -1, true, &finishes);
      expect_clean(r);
      EXPECT_EQ(outputs(r), outputs(sync)) << (off == 0 ? "--no-cpu-sampler" : "--no-tsem");
      EXPECT_EQ(finishes.load(), 0) << "the synchronous call is used with " << (off == 0 ? "--no-cpu-sampler" : "--no-tsem");
    }
  }
}

TEST(Engine, ChunkedPrefillChangesNoToken) {
  // Greedy and seeded sampling with penalties (the repetition penalty sees every chunk of
  // the prompt): chunks of 1 and 3 tokens give the tokens of whole-prompt prefill, under
  // every layout and with the sampler inline or on its own thread.
  for (bool sampled : {false, true}) {
    auto reqs = workload(sampled);
    auto whole = run_layout(1, 1, reqs, base_options());
    expect_clean(whole);
    for (int chunk : {1, 3})
      for (auto [pp, tp] : {std::pair{1, 1}, std::pair{2, 1}, std::pair{2, 2}}) {
        auto opt = base_options();
        opt.scheduler.prefill_chunk = chunk;
        opt.cpu_sampler = pp != 2 || tp != 1;
        auto r = run_layout(pp, tp, reqs, opt);
        expect_clean(r);
        EXPECT_EQ(outputs(r), outputs(whole)) << "chunk " << chunk << " pp " << pp << " tp " << tp << " sampled "
                                              << sampled;
      }
  }
}

TEST(Engine, TwoEmulatedHostsRelayTheSchedule) {
  auto reqs = workload(false);
  auto single = run_layout(1, 1, reqs, base_options());
  auto r = run_layout(2, 2, reqs, base_options(), {0, 0, 1, 1});
  expect_clean(r);
  EXPECT_EQ(outputs(r), outputs(single));
}

TEST(Engine, SeededSamplingReproducibleAcrossLayouts) {
  auto reqs = workload(true);
  auto single = run_layout(1, 1, reqs, base_options());
  expect_clean(single);
  auto again = run_layout(1, 1, reqs, base_options());
  EXPECT_EQ(outputs(again), outputs(single));
  for (auto [pp, tp] : {std::pair{2, 2}, {4, 1}}) {
    auto opt = base_options();
    opt.sampler_threads = 3;
    opt.scheduler.max_seqs_per_group = 2;  // other microbatches, other columns
    auto r = run_layout(pp, tp, reqs, opt);
    expect_clean(r);
    EXPECT_EQ(outputs(r), outputs(single)) << pp << "x" << tp;
  }
}

TEST(Engine, AblationsChangeTimingNotTokens) {
  auto reqs = workload(true);
  auto ref = run_layout(2, 2, reqs, base_options());
  expect_clean(ref);
  for (int mask = 0; mask < 8; ++mask) {
    auto opt = base_options();
    opt.cpu_sampler = mask & 1;
    opt.tsem = mask & 2;
    opt.sat = mask & 4;
    auto r = run_layout(2, 2, reqs, opt);
    expect_clean(r);
    EXPECT_EQ(outputs(r), outputs(ref)) << "cpu_sampler " << opt.cpu_sampler << " tsem " << opt.tsem << " sat "
                                        << opt.sat;
  }
}

TEST(Engine, BadRequestsFailAloneAndKvBudgetMakesOthersWait) {
  auto reqs = workload(false);
  reqs[2].error = "p.jsonl:3: top_p must be in (0, 1], got 2";
  reqs[5].prompt.assign(80, 1);  // longer than the context of 64
  auto opt = base_options();
  opt.scheduler.kv_budget_tokens = 24;  // two or three sequences at a time
  auto r = run_layout(2, 1, reqs, opt);
  expect_clean(r);
  auto single = run_layout(1, 1, workload(false), base_options());
  for (const auto& res : r.result.results) {
    if (res.id == 2 || res.id == 5) {
      EXPECT_EQ(res.status, RequestStatus::kFailed);
      continue;
    }
    EXPECT_EQ(res.status, RequestStatus::kFinished);
    EXPECT_EQ(res.output, single.result.results[static_cast<std::size_t>(res.id)].output) << res.id;
  }
  EXPECT_NE(r.result.results[2].reason.find("top_p"), std::string::npos);
  EXPECT_NE(r.result.results[5].reason.find("context"), std::string::npos);
  bool waited = false;
  for (const auto& n : r.result.notes) waited = waited || n.find("waits: KV cache full") != std::string::npos;
  EXPECT_TRUE(waited);
}

TEST(Engine, StopFlagDrainsAndEndsEveryRank) {
  std::atomic<bool> stop{true};
  auto opt = base_options();
  opt.stop = &stop;
  auto r = run_layout(2, 2, workload(false), opt);
  expect_clean(r);
  EXPECT_TRUE(r.result.interrupted);
  for (const auto& res : r.result.results) EXPECT_NE(res.status, RequestStatus::kRunning);
}

TEST(Engine, DeadRankIsNamedWithinTheDeadline) {
  auto opt = base_options();
  opt.deadline = Millis(700);
  auto start = now_seconds();
  auto r = run_layout(2, 1, workload(false), opt, {}, /*skip_rank=*/1);
  EXPECT_LT(now_seconds() - start, 10.0);
  ASSERT_FALSE(r.errors[0].empty());
  EXPECT_NE(r.errors[0].find("rank 1"), std::string::npos) << r.errors[0];
}

// A rank whose heartbeats stopped (a stopped process on another host, or one behind a cut
// link: what Bootstrap::silent_ranks reports) is named by the watchdog as soon as it is
// reported, first-hand, not by the wait that would time out on it at the deadline.
TEST(Engine, SilentHeartbeatIsNamedFirstHand) {
  auto opt = base_options();
  opt.deadline = Millis(20000);
  opt.silent_ranks = [] { return std::vector<transport::Bootstrap::SilentRank>{{1, 4.2}}; };
  // Long enough to outlast the watchdog's first check (100 ms) several times over: ~0.5 s.
  std::vector<Request> reqs;
  for (int copy = 0; copy < 3; ++copy)
    for (auto q : workload(false)) {
      q.id = static_cast<std::int64_t>(reqs.size());
      q.sampling.max_tokens = opt.scheduler.max_context - static_cast<int>(q.prompt.size());
      reqs.push_back(q);
    }
  auto start = now_seconds();
  auto r = run_layout(2, 1, reqs, opt);
  EXPECT_LT(now_seconds() - start, 10.0) << "named only at a deadline";
  ASSERT_FALSE(r.errors[0].empty()) << "the run went on although rank 1 was silent";
  EXPECT_NE(r.errors[0].find("no heartbeat from rank 1 for 4.2 s"), std::string::npos) << r.errors[0];
}

// ---- serving: requests arrive through a LiveQueue while the engine runs ----

namespace {

// A front end's view of one request: its events, in order.
struct Client {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::int64_t, std::vector<std::int32_t>> tokens;
  std::map<std::int64_t, LiveEvent> final;
  LiveSink sink() {
    return [this](const LiveEvent& e) {
      std::lock_guard lock(mu);
      auto& t = tokens[e.id];
      t.insert(t.end(), e.tokens.begin(), e.tokens.end());
      if (e.finished) final[e.id] = e;
      cv.notify_all();
    };
  }
  bool wait_final(std::int64_t id, double seconds) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return final.count(id) > 0; });
  }
  bool wait_tokens(std::int64_t id, std::size_t n, double seconds) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return tokens[id].size() >= n; });
  }
};

bool wait_ready(LiveQueue& q, double seconds) {
  const auto until = Deadline::after(Millis(static_cast<std::int64_t>(seconds * 1000)));
  while (!q.stats().ready && !until.expired()) std::this_thread::sleep_for(Millis(5));
  return q.stats().ready;
}

// Shuts the queue down when the front end's thread ends, also when an ASSERT left it early,
// so a failing test fails instead of leaving the engine serving forever.
struct ShutdownAtExit {
  LiveQueue& q;
  ~ShutdownAtExit() { q.shutdown(); }
};

}  // namespace

TEST(EngineLive, RequestsArrivingOverTimeGetTheBatchTokensAndIdleOutlivesTheDeadline) {
  auto reqs = workload(false);
  auto batch = run_layout(2, 2, reqs, base_options());
  expect_clean(batch);
  LiveQueue q({64});
  Client c;
  std::thread front([&] {
    ShutdownAtExit bye{q};
    ASSERT_TRUE(wait_ready(q, 10));
    // Idle for over twice the deadline: only the heartbeats keep the other ranks waiting.
    std::this_thread::sleep_for(Millis(900));
    std::vector<std::int64_t> ids;
    for (std::size_t i = 0; i < reqs.size(); ++i) {
      auto sub = q.submit(reqs[i], c.sink());
      ASSERT_EQ(sub.status, LiveQueue::Admit::kAccepted) << sub.reason;
      ids.push_back(sub.id);
      if (i % 4 == 3) std::this_thread::sleep_for(Millis(30));  // arrivals join a running batch
    }
    for (auto id : ids) EXPECT_TRUE(c.wait_final(id, 20)) << id;
    q.shutdown();
  });
  auto opt = base_options();
  opt.deadline = Millis(300);
  opt.serving = true;
  opt.live = &q;
  auto r = run_layout(2, 2, {}, opt);
  front.join();
  expect_clean(r);
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const auto id = static_cast<std::int64_t>(i);
    EXPECT_EQ(c.tokens[id], batch.result.results[i].output) << "request " << i;
    EXPECT_EQ(c.final[id].finish_reason, "length");
    EXPECT_FALSE(c.final[id].failed);
  }
  auto st = q.stats();
  EXPECT_EQ(st.finished, reqs.size());
  EXPECT_EQ(st.running + st.waiting, 0);
  EXPECT_EQ(st.kv_used_tokens, 0);
  EXPECT_GT(st.iterations, 0u);
  ASSERT_FALSE(st.stages.empty());
  EXPECT_EQ(st.stages.back().stage, 1);
}

TEST(EngineLive, EveryStageReportsItsSharesAndStopsCleanly) {
  LiveQueue q({16});
  Client c;
  std::vector<StageShare> stages;
  std::thread front([&] {
    ShutdownAtExit bye{q};
    ASSERT_TRUE(wait_ready(q, 10));
    auto reqs = workload(false);
    std::vector<std::int64_t> ids;
    for (int i = 0; i < 4; ++i) ids.push_back(q.submit(reqs[static_cast<std::size_t>(i)], c.sink()).id);
    for (auto id : ids) ASSERT_TRUE(c.wait_final(id, 20));
    stages = q.stats().stages;
  });
  auto opt = base_options();
  opt.serving = true;
  opt.live = &q;
  auto r = run_layout(3, 1, {}, opt);  // stage 1 is a middle stage: its own message to rank 0
  front.join();
  expect_clean(r);
  ASSERT_EQ(stages.size(), 3u);
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(stages[static_cast<std::size_t>(s)].stage, s);
    const auto& sh = stages[static_cast<std::size_t>(s)];
    EXPECT_NEAR(sh.busy + sh.comm + sh.wait, 1.0, 0.05) << "stage " << s;
  }
}

TEST(EngineLive, CancelFreesTheKvAtOnceAndRefusalsNameTheLimit) {
  LiveQueue q({2});
  Client c;
  std::thread front([&] {
    ShutdownAtExit bye{q};
    ASSERT_TRUE(wait_ready(q, 10));
    Request longer = workload(false)[0];
    longer.sampling.max_tokens = 40;
    auto a = q.submit(longer, c.sink());
    ASSERT_EQ(a.status, LiveQueue::Admit::kAccepted);
    // The heartbeat is 10 s here: a second token within 5 s shows that iterations go out as
    // soon as the previous one completes, not when the next heartbeat is due.
    ASSERT_TRUE(c.wait_tokens(a.id, 2, 5));
    q.cancel(a.id, "client disconnected");
    ASSERT_TRUE(c.wait_final(a.id, 10));
    EXPECT_EQ(c.final[a.id].finish_reason, "client disconnected");
    EXPECT_FALSE(c.final[a.id].failed);
    EXPECT_LT(c.tokens[a.id].size(), 40u);
    // Never fits: prompt beyond the context.
    Request big = longer;
    big.prompt.assign(80, 1);
    auto b = q.submit(big, c.sink());
    EXPECT_EQ(b.status, LiveQueue::Admit::kRejected);
    EXPECT_NE(b.reason.find("context"), std::string::npos) << b.reason;
    q.begin_drain();
    EXPECT_EQ(q.submit(longer, c.sink()).status, LiveQueue::Admit::kStopping);
    q.shutdown();
  });
  auto opt = base_options();
  opt.deadline = Millis(30000);
  opt.serving = true;
  opt.live = &q;
  auto r = run_layout(1, 2, {}, opt);
  front.join();
  expect_clean(r);
  auto st = q.stats();
  EXPECT_EQ(st.kv_used_tokens, 0);
  EXPECT_EQ(st.cancelled, 1u);
  EXPECT_EQ(st.rejected, 1u);
}

TEST(EngineLive, ShutdownCancelsWhatIsOpenAndAFailedRankFailsTheQueue) {
  {
    LiveQueue q({8});
    Client c;
    std::thread front([&] {
      ShutdownAtExit bye{q};
      ASSERT_TRUE(wait_ready(q, 10));
      Request r = workload(false)[1];
      r.sampling.max_tokens = 50;
      auto a = q.submit(r, c.sink());
      ASSERT_TRUE(c.wait_tokens(a.id, 1, 10));
      q.shutdown("the server is shutting down");
      ASSERT_TRUE(c.wait_final(a.id, 10));
      EXPECT_EQ(c.final[a.id].finish_reason, "the server is shutting down");
    });
    auto opt = base_options();
    opt.serving = true;
    opt.live = &q;
    auto r = run_layout(2, 1, {}, opt);
    front.join();
    expect_clean(r);
  }
  {
    LiveQueue q({8});
    Client c;
    std::int64_t id = -1;
    std::thread front([&] {
      ShutdownAtExit bye{q};
      ASSERT_TRUE(wait_ready(q, 10));
      id = q.submit(workload(false)[0], c.sink()).id;
      ASSERT_TRUE(c.wait_final(id, 10));
    });
    auto opt = base_options();
    opt.deadline = Millis(500);
    opt.serving = true;
    opt.live = &q;
    auto r = run_layout(2, 1, {}, opt, {}, /*skip_rank=*/1);
    front.join();
    EXPECT_TRUE(c.final[id].failed);
    EXPECT_NE(c.final[id].finish_reason.find("rank 1"), std::string::npos) << c.final[id].finish_reason;
    ASSERT_FALSE(r.errors[0].empty());
    EXPECT_NE(r.errors[0].find("rank 1"), std::string::npos) << r.errors[0];
    auto st = q.stats();
    EXPECT_TRUE(st.failed);
    EXPECT_EQ(q.submit(workload(false)[0], nullptr).status, LiveQueue::Admit::kFailed);
  }
}
