// warm_up_stage(): the shape it runs through a stage, and that a warmed-up stage generates
// exactly what a cold one does (the warm-up's KV entries and state never reach a request).
#include <gtest/gtest.h>
#include <unistd.h>

#include <thread>

#include "engine_fixture.hpp"
#include "trellis/runtime/engine/warmup.hpp"

using namespace trellis;
using namespace trellis::runtime;

namespace {

// Records every call; hidden size 4, vocabulary [0, 10).
class RecordingStage final : public StageCompute {
 public:
  struct Call {
    bool logits;
    std::vector<std::int32_t> slots, starts, lengths, fresh;
    int tokens;
  };
  int hidden_size() const override { return 4; }
  int vocab_size() const override { return 10; }
  int vocab_begin() const override { return 0; }
  int vocab_end() const override { return 10; }
  void forward(const StageInput& in, float*, Tracer&) override { calls.push_back(record(in, false)); }
  void logits(const StageInput& in, const float*, float* out) override {
    calls.push_back(record(in, true));
    std::fill_n(out, in.n_seqs() * 10, 0.0f);
  }
  std::vector<Call> calls;

 private:
  static Call record(const StageInput& in, bool logits) {
    EXPECT_EQ(static_cast<std::size_t>(in.n_tokens()), in.positions.size());
    return {logits, in.slots, in.starts, in.lengths, in.fresh, in.n_tokens()};
  }
};

using V = std::vector<std::int32_t>;

TEST(Warmup, PrefillSplitOverSlotsThenOneDecodeStep) {
  RecordingStage st;
  WarmupShape w;
  w.prefill_tokens = 300;
  w.decode_rows = 4;
  w.slots = 4;
  w.max_context = 512;
  auto times = warm_up_stage(st, w);
  EXPECT_GE(times.prefill_s, 0.0);
  EXPECT_GE(times.decode_s, 0.0);
  ASSERT_EQ(st.calls.size(), 4u);  // prefill forward + logits, decode forward + logits
  EXPECT_FALSE(st.calls[0].logits);
  EXPECT_EQ(st.calls[0].tokens, 300);
  EXPECT_EQ(st.calls[0].lengths, (V{kWarmupSeqLen, kWarmupSeqLen, 300 - 2 * kWarmupSeqLen}));
  EXPECT_EQ(st.calls[0].slots, (V{0, 1, 2}));
  EXPECT_EQ(st.calls[0].fresh, (V{1, 1, 1}));
  EXPECT_TRUE(st.calls[1].logits);
  EXPECT_EQ(st.calls[2].slots, (V{0, 1, 2, 3}));
  EXPECT_EQ(st.calls[2].starts, (V{kWarmupSeqLen, kWarmupSeqLen, 300 - 2 * kWarmupSeqLen, 0}));
  EXPECT_EQ(st.calls[2].lengths, (V{1, 1, 1, 1}));
  EXPECT_EQ(st.calls[2].fresh, (V{0, 0, 0, 1}));
}

TEST(Warmup, BoundedBySlotsAndContextAndOnlyTheLastStageComputesLogits) {
  RecordingStage st;
  WarmupShape w;
  w.prefill_tokens = 1000;
  w.decode_rows = 8;
  w.slots = 2;
  w.max_context = 40;  // sequences of 39: the decode step still fits the slot
  w.last_stage = false;
  warm_up_stage(st, w);
  ASSERT_EQ(st.calls.size(), 2u);
  EXPECT_EQ(st.calls[0].lengths, (V{39, 39}));
  EXPECT_EQ(st.calls[1].starts, (V{39, 39}));
  for (const auto& c : st.calls) EXPECT_FALSE(c.logits);
}

TEST(Warmup, ZeroTokensIsOff) {
  RecordingStage st;
  WarmupShape w;
  EXPECT_EQ(warm_up_stage(st, w).total_s(), 0.0);
  EXPECT_TRUE(st.calls.empty());
}

// pp=2 x tp=2 over the in-process links: the same greedy tokens with and without a warm-up
// of every stage before the engine starts.
std::vector<std::vector<std::int32_t>> generate(bool warm) {
  constexpr int kVocab = 61, kLayers = 4, kPp = 2, kTp = 2;
  std::vector<Request> reqs;
  for (int i = 0; i < 7; ++i) {
    Request r;
    r.id = i;
    r.name = fmt::format("q{}", i);
    for (int j = 0; j < 3 + i % 4; ++j) r.prompt.push_back((i * 11 + j * 5) % kVocab);
    r.sampling.max_tokens = 4 + i % 3;
    r.sampling.greedy = true;
    reqs.push_back(r);
  }
  EngineOptions opt;
  opt.scheduler.groups = kPp;
  opt.scheduler.max_seqs_per_group = 2;
  opt.scheduler.max_context = 64;
  opt.scheduler.kv_budget_tokens = 4096;
  opt.sampler_threads = 1;
  opt.deadline = Millis(20000);
  opt.ring_slot_bytes = 64 << 10;
  opt.job = fmt::format("w{}-{}", ::getpid(), warm ? 1 : 0);
  auto grid = EngineGrid::contiguous(kPp, kTp);
  test::InProcHub hub;
  EngineResult res0;
  std::vector<std::string> errors(kPp * kTp);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kPp * kTp; ++r)
    ranks.emplace_back([&, r] {
      try {
        test::InProcTransport links(hub, r);
        const int slots = kPp * opt.scheduler.max_seqs_per_group;
        test::StandInStage stage(kVocab, kLayers, kPp, grid.stage_of(r), kTp, grid.tp_of(r), slots);
        if (warm) {
          WarmupShape w;
          w.prefill_tokens = 100;
          w.decode_rows = opt.scheduler.max_seqs_per_group;
          w.slots = slots;
          w.max_context = opt.scheduler.max_context;
          w.first_stage = grid.stage_of(r) == 0;
          w.last_stage = grid.stage_of(r) == kPp - 1;
          warm_up_stage(stage, w);
        }
        Tracer tracer(false);
        auto res = run_engine(r, grid, links, stage, reqs, opt, tracer);
        if (r == 0) res0 = std::move(res);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (const auto& e : errors) EXPECT_EQ(e, "");
  std::vector<std::vector<std::int32_t>> out;
  for (const auto& q : res0.results) {
    EXPECT_EQ(q.status, RequestStatus::kFinished) << q.id;
    out.push_back(q.output);
  }
  return out;
}

TEST(Warmup, WarmedStagesGenerateTheSameTokens) {
  auto cold = generate(false);
  ASSERT_EQ(cold.size(), 7u);
  EXPECT_EQ(generate(true), cold);
}

}  // namespace
