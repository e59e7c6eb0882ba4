#include "locked_transport.hpp"

#include <algorithm>

namespace trellis::runtime::detail {

class LockedRequest final : public transport::Request {
 public:
  LockedRequest(transport::RequestPtr inner, LockedTransport& owner, bool send)
      : inner_(std::move(inner)), owner_(owner), send_(send) {}
  ~LockedRequest() override {
    std::lock_guard lock(owner_.mutex());
    if (send_ && !done_) forget();
    inner_.reset();
  }
  bool test() override {
    std::lock_guard lock(owner_.mutex());
    return test_locked();
  }
  // With owner_.mutex() held.
  bool test_locked() {
    if (done_) return true;
    done_ = inner_->test();
    if (done_ && send_) forget();
    return done_;
  }
  std::size_t bytes() const override { return inner_->bytes(); }
  std::string describe() const override { return inner_->describe(); }

 private:
  void forget() {
    auto& v = owner_.sends_;
    v.erase(std::remove(v.begin(), v.end(), this), v.end());
  }

  transport::RequestPtr inner_;
  LockedTransport& owner_;
  bool send_;
  bool done_ = false;
};

transport::RequestPtr LockedLink::isend(std::span<const std::byte> data, std::uint32_t tag) {
  std::unique_lock lock(owner_.mutex());
  auto r = std::make_unique<LockedRequest>(inner_.isend(data, tag), owner_, true);
  owner_.sends_.push_back(r.get());
  lock.unlock();
  owner_.posted();
  return r;
}

transport::RequestPtr LockedLink::irecv(std::span<std::byte> data, std::uint32_t tag) {
  std::unique_lock lock(owner_.mutex());
  auto r = std::make_unique<LockedRequest>(inner_.irecv(data, tag), owner_, false);
  lock.unlock();
  owner_.posted();
  return r;
}

LockedTransport::~LockedTransport() = default;

transport::Link& LockedTransport::link(int peer) {
  std::lock_guard lock(mu_);
  auto& l = links_[peer];
  if (!l) l = std::make_unique<LockedLink>(inner_.link(peer), *this);
  return *l;
}

std::size_t LockedTransport::sweep_sends() {
  std::lock_guard lock(mu_);
  // test_locked() removes completed sends from sends_, so walk a copy.
  auto snapshot = sends_;
  for (LockedRequest* r : snapshot) r->test_locked();
  return sends_.size();
}

void LockedTransport::posted() {
  {
    std::lock_guard g(post_mu_);
    ++posts_;
  }
  post_cv_.notify_one();
}

std::uint64_t LockedTransport::post_count() {
  std::lock_guard g(post_mu_);
  return posts_;
}

void LockedTransport::wait_for_post(std::uint64_t seen, std::chrono::microseconds timeout) {
  std::unique_lock g(post_mu_);
  post_cv_.wait_for(g, timeout, [&] { return posts_ != seen; });
}

}  // namespace trellis::runtime::detail
