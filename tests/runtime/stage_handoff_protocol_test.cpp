// The CUDA IPC stage hand-off's protocol (runtime/engine/stage_handoff.cpp) without a GPU: the
// device side (cuda_handoff.hpp) is replaced by a fake whose "stream operations" happen when
// they are enqueued, so the host order the protocol guarantees is the order the fake sees. It
// checks the premises of the race-freedom argument at the top of stage_handoff.cpp over many
// hand-offs on two threads with random delays:
//  * the sender never writes the receiver's x while the receiver still uses the previous
//    hand-off (between its "arrived" and its "consumed");
//  * every copy but the first waits for a "consumed" of the hand-off before it;
//  * the receiver's "arrived" for hand-off n comes after the sender's copy of n, and x then
//    holds exactly n's bytes;
//  * finish() on both sides ends with nothing outstanding.
// The real device path runs in runtime_gpu_run (pp=2 on one GPU) and `trellis bench handoff`.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "cuda_handoff.hpp"
#include "engine_fixture.hpp"
#include "trellis/runtime/engine/stage_handoff.hpp"

using namespace trellis;
using namespace trellis::runtime;

namespace {

constexpr std::size_t kBytes = 64;

// What both fakes share: the receiver's x and the counts the checks compare.
struct World {
  std::mutex mu;
  std::vector<std::byte> x = std::vector<std::byte>(kBytes);
  int puts = 0, arrived = 0, consumed = 0, syncs = 0;
  // What the fake GPUs 0 and 1 answer to "stream memory operations?", and the signals the
  // fakes were built with (0: none yet).
  bool values_on_gpu[2] = {true, true};
  int target_signal = 0, peer_signal = 0;
  std::vector<std::string> violations;
  void fail(std::string what) { violations.push_back(std::move(what)); }
};
World* g_world = nullptr;

class FakeTarget final : public detail::IpcTarget {
 public:
  std::vector<std::byte> export_handles() const override { return std::vector<std::byte>(detail::kIpcExportBytes); }
  std::size_t bytes() const override { return kBytes; }
  void arrived(std::uint64_t n, void*) override {
    std::lock_guard lock(g_world->mu);
    World& w = *g_world;
    if (n != static_cast<std::uint64_t>(w.arrived)) w.fail("arrived(" + std::to_string(n) + ") for hand-off " +
                                                           std::to_string(w.arrived));
    if (w.puts != w.arrived + 1)
      w.fail("arrived for hand-off " + std::to_string(w.arrived) + " after " + std::to_string(w.puts) + " copies");
    ++w.arrived;
  }
  void consumed(std::uint64_t n, void*) override {
    std::lock_guard lock(g_world->mu);
    World& w = *g_world;
    if (n != static_cast<std::uint64_t>(w.consumed)) w.fail("consumed(" + std::to_string(n) + ") for hand-off " +
                                                            std::to_string(w.consumed));
    if (w.consumed + 1 != w.arrived)
      w.fail("consumed recorded " + std::to_string(w.consumed + 1) + " times after " + std::to_string(w.arrived) +
             " arrivals");
    ++w.consumed;
  }
};

class FakePeer final : public detail::IpcPeerTarget {
 public:
  void put(std::uint64_t seq, const void* src, std::size_t bytes, void*) override {
    std::lock_guard lock(g_world->mu);
    World& w = *g_world;
    const int n = w.puts;
    if (seq != static_cast<std::uint64_t>(n)) w.fail("put(" + std::to_string(seq) + ") for hand-off " + std::to_string(n));
    // The stream wait on "consumed" (the latest event record, or the word reaching n) must be
    // satisfied by hand-off n-1's mark.
    if (n > 0 && w.consumed != n)
      w.fail("copy of hand-off " + std::to_string(n) + " with " + std::to_string(w.consumed) + " consumed records");
    if (w.arrived > w.consumed) w.fail("copy of hand-off " + std::to_string(n) + " while x is in use");
    if (bytes > kBytes) w.fail("copy of " + std::to_string(bytes) + " bytes");
    std::memcpy(w.x.data(), src, std::min(bytes, kBytes));
    ++w.puts;
  }
};

std::unique_ptr<detail::IpcTarget> make_fake(int, void* dst, std::size_t, detail::IpcSignal signal) {
  if (!dst) throw std::runtime_error("no destination");
  std::lock_guard lock(g_world->mu);
  g_world->target_signal = static_cast<int>(signal);
  return std::make_unique<FakeTarget>();
}
std::unique_ptr<detail::IpcPeerTarget> open_fake(int, std::span<const std::byte>, std::size_t,
                                                 detail::IpcSignal signal) {
  std::lock_guard lock(g_world->mu);
  g_world->peer_signal = static_cast<int>(signal);
  return std::make_unique<FakePeer>();
}
bool values_fake(int gpu, std::string* why) {
  std::lock_guard lock(g_world->mu);
  const bool ok = g_world->values_on_gpu[gpu & 1];
  if (!ok && why) *why = "fake GPU " + std::to_string(gpu) + " has no stream memory operations";
  return ok;
}
void sync_fake(int, void*) {
  std::lock_guard lock(g_world->mu);
  ++g_world->syncs;
}

// Points the protocol at the fakes for one test, and back.
struct FakeDevice {
  detail::IpcDevice saved = detail::ipc_device();
  explicit FakeDevice(World& w) {
    g_world = &w;
    detail::ipc_device() = detail::IpcDevice{make_fake, open_fake, sync_fake, values_fake};
  }
  ~FakeDevice() {
    detail::ipc_device() = saved;
    g_world = nullptr;
  }
};

void jitter(std::mt19937& rng) {
  if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
}

// The protocol is the same for both GPU signals; under auto the fake GPUs offer stream values.
class StageHandoffSignals : public ::testing::TestWithParam<HandoffSignal> {};
INSTANTIATE_TEST_SUITE_P(Signals, StageHandoffSignals,
                         ::testing::Values(HandoffSignal::kAuto, HandoffSignal::kEvent, HandoffSignal::kStreamValue),
                         [](const auto& tpi) { return std::string(tpi.param == HandoffSignal::kAuto    ? "Auto"
                                                                   : tpi.param == HandoffSignal::kEvent ? "Event"
                                                                                                         : "StreamValue"); });

TEST_P(StageHandoffSignals, NoCopyOverwritesAnXInUseAndEveryArrivalSeesItsBytes) {
  World w;
  FakeDevice device(w);
  const HandoffSignal signal = GetParam();
  test::InProcHub hub;
  test::InProcTransport a(hub, 0), b(hub, 1);
  const auto deadline = Deadline::after(std::chrono::seconds(60));
  constexpr int kHandoffs = 300;
  std::byte x_dev[kBytes];  // stands for the receiver's device x (the fake copies into w.x)
  std::string rx_error;
  std::vector<int> seen;
  std::thread rx([&] {
    try {
      std::mt19937 rng(7);
      auto r = CudaIpcReceiver::connect({&b.link(0), 1, 0, kBytes, true, {}, x_dev, signal}, deadline, nullptr);
      EXPECT_EQ(r->signal(), signal == HandoffSignal::kEvent ? HandoffSignal::kEvent : HandoffSignal::kStreamValue);
      for (int n = 0; n < kHandoffs; ++n) {
        r->receive(kBytes, nullptr, deadline);
        jitter(rng);
        {  // the forward "uses" x now: it must hold hand-off n, whole
          std::lock_guard lock(w.mu);
          const auto v = std::to_integer<int>(w.x[0]);
          bool whole = true;
          for (std::byte c : w.x) whole = whole && c == w.x[0];
          if (!whole) w.fail("x mixes two hand-offs at " + std::to_string(n));
          seen.push_back(v);
        }
        jitter(rng);
      }
      r->finish(nullptr, deadline);
      EXPECT_EQ(r->received(), static_cast<std::size_t>(kHandoffs));
    } catch (const std::exception& e) {
      rx_error = e.what();
    }
  });
  std::string tx_error;
  try {
    std::mt19937 rng(11);
    auto s = CudaIpcSender::connect({&a.link(1), 0, 0, kBytes, true, {}, signal}, deadline, nullptr);
    std::vector<std::byte> src(kBytes);
    for (int n = 0; n < kHandoffs; ++n) {
      std::fill(src.begin(), src.end(), static_cast<std::byte>(n % 251));
      jitter(rng);
      s->send(src.data(), kBytes, nullptr, deadline);
    }
    s->finish(nullptr, deadline);
    EXPECT_EQ(s->sent(), static_cast<std::size_t>(kHandoffs));
  } catch (const std::exception& e) {
    tx_error = e.what();
  }
  rx.join();
  EXPECT_EQ(tx_error, "");
  EXPECT_EQ(rx_error, "");
  EXPECT_TRUE(w.violations.empty()) << w.violations.size() << " violations, the first: " << w.violations.front();
  EXPECT_EQ(w.puts, kHandoffs);
  EXPECT_EQ(w.arrived, kHandoffs);
  EXPECT_EQ(w.consumed, kHandoffs);  // the last one by the receiver's finish()
  EXPECT_EQ(w.syncs, 2);             // each side's finish() waits for its stream once
  ASSERT_EQ(seen.size(), static_cast<std::size_t>(kHandoffs));
  for (int n = 0; n < kHandoffs; ++n) EXPECT_EQ(seen[static_cast<std::size_t>(n)], n % 251) << "hand-off " << n;
  // Both ends were built for the signal the receiver picked.
  const int want = static_cast<int>(signal == HandoffSignal::kEvent ? detail::IpcSignal::kEvent
                                                                     : detail::IpcSignal::kStreamValue);
  EXPECT_EQ(w.target_signal, want);
  EXPECT_EQ(w.peer_signal, want);
}

// Connects a pair: the receiver on fake GPU 0 (rank 1), the sender on fake GPU 1 (rank 0).
// The links outlive the two ends (declared first, destroyed last).
struct Pair {
  test::InProcHub hub;
  test::InProcTransport a{hub, 0}, b{hub, 1};
  std::byte x_dev[kBytes];
  std::unique_ptr<CudaIpcReceiver> r;
  std::unique_ptr<CudaIpcSender> s;
  std::string r_why, s_why, r_error, s_error;
};
std::unique_ptr<Pair> connect_pair(HandoffSignal rx_signal, HandoffSignal tx_signal, bool required) {
  const auto deadline = Deadline::after(std::chrono::seconds(20));
  auto owned = std::make_unique<Pair>();
  Pair& p = *owned;
  std::thread rx([&] {
    try {
      p.r = CudaIpcReceiver::connect({&p.b.link(0), 1, 0, kBytes, required, {}, p.x_dev, rx_signal}, deadline,
                                     &p.r_why);
    } catch (const Error& e) {
      p.r_error = e.what();
    }
  });
  try {
    p.s = CudaIpcSender::connect({&p.a.link(1), 0, 1, kBytes, required, {}, tx_signal}, deadline, &p.s_why);
  } catch (const Error& e) {
    p.s_error = e.what();
  }
  rx.join();
  return owned;
}

// A set-up message the sender cannot follow (a signal it does not know: a newer peer; the
// magic of an older build) is refused with an error naming what was wrong, and the peer is
// still answered (not left waiting until its deadline). The wire format is written out here on
// purpose: it is what a peer of another build would send (stage_handoff.cpp, pack()).
TEST(StageHandoffProtocol, ASetUpMessageFromAnotherBuildIsRefusedNamingWhy) {
  World w;
  FakeDevice device(w);
  struct Case {
    std::uint32_t magic, signal;
    const char* want;
  };
  for (const Case c : {Case{0x54484f33u, 7u, "unknown hand-off signal 7"}, Case{0x54484f32u, 1u, "malformed message"}}) {
    test::InProcHub hub;
    test::InProcTransport a(hub, 0), b(hub, 1);
    std::vector<std::byte> msg(24 + detail::kIpcExportBytes);
    const std::uint32_t ok = 1, rlen = 0;
    const std::uint64_t dst = kBytes;
    std::memcpy(msg.data(), &c.magic, 4);
    std::memcpy(msg.data() + 4, &ok, 4);
    std::memcpy(msg.data() + 8, &dst, 8);
    std::memcpy(msg.data() + 16, &c.signal, 4);
    std::memcpy(msg.data() + 20, &rlen, 4);
    const auto deadline = Deadline::after(std::chrono::seconds(10));
    b.link(0).isend(msg, 0x500)->wait(deadline);  // the receiver's set-up message
    std::string error;
    try {
      CudaIpcSender::connect({&a.link(1), 0, 0, kBytes, true, {}}, deadline, nullptr);
      ADD_FAILURE() << "a set-up message with magic " << c.magic << ", signal " << c.signal << " was accepted";
    } catch (const Error& e) {
      error = e.what();
    }
    EXPECT_NE(error.find(c.want), std::string::npos) << error;
    EXPECT_NE(error.find("rank 0"), std::string::npos) << error;
    if (c.magic == 0x54484f33u) {  // a readable message is answered: not ok, with the reason
      std::vector<std::byte> ack(24 + 1024);
      auto r = b.link(0).irecv(ack, 0x501);
      r->wait(deadline);
      std::uint32_t ack_ok = 1;
      std::memcpy(&ack_ok, ack.data() + 4, 4);
      EXPECT_EQ(ack_ok, 0u);
      const std::string reason(reinterpret_cast<const char*>(ack.data() + 24), r->bytes() - 24);
      EXPECT_NE(reason.find(c.want), std::string::npos) << reason;
    }
  }
  EXPECT_EQ(w.peer_signal, 0) << "nothing was opened";
}

// Which signal a pair ends up with, and how a signal one side cannot use fails: on both sides,
// within the set-up exchange (no hang), as an error where the signal was named.
TEST(StageHandoffProtocol, TheSignalIsTheReceiversChoiceAndAnUnusableOneFailsOnBothSides) {
  World w;
  FakeDevice device(w);
  {  // auto, the receiver's GPU has no stream values: events, silently and correctly
    w.values_on_gpu[0] = false;
    auto pp = connect_pair(HandoffSignal::kAuto, HandoffSignal::kAuto, false);
    Pair& p = *pp;
    ASSERT_TRUE(p.r && p.s) << p.r_why << " / " << p.s_why;
    EXPECT_EQ(p.r->signal(), HandoffSignal::kEvent);
    EXPECT_EQ(p.s->signal(), HandoffSignal::kEvent);
    EXPECT_NE(p.r->signal_reason().find("no stream memory operations"), std::string::npos) << p.r->signal_reason();
  }
  {  // auto, the receiver can and the sender cannot: both fall back (auto), saying why
    w.values_on_gpu[0] = true;
    w.values_on_gpu[1] = false;
    auto pp = connect_pair(HandoffSignal::kAuto, HandoffSignal::kAuto, false);
    Pair& p = *pp;
    EXPECT_FALSE(p.r);
    EXPECT_FALSE(p.s);
    EXPECT_NE(p.s_why.find("this rank cannot"), std::string::npos) << p.s_why;
    EXPECT_NE(p.r_why.find("could not open"), std::string::npos) << p.r_why;
  }
  {  // stream-value named where the receiver cannot: an error on both sides, naming it
    w.values_on_gpu[0] = false;
    w.values_on_gpu[1] = true;
    auto pp = connect_pair(HandoffSignal::kStreamValue, HandoffSignal::kStreamValue, false);
    Pair& p = *pp;
    EXPECT_FALSE(p.r);
    EXPECT_FALSE(p.s);
    EXPECT_NE(p.r_error.find("comm.handoff_signal=stream-value"), std::string::npos) << p.r_error;
    EXPECT_NE(p.s_error.find("fake GPU 0 has no stream memory operations"), std::string::npos) << p.s_error;
  }
  EXPECT_EQ(parse_handoff_signal("stream-value", "x"), HandoffSignal::kStreamValue);
  EXPECT_THROW(parse_handoff_signal("flag", "comm.handoff_signal"), Error);
}

// A sender that finishes while the receiver has not taken its last hand-off waits for the
// credit within the deadline and then fails naming it, never hangs.
TEST(StageHandoffProtocol, AMissingCreditEndsInAnErrorNamingIt) {
  World w;
  FakeDevice device(w);
  test::InProcHub hub;
  test::InProcTransport a(hub, 0), b(hub, 1);
  std::unique_ptr<CudaIpcReceiver> r;
  std::thread rx([&] {
    std::byte x_dev[kBytes];
    r = CudaIpcReceiver::connect({&b.link(0), 1, 0, kBytes, true, {}, x_dev},
                                 Deadline::after(std::chrono::seconds(20)), nullptr);
  });
  auto s = CudaIpcSender::connect({&a.link(1), 0, 0, kBytes, true, {}}, Deadline::after(std::chrono::seconds(20)),
                                  nullptr);
  rx.join();
  std::vector<std::byte> src(kBytes);
  s->send(src.data(), kBytes, nullptr, Deadline::after(std::chrono::seconds(5)));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    s->finish(nullptr, Deadline::after(std::chrono::milliseconds(300)));
    ADD_FAILURE() << "finish() returned without the receiver's credit";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("credit of hand-off 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_TRUE(w.violations.empty());
}

}  // namespace
