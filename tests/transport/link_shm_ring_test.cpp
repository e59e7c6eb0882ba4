// The shm link's ring under the traffic patterns that exercise its record layout: records
// cut short at the ring's end, pad records that send a quiet link back to the ring's start
// (ShmLink::rewind), messages split into many chunks, messages larger than the ring, and
// messages that arrive before their receive. A small ring (64 KiB: 32 KiB hot region,
// 16 KiB chunks) makes every one of these happen many times. Every byte is checked.
// Run with 2 ranks on one host.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "harness/mpi_world.hpp"
#include "trellis/core/config.hpp"
#include "trellis/core/error.hpp"
#include "trellis/transport/bootstrap.hpp"
#include "trellis/transport/link.hpp"

namespace trellis::transport {
namespace {

using testing_support::soon;
using testing_support::world;

std::vector<std::byte> payload(std::size_t n, int from, std::uint32_t seq) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seq * 7919 + static_cast<std::size_t>(from) * 17) >> 2);
  return v;
}

// Sizes that land records on every alignment and straddle the hot region, the chunk size
// and the ring's end; the same sequence on both ranks (fixed seed).
std::vector<std::size_t> sizes(int count, std::size_t max) {
  std::mt19937 rng(1234);
  std::vector<std::size_t> v;
  const std::size_t edges[] = {0, 1, 47, 48, 49, 63, 64, 65, 16383, 16384, 16385, 32768, 40000};
  for (std::size_t e : edges) v.push_back(e);
  std::uniform_int_distribution<std::size_t> small(0, 5000), large(0, max);
  while (static_cast<int>(v.size()) < count) v.push_back(v.size() % 4 == 0 ? large(rng) : small(rng));
  return v;
}

class ShmRing : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(world().size(), 2) << "run with 2 ranks";
    config_.set("comm.shm.ring_bytes", "64KiB", SettingSource::kFlag);
    transport_ = connect(Backend::kShm, world(), {peer()}, config_);
  }
  void TearDown() override {
    if (transport_) world().barrier(soon());
    transport_.reset();
  }
  int rank() const { return world().rank(); }
  int peer() const { return 1 - world().rank(); }
  Link& link() { return transport_->link(peer()); }

  // Receives message `seq` of size n from the peer and checks every byte.
  void expect_message(RequestPtr& r, const std::vector<std::byte>& in, std::size_t n, std::uint32_t seq) {
    r->wait(soon());
    ASSERT_EQ(r->bytes(), n) << "message " << seq;
    auto want = payload(n, peer(), seq);
    ASSERT_TRUE(n == 0 || std::memcmp(in.data(), want.data(), n) == 0) << "message " << seq << " of " << n << " bytes";
  }

  Config config_;
  std::unique_ptr<Transport> transport_;
};

// One message at a time each way: the ring is empty before every send, so the writer pads
// back to the start whenever it passed the hot region.
TEST_F(ShmRing, PingPongOfMixedSizesCrossesRewindsAndRingEnds) {
  const auto n = sizes(600, 200000);
  for (std::uint32_t seq = 0; seq < n.size(); ++seq) {
    auto out = payload(n[seq], rank(), seq);
    std::vector<std::byte> in(n[seq] + 8);
    auto r = link().irecv(in, 1);
    if (rank() == 0) {
      link().isend(out, 1)->wait(soon());
      expect_message(r, in, n[seq], seq);
    } else {
      expect_message(r, in, n[seq], seq);
      link().isend(out, 1)->wait(soon());
    }
    if (HasFatalFailure()) return;
  }
}

// Both ranks send a burst larger than the ring before receiving anything, on two tags, so
// records queue behind a full ring, arrive unexpected, and chunks of one message straddle
// pads; receives are posted late and in the other tag's order first.
TEST_F(ShmRing, BurstsLargerThanTheRingArriveWholeAndInOrder) {
  const auto n = sizes(120, 150000);
  std::vector<std::vector<std::byte>> outs, ins;
  std::vector<RequestPtr> sends, recvs;
  for (std::uint32_t seq = 0; seq < n.size(); ++seq) outs.push_back(payload(n[seq], rank(), seq));
  for (std::uint32_t seq = 0; seq < n.size(); ++seq) sends.push_back(link().isend(outs[seq], 10 + seq % 2));
  for (int pass = 1; pass >= 0; --pass)
    for (std::uint32_t seq = 0; seq < n.size(); ++seq) {
      if (static_cast<int>(seq % 2) != pass) continue;
      ins.emplace_back(n[seq]);
      recvs.push_back(link().irecv(ins.back(), 10 + seq % 2));
    }
  for (auto& s : sends) s->wait(soon());
  std::size_t k = 0;
  for (int pass = 1; pass >= 0; --pass)
    for (std::uint32_t seq = 0; seq < n.size(); ++seq) {
      if (static_cast<int>(seq % 2) != pass) continue;
      expect_message(recvs[k], ins[k], n[seq], seq);
      ++k;
      if (HasFatalFailure()) return;
    }
}

// A message 64 times the ring between small ones: it must stream through the ring while
// the receiver copies it out, and the small ones keep their order around it.
TEST_F(ShmRing, MessageMuchLargerThanTheRingStreamsThrough) {
  const std::vector<std::size_t> n = {5, 4u << 20, 3, (4u << 20) + 17, 1};
  for (int round = 0; round < 2; ++round) {
    std::vector<std::vector<std::byte>> outs, ins;
    std::vector<RequestPtr> reqs;
    for (std::uint32_t seq = 0; seq < n.size(); ++seq) {
      ins.emplace_back(n[seq]);
      reqs.push_back(link().irecv(ins.back(), 20));
    }
    for (std::uint32_t seq = 0; seq < n.size(); ++seq) outs.push_back(payload(n[seq], rank(), seq));
    std::vector<RequestPtr> sends;
    for (std::uint32_t seq = 0; seq < n.size(); ++seq) sends.push_back(link().isend(outs[seq], 20));
    for (auto& s : sends) s->wait(soon());
    for (std::uint32_t seq = 0; seq < n.size(); ++seq) {
      expect_message(reqs[seq], ins[seq], n[seq], seq);
      if (HasFatalFailure()) return;
    }
  }
}

}  // namespace
}  // namespace trellis::transport
