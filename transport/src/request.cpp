#include "trellis/transport/request.hpp"

#include "src/wait.hpp"

namespace trellis::transport {

void Request::wait(Deadline deadline, const PollPolicy& policy) {
  // describe() formats a string: only on the slow path (the timeout), not per wait.
  detail::adaptive_wait([this] { return test(); }, [] { return 0; }, deadline, [this] { return describe(); }, policy);
}

namespace {

class CompletedRequest final : public Request {
 public:
  CompletedRequest(std::size_t bytes, std::string what) : bytes_(bytes), what_(std::move(what)) {}
  bool test() override { return true; }
  std::size_t bytes() const override { return bytes_; }
  std::string describe() const override { return what_; }

 private:
  std::size_t bytes_;
  std::string what_;
};

}  // namespace

RequestPtr make_completed_request(std::size_t bytes, std::string what) {
  return std::make_unique<CompletedRequest>(bytes, std::move(what));
}

}  // namespace trellis::transport
