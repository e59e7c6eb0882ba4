// Token-safe execution: a CPU thread and a forward thread run flat out; the forward thread
// must see every iteration in order with the contents the CPU wrote, and the CPU must never
// write the version the forward is reading.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "trellis/runtime/engine/token_safe.hpp"

using namespace trellis;
using namespace trellis::runtime;

namespace {
struct Buf {
  std::int64_t iteration = -1;
  std::vector<std::int64_t> data = std::vector<std::int64_t>(64);
  std::atomic<int> readers{0};
};
}  // namespace

TEST(TokenSafe, NoWriteAfterReadHazardAndInOrder) {
  TokenSafe<Buf> ts("test stage");
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

TEST(TokenSafe, CpuRunsOneAheadThenWaits) {
  TokenSafe<Buf> ts("test stage");
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
