// SWIFT's auto-off rule (SwiftControl::judge, scheduler/swift_control.hpp), driven directly:
// one sequence, hand-made sampler answers and iteration times measured in plain decode steps,
// so that each case fixes what drafting costs and what it commits.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "trellis/runtime/scheduler/swift_control.hpp"

namespace trellis::runtime {
namespace {

constexpr int K = 10;           // candidates per logits row (detail::kSwiftTopK)
constexpr double kPlain = 0.01;  // the calibrated plain step: 10 ms per token

struct Stream {
  SwiftControl ctl;
  std::vector<std::int32_t> prompt{1, 2, 3}, output{4};
  std::int32_t len = 3;  // committed tokens in the KV cache; output.back() is not yet in it
  double now = 0;
  int cycles = 0;

  explicit Stream(SwiftConfig c) : ctl(std::move(c)) { ctl.observe_plain(kPlain, 1); }

  SwiftControl::SeqView view() const { return {0, 0, 0, len, output.back(), &prompt, &output}; }

  // One draft then one verify pass over root + draft (the draft's one candidate stops
  // drafting: max_draft 1). `accept`: the target agrees with the draft (2 tokens committed)
  // or not (1). The cycle takes `cycle_plain_steps` plain steps of time, split between both.
  void cycle(bool accept, double cycle_plain_steps) {
    const auto v = view();
    ScheduleOutput d;
    ASSERT_TRUE(ctl.plan(std::span(&v, 1), d, now));
    ASSERT_FALSE(d.skip.empty());
    ASSERT_EQ(d.logit_rows(), 1);
    std::vector<std::int32_t> dt(K, -1);
    std::vector<float> dp(K, 0.0f);
    dt[0] = 500 + cycles;
    dp[0] = 0.9f;
    const double half = 0.5 * cycle_plain_steps * kPlain;
    now += half;
    ctl.complete(d, dt, dp, half, now);
    ScheduleOutput vq;
    ASSERT_TRUE(ctl.plan(std::span(&v, 1), vq, now));
    ASSERT_TRUE(vq.skip.empty());
    ASSERT_EQ(vq.logit_rows(), 2);  // root and the draft
    std::vector<std::int32_t> vt(2 * K, -1);
    std::vector<float> vp(2 * K, 0.0f);
    vt[0] = accept ? dt[0] : 900 + cycles;  // the target's token after the root
    vt[K] = 700 + cycles;                    // ... and after the draft
    now += half;
    const auto commits = ctl.complete(vq, vt, vp, half, now);
    ASSERT_EQ(commits.size(), 1u);
    len += commits[0].kv_advance;
    output.insert(output.end(), commits[0].tokens.begin(), commits[0].tokens.end());
    ++cycles;
  }
  std::int64_t committed() const { return ctl.report().committed; }
};

SwiftConfig config() {
  SwiftConfig c;
  c.enabled = c.allowed = c.invariant = true;
  c.num_layers = 4;
  c.max_tree = 8;
  c.calibration_steps = 1;
  c.settings.max_draft = 1;
  c.settings.max_steps = 0;  // no optimisation steps: drafting and verifying alone
  return c;
}

// Nothing accepted and each cycle as slow as 5 plain steps (SmolLM2 at r = 0.5 on 2 CPU cores
// took 3 in the runs of docs/swift.md): the early look comes once the SWIFT iterations took
// as long as 16 plain steps, after 4 tokens, instead of after 16 tokens (80 plain steps).
TEST(SwiftAutoOff, DraftingThatCannotPayIsTurnedOffWithinSixteenPlainStepsOfTime) {
  Stream s(config());
  while (!s.ctl.report().turned_off && s.cycles < 40) s.cycle(/*accept=*/false, 5.0);
  const auto r = s.ctl.report();
  ASSERT_TRUE(r.turned_off);
  EXPECT_EQ(r.committed, 4);  // 4 cycles of one token: 20 plain steps of time
  EXPECT_NE(r.off_reason.find("early check"), std::string::npos) << r.off_reason;
  EXPECT_NE(r.off_reason.find("0.20x drafting and verifying alone"), std::string::npos) << r.off_reason;
  EXPECT_FALSE(s.ctl.drafting(s.view(), 1000));
}

// A cycle slower than 16 plain steps is not judged on its own 2 tokens: the early look
// waits for 4. A cheap rejected cycle (1 token per 1.2 plain steps: 0.83x, above the early
// threshold of 0.75x) is not turned off early.
TEST(SwiftAutoOff, TheEarlyLookWaitsForFourTokensAndSparesDraftingNearTheThreshold) {
  {
    Stream s(config());
    s.cycle(true, 20.0);  // 2 tokens in 20 plain steps: past the time, short of the tokens
    EXPECT_FALSE(s.ctl.report().turned_off);
    s.cycle(true, 20.0);
    EXPECT_TRUE(s.ctl.report().turned_off);
    EXPECT_EQ(s.committed(), 4);
  }
  {
    Stream s(config());
    while (s.committed() < 100) s.cycle(false, 1.2);
    EXPECT_FALSE(s.ctl.report().turned_off) << s.ctl.report().off_reason;
  }
}

// Drafting below 1x but above the early threshold is turned off by the full window (128
// tokens) and never before; drafting that pays is never turned off.
TEST(SwiftAutoOff, TheFullWindowJudgesWhatTheEarlyLookSpares) {
  {
    Stream s(config());
    std::int64_t off_at = -1;
    while (off_at < 0 && s.committed() < 400) {
      s.cycle(false, 1.2);
      if (s.ctl.report().turned_off) off_at = s.committed();
    }
    EXPECT_EQ(off_at, 128);
    EXPECT_EQ(s.ctl.report().off_reason.find("early check"), std::string::npos) << s.ctl.report().off_reason;
  }
  {
    Stream s(config());
    while (s.committed() < 400) s.cycle(true, 1.5);  // 2 tokens per 1.5 plain steps: 1.33x
    EXPECT_FALSE(s.ctl.report().turned_off) << s.ctl.report().off_reason;
    EXPECT_NEAR(s.ctl.report().measured_speedup(), 2.0 / 1.5, 1e-9);
  }
}

}  // namespace
}  // namespace trellis::runtime
