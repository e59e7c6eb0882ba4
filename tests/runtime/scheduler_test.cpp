// Scheduler (continuous batching, KV budget, rejection), the scheduling output's wire form,
// and the shared-memory ring channel.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <thread>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "trellis/core/error.hpp"
#include "trellis/runtime/ipc/shm_ring.hpp"
#include "trellis/runtime/scheduler/scheduler.hpp"

using namespace trellis;
using namespace trellis::runtime;

namespace {

Request make_request(std::int64_t id, int prompt_len, int max_tokens) {
  Request r;
  r.id = id;
  r.name = fmt::format("r{}", id);
  for (int i = 0; i < prompt_len; ++i) r.prompt.push_back(static_cast<std::int32_t>(id * 10 + i));
  r.sampling.greedy = true;
  r.sampling.max_tokens = max_tokens;
  return r;
}

// Drives a scheduler the way the engine does (groups in turn, one iteration in flight per
// group) with a fake "model" that answers token = 1000 + position; checks every invariant.
// `on_schedule` (optional) sees every iteration as it is scheduled.
void drive(Scheduler& s, int groups, int max_iters = 10000,
           const std::function<void(const ScheduleOutput&, double)>& on_schedule = {}) {
  std::vector<std::optional<ScheduleOutput>> inflight(static_cast<std::size_t>(groups));
  int it = 0;
  double now = 0;
  while (!s.done() && it++ < max_iters) {
    bool any = false;
    for (int g = 0; g < groups; ++g) {
      auto& f = inflight[static_cast<std::size_t>(g)];
      if (f) {
        std::vector<std::int32_t> toks;
        for (const auto& q : f->seqs)
          if (q.sample) toks.push_back(1000 + q.pos + q.n_tokens);
        s.complete(*f, toks, now += 1);
        f.reset();
      }
      f = s.schedule(g, now);
      if (f && on_schedule) on_schedule(*f, now);
      any = any || f.has_value();
    }
    ASSERT_TRUE(any || s.done()) << "no group can make progress";
  }
}

}  // namespace

TEST(Schedule, WireRoundTripAndCorruption) {
  ScheduleOutput s;
  s.iteration = 77;
  s.group = 1;
  ScheduledSeq a;
  a.id = 5;
  a.slot = 2;
  a.column = 1;
  a.pos = 0;
  a.n_tokens = 3;
  a.first = true;
  a.prompt = true;
  a.params.temperature = 0.5f;
  a.params.top_k = 9;
  a.params.seed = 123;
  a.params.stop_ids = {4, 7};
  ScheduledSeq b;
  b.id = 6;
  b.slot = 0;
  b.column = 0;
  b.pos = 10;
  b.n_tokens = 1;
  s.seqs = {a, b};
  s.tokens = {1, 2, 3, 9};
  std::vector<std::byte> wire;
  serialize(s, wire);
  auto r = deserialize_schedule(wire, "test");
  EXPECT_EQ(r.iteration, 77u);
  EXPECT_EQ(r.group, 1);
  ASSERT_EQ(r.seqs.size(), 2u);
  EXPECT_TRUE(r.seqs[0].first);
  EXPECT_EQ(r.seqs[0].params.top_k, 9);
  EXPECT_EQ(r.seqs[0].params.seed, 123u);
  EXPECT_EQ(r.seqs[0].params.stop_ids, (std::vector<std::int32_t>{4, 7}));
  EXPECT_FALSE(r.seqs[1].first);
  EXPECT_EQ(r.seqs[1].pos, 10);
  EXPECT_EQ(r.tokens, s.tokens);
  EXPECT_EQ(r.n_sampled(), 2);
  // A decode step is compact: 28 bytes of header + 25 per sequence + 4 per token.
  ScheduleOutput d;
  d.seqs = {b};
  d.tokens = {9};
  serialize(d, wire);
  EXPECT_EQ(wire.size(), 28u + 25u + 4u);
  // Every truncation is caught.
  serialize(s, wire);
  for (std::size_t n = 0; n < wire.size(); ++n)
    EXPECT_THROW(deserialize_schedule(std::span(wire).first(n), "test"), Error) << n;
  wire.push_back(std::byte{0});
  EXPECT_THROW(deserialize_schedule(wire, "test"), Error);
}

// Wire format v3: SWIFT's candidates, token tree, skip set and KV moves survive the round
// trip, and a peer's malformed tree, skip set or move is refused naming what is wrong.
TEST(Schedule, SwiftFieldsRoundTripAndBadOnesAreRefused) {
  ScheduleOutput s;
  s.iteration = 5;
  ScheduledSeq q;
  q.id = 3;
  q.pos = 10;
  q.n_tokens = 4;
  q.sample = false;
  q.candidates = true;
  q.parents = {-1, 0, 1, 0};
  q.kv_pos = 10;
  q.prefix = 10;
  s.seqs = {q};
  s.tokens = {1, 2, 3, 4};
  s.skip = {0, 1, 1, 0, 0, 0, 1, 0};
  s.moves = {KvCopy{0, 13, 11, 1}};
  std::vector<std::byte> wire;
  serialize(s, wire);
  auto r = deserialize_schedule(wire, "test");
  ASSERT_EQ(r.seqs.size(), 1u);
  EXPECT_TRUE(r.seqs[0].candidates);
  EXPECT_EQ(r.seqs[0].parents, q.parents);
  EXPECT_EQ(r.seqs[0].kv_pos, 10);
  EXPECT_EQ(r.skip, s.skip);
  ASSERT_EQ(r.moves.size(), 1u);
  EXPECT_EQ(r.moves[0].src, 13);
  EXPECT_EQ(r.logit_rows(), 4);
  for (std::size_t n = 0; n < wire.size(); ++n)
    EXPECT_THROW(deserialize_schedule(std::span(wire).first(n), "test"), Error) << n;
  auto refused = [&](ScheduleOutput bad, const std::string& needle) {
    serialize(bad, wire);
    try {
      deserialize_schedule(wire, "test");
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto b = s;
  b.seqs[0].parents = {-1, 0, 3, 0};  // a parent after its child
  refused(b, "tree token 2 has parent 3");
  b = s;
  b.seqs[0].prefix = 11;  // sees past its own K/V start
  refused(b, "tree prefix 11");
  b = s;
  b.skip[2] = 7;
  refused(b, "skip set entry 7 is not 0 or 1");
  b = s;
  b.moves[0].count = -1;
  refused(b, "KV move");
  b = s;
  b.seqs[0].sample = true;  // sampled and asked for candidates
  refused(b, "both sampled and asked for candidates");
}

TEST(Scheduler, ContinuousBatchingFinishesEverything) {
  SchedulerConfig cfg{2, 2, 1000, 64, 256};
  std::vector<Request> reqs;
  for (int i = 0; i < 9; ++i) reqs.push_back(make_request(i, 3 + i % 4, 2 + i % 5));
  reqs[4].sampling.stop_ids = {1000 + 3 + 4 % 4};  // stops at its first token
  Scheduler s(cfg, reqs);
  drive(s, 2);
  ASSERT_TRUE(s.done());
  for (const auto& r : s.results()) {
    EXPECT_EQ(r.status, RequestStatus::kFinished) << r.id;
    const auto& q = reqs[static_cast<std::size_t>(r.id)];
    if (r.id == 4) {
      EXPECT_EQ(r.output.size(), 1u);
      EXPECT_EQ(r.reason, "stop");
      continue;
    }
    ASSERT_EQ(static_cast<int>(r.output.size()), q.sampling.max_tokens) << r.id;
    // Positions advance one per token: the fake model echoes the position.
    for (std::size_t k = 0; k < r.output.size(); ++k)
      EXPECT_EQ(r.output[k], 1000 + static_cast<int>(q.prompt.size() + k)) << r.id;
  }
  EXPECT_EQ(s.kv_used_tokens(), 0);
}

TEST(Scheduler, GroupsHoldDisjointSlotsAndStableColumns) {
  SchedulerConfig cfg{3, 2, 10000, 64, 256};
  std::vector<Request> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(make_request(i, 2, 4));
  Scheduler s(cfg, reqs);
  std::map<std::int64_t, std::pair<int, int>> where;  // id -> (slot, column)
  std::set<int> slots_in_flight;
  std::vector<std::optional<ScheduleOutput>> f(3);
  for (int round = 0; round < 6; ++round) {
    for (int g = 0; g < 3; ++g) {
      auto& o = f[static_cast<std::size_t>(g)];
      if (o) {
        for (const auto& q : o->seqs) slots_in_flight.erase(q.slot);
        s.complete(*o, std::vector<std::int32_t>(static_cast<std::size_t>(o->n_sampled()), 5), 0);
      }
      o = s.schedule(g, 0);
      if (!o) continue;
      EXPECT_EQ(o->group, g);
      for (const auto& q : o->seqs) {
        EXPECT_TRUE(slots_in_flight.insert(q.slot).second) << "slot " << q.slot << " used twice";
        auto [it, fresh] = where.emplace(q.id, std::pair{q.slot, q.column});
        if (!fresh) {
          EXPECT_EQ(it->second, (std::pair{q.slot, q.column}));
        }
        EXPECT_EQ(q.first, fresh);
      }
    }
  }
}

TEST(Scheduler, KvBudgetWaitsAndRejects) {
  // Budget 20 positions: requests of 10 fit two at a time; one of 30 can never fit.
  SchedulerConfig cfg{1, 4, 20, 64, 256};
  std::vector<Request> reqs = {make_request(0, 5, 5), make_request(1, 5, 5), make_request(2, 5, 5),
                               make_request(3, 20, 10), make_request(4, 70, 1)};
  Scheduler s(cfg, reqs);
  auto notes = s.take_notes();
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_NE(notes[0].find("request r3 rejected: needs 30 KV positions"), std::string::npos) << notes[0];
  EXPECT_NE(notes[1].find("request r4 rejected: prompt of 70 tokens does not fit the context of 64"), std::string::npos)
      << notes[1];
  auto o = s.schedule(0, 0);
  ASSERT_TRUE(o);
  EXPECT_EQ(o->seqs.size(), 2u);
  notes = s.take_notes();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("request r2 waits: KV cache full (20 of 20 positions reserved, it needs 10)"),
            std::string::npos);
  s.complete(*o, std::vector<std::int32_t>{1, 1}, 0);
  drive(s, 1);
  EXPECT_TRUE(s.done());
  EXPECT_EQ(s.results()[2].status, RequestStatus::kFinished);
  EXPECT_EQ(s.results()[3].status, RequestStatus::kFailed);
  EXPECT_EQ(s.results()[4].status, RequestStatus::kFailed);
}

TEST(Scheduler, LiveAddAbortAndForget) {
  SchedulerConfig c;
  c.groups = 2;
  c.max_seqs_per_group = 1;
  c.kv_budget_tokens = 100;
  c.max_context = 40;
  Scheduler s(c, {});
  EXPECT_TRUE(s.done());
  EXPECT_TRUE(s.add(make_request(0, 4, 10), 0));
  EXPECT_TRUE(s.add(make_request(1, 4, 10), 0));
  EXPECT_TRUE(s.add(make_request(2, 4, 10), 0));
  EXPECT_FALSE(s.add(make_request(3, 50, 10), 0));  // never fits the context: fails at once
  EXPECT_NE(s.results()[3].reason.find("context"), std::string::npos);
  EXPECT_THROW(s.add(make_request(9, 4, 10), 0), Error);  // ids stay dense
  auto a = s.schedule(0, 1);
  auto b = s.schedule(1, 1);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(s.running_count(), 2);
  EXPECT_EQ(s.waiting_count(), 1);
  EXPECT_EQ(s.kv_used_tokens(), 28);
  s.abort(2, "gone", 2);  // waiting: fails now
  EXPECT_EQ(s.results()[2].status, RequestStatus::kFailed);
  EXPECT_EQ(s.waiting_count(), 0);
  s.abort(0, "client disconnected", 2);  // in flight: leaves when its iteration completes
  EXPECT_EQ(s.results()[0].status, RequestStatus::kRunning);
  s.complete(*a, std::vector<std::int32_t>{7}, 3);
  EXPECT_EQ(s.results()[0].status, RequestStatus::kFailed);
  EXPECT_EQ(s.results()[0].reason, "client disconnected");
  EXPECT_TRUE(s.results()[0].output.empty());  // the token sampled after the abort is dropped
  EXPECT_EQ(s.kv_used_tokens(), 14);
  s.complete(*b, std::vector<std::int32_t>{8}, 3);
  s.abort(1, "stop", 4);  // running, nothing in flight: leaves now
  EXPECT_EQ(s.kv_used_tokens(), 0);
  EXPECT_TRUE(s.done());
  EXPECT_EQ(s.results()[1].output, std::vector<std::int32_t>{8});
  s.forget(1);
  EXPECT_TRUE(s.results()[1].output.empty());
  EXPECT_TRUE(s.requests()[1].prompt.empty());
  EXPECT_TRUE(s.add(make_request(4, 4, 10), 5));
  EXPECT_FALSE(s.done());
}

TEST(Scheduler, ChunkedPrefillSplitsLongPromptsAndSamplesOnlyTheLastChunk) {
  SchedulerConfig cfg{1, 3, 1000, 64, 8};
  cfg.prefill_chunk = 4;
  // Prompt 10 > the 8 tokens of an iteration: admitted only because it is chunked.
  std::vector<Request> reqs{make_request(0, 10, 3), make_request(1, 2, 5)};
  Scheduler s(cfg, reqs);
  EXPECT_EQ(s.results()[0].status, RequestStatus::kPending);
  // Iteration 1: request 0's first chunk (4) and request 1's whole prompt (2): 6 <= 8.
  auto a = s.schedule(0, 0);
  ASSERT_TRUE(a);
  ASSERT_EQ(a->seqs.size(), 2u);
  EXPECT_TRUE(a->seqs[0].first && a->seqs[0].prompt && !a->seqs[0].sample);
  EXPECT_EQ(a->seqs[0].n_tokens, 4);
  EXPECT_TRUE(a->seqs[1].first && a->seqs[1].sample);
  EXPECT_EQ(std::vector<std::int32_t>(a->tokens.begin(), a->tokens.begin() + 4),
            std::vector<std::int32_t>(reqs[0].prompt.begin(), reqs[0].prompt.begin() + 4));
  EXPECT_EQ(a->n_sampled(), 1);
  s.complete(*a, std::vector<std::int32_t>{77}, 1);
  // Iteration 2: the second chunk (not first, still a prompt) beside a decode step.
  auto b = s.schedule(0, 1);
  ASSERT_TRUE(b);
  EXPECT_FALSE(b->seqs[0].first);
  EXPECT_TRUE(b->seqs[0].prompt && !b->seqs[0].sample);
  EXPECT_EQ(b->seqs[0].pos, 4);
  EXPECT_EQ(b->seqs[0].n_tokens, 4);
  EXPECT_FALSE(b->seqs[1].prompt);
  EXPECT_EQ(b->seqs[1].n_tokens, 1);
  EXPECT_EQ(b->tokens.back(), 77);
  s.complete(*b, std::vector<std::int32_t>{78}, 2);
  // Iteration 3: the last 2 prompt tokens, sampled.
  auto c = s.schedule(0, 2);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->seqs[0].pos, 8);
  EXPECT_EQ(c->seqs[0].n_tokens, 2);
  EXPECT_TRUE(c->seqs[0].sample && c->seqs[0].prompt);
  EXPECT_LT(s.results()[0].first_token_s, 0);  // no token before the last chunk
  s.complete(*c, std::vector<std::int32_t>{90, 79}, 3);
  EXPECT_EQ(s.results()[0].output, (std::vector<std::int32_t>{90}));
  EXPECT_EQ(s.results()[0].first_token_s, 3);
  // The rest behaves as without chunks, and the fake model's positions check every chunk.
  drive(s, 1);
  ASSERT_TRUE(s.done());
  EXPECT_EQ(s.results()[0].output, (std::vector<std::int32_t>{90, 1000 + 11, 1000 + 12}));
  EXPECT_EQ(s.kv_used_tokens(), 0);
}

TEST(Scheduler, ChunkedPrefillKeepsEveryIterationWithinItsTokensAndAbortsMidPrompt) {
  SchedulerConfig cfg{2, 2, 4000, 256, 16};
  cfg.prefill_chunk = 5;
  std::vector<Request> reqs;
  for (int i = 0; i < 8; ++i) reqs.push_back(make_request(i, 3 + 7 * i, 4));
  Scheduler s(cfg, reqs);
  bool aborted = false;
  drive(s, 2, 10000, [&](const ScheduleOutput& f, double now) {
    EXPECT_LE(f.n_tokens(), 16);
    for (const auto& q : f.seqs) {
      EXPECT_LE(q.n_tokens, 5);
      // Request 6 (45 prompt tokens) is cancelled in the middle of its prefill.
      if (q.id == 6 && q.pos >= 10 && !aborted) {
        s.abort(6, "client gone", now);
        aborted = true;
      }
    }
  });
  ASSERT_TRUE(s.done());
  EXPECT_TRUE(aborted);
  EXPECT_EQ(s.results()[6].status, RequestStatus::kFailed);
  EXPECT_TRUE(s.results()[6].output.empty());
  for (int i = 0; i < 8; ++i) {
    if (i == 6) continue;
    const auto& r = s.results()[static_cast<std::size_t>(i)];
    EXPECT_EQ(r.status, RequestStatus::kFinished) << i;
    ASSERT_EQ(r.output.size(), 4u) << i;
    EXPECT_EQ(r.output.back(), 1000 + 3 + 7 * i + 3) << i;
  }
  EXPECT_EQ(s.kv_used_tokens(), 0);
}

TEST(Scheduler, PrefillChunkIsCheckedAndLongPromptsNeedIt) {
  SchedulerConfig cfg{1, 2, 1000, 64, 8};
  cfg.prefill_chunk = 9;
  EXPECT_THROW(Scheduler(cfg, {}), Error);
  cfg.prefill_chunk = -1;
  EXPECT_THROW(Scheduler(cfg, {}), Error);
  cfg.prefill_chunk = 0;
  auto why = admission_error(cfg, make_request(0, 10, 2));
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("--prefill-chunk"), std::string::npos) << *why;
  cfg.prefill_chunk = 8;
  EXPECT_FALSE(admission_error(cfg, make_request(0, 10, 2)));
}

TEST(Scheduler, ConcurrentChunksShareTheIterationLimit) {
  // Four prompts mid-prefill at once with room for fewer than all their chunks: the chunks
  // shrink or wait so that no iteration carries more than its 8 tokens, and every answer
  // still comes out at the right positions.
  SchedulerConfig cfg{1, 4, 4000, 128, 8};
  cfg.prefill_chunk = 5;
  std::vector<Request> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(make_request(i, 12 + i, 3));
  Scheduler s(cfg, reqs);
  int max_tokens = 0, waited = 0;
  drive(s, 1, 10000, [&](const ScheduleOutput& f, double) {
    max_tokens = std::max(max_tokens, f.n_tokens());
    waited += 4 - static_cast<int>(f.seqs.size());
  });
  ASSERT_TRUE(s.done());
  EXPECT_LE(max_tokens, 8);
  EXPECT_GT(waited, 0);  // some prompt had to wait for an iteration with room
  for (int i = 0; i < 4; ++i) {
    const auto& r = s.results()[static_cast<std::size_t>(i)];
    EXPECT_EQ(r.status, RequestStatus::kFinished) << i;
    EXPECT_EQ(r.output, (std::vector<std::int32_t>{1000 + 12 + i, 1000 + 13 + i, 1000 + 14 + i})) << i;
  }
}

// SWIFT on the scheduler (swift_control.hpp), driven with hand-made sampler answers: an
// accepted tree alternative owes the KV cache a move, and when drafting stops right after it
// (here: no room left for scratch positions) the plain iteration that follows must carry it.
TEST(SchedulerSwift, AMoveOwedByAnAcceptedAlternativeGoesWithTheNextPlainIteration) {
  SchedulerConfig c;
  c.max_seqs_per_group = 1;
  c.kv_budget_tokens = 1000;
  c.max_context = 8;
  c.swift.enabled = c.swift.allowed = c.swift.invariant = true;
  c.swift.num_layers = 4;
  c.swift.max_tree = 3;
  c.swift.calibration_steps = 1;
  c.swift.settings.gamma = 1;
  c.swift.settings.max_draft = 1;
  c.swift.settings.epsilon = 0;
  c.swift.settings.max_steps = 0;
  Scheduler s(c, {make_request(0, 3, 10)});
  constexpr int K = 10;
  auto answer = [](std::vector<std::pair<std::int32_t, float>> top) {
    std::vector<std::int32_t> t(K, -1);
    std::vector<float> p(K, 0.0f);
    for (std::size_t i = 0; i < top.size(); ++i) std::tie(t[i], p[i]) = top[i];
    return std::make_pair(t, p);
  };
  auto prefill = *s.schedule(0, 0);
  s.complete(prefill, std::vector<std::int32_t>{7}, 1);  // t1 = 7 (len 3)
  auto plain = *s.schedule(0, 1);                          // calibration: a plain step
  ASSERT_FALSE(plain.seqs[0].candidates);
  s.complete(plain, std::vector<std::int32_t>{8}, 2);   // t2 = 8 (len 4)
  auto draft = *s.schedule(0, 2);
  ASSERT_TRUE(draft.seqs[0].candidates);
  ASSERT_FALSE(draft.skip.empty());
  auto [dt, dp] = answer({{20, 0.6f}, {21, 0.3f}, {22, 0.05f}});
  s.complete(draft, {}, 3, dt, dp);
  auto verify = *s.schedule(0, 3);
  ASSERT_EQ(verify.seqs[0].parents, (std::vector<std::int32_t>{-1, 0, 0}));  // root, draft 20, alternative 21
  ASSERT_EQ(verify.tokens, (std::vector<std::int32_t>{8, 20, 21}));
  // The target wants 21 after the root (the alternative), then 30.
  std::vector<std::int32_t> vt(3 * K, -1);
  std::vector<float> vp(3 * K, 0.0f);
  vt[0] = 21;
  vt[1 * K] = 99;
  vt[2 * K] = 30;
  s.complete(verify, {}, 4, vt, vp);
  EXPECT_EQ(s.results()[0].output, (std::vector<std::int32_t>{7, 8, 21, 30}));
  auto next = *s.schedule(0, 4);  // len 6 + 3 scratch > context 8: plain from here on
  ASSERT_FALSE(next.seqs[0].candidates);
  EXPECT_EQ(next.seqs[0].pos, 6);
  ASSERT_EQ(next.moves.size(), 1u);
  EXPECT_EQ(next.moves[0].src, 6);  // the alternative's K/V (node 2 of the tree at 4)
  EXPECT_EQ(next.moves[0].dst, 5);  // into depth 1's position
  auto report = s.swift_report();
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->alternatives, 1);
  EXPECT_EQ(report->accepted, 1);
  EXPECT_EQ(report->verify_passes, 1);
}
