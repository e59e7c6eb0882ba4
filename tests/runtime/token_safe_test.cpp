// Token-safe execution: a CPU thread and a forward thread run flat out; the forward thread
// must see every iteration in order with the contents the CPU wrote, and the CPU must never
// write the version the forward is reading. Both wait styles (run.host_waits): blocking on the
// condition variable and polling with yields.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "trellis/runtime/engine/engine.hpp"
#include "trellis/runtime/engine/token_safe.hpp"

using namespace trellis;
using namespace trellis::runtime;

namespace {
struct Buf {
  std::int64_t iteration = -1;
  std::vector<std::int64_t> data = std::vector<std::int64_t>(64);
  std::atomic<int> readers{0};
};
class TokenSafeWaits : public ::testing::TestWithParam<bool> {};  // spin?
INSTANTIATE_TEST_SUITE_P(Styles, TokenSafeWaits, ::testing::Values(false, true),
                         [](const auto& tpi) { return std::string(tpi.param ? "Spin" : "Block"); });
}  // namespace

TEST_P(TokenSafeWaits, NoWriteAfterReadHazardAndInOrder) {
  TokenSafe<Buf> ts("test stage");
  ts.set_spin(GetParam());
  const int kIters = 3000;
  std::atomic<bool> hazard{false};
  std::thread cpu([&] {
    for (int i = 0; i < kIters; ++i) {
      Buf& b = ts.cpu_acquire(Deadline::after_ms(10000));
      if (b.readers.load() != 0) hazard = true;  // the forward still reads this version
      b.iteration = i;
      for (auto& x : b.data) x = i * 7;
      ts.cpu_publish();
    }
    ts.close();
  });
  int seen = 0;
  bool ok = true;
  while (const Buf* b = ts.forward_acquire(Deadline::after_ms(10000))) {
    auto& mb = const_cast<Buf&>(*b);
    mb.readers++;
    ok = ok && b->iteration == seen;
    // The CPU may now prepare the next iteration into the other version concurrently.
    std::this_thread::yield();
    for (auto x : b->data) ok = ok && x == seen * 7;
    mb.readers--;
    ++seen;
  }
  cpu.join();
  EXPECT_TRUE(ok);
  EXPECT_FALSE(hazard.load());
  EXPECT_EQ(seen, kIters);
  EXPECT_EQ(ts.ci(), kIters - 1);
  EXPECT_EQ(ts.gi(), kIters - 1);
}

TEST_P(TokenSafeWaits, CpuRunsOneAheadThenWaits) {
  TokenSafe<Buf> ts("test stage");
  ts.set_spin(GetParam());
  ts.cpu_acquire(Deadline::after_ms(100)).iteration = 0;
  ts.cpu_publish();
  // CI = 0 > GI = -1: the CPU may not prepare iteration 1 until the forward takes 0.
  try {
    ts.cpu_acquire(Deadline::after_ms(30));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout);
    EXPECT_NE(std::string(e.what()).find("test stage"), std::string::npos);
  }
  const Buf* f = ts.forward_acquire(Deadline::after_ms(100));
  ASSERT_TRUE(f);
  EXPECT_EQ(f->iteration, 0);
  // GI incremented on entry: the CPU may prepare iteration 1 (the other version) now.
  Buf& next = ts.cpu_acquire(Deadline::after_ms(100));
  EXPECT_NE(&next, f);
  EXPECT_THROW(ts.forward_acquire(Deadline::after_ms(30)), Error);
}

// A wait longer than the spin window (an idle server) goes on blocking and still wakes when
// the input comes.
TEST_P(TokenSafeWaits, AWaitLongerThanTheSpinWindowStillWakes) {
  TokenSafe<Buf> ts("test stage");
  ts.set_spin(GetParam());
  std::thread cpu([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(80));
    ts.cpu_acquire(Deadline::after_ms(1000)).iteration = 7;
    ts.cpu_publish();
  });
  const Buf* b = ts.forward_acquire(Deadline::after_ms(5000));
  cpu.join();
  ASSERT_TRUE(b);
  EXPECT_EQ(b->iteration, 7);
}

// run.host_waits: named styles are taken as they are; auto never spins for CPU stages (their
// threads compute) nor for a rank without 4 cores of its own.
TEST(HostWaits, AutoSpinsOnlyForGpuStagesWithCoresToSpare) {
  std::string why;
  EXPECT_TRUE(host_waits_spin(HostWaits::kSpin, false, 64, &why));
  EXPECT_EQ(why, "run.host_waits=spin");
  EXPECT_FALSE(host_waits_spin(HostWaits::kBlock, true, 1, &why));
  EXPECT_FALSE(host_waits_spin(HostWaits::kAuto, false, 1, &why));
  EXPECT_NE(why.find("stages on the CPU"), std::string::npos) << why;
  // 100000 ranks on this host leave no rank 4 cores, whatever the machine.
  EXPECT_FALSE(host_waits_spin(HostWaits::kAuto, true, 100000, &why));
  EXPECT_NE(why.find("stages on CUDA GPUs"), std::string::npos) << why;
  EXPECT_EQ(parse_host_waits("spin", "x"), HostWaits::kSpin);
  try {
    parse_host_waits("busy", "run.host_waits");
    ADD_FAILURE() << "an unknown style was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("run.host_waits: unknown wait style 'busy'"), std::string::npos) << e.what();
  }
}
