// A Transport decorator that lets several engine threads share one set of links: every call
// into the backend (isend, irecv, test, progress) takes one mutex. Nothing blocks while it is
// held — waits poll test() — so a thread waiting for one message never stalls another. Some
// backends (the shm link's single-producer rings) are not safe for two threads on one link;
// this makes them so at the cost of an uncontended lock per call.
#pragma once

#include <map>
#include <memory>
#include <mutex>

#include "trellis/transport/link.hpp"

namespace trellis::runtime::detail {

class LockedTransport;

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

  std::mutex& mutex() { return mu_; }
  transport::Transport& inner() { return inner_; }

 private:
  transport::Transport& inner_;
  std::mutex mu_;
  std::map<int, std::unique_ptr<LockedLink>> links_;
};

}  // namespace trellis::runtime::detail
