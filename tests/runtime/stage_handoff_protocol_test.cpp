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
  std::vector<std::string> violations;
  void fail(std::string what) { violations.push_back(std::move(what)); }
};
World* g_world = nullptr;

class FakeTarget final : public detail::IpcTarget {
 public:
  std::vector<std::byte> export_handles() const override { return std::vector<std::byte>(detail::kIpcExportBytes); }
  std::size_t bytes() const override { return kBytes; }
  void arrived(void*) override {
    std::lock_guard lock(g_world->mu);
    World& w = *g_world;
    if (w.puts != w.arrived + 1)
      w.fail("arrived for hand-off " + std::to_string(w.arrived) + " after " + std::to_string(w.puts) + " copies");
    ++w.arrived;
  }
  void consumed(void*) override {
    std::lock_guard lock(g_world->mu);
    World& w = *g_world;
    if (w.consumed + 1 != w.arrived)
      w.fail("consumed recorded " + std::to_string(w.consumed + 1) + " times after " + std::to_string(w.arrived) +
             " arrivals");
    ++w.consumed;
  }
};

class FakePeer final : public detail::IpcPeerTarget {
 public:
  void put(bool first, const void* src, std::size_t bytes, void*) override {
    std::lock_guard lock(g_world->mu);
    World& w = *g_world;
    const int n = w.puts;
    if (first != (n == 0)) w.fail("hand-off " + std::to_string(n) + ": first=" + std::to_string(first));
    // The stream wait on "consumed" captures the latest record: it must be hand-off n-1's.
    if (n > 0 && w.consumed != n)
      w.fail("copy of hand-off " + std::to_string(n) + " with " + std::to_string(w.consumed) + " consumed records");
    if (w.arrived > w.consumed) w.fail("copy of hand-off " + std::to_string(n) + " while x is in use");
    if (bytes > kBytes) w.fail("copy of " + std::to_string(bytes) + " bytes");
    std::memcpy(w.x.data(), src, std::min(bytes, kBytes));
    ++w.puts;
  }
};

std::unique_ptr<detail::IpcTarget> make_fake(int, void* dst, std::size_t) {
  if (!dst) throw std::runtime_error("no destination");
  return std::make_unique<FakeTarget>();
}
std::unique_ptr<detail::IpcPeerTarget> open_fake(int, std::span<const std::byte>, std::size_t) {
  return std::make_unique<FakePeer>();
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
    detail::ipc_device() = detail::IpcDevice{make_fake, open_fake, sync_fake};
  }
  ~FakeDevice() {
    detail::ipc_device() = saved;
    g_world = nullptr;
  }
};

void jitter(std::mt19937& rng) {
  if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
}

TEST(StageHandoffProtocol, NoCopyOverwritesAnXInUseAndEveryArrivalSeesItsBytes) {
  World w;
  FakeDevice device(w);
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
      auto r = CudaIpcReceiver::connect({&b.link(0), 1, 0, kBytes, true, {}, x_dev}, deadline, nullptr);
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
    auto s = CudaIpcSender::connect({&a.link(1), 0, 0, kBytes, true, {}}, deadline, nullptr);
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
