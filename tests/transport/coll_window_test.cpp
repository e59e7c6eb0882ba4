// Registered windows (Group::allocate_window) and the zero-copy shm all-reduce on them, under
// mpirun with 2, 3 and 4 ranks: exact sums for both dtypes at odd sizes and offsets inside
// the window, bit-identical to the copying path for random inputs, back-to-back operations
// that alternate window and copying operations on one group, the asynchronous form
// overlapped with another group's operations, and the errors: members passing different
// parts of their windows, different window sizes, a member that never arrives. Groups
// without shared memory return no window; a group of one returns private memory.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
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

using testing_support::everyone;
using testing_support::soon;
using testing_support::world;

std::unique_ptr<Group> shm_group(Millis deadline = Millis(30000), std::size_t one_shot = 32 << 10) {
  Config config;
  GroupOptions o;
  o.algorithm = Algorithm::kShm;
  o.shm_slot_bytes = 16 << 10;  // the copying path in several pieces, for the mixed test
  o.shm_slots = 3;
  o.one_shot_max_bytes = one_shot;
  o.deadline = deadline;
  return make_group(world(), everyone(), o, config);
}

int rank() { return world().rank(); }
int size() { return world().size(); }
float int_value(std::size_t i, int r) { return static_cast<float>(static_cast<int>((i * 5 + r * 11) % 19) - 9); }
float want_sum(std::size_t i) {
  float w = 0;
  for (int r = 0; r < size(); ++r) w += int_value(i, r);
  return w;
}

// Whether an operation of `bytes` on window memory takes the zero-copy path (shm_group.cpp).
bool zero_copy(std::size_t bytes) { return size() == 2 || bytes > (32u << 10); }

TEST(Window, IsZeroedSizedAndPerRank) {
  auto g = shm_group();
  auto w = g->allocate_window(100001);
  ASSERT_EQ(w.size(), 100001u);
  EXPECT_EQ(std::count(w.begin(), w.end(), std::byte{0}), static_cast<std::ptrdiff_t>(w.size()));
  // Each member has its own region: writing mine changes nobody else's.
  std::memset(w.data(), rank() + 1, w.size());
  g->barrier();
  EXPECT_EQ(static_cast<int>(w[w.size() - 1]), rank() + 1);
  auto w2 = g->allocate_window(64);
  EXPECT_EQ(w2.size(), 64u);
  EXPECT_TRUE(w2.data() + w2.size() <= w.data() || w2.data() >= w.data() + w.size());
}

TEST(Window, AllReduceBothDTypesAtOddSizesAndOffsets) {
  auto g = shm_group();
  const std::size_t bytes = 1300000;
  auto w = g->allocate_window(bytes);
  const std::size_t offsets[] = {0, 4, 64, 4100, 200004};
  const std::size_t counts[] = {1, 2, 17, 1000, 4097, 65537, 200001};
  for (std::size_t off : offsets) {
    for (std::size_t n : counts) {
      for (DType dt : {DType::kF32, DType::kBF16}) {
        const std::size_t es = dtype_size(dt);
        if (off + n * es > bytes) continue;
        std::byte* p = w.data() + off;
        for (std::size_t i = 0; i < n; ++i) {
          if (dt == DType::kF32) {
            float v = int_value(i, rank());
            std::memcpy(p + i * 4, &v, 4);
          } else {
            std::uint16_t b = f32_to_bf16_bits(int_value(i, rank()));
            std::memcpy(p + i * 2, &b, 2);
          }
        }
        auto req = g->all_reduce_async(p, n, dt);
        if (zero_copy(n * es)) {
          EXPECT_NE(req->describe().find("registered window"), std::string::npos) << req->describe();
        }
        req->wait(soon());
        std::size_t bad = 0;
        for (std::size_t i = 0; i < n; ++i) {
          float got;
          if (dt == DType::kF32) {
            std::memcpy(&got, p + i * 4, 4);
          } else {
            std::uint16_t b;
            std::memcpy(&b, p + i * 2, 2);
            got = bf16_bits_to_f32(b);
          }
          bad += got != want_sum(i);
        }
        ASSERT_EQ(bad, 0u) << "offset " << off << ", n=" << n << (dt == DType::kF32 ? " f32" : " bf16");
      }
    }
  }
}

// Random inputs: the window path forms every sum in the same order as the copying path, so
// the two agree bit for bit (and so do all ranks).
TEST(Window, BitIdenticalToTheCopyingPath) {
  auto g = shm_group();
  const std::size_t n = 300007;
  auto w = g->allocate_window(n * 4);
  std::mt19937 gen(static_cast<unsigned>(1234 + rank()));
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> copy(n);
  for (auto& x : copy) x = d(gen);
  std::memcpy(w.data(), copy.data(), n * 4);
  g->all_reduce(copy.data(), n, DType::kF32);
  g->all_reduce(w.data(), n, DType::kF32);
  EXPECT_EQ(std::memcmp(copy.data(), w.data(), n * 4), 0);
  std::vector<float> first(n);
  if (rank() == 0) std::memcpy(first.data(), copy.data(), n * 4);
  g->broadcast(first.data(), n * 4, 0);
  EXPECT_EQ(std::memcmp(first.data(), w.data(), n * 4), 0) << "ranks disagree";
}

// Window and copying operations alternate on one group, back to back and asynchronously, with
// sizes and offsets that change every time: a member that rewrote its region while a peer
// still read it, or started an operation before the previous one ended, leaves wrong sums.
TEST(Window, BackToBackMixedWithCopyingOperations) {
  auto g = shm_group();
  auto w = g->allocate_window(1 << 20);
  const std::size_t sizes[] = {70001, 5, 33000, 129, 200001, 16385};
  for (int k = 0; k < 36; ++k) {
    const std::size_t n = sizes[static_cast<std::size_t>(k) % std::size(sizes)];
    const std::size_t shift = static_cast<std::size_t>(k % 7);
    const bool in_window = k % 3 != 2;
    std::vector<float> own;
    float* p = reinterpret_cast<float*>(w.data()) + (k % 4) * 16;
    if (!in_window) {
      own.resize(n);
      p = own.data();
    }
    for (std::size_t i = 0; i < n; ++i) p[i] = int_value(i + shift, rank());
    if (k % 2 == 0) {
      g->all_reduce(p, n, DType::kF32);
    } else {
      auto req = g->all_reduce_async(p, n, DType::kF32);
      std::this_thread::sleep_for(std::chrono::microseconds(100 * rank()));  // ranks arrive at different times
      req->wait(soon());
    }
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      float want = 0;
      for (int r = 0; r < size(); ++r) want += int_value(i + shift, r);
      bad += p[i] != want;
    }
    ASSERT_EQ(bad, 0u) << "operation " << k << ", n=" << n << (in_window ? " in the window" : " copying");
  }
}

// Ladder Residual's use: the reduction runs while the caller computes and while the same
// ranks use another group.
TEST(Window, AsyncOverlapsAnotherGroupsOperations) {
  auto g = shm_group();
  auto other = shm_group();
  const std::size_t n = 250000, m = 40001;
  auto w = g->allocate_window(n * 4);
  auto* a = reinterpret_cast<float*>(w.data());
  for (std::size_t i = 0; i < n; ++i) a[i] = int_value(i, rank());
  std::vector<float> b(m);
  for (std::size_t i = 0; i < m; ++i) b[i] = int_value(i + 3, rank());
  auto ra = g->all_reduce_async(a, n, DType::kF32);
  other->all_reduce(b.data(), m, DType::kF32);
  ra->wait(soon());
  for (std::size_t i = 0; i < n; i += 3) ASSERT_EQ(a[i], want_sum(i)) << i;
  for (std::size_t i = 0; i < m; i += 3) ASSERT_EQ(b[i], want_sum(i + 3)) << i;
}

// Members that pass different parts of their windows fail, each with an error, instead of
// reading memory the others are not reducing.
TEST(Window, DifferentOffsetsAreRejectedOnEveryMember) {
  auto g = shm_group(Millis(5000));
  auto w = g->allocate_window(1 << 16);
  auto* p = reinterpret_cast<float*>(w.data()) + (rank() == size() - 1 ? 16 : 0);
  try {
    g->all_reduce(p, 10000, DType::kF32);
    ADD_FAILURE() << "mismatched offsets were accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(e.code() == ErrorCode::kInvalidArgument || e.code() == ErrorCode::kPeerFailed) << e.what();
    EXPECT_NE(std::string(e.what()).find("same part of its window"), std::string::npos) << e.what();
  }
  world().barrier(soon());
}

TEST(Window, DifferentSizesAreRejectedOnEveryMember) {
  auto g = shm_group(Millis(5000));
  try {
    g->allocate_window(rank() == size() - 1 ? 8192 : 4096);
    ADD_FAILURE() << "windows of different sizes were accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(e.code() == ErrorCode::kIo || e.code() == ErrorCode::kPeerFailed) << e.what();
  }
  EXPECT_THROW(g->allocate_window(0), Error);
  world().barrier(soon());
}

TEST(Window, MissingMemberIsNamedWithinDeadline) {
  world().barrier(soon());
  auto g = shm_group(Millis(1500));
  auto w = g->allocate_window(1 << 20);
  const int absent = size() - 1;
  if (rank() != absent)
    expect_fails_naming_absent(absent, [&] { g->all_reduce(w.data(), 200000, DType::kF32); });
  world().barrier(soon());
}

// Across (emulated) hosts the hierarchical group hands out its host's shm window: the
// in-host phase runs in place, the rest as for any memory; the sums stay exact.
TEST(Window, HierarchicalGroupUsesItsHostsWindow) {
  if (size() < 4) GTEST_SKIP() << "needs 2 emulated hosts with 2 ranks each";
  Config config;
  GroupOptions o;
  o.algorithm = Algorithm::kHierarchical;
  o.cross_host = Backend::kMpi;
  std::vector<int> hosts(static_cast<std::size_t>(size()));
  for (int r = 0; r < size(); ++r) hosts[static_cast<std::size_t>(r)] = r < size() / 2 ? 0 : 1;
  auto g = make_group(world(), everyone(), o, config, hosts);
  const std::size_t n = 100003;
  auto w = g->allocate_window(n * 4);
  ASSERT_EQ(w.size(), n * 4);
  auto* p = reinterpret_cast<float*>(w.data());
  for (int k = 0; k < 3; ++k) {
    for (std::size_t i = 0; i < n; ++i) p[i] = int_value(i + static_cast<std::size_t>(k), rank());
    g->all_reduce(p, n, DType::kF32);
    for (std::size_t i = 0; i < n; i += 5) ASSERT_EQ(p[i], want_sum(i + static_cast<std::size_t>(k))) << k << " " << i;
  }
  g->barrier();
}

TEST(Window, GroupsWithoutSharedMemoryReturnNone) {
  Config config;
  GroupOptions o;
  o.algorithm = Algorithm::kMpi;
  auto mpi = make_group(world(), everyone(), o, config);
  EXPECT_TRUE(mpi->allocate_window(4096).empty());
  auto solo = make_single_group(rank());
  auto w = solo->allocate_window(1000);
  ASSERT_EQ(w.size(), 1000u);
  EXPECT_EQ(std::count(w.begin(), w.end(), std::byte{0}), 1000);
  solo->all_reduce(w.data(), 250, DType::kF32);
}

}  // namespace
}  // namespace trellis::transport
