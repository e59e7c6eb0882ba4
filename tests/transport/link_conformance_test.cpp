// One test body for every link backend built (UCX's UCT_INSTANTIATE_TEST_CASE idea):
// ordering on a tag, sizes from 0 bytes to tens of MiB, many outstanding requests on mixed
// tags, receives posted before and after their messages, deadlines that name the peer,
// and capability flags that match what the backend does. Run under mpirun with 2 and 4
// ranks; every rank connects to every other rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "harness/mpi_world.hpp"
#include "trellis/core/config.hpp"
#include "trellis/core/error.hpp"
#include "trellis/transport/bootstrap.hpp"
#include "trellis/transport/link.hpp"

namespace trellis::transport {
namespace {

using testing_support::soon;
using testing_support::world;

// The ranks a backend can link this rank to: every rank, except for shm, which joins the
// ranks of one host (on the emulated cluster, half of them).
std::vector<int> reachable_group(Backend b) {
  std::vector<int> group;
  auto hosts = allgather_strings(world(), world().hostname(), soon());
  for (int r = 0; r < world().size(); ++r)
    if (b != Backend::kShm || hosts[r] == hosts[world().rank()]) group.push_back(r);
  return group;
}

std::byte pattern(std::size_t i, int from, int to, std::uint32_t salt) {
  return static_cast<std::byte>((i * 2654435761u + static_cast<std::size_t>(from) * 97 +
                                 static_cast<std::size_t>(to) * 13 + salt) >> 7);
}

std::vector<std::byte> make_payload(std::size_t n, int from, int to, std::uint32_t salt) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = pattern(i, from, to, salt);
  return v;
}

// Index of the first wrong byte, or -1.
long first_mismatch(const std::vector<std::byte>& got, std::size_t n, int from, int to, std::uint32_t salt) {
  for (std::size_t i = 0; i < n; ++i)
    if (got[i] != pattern(i, from, to, salt)) return static_cast<long>(i);
  return -1;
}

void wait_all(std::vector<RequestPtr>& reqs, Deadline deadline) {
  for (auto& r : reqs) r->wait(deadline);
}

class LinkConformance : public testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    config_.set("comm.deadline_ms", "30000", SettingSource::kDefault);
    group_ = reachable_group(GetParam());
    if (world().any(group_.size() < 2, soon())) GTEST_SKIP() << "a rank has no peer this backend can reach";
    std::string why;
    try {
      transport_ = connect(GetParam(), world(), everyone_else(), config_);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kUnsupported) throw;
      why = e.what();
    }
    // Skip alike on every rank, so the ranks stay in step.
    if (world().any(!why.empty(), soon())) GTEST_SKIP() << "backend not usable here: " << why;
    // This body hands host memory and larger-than-sent receive buffers; nccl takes device
    // memory and equal sizes only, so it needs its own body (not written: no GPU here).
    if (GetParam() == Backend::kNccl) GTEST_SKIP() << "nccl needs device buffers of equal size";
  }
  void TearDown() override {
    if (transport_) world().barrier(soon());
    transport_.reset();
  }
  // Ring neighbours inside the reachable group.
  int index() const { return static_cast<int>(std::find(group_.begin(), group_.end(), rank()) - group_.begin()); }
  int rank() const { return world().rank(); }
  int size() const { return static_cast<int>(group_.size()); }
  int next() const { return group_[(index() + 1) % size()]; }
  int prev() const { return group_[(index() + size() - 1) % size()]; }
  std::vector<int> everyone_else() const {
    std::vector<int> peers;
    for (int r : group_)
      if (r != rank()) peers.push_back(r);
    return peers;
  }

  std::vector<int> group_;
  Config config_;
  std::unique_ptr<Transport> transport_;
};

TEST_P(LinkConformance, CapabilitiesMatchTheBackend) {
  auto caps = transport_->capabilities();
  EXPECT_EQ(transport_->backend(), GetParam());
  EXPECT_EQ(caps.device_memory, GetParam() == Backend::kNccl);
  EXPECT_EQ(caps.same_host_only, GetParam() == Backend::kShm);
  for (int p : everyone_else()) {
    EXPECT_EQ(transport_->link(p).peer(), p);
    EXPECT_EQ(transport_->link(p).backend(), GetParam());
  }
  EXPECT_FALSE(transport_->describe().empty());
  try {
    transport_->link(rank());
    ADD_FAILURE() << "link to self should throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
}

TEST_P(LinkConformance, MessagesOnATagArriveInOrder) {
  constexpr int kMessages = 64;
  std::vector<std::uint32_t> out(kMessages), in(kMessages * world().size(), 0);
  std::vector<RequestPtr> reqs;
  for (int p : everyone_else())
    for (int i = 0; i < kMessages; ++i)
      reqs.push_back(transport_->link(p).irecv(std::as_writable_bytes(std::span(&in[p * kMessages + i], 1)), 5));
  for (int i = 0; i < kMessages; ++i) out[i] = static_cast<std::uint32_t>(rank() * 1000 + i);
  for (int p : everyone_else())
    for (int i = 0; i < kMessages; ++i)
      reqs.push_back(transport_->link(p).isend(std::as_bytes(std::span(&out[i], 1)), 5));
  wait_all(reqs, soon());
  for (int p : everyone_else())
    for (int i = 0; i < kMessages; ++i) ASSERT_EQ(in[p * kMessages + i], static_cast<std::uint32_t>(p * 1000 + i));
}

TEST_P(LinkConformance, SizesFromZeroBytesToTensOfMiB) {
  const std::vector<std::size_t> sizes = {0, 1, 7, 64, 4096, 65537, (1u << 20) + 3, 24u << 20};
  for (std::size_t n : sizes) {
    auto out = make_payload(n, rank(), next(), static_cast<std::uint32_t>(n));
    std::vector<std::byte> in(n + 16, std::byte{0xee});  // larger buffer: bytes() tells the size
    auto r = transport_->link(prev()).irecv(in, 9);
    auto s = transport_->link(next()).isend(out, 9);
    s->wait(soon());
    r->wait(soon());
    ASSERT_EQ(r->bytes(), n) << "size " << n;
    ASSERT_EQ(first_mismatch(in, n, prev(), rank(), static_cast<std::uint32_t>(n)), -1) << "size " << n;
    ASSERT_EQ(in[n], std::byte{0xee}) << "wrote past the message, size " << n;
  }
}

TEST_P(LinkConformance, ManyOutstandingRequestsOnMixedTags) {
  constexpr int kPerTag = 32, kTags = 4;
  constexpr std::size_t kBytes = 3000;
  std::vector<std::vector<std::byte>> out, in;
  std::vector<RequestPtr> reqs;
  // Receives posted in reverse tag order, sends in forward order: tags must not block each other.
  for (int p : everyone_else())
    for (int t = kTags - 1; t >= 0; --t)
      for (int i = 0; i < kPerTag; ++i) {
        in.emplace_back(kBytes);
        reqs.push_back(transport_->link(p).irecv(in.back(), static_cast<std::uint32_t>(100 + t)));
      }
  for (int p : everyone_else())
    for (int t = 0; t < kTags; ++t)
      for (int i = 0; i < kPerTag; ++i) {
        out.push_back(make_payload(kBytes, rank(), p, static_cast<std::uint32_t>(t * kPerTag + i)));
        reqs.push_back(transport_->link(p).isend(out.back(), static_cast<std::uint32_t>(100 + t)));
      }
  wait_all(reqs, soon());
  std::size_t k = 0;
  for (int p : everyone_else())
    for (int t = kTags - 1; t >= 0; --t)
      for (int i = 0; i < kPerTag; ++i, ++k)
        ASSERT_EQ(first_mismatch(in[k], kBytes, p, rank(), static_cast<std::uint32_t>(t * kPerTag + i)), -1)
            << "from rank " << p << " tag " << 100 + t << " message " << i;
}

TEST_P(LinkConformance, ReceivePostedAfterTheMessageArrived) {
  auto out = make_payload(100000, rank(), next(), 1);
  auto s = transport_->link(next()).isend(out, 3);
  world().barrier(soon());  // the message is on its way before anyone posts a receive
  std::vector<std::byte> in(100000);
  auto r = transport_->link(prev()).irecv(in, 3);
  r->wait(soon());
  s->wait(soon());
  EXPECT_EQ(first_mismatch(in, in.size(), prev(), rank(), 1), -1);
}

TEST_P(LinkConformance, ReceiveWithNobodySendingTimesOutNamingThePeer) {
  std::vector<std::byte> in(64);
  auto r = transport_->link(next()).irecv(in, 77);
  try {
    r->wait(Deadline::after_ms(300));
    ADD_FAILURE() << "a receive nobody sends to must time out";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimeout);
    EXPECT_NE(std::string(e.what()).find(fmt::format("rank {}", next())), std::string::npos) << e.what();
  }
  r.reset();  // cancels the receive; the link stays usable
  std::uint64_t v = static_cast<std::uint64_t>(rank()), got = 0;
  auto r2 = transport_->link(prev()).irecv(std::as_writable_bytes(std::span(&got, 1)), 78);
  auto s2 = transport_->link(next()).isend(std::as_bytes(std::span(&v, 1)), 78);
  s2->wait(soon());
  r2->wait(soon());
  EXPECT_EQ(got, static_cast<std::uint64_t>(prev()));
}

TEST_P(LinkConformance, MessageLargerThanTheBufferIsAnErrorNotACrash) {
  std::vector<std::byte> out(4096, std::byte{1}), in(1024);
  auto r = transport_->link(prev()).irecv(in, 11);
  auto s = transport_->link(next()).isend(out, 11);
  bool threw = false;
  try {
    r->wait(soon());
  } catch (const Error& e) {
    threw = true;
    EXPECT_NE(std::string(e.what()).find(fmt::format("rank {}", prev())), std::string::npos) << e.what();
  }
  EXPECT_TRUE(threw) << "a 4 KiB message into a 1 KiB buffer must fail the receive";
  try {
    s->wait(soon());
  } catch (const Error&) {
    // Backends may fail the send too (UCX does not); either is fine, a crash is not.
  }
}

TEST_P(LinkConformance, RegisteredBuffersAreReused) {
  constexpr std::size_t kBytes = 256 << 10;
  std::vector<std::byte> out(kBytes), in(kBytes);
  auto reg_out = transport_->register_buffer(out);
  auto reg_in = transport_->register_buffer(in);
  EXPECT_EQ(reg_in->data().data(), in.data());
  EXPECT_EQ(reg_in->data().size(), kBytes);
  for (std::uint32_t it = 0; it < 4; ++it) {
    // Whole buffers and slices inside them, both through the registration.
    std::size_t n = it % 2 ? kBytes : 1000 + it;
    auto payload = make_payload(n, rank(), next(), it);
    std::copy(payload.begin(), payload.end(), out.begin());
    auto r = transport_->link(prev()).irecv(std::span(in).first(n), 20);
    auto s = transport_->link(next()).isend(std::span<const std::byte>(out).first(n), 20);
    s->wait(soon());
    r->wait(soon());
    ASSERT_EQ(r->bytes(), n);
    ASSERT_EQ(first_mismatch(in, n, prev(), rank(), it), -1) << "iteration " << it;
    world().barrier(soon());  // nobody overwrites `out` while a peer may still read it
  }
}

TEST_P(LinkConformance, TooLargeMessageThatArrivedFirstFailsTheReceive) {
  std::vector<std::byte> out(4096, std::byte{2}), in(1024);
  auto s = transport_->link(next()).isend(out, 12);
  world().barrier(soon());  // the message is on its way before the receive exists
  bool threw = false;
  try {
    auto r = transport_->link(prev()).irecv(in, 12);
    r->wait(soon());
  } catch (const Error& e) {
    threw = true;
    EXPECT_EQ(e.code(), ErrorCode::kCorruptInput) << e.what();
    EXPECT_NE(std::string(e.what()).find(fmt::format("rank {}", prev())), std::string::npos) << e.what();
  }
  EXPECT_TRUE(threw);
  try {
    s->wait(soon());
  } catch (const Error&) {
  }
}

std::string backend_name(const testing::TestParamInfo<Backend>& info) {
  return std::string(to_string(info.param));
}

INSTANTIATE_TEST_SUITE_P(Built, LinkConformance, testing::ValuesIn(built_backends()), backend_name);

}  // namespace
}  // namespace trellis::transport
