// The transport's adaptive wait (transport/src/wait.hpp): a wait whose link keeps moving
// data must not fall into the sleeping phase. A 64 MiB UCX-over-TCP message needs thousands
// of progress calls; with a sleep between them it took 140-185 ms instead of ~70 ms.
// The deadline is checked every 64 polls; a wait that slept from its third poll on has slept
// 61 x 50 ms by then, more than the 2 s deadline, and times out.
#include <gtest/gtest.h>

#include <thread>

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

// A wait that can block blocks once spinning and yielding did not end it, and goes on
// blocking (each park is one slice) until done; steps in between restart the policy.
TEST(AdaptiveWait, AWaitThatCanBlockParksUntilDone) {
  int parks = 0, polls = 0;
  auto park = [&](Clock::duration max) {
    EXPECT_GT(max, Clock::duration::zero());
    EXPECT_LE(max, std::chrono::duration_cast<Clock::duration>(kParkSlice));
    ++parks;
    return true;
  };
  const auto before = park_count();
  adaptive_wait([&] { return ++polls > 1000 && parks >= 3; }, [] { return 0; }, park, Deadline::after_ms(5000),
                "blocking wait", PollPolicy{4, 1u << 30, std::chrono::microseconds(50)});
  EXPECT_GE(parks, 3);
  EXPECT_EQ(park_count() - before, static_cast<std::uint64_t>(parks));
}

// A request that cannot block (park returns false) falls back to yielding and sleeping and
// is not asked again during the same wait.
TEST(AdaptiveWait, AWaitThatCannotBlockYieldsAndSleepsInstead) {
  int asked = 0, polls = 0;
  adaptive_wait([&] { return ++polls == 3000; }, [] { return 0; },
                [&](Clock::duration) {
                  ++asked;
                  return false;
                },
                Deadline::after_ms(5000), "non-blocking wait", PollPolicy{4, 2000, std::chrono::microseconds(1)});
  EXPECT_EQ(polls, 3000);
  EXPECT_LE(asked, 1);
}

// A blocked wait still ends at its deadline with kTimeout.
TEST(AdaptiveWait, ABlockedWaitTimesOut) {
  try {
    adaptive_wait([] { return false; }, [] { return 0; },
                  [](Clock::duration max) {
                    std::this_thread::sleep_for(max);
                    return true;
                  },
                  Deadline::after_ms(100), "peer 7's flag", PollPolicy{4, 1u << 30, std::chrono::microseconds(50)});
    ADD_FAILURE() << "a blocked wait should time out";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout);
    EXPECT_NE(std::string(e.what()).find("peer 7's flag"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace trellis::transport::detail
