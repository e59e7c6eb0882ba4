// The shared-memory ring that broadcasts the scheduler's outputs to a host's ranks: order,
// deadlines and limits, and a dead or failed producer or consumer named (runtime/ipc).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "trellis/core/error.hpp"
#include "trellis/runtime/ipc/shm_ring.hpp"

using namespace trellis;
using namespace trellis::runtime;

TEST(ShmRing, BroadcastsInOrderToEveryConsumer) {
  auto name = fmt::format("/trellis-test-{}-ring", ::getpid());
  auto ring = ShmRing::create(name, 4, 256, 3);
  const int kMessages = 200;
  std::vector<std::thread> readers;
  std::atomic<int> good{0};
  for (std::uint32_t c = 0; c < 3; ++c) {
    readers.emplace_back([&, c] {
      auto r = ShmRing::open(name, c, Deadline::after_ms(10000));
      std::vector<std::byte> msg;
      int expect = 0;
      while (r->read(msg, Deadline::after_ms(10000))) {
        if (msg.size() == static_cast<std::size_t>(expect % 200) &&
            (msg.empty() || msg.back() == static_cast<std::byte>(expect)))
          ++expect;
        else
          return;
      }
      if (expect == kMessages) ++good;
    });
  }
  std::vector<std::byte> m;
  for (int i = 0; i < kMessages; ++i) {
    m.assign(static_cast<std::size_t>(i % 200), static_cast<std::byte>(i));
    ring->write(m, Deadline::after_ms(10000));
  }
  ring->close();
  for (auto& t : readers) t.join();
  EXPECT_EQ(good.load(), 3);
  // Every consumer attached before the last write: the name is already gone, so a killed
  // job would have left nothing in /dev/shm.
  EXPECT_LT(::shm_open(name.c_str(), O_RDWR, 0), 0);
}

TEST(ShmRing, DeadlinesAndLimits) {
  auto name = fmt::format("/trellis-test-{}-ring2", ::getpid());
  auto ring = ShmRing::create(name, 2, 64, 1);
  auto reader = ShmRing::open(name, 0, Deadline::after_ms(1000));
  std::vector<std::byte> msg;
  EXPECT_FALSE(reader->try_read(msg));
  try {
    reader->read(msg, Deadline::after_ms(50));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout);
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos);
  }
  std::vector<std::byte> big(65);
  EXPECT_THROW(ring->write(big, Deadline::after_ms(50)), Error);
  std::vector<std::byte> one(1);
  ring->write(one, Deadline::after_ms(50));
  ring->write(one, Deadline::after_ms(50));
  try {
    ring->write(one, Deadline::after_ms(50));  // full: consumer 0 is two behind
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("consumer 0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ShmRing::open(name, 5, Deadline::after_ms(100)), Error);
  EXPECT_THROW(ShmRing::open("/trellis-test-nope", 0, Deadline::after_ms(50)), Error);
}

namespace {

// Runs `wait` (given the rank's failure flag, set 100 ms in by another thread, and a 20 s
// deadline) and expects it to stop at the failure, as a symptom that says why.
void expect_stops_when_the_rank_fails(const std::function<void(const std::atomic<bool>*)>& wait,
                                      const char* what_should_not_happen) {
  std::atomic<bool> failed{false};
  std::thread fail([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    failed = true;
  });
  const auto t0 = std::chrono::steady_clock::now();
  try {
    wait(&failed);
    ADD_FAILURE() << what_should_not_happen;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kPeerFailed);
    EXPECT_EQ(e.scope(), ErrorScope::kRank);
    EXPECT_NE(std::string(e.what()).find("its rank failed"), std::string::npos) << e.what();
  }
  fail.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

}  // namespace

// A consumer waiting for a producer that will never create the ring (its rank failed first:
// seen as a 20 s hang in Engine.SilentHeartbeatIsNamedFirstHand about once in 125 runs under
// load) stops when its own rank fails, not at the deadline, and says why.
TEST(ShmRing, OpenStopsWaitingWhenItsRankFails) {
  const auto name = fmt::format("/trellis-test-{}-never", ::getpid());
  expect_stops_when_the_rank_fails(
      [&](const std::atomic<bool>* failed) { ShmRing::open(name, 0, Deadline::after_ms(20000), failed); },
      "opened a ring nobody created");
}

// The producer side: a full ring whose consumer (a thread of this process, so alive) stopped
// reading because the rank failed. The write stops at the rank's failure, as a symptom.
TEST(ShmRing, WriteToAFullRingStopsWhenItsRankFails) {
  auto name = fmt::format("/trellis-test-{}-full", ::getpid());
  auto ring = ShmRing::create(name, 2, 64, 1);
  auto reader = ShmRing::open(name, 0, Deadline::after_ms(1000));
  std::vector<std::byte> one(8, std::byte{1});
  ring->write(one, Deadline::after_ms(1000));  // both slots, never read
  ring->write(one, Deadline::after_ms(1000));
  expect_stops_when_the_rank_fails(
      [&](const std::atomic<bool>* failed) { ring->write(one, Deadline::after_ms(20000), failed); },
      "wrote into a full ring");
}

// A peer process that dies mid-channel is named within about 100 ms of waiting, not at the
// deadline, and what it wrote before dying is still delivered.
TEST(ShmRing, DeadProducerIsNamedAndItsMessagesDelivered) {
  auto name = fmt::format("/trellis-test-{}-ring3", ::getpid());
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto ring = ShmRing::create(name, 4, 64, 1);
    std::vector<std::byte> m(3, std::byte{7});
    ring->write(m, Deadline::after_ms(1000));
    ::_exit(0);  // dies without close() and without unmapping or unlinking
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);  // reaped: the pid is gone
  auto reader = ShmRing::open(name, 0, Deadline::after_ms(5000));
  ::shm_unlink(name.c_str());
  std::vector<std::byte> msg;
  ASSERT_TRUE(reader->read(msg, Deadline::after_ms(5000)));
  EXPECT_EQ(msg.size(), 3u);
  auto t0 = std::chrono::steady_clock::now();
  try {
    reader->read(msg, Deadline::after_ms(20000));
    FAIL() << "read returned after the producer died";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kPeerFailed) << e.what();
    EXPECT_NE(std::string(e.what()).find(fmt::format("pid {}", child)), std::string::npos) << e.what();
  }
  // Well before the 20 s deadline (generous for a loaded machine; the probe runs every 100 ms).
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

TEST(ShmRing, DeadConsumerIsNamedWhenTheRingFills) {
  auto name = fmt::format("/trellis-test-{}-ring4", ::getpid());
  auto ring = ShmRing::create(name, 2, 64, 1);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto r = ShmRing::open(name, 0, Deadline::after_ms(5000));
    ::_exit(0);
  }
  // Not reaped yet: a zombie must count as dead too.
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT), 0);
  std::vector<std::byte> one(1);
  ring->write(one, Deadline::after_ms(1000));
  ring->write(one, Deadline::after_ms(1000));
  try {
    ring->write(one, Deadline::after_ms(20000));  // full: the dead consumer is two behind
    FAIL() << "write returned into a full ring";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kPeerFailed) << e.what();
    EXPECT_NE(std::string(e.what()).find("consumer 0"), std::string::npos) << e.what();
  }
  ::waitpid(child, nullptr, 0);
}

TEST(ShmRing, FailedProducerPassesItsReasonAfterTheMessages) {
  auto name = fmt::format("/trellis-test-{}-ring5", ::getpid());
  auto ring = ShmRing::create(name, 4, 64, 1);
  auto reader = ShmRing::open(name, 0, Deadline::after_ms(1000));
  std::vector<std::byte> one(1);
  ring->write(one, Deadline::after_ms(1000));
  ring->fail("rank 0: link to rank 2 broke");
  ring->close();  // a later close does not hide the failure
  std::vector<std::byte> msg;
  EXPECT_TRUE(reader->read(msg, Deadline::after_ms(1000)));  // written before the failure
  try {
    reader->read(msg, Deadline::after_ms(1000));
    FAIL() << "read after a failed producer returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kPeerFailed);
    EXPECT_NE(std::string(e.what()).find("link to rank 2 broke"), std::string::npos) << e.what();
  }
}
