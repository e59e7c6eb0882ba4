// The engine's link decorator: it keeps the sends it has not seen complete, so that the
// progress thread passes often only while one is in flight, and wakes that thread on a post.
#include "locked_transport.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

namespace trellis::runtime::detail {
namespace {

// A request that completes when the test says so.
struct Switch {
  std::atomic<bool> done{false};
};

class FakeRequest final : public transport::Request {
 public:
  explicit FakeRequest(std::shared_ptr<Switch> s) : s_(std::move(s)) {}
  bool test() override { return s_->done.load(); }
  std::size_t bytes() const override { return 0; }
  std::string describe() const override { return "fake"; }

 private:
  std::shared_ptr<Switch> s_;
};

class FakeLink final : public transport::Link {
 public:
  int peer() const override { return 1; }
  transport::Backend backend() const override { return transport::Backend::kShm; }
  transport::RequestPtr isend(std::span<const std::byte>, std::uint32_t) override { return next(); }
  transport::RequestPtr irecv(std::span<std::byte>, std::uint32_t) override { return next(); }
  std::shared_ptr<Switch> last;

 private:
  transport::RequestPtr next() {
    last = std::make_shared<Switch>();
    return std::make_unique<FakeRequest>(last);
  }
};

class FakeTransport final : public transport::Transport {
 public:
  transport::Backend backend() const override { return transport::Backend::kShm; }
  transport::Capabilities capabilities() const override { return {}; }
  transport::Link& link(int) override { return link_; }
  void progress() override {}
  FakeLink link_;
};

TEST(LockedTransport, SweepCountsSendsInFlightOnly) {
  FakeTransport inner;
  LockedTransport lt(inner);
  std::byte buf[8]{};
  EXPECT_EQ(lt.sweep_sends(), 0u);
  auto recv = lt.link(1).irecv(buf, 1);
  EXPECT_EQ(lt.sweep_sends(), 0u) << "a receive alone must not keep the fast pace";
  auto send = lt.link(1).isend(buf, 1);
  auto send_switch = inner.link_.last;
  auto send2 = lt.link(1).isend(buf, 2);
  EXPECT_EQ(lt.sweep_sends(), 2u);
  // The sweep itself notices completion: nobody tests `send` here.
  send_switch->done = true;
  EXPECT_EQ(lt.sweep_sends(), 1u);
  EXPECT_TRUE(send->test());
  // A send dropped before completion is forgotten with it.
  send2.reset();
  EXPECT_EQ(lt.sweep_sends(), 0u);
}

TEST(LockedTransport, PostsWakeTheWaiter) {
  FakeTransport inner;
  LockedTransport lt(inner);
  std::byte buf[8]{};
  const auto seen = lt.post_count();
  auto r = lt.link(1).irecv(buf, 1);
  EXPECT_EQ(lt.post_count(), seen + 1);
  // Already moved on: returns without waiting for the (long) timeout.
  auto t0 = std::chrono::steady_clock::now();
  lt.wait_for_post(seen, std::chrono::seconds(30));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));

  const auto now_seen = lt.post_count();
  std::thread poster([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto s = lt.link(1).isend(buf, 3);
  });
  t0 = std::chrono::steady_clock::now();
  lt.wait_for_post(now_seen, std::chrono::seconds(30));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10)) << "a post did not wake the waiter";
  poster.join();
  EXPECT_EQ(lt.post_count(), now_seen + 1);
}

}  // namespace
}  // namespace trellis::runtime::detail
