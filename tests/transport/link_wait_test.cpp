// The transport's adaptive wait (transport/src/wait.hpp): a wait whose link keeps moving
// data must not fall into the sleeping phase. A 64 MiB UCX-over-TCP message needs thousands
// of progress calls; with a sleep between them it took 140-185 ms instead of ~70 ms.
// The deadline is checked every 64 polls; a wait that slept from its third poll on has slept
// 61 x 50 ms by then, more than the 2 s deadline, and times out.
#include <gtest/gtest.h>

#include "src/wait.hpp"
#include "trellis/core/error.hpp"

namespace trellis::transport::detail {
namespace {

// Sleeps (50 ms per poll) from the third poll on, unless something resets the policy.
PollPolicy sleepy() { return PollPolicy{1, 2, std::chrono::milliseconds(50)}; }

TEST(AdaptiveWait, ProgressMarksKeepAMovingTransferFromSleeping) {
  int polls = 0;
  auto done = [&] {
    note_progress();  // what a link does when its progress moved bytes
    return ++polls == 200;
  };
  EXPECT_NO_THROW(adaptive_wait(done, [] { return 0; }, Deadline::after_ms(2000), "moving transfer", sleepy()));
  EXPECT_EQ(polls, 200);
}

TEST(AdaptiveWait, StepsKeepAMultiStepOperationFromSleeping) {
  int polls = 0;
  auto done = [&] { return ++polls == 200; };
  EXPECT_NO_THROW(adaptive_wait(done, [&] { return polls; }, Deadline::after_ms(2000), "stepped operation", sleepy()));
}

// Without progress the policy runs its course: the wait sleeps (64 x 5 ms before the first
// deadline check), and the deadline ends it with kTimeout naming what it waited for.
TEST(AdaptiveWait, AnIdleWaitSleepsAndTimesOutNamingWhatItWaitedFor) {
  try {
    adaptive_wait([] { return false; }, [] { return 0; }, Deadline::after_ms(200), "receive from rank 3",
                  PollPolicy{1, 2, std::chrono::milliseconds(5)});
    ADD_FAILURE() << "an idle wait should time out";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout);
    EXPECT_NE(std::string(e.what()).find("receive from rank 3"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace trellis::transport::detail
