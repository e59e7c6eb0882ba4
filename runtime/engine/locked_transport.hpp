// A Transport decorator that lets several engine threads share one set of links: every call
// into the backend (isend, irecv, test, progress) takes one mutex. Nothing blocks while it is
// held — waits poll test() — so a thread waiting for one message never stalls another. Some
// backends (the shm link's single-producer rings) are not safe for two threads on one link;
// this makes them so at the cost of an uncontended lock per call.
//
// It also paces the engine's progress thread: the thread needs to run often only while a
// send is in flight (a sender may be busy elsewhere while its bytes still need driving), so
// the decorator keeps the posted sends it has not yet seen complete (sweep_sends()) and lets
// the thread sleep until the next post (wait_for_post()) when there are none.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "trellis/transport/link.hpp"

namespace trellis::runtime::detail {

class LockedTransport;
class LockedRequest;

class LockedLink final : public transport::Link {
 public:
  LockedLink(transport::Link& inner, LockedTransport& owner) : inner_(inner), owner_(owner) {}
  int peer() const override { return inner_.peer(); }
  transport::Backend backend() const override { return inner_.backend(); }
  transport::RequestPtr isend(std::span<const std::byte> data, std::uint32_t tag) override;
  transport::RequestPtr irecv(std::span<std::byte> data, std::uint32_t tag) override;

 private:
  transport::Link& inner_;
  LockedTransport& owner_;
};

class LockedTransport final : public transport::Transport {
 public:
  explicit LockedTransport(transport::Transport& inner) : inner_(inner) {}
  ~LockedTransport() override;
  transport::Backend backend() const override { return inner_.backend(); }
  transport::Capabilities capabilities() const override { return inner_.capabilities(); }
  transport::Link& link(int peer) override;
  void progress() override {
    std::lock_guard lock(mu_);
    inner_.progress();
  }

  // Tests every send posted through this transport that nobody has seen complete yet and
  // returns how many are still in flight. Thread-safe.
  std::size_t sweep_sends();
  // How many sends and receives have been posted so far. Thread-safe.
  std::uint64_t post_count();
  // Returns once post_count() differs from `seen`, or after `timeout`. Thread-safe.
  void wait_for_post(std::uint64_t seen, std::chrono::microseconds timeout);

  std::mutex& mutex() { return mu_; }
  transport::Transport& inner() { return inner_; }

 private:
  friend class LockedLink;
  friend class LockedRequest;
  void posted();

  transport::Transport& inner_;
  std::mutex mu_;
  std::map<int, std::unique_ptr<LockedLink>> links_;
  std::vector<LockedRequest*> sends_;  // guarded by mu_: in flight as far as we know
  std::mutex post_mu_;
  std::condition_variable post_cv_;
  std::uint64_t posts_ = 0;  // guarded by post_mu_
};

}  // namespace trellis::runtime::detail
