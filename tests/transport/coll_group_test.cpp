// Multi-rank tests of every collective algorithm (shm one-/two-shot and in pieces, ring,
// recursive doubling, hierarchical over emulated hosts, mpi) and both dtypes against a
// reference sum: exact for integer-valued inputs, within f32 rounding of the MPI group for
// random inputs, and bit-identical across ranks. Odd sizes, 0 and 1 elements, broadcast
// from every root, all-gather, async overlapped with work and with another group's
// operations, large messages back to back through a short shm ring, subgroups, a missing
// member (one-shot and mid-pipeline).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "coll_expect.hpp"
#include "harness/mpi_world.hpp"
#include "trellis/core/config.hpp"
#include "trellis/core/error.hpp"
#include "trellis/transport/bootstrap.hpp"
#include "trellis/transport/collectives.hpp"
#include "trellis/transport/dtype.hpp"

namespace trellis::transport {
namespace {

using testing_support::soon;
using testing_support::everyone;
using testing_support::world;

struct Case {
  const char* name;
  Algorithm algorithm;
  std::size_t slot = 1 << 20, one_shot = 32 << 10, doubling = 64 << 10;
  bool two_hosts = false;  // emulate hosts: ranks {0..n/2-1} and {n/2..n-1}
  bool uneven_hosts = false;  // rank 0 alone on its host
  std::size_t slots = 8;      // shm ring slots
};

const Case kCases[] = {
    {"shm", Algorithm::kShm},
    {"shm_one_shot", Algorithm::kShm, 1 << 20, std::size_t{1} << 30},
    {"shm_two_shot", Algorithm::kShm, 1 << 20, 0},
    {"shm_pieces", Algorithm::kShm, 4096, 1024},
    // The pipelined path wrapping a short ring many times: pieces that are not a multiple
    // of the chunk alignment, a last piece of one element, the smallest ring (2 slots).
    {"shm_ring3", Algorithm::kShm, 4160, 0, 64 << 10, false, false, 3},
    {"shm_ring2", Algorithm::kShm, 8192, 0, 64 << 10, false, false, 2},
    {"ring", Algorithm::kRing, 1 << 20, 0, 0},
    {"ring_doubling", Algorithm::kRing, 1 << 20, 0, std::size_t{1} << 30},
    {"hierarchical", Algorithm::kHierarchical, 8192, 2048, 4096, true},
    {"hierarchical_uneven", Algorithm::kHierarchical, 8192, 2048, 4096, false, true},
    {"auto", Algorithm::kAuto},
    {"mpi", Algorithm::kMpi},
};

// The host of every world rank a case pretends (one host unless it says two).
std::vector<int> hosts_of(const Case& c) {
  const int n = world().size();
  std::vector<int> hosts(static_cast<std::size_t>(n), 0);
  for (int r = 0; r < n; ++r) {
    if (c.two_hosts) hosts[r] = r < n / 2 ? 0 : 1;
    if (c.uneven_hosts) hosts[r] = r == 0 ? 0 : 1;
  }
  return hosts;
}

class Collectives : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case& c = GetParam();
    config_.set("comm.deadline_ms", "30000", SettingSource::kDefault);
    GroupOptions o;
    o.algorithm = c.algorithm;
    o.cross_host = Backend::kMpi;  // the link every build has; the bench covers ucx
    o.shm_slot_bytes = c.slot;
    o.shm_slots = c.slots;
    o.one_shot_max_bytes = c.one_shot;
    o.doubling_max_bytes = c.doubling;
    o.deadline = Millis(30000);
    group_ = make_group(world(), everyone(), o, config_, hosts_of(c));
    ASSERT_NE(group_, nullptr);
  }
  void TearDown() override {
    if (group_) group_->barrier();
    group_.reset();
  }
  int rank() const { return world().rank(); }
  int size() const { return world().size(); }

  Config config_;
  std::unique_ptr<Group> group_;
};

// Small integers: every partial sum is exact in f32 and bf16, so any order gives the reference.
float int_value(std::size_t i, int rank) { return static_cast<float>(static_cast<int>((i * 7 + rank * 13) % 17) - 8); }
// Element i of the sum over `ranks` ranks of int_value(i, rank).
float int_sum(std::size_t i, int ranks) {
  float w = 0;
  for (int r = 0; r < ranks; ++r) w += int_value(i, r);
  return w;
}

const std::size_t kSizes[] = {0, 1, 2, 3, 7, 17, 1000, 4097, 65537, 300001};

TEST_P(Collectives, AllReduceF32MatchesReferenceSum) {
  for (std::size_t n : kSizes) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = int_value(i, rank());
    group_->all_reduce(v.data(), n, DType::kF32);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float want = int_sum(i, size());
      bad += v[i] != want;
    }
    EXPECT_EQ(bad, 0u) << "n=" << n << " algorithm " << group_->describe();
  }
}

TEST_P(Collectives, AllReduceBF16MatchesReferenceSum) {
  for (std::size_t n : kSizes) {
    std::vector<std::uint16_t> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = f32_to_bf16_bits(int_value(i, rank()));
    group_->all_reduce(v.data(), n, DType::kBF16);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float want = int_sum(i, size());
      bad += bf16_bits_to_f32(v[i]) != want;
    }
    EXPECT_EQ(bad, 0u) << "n=" << n;
  }
}

// bf16 is accumulated in f32 and rounded once: 1 + 2^-9 + 2^-9 (+ ...) rounds up in f32
// summation where rounding after every addition would keep 1.0.
TEST_P(Collectives, BF16IsRoundedOnce) {
  const float tiny = std::ldexp(1.0f, -9);  // half an ulp of bf16 at 1.0
  std::vector<std::uint16_t> v(33, f32_to_bf16_bits(rank() == 0 ? 1.0f : tiny));
  group_->all_reduce(v.data(), v.size(), DType::kBF16);
  float want = bf16_bits_to_f32(f32_to_bf16_bits(1.0f + tiny * static_cast<float>(size() - 1)));
  for (auto b : v) ASSERT_EQ(bf16_bits_to_f32(b), want);
}

TEST_P(Collectives, RandomF32AgreesWithMpiAndAcrossRanks) {
  auto mpi = make_mpi_group(world(), everyone(), Millis(30000));
  for (std::size_t n : {5u, 3000u, 70001u}) {
    std::mt19937 rng(1234u + static_cast<unsigned>(rank()));
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    std::vector<float> a(n), b(n);
    for (auto& x : a) x = d(rng);
    b = a;
    group_->all_reduce(a.data(), n, DType::kF32);
    mpi->all_reduce(b.data(), n, DType::kF32);
    std::size_t far = 0;
    for (std::size_t i = 0; i < n; ++i) far += std::fabs(a[i] - b[i]) > 1e-5f * static_cast<float>(size());
    EXPECT_EQ(far, 0u) << "n=" << n;
    // Every rank must hold the same bits (a TP layer would diverge otherwise).
    std::vector<float> gathered(n * static_cast<std::size_t>(size()));
    mpi->all_gather(a.data(), gathered.data(), n * sizeof(float));
    for (int r = 0; r < size(); ++r)
      EXPECT_EQ(std::memcmp(gathered.data() + n * static_cast<std::size_t>(r), a.data(), n * sizeof(float)), 0)
          << "rank " << r << " differs, n=" << n;
  }
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  for (std::size_t bytes : {1u, 3u, 4096u, 10001u, 70001u}) {
    for (int root = 0; root < size(); ++root) {
      std::vector<std::uint8_t> v(bytes);
      for (std::size_t i = 0; i < bytes; ++i) v[i] = static_cast<std::uint8_t>(rank() == root ? (i * 31 + root) : 0xEE);
      group_->broadcast(v.data(), bytes, root);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < bytes; ++i) bad += v[i] != static_cast<std::uint8_t>(i * 31 + root);
      EXPECT_EQ(bad, 0u) << "bytes=" << bytes << " root=" << root;
    }
  }
}

TEST_P(Collectives, AllGatherInGroupOrder) {
  for (std::size_t bytes : {1u, 5u, 4096u, 9001u}) {
    std::vector<std::uint8_t> in(bytes), out(bytes * static_cast<std::size_t>(size()), 0xEE);
    for (std::size_t i = 0; i < bytes; ++i) in[i] = static_cast<std::uint8_t>(i + 41 * rank());
    group_->all_gather(in.data(), out.data(), bytes);
    std::size_t bad = 0;
    for (int r = 0; r < size(); ++r)
      for (std::size_t i = 0; i < bytes; ++i) bad += out[r * bytes + i] != static_cast<std::uint8_t>(i + 41 * r);
    EXPECT_EQ(bad, 0u) << "bytes=" << bytes;
  }
}

// The Ladder Residual pattern: start the reduction, compute, then wait; and a second
// reduction issued while the first is still in flight.
TEST_P(Collectives, AsyncOverlapsWithWork) {
  const std::size_t n = 50001;
  std::vector<float> a(n), b(n);
  for (std::size_t i = 0; i < n; ++i) a[i] = b[i] = int_value(i, rank());
  auto ra = group_->all_reduce_async(a.data(), n, DType::kF32);
  double work = 0;
  for (int k = 0; k < 200000; ++k) {
    work += std::sqrt(static_cast<double>(k));
    if (k % 5000 == 0) ra->test();
  }
  auto rb = group_->all_reduce_async(b.data(), n, DType::kF32);
  rb->wait(soon());
  ra->wait(soon());
  EXPECT_GT(work, 0);
  for (std::size_t i = 0; i < n; i += 97) {
    const float want = int_sum(i, size());
    ASSERT_EQ(a[i], want) << i;
    ASSERT_EQ(b[i], want) << i;
  }
}

// Ranks drive overlapping asynchronous operations differently: the lower half pushes the first
// one as far as it goes alone before issuing the second (with hosts {0,1},{2,3}, rank 0 gets
// stuck in the leaders' phase and rank 1 in the local broadcast), the upper half issues both
// at once; all wait for the second first. Multi-phase algorithms (hierarchical) must still
// complete every rank's sub-operations in one order everywhere, or this deadlocks.
TEST_P(Collectives, OverlappingAsyncOperationsDrivenDifferentlyPerRank) {
  const std::size_t n = 20001;
  std::vector<float> a(n), b(n);
  for (std::size_t i = 0; i < n; ++i) a[i] = b[i] = int_value(i, rank());
  auto ra = group_->all_reduce_async(a.data(), n, DType::kF32);
  if (rank() < size() / 2) {
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
    while (std::chrono::steady_clock::now() < until && !ra->test()) std::this_thread::yield();
  }
  auto rb = group_->all_reduce_async(b.data(), n, DType::kF32);
  rb->wait(soon());
  ra->wait(soon());
  for (std::size_t i = 0; i < n; i += 89) {
    const float want = int_sum(i, size());
    ASSERT_EQ(a[i], want) << i;
    ASSERT_EQ(b[i], want) << i;
  }
}

TEST_P(Collectives, ManyBackToBackOperationsStayInStep) {
  std::vector<float> v(33);
  for (int k = 0; k < 300; ++k) {
    std::fill(v.begin(), v.end(), static_cast<float>(rank() + k));
    group_->all_reduce(v.data(), v.size(), DType::kF32);
    float want = static_cast<float>(size() * k + size() * (size() - 1) / 2);
    ASSERT_EQ(v[k % v.size()], want) << "iteration " << k;
    if (k % 50 == 0) group_->barrier();
  }
}

// Large messages back to back with sizes that shift where pieces start in the ring, both
// dtypes alternating, checked exactly: a rank that reused a slot too early, or drained a
// piece before its owner reduced it, leaves wrong sums.
TEST_P(Collectives, LargeBackToBackOperationsBothDTypes) {
  const std::size_t sizes[] = {70001, 5, 33000, 1, 129, 300001, 16385, 99999};
  for (int k = 0; k < 24; ++k) {
    const std::size_t n = sizes[static_cast<std::size_t>(k) % std::size(sizes)];
    const int shift = k % 5;
    auto want = [&](std::size_t i) { return int_sum(i + static_cast<std::size_t>(shift), size()); };
    std::size_t bad = 0;
    if (k % 2 == 0) {
      std::vector<float> v(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = int_value(i + static_cast<std::size_t>(shift), rank());
      group_->all_reduce(v.data(), n, DType::kF32);
      for (std::size_t i = 0; i < n; ++i) bad += v[i] != want(i);
    } else {
      std::vector<std::uint16_t> v(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = f32_to_bf16_bits(int_value(i + static_cast<std::size_t>(shift), rank()));
      group_->all_reduce(v.data(), n, DType::kBF16);
      for (std::size_t i = 0; i < n; ++i) bad += bf16_bits_to_f32(v[i]) != want(i);
    }
    ASSERT_EQ(bad, 0u) << "operation " << k << ", n=" << n << (k % 2 == 0 ? " f32" : " bf16");
  }
}

// An asynchronous all-reduce on one group stays in flight (it is larger than a ring of
// slots) while the same ranks run a blocking all-reduce and a broadcast on another group.
TEST_P(Collectives, AsyncOverlapsAnotherGroupsOperations) {
  Config config;
  GroupOptions o;
  o.algorithm = GetParam().algorithm;
  o.cross_host = Backend::kMpi;
  o.shm_slot_bytes = 4096;
  o.shm_slots = 2;
  auto other = make_group(world(), everyone(), o, config, hosts_of(GetParam()));
  const std::size_t n = 100003, m = 40001;
  std::vector<float> a(n), b(m);
  for (std::size_t i = 0; i < n; ++i) a[i] = int_value(i, rank());
  for (std::size_t i = 0; i < m; ++i) b[i] = int_value(i + 3, rank());
  auto ra = group_->all_reduce_async(a.data(), n, DType::kF32);
  other->all_reduce(b.data(), m, DType::kF32);
  std::vector<std::uint8_t> c(9001, rank() == 1 % size() ? 0x5A : 0);
  other->broadcast(c.data(), c.size(), 1 % size());
  ra->wait(soon());
  for (std::size_t i = 0; i < n; i += 7) {
    const float want = int_sum(i, size());
    ASSERT_EQ(a[i], want) << i;
  }
  for (std::size_t i = 0; i < m; i += 7) {
    const float want = int_sum(i + 3, size());
    ASSERT_EQ(b[i], want) << i;
  }
  EXPECT_EQ(std::count(c.begin(), c.end(), 0x5A), static_cast<std::ptrdiff_t>(c.size()));
  other->barrier();
}

INSTANTIATE_TEST_SUITE_P(Algorithms, Collectives, testing::ValuesIn(kCases),
                         [](const testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

TEST(CollectivesFactory, AutoPicksShmInHostAndRingAcrossHosts) {
  Config config;
  GroupOptions o;
  o.cross_host = Backend::kMpi;
  auto g = make_group(world(), everyone(), o, config);
  EXPECT_EQ(g->describe(), "shm");
  std::vector<int> one_per_host(static_cast<std::size_t>(world().size()));
  std::iota(one_per_host.begin(), one_per_host.end(), 0);
  auto ring = make_group(world(), everyone(), o, config, one_per_host);
  EXPECT_EQ(ring->describe(), "ring over mpi");  // the link backend is named, for the start-up log
  o.algorithm = Algorithm::kShm;
  EXPECT_THROW(make_group(world(), everyone(), o, config, one_per_host), Error);
}

TEST(CollectivesFactory, SubgroupsAndNonMembers) {
  if (world().size() < 4) GTEST_SKIP() << "needs 4 ranks";
  Config config;
  GroupOptions o;
  auto g = make_group(world(), {2, 0}, o, config);
  const int me = world().rank();
  if (me != 0 && me != 2) {
    EXPECT_EQ(g, nullptr);
    return;
  }
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->rank(), me == 2 ? 0 : 1);
  std::vector<float> v(100, static_cast<float>(me));
  g->all_reduce(v.data(), v.size(), DType::kF32);
  EXPECT_EQ(v[99], 2.0f);
}

// A member that never arrives is named by the others within the group's deadline: for a
// one-shot message, and for one that fills the whole ring before it needs the absent rank.
class MissingMember : public testing::TestWithParam<std::size_t> {};

TEST_P(MissingMember, IsNamedWithinDeadline) {
  Config config;
  GroupOptions o;
  o.algorithm = Algorithm::kShm;
  // The deadline also bounds the group's creation (a bootstrap all-gather): 300 ms timed out
  // there on this loaded 2-core machine, so ranks left the collective at different points.
  o.deadline = Millis(1500);
  o.shm_slot_bytes = 16 << 10;
  o.shm_slots = 3;
  world().barrier(soon());
  auto g = make_group(world(), everyone(), o, config);
  const int absent = world().size() - 1;
  if (world().rank() != absent) {
    std::vector<float> v(GetParam(), 1.0f);
    expect_fails_naming_absent(absent, [&] { g->all_reduce(v.data(), v.size(), DType::kF32); });
  }
  world().barrier(soon());
}

INSTANTIATE_TEST_SUITE_P(Sizes, MissingMember, testing::Values(std::size_t{1000}, std::size_t{300000}));

}  // namespace
}  // namespace trellis::transport
