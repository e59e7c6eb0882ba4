// The shm collectives' blocking wait (futex in the segment, transport/src/collectives/
// shm_group.cpp): a rank whose peers do not move blocks instead of yielding, and every
// publish that sees it waiting wakes it. Checked here: results stay exact with every rank
// pinned to one CPU (each wait then needs the peer to run on this rank's core); a member
// that arrives late wakes a rank that blocked on it (it did block, and the result is right);
// with comm.coll_shm_park off the same wait never blocks. A member killed while its peer is
// blocked is tests/transport/coll_fault_dead_rank.sh.
#include <gtest/gtest.h>
#include <sched.h>

#include <chrono>
#include <cstdint>
#include <numeric>
#include <thread>
#include <vector>

#include "harness/mpi_world.hpp"
#include "src/wait.hpp"
#include "trellis/core/error.hpp"
#include "trellis/transport/bootstrap.hpp"
#include "trellis/transport/collectives.hpp"
#include "trellis/transport/dtype.hpp"

namespace trellis::transport {
namespace {

using testing_support::soon;
using testing_support::everyone;
using testing_support::world;

GroupOptions options(bool park) {
  GroupOptions o;
  o.algorithm = Algorithm::kShm;
  o.shm_slot_bytes = 64 << 10;  // a 1 MiB message goes through the 8-slot ring twice
  o.shm_park = park;
  o.deadline = Millis(30000);
  return o;
}

// Every rank contributes (rank + 1) * (i % 7 + 1): the sum is (i % 7 + 1) * P(P+1)/2.
bool all_reduce_is_exact(Group& g, std::size_t n, DType dtype) {
  const int p = g.size();
  const float total = static_cast<float>(p * (p + 1) / 2);
  std::vector<float> f(n);
  for (std::size_t i = 0; i < n; ++i) f[i] = static_cast<float>((g.rank() + 1) * (i % 7 + 1));
  if (dtype == DType::kF32) {
    g.all_reduce(f.data(), n, dtype);
    for (std::size_t i = 0; i < n; ++i)
      if (f[i] != total * static_cast<float>(i % 7 + 1)) return false;
    return true;
  }
  std::vector<std::uint16_t> b(n);
  f32_to_bf16(f.data(), b.data(), n);
  g.all_reduce(b.data(), n, dtype);
  bf16_to_f32(b.data(), f.data(), n);
  for (std::size_t i = 0; i < n; ++i)
    if (f[i] != total * static_cast<float>(i % 7 + 1)) return false;  // small integers: exact in bf16
  return true;
}

// Pins this process to the first CPU it may use (the same one on every rank of this host)
// for the scope, and restores its mask after.
class OneCpu {
 public:
  OneCpu() {
    if (sched_getaffinity(0, sizeof(old_), &old_) != 0) return;
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &old_)) {
        CPU_SET(c, &one);
        break;
      }
    pinned_ = sched_setaffinity(0, sizeof(one), &one) == 0;
  }
  ~OneCpu() {
    if (pinned_) sched_setaffinity(0, sizeof(old_), &old_);
  }
  bool pinned() const { return pinned_; }

 private:
  cpu_set_t old_;
  bool pinned_ = false;
};

TEST(ShmPark, AllRanksOnOneCpuStayExact) {
  auto g = make_group(world(), everyone(), options(true), Config{});
  OneCpu pin;
  ASSERT_TRUE(pin.pinned());
  int bad = 0;
  for (int round = 0; round < 3; ++round)
    for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{16384}, std::size_t{262144 + 3}})
      for (DType d : {DType::kF32, DType::kBF16}) bad += all_reduce_is_exact(*g, n, d) ? 0 : 1;
  EXPECT_EQ(bad, 0);
  EXPECT_FALSE(world().any(bad != 0, soon())) << "another rank saw a wrong sum";
}

// Rank 0 arrives 300 ms before the others: far past spinning and yielding, so it blocks, and
// the others' first publish must wake it (the 5 ms park slices would also end the wait, but
// the result and the park count are what is checked).
void late_member(bool park) {
  auto g = make_group(world(), everyone(), options(park), Config{});
  ASSERT_TRUE(all_reduce_is_exact(*g, 4096, DType::kF32));  // warm: segment mapped, flags set
  world().barrier(soon());
  if (g->rank() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto parks = detail::park_count();
  EXPECT_TRUE(all_reduce_is_exact(*g, 300000, DType::kF32));
  if (g->rank() == 0) {
    if (park) {
      EXPECT_GT(detail::park_count(), parks) << "rank 0 waited 300 ms without blocking";
    } else {
      EXPECT_EQ(detail::park_count(), parks) << "comm.coll_shm_park=false must not block";
    }
  }
  world().barrier(soon());
}

TEST(ShmPark, LateMemberWakesABlockedRank) { late_member(true); }
TEST(ShmPark, SwitchedOffNeverBlocks) { late_member(false); }

}  // namespace
}  // namespace trellis::transport
