// The MPI bootstrap at 4 ranks: collectives, point-to-point, and deadlines that turn a
// missing peer into an error instead of a hang.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "trellis/core/error.hpp"
#include "trellis/transport/bootstrap.hpp"

namespace trellis::transport {
namespace {

Bootstrap& world() {
  static auto w = make_mpi_bootstrap();
  return *w;
}

Deadline soon() { return Deadline::after_ms(20000); }

TEST(MpiBootstrap, RankAndSize) {
  EXPECT_GE(world().size(), 2);
  EXPECT_GE(world().rank(), 0);
  EXPECT_LT(world().rank(), world().size());
  EXPECT_FALSE(world().hostname().empty());
}

TEST(MpiBootstrap, AllgatherVariableSizes) {
  std::string mine(static_cast<std::size_t>(world().rank()) * 3, 'a' + static_cast<char>(world().rank()));
  auto all = allgather_strings(world(), mine, soon());
  ASSERT_EQ(static_cast<int>(all.size()), world().size());
  for (int r = 0; r < world().size(); ++r) {
    EXPECT_EQ(all[r], std::string(static_cast<std::size_t>(r) * 3, 'a' + static_cast<char>(r)));
  }
}

TEST(MpiBootstrap, BroadcastAndAgreement) {
  std::vector<std::byte> data;
  if (world().rank() == 1) data = {std::byte{1}, std::byte{2}, std::byte{3}};
  world().broadcast(data, 1, soon());
  ASSERT_EQ(data.size(), 3u);
  EXPECT_EQ(data[2], std::byte{3});
  EXPECT_TRUE(world().any(world().rank() == world().size() - 1, soon()));
  EXPECT_FALSE(world().any(false, soon()));
  EXPECT_DOUBLE_EQ(world().max(static_cast<double>(world().rank()), soon()), world().size() - 1.0);
}

TEST(MpiBootstrap, RingSendRecvCarriesEveryByte) {
  const int n = world().size(), r = world().rank();
  std::vector<std::byte> out(100000), in(100000);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>((i + r) & 0xff);
  world().sendrecv((r + 1) % n, out, (r + n - 1) % n, in, 7, soon());
  int prev = (r + n - 1) % n;
  for (std::size_t i = 0; i < in.size(); ++i) ASSERT_EQ(in[i], static_cast<std::byte>((i + prev) & 0xff));
}

TEST(MpiBootstrap, ReceiveFromSilentPeerTimesOut) {
  // Nobody sends tag 99: every rank's receive must end at its deadline, naming the peer.
  const int n = world().size(), r = world().rank();
  std::vector<std::byte> in(16);
  auto start = Clock::now();
  try {
    world().recv((r + 1) % n, 99, in, Deadline::after_ms(300));
    FAIL() << "receive returned without a sender";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout);
    EXPECT_NE(std::string(e.what()).find("rank " + std::to_string((r + 1) % n)), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  world().barrier(soon());
}

TEST(MpiBootstrap, WrongSizeIsReported) {
  const int n = world().size(), r = world().rank();
  std::vector<std::byte> small(8), big(16);
  if (r == 0) {
    world().send(1 % n, 5, small, soon());
  } else if (r == 1) {
    EXPECT_THROW(world().recv(0, 5, big, soon()), Error);
  }
  world().barrier(soon());
}

TEST(MpiBootstrap, BadPeerIsRejected) {
  std::vector<std::byte> b(1);
  EXPECT_THROW(world().send(world().size(), 0, b, soon()), Error);
  EXPECT_THROW(world().recv(-1, 0, b, soon()), Error);
}

// Kept last: it leaves rank 0's side of one collective abandoned (MPI cannot cancel it).
// The last rank enters a world collective 1.2 s late; rank 0, whose deadline is 0.4 s, names
// it as the rank that never came; the others wait 1.5 s longer than their own deadline (so
// rank 0's naming comes first) and here see it arrive in time. The abandoned collective
// completes in the background once the late rank has entered it.
TEST(MpiBootstrap, ZTimedOutCollectiveNamesTheRankThatNeverCame) {
  const int n = world().size(), r = world().rank(), late = n - 1;
  world().barrier(soon());
  if (r == late) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    EXPECT_EQ(world().max(1.0, soon()), 1.0);
    return;
  }
  try {
    EXPECT_EQ(world().max(1.0, Deadline::after_ms(400)), 1.0);
    EXPECT_NE(r, 0) << "rank 0 waited past its deadline";
  } catch (const Error& e) {
    ASSERT_EQ(r, 0) << "rank " << r << " gave up within its grace: " << e.what();
    EXPECT_EQ(e.code(), ErrorCode::kPeerFailed) << e.what();
    EXPECT_NE(std::string(e.what()).find("waiting for world rank(s) " + std::to_string(late) + ", which never reached it"), std::string::npos)
        << e.what();
  }
}

// Kept last as well. The last rank stops itself (SIGSTOP) where the others enter a world
// collective with a 20 s deadline; with heartbeats on (1.5 s of silence), rank 0 names it as
// silent long before that deadline, then sends it SIGCONT; the rank goes on and the collective
// completes for the others. Before heartbeats, nobody could tell a stopped rank (or a cut
// link) from a slow one until the deadline, and when every rank had already arrived at the
// collective nobody could be named at all.
TEST(MpiBootstrap, ZZSilentRankIsNamedLongBeforeTheDeadline) {
  const int n = world().size(), r = world().rank(), late = n - 1;
  const auto pids = allgather_strings(world(), std::to_string(::getpid()), soon());
  world().watch_liveness(std::chrono::milliseconds(1500));
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // every rank heard from
  world().barrier(soon());
  if (r == late) {
    ::raise(SIGSTOP);  // rank 0 continues this process once it has named it
    EXPECT_EQ(world().max(1.0, soon()), 1.0);
    world().watch_liveness(std::chrono::minutes(10));
    return;
  }
  const auto start = Clock::now();
  try {
    EXPECT_EQ(world().max(1.0, soon()), 1.0);
    EXPECT_NE(r, 0) << "rank 0 did not notice that rank " << late << " went silent";
  } catch (const Error& e) {
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (r == 0) ::kill(std::stoi(pids[static_cast<std::size_t>(late)]), SIGCONT);
    ASSERT_EQ(r, 0) << "rank " << r << " gave up: " << e.what();
    EXPECT_EQ(e.code(), ErrorCode::kPeerFailed) << e.what();
    // The late rank must be among those named (a busy CI host may starve another's beats).
    const std::string what = e.what(), head = "waiting for world rank(s) ";
    const auto a = what.find(head), b = what.find(", silent for");
    ASSERT_TRUE(a != std::string::npos && b != std::string::npos && b > a) << what;
    const std::string named = " " + what.substr(a + head.size(), b - a - head.size()) + " ";
    EXPECT_NE(named.find(" " + std::to_string(late) + " "), std::string::npos) << what;
    EXPECT_LT(waited, 10.0) << "named only after " << waited << " s";
  }
  if (r == 0) ::kill(std::stoi(pids[static_cast<std::size_t>(late)]), SIGCONT);  // never leave it stopped
  world().watch_liveness(std::chrono::minutes(10));
}

}  // namespace
}  // namespace trellis::transport
