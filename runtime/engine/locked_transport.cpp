#include "locked_transport.hpp"

namespace trellis::runtime::detail {
namespace {

class LockedRequest final : public transport::Request {
 public:
  LockedRequest(transport::RequestPtr inner, LockedTransport& owner) : inner_(std::move(inner)), owner_(owner) {}
  ~LockedRequest() override {
    std::lock_guard lock(owner_.mutex());
    inner_.reset();
  }
  bool test() override {
    std::lock_guard lock(owner_.mutex());
    if (done_) return true;
    done_ = inner_->test();
    return done_;
  }
  std::size_t bytes() const override { return inner_->bytes(); }
  std::string describe() const override { return inner_->describe(); }

 private:
  transport::RequestPtr inner_;
  LockedTransport& owner_;
  bool done_ = false;
};

}  // namespace

transport::RequestPtr LockedLink::isend(std::span<const std::byte> data, std::uint32_t tag) {
  std::unique_lock lock(owner_.mutex());
  auto r = inner_.isend(data, tag);
  lock.unlock();
  return std::make_unique<LockedRequest>(std::move(r), owner_);
}

transport::RequestPtr LockedLink::irecv(std::span<std::byte> data, std::uint32_t tag) {
  std::unique_lock lock(owner_.mutex());
  auto r = inner_.irecv(data, tag);
  lock.unlock();
  return std::make_unique<LockedRequest>(std::move(r), owner_);
}

LockedTransport::~LockedTransport() = default;

transport::Link& LockedTransport::link(int peer) {
  std::lock_guard lock(mu_);
  auto& l = links_[peer];
  if (!l) l = std::make_unique<LockedLink>(inner_.link(peer), *this);
  return *l;
}

}  // namespace trellis::runtime::detail
