// Request: a non-blocking operation in flight (a send, a receive, an asynchronous
// collective). The owner polls test() or blocks in wait() with a deadline.
//
// Ownership: the memory handed to the operation must stay valid until test() returned
// true or the request was destroyed. Destroying an incomplete request cancels it where the
// backend can, and otherwise waits briefly for it; either way the memory is released.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "trellis/core/clock.hpp"
#include "trellis/core/poll.hpp"

namespace trellis::transport {

class Request {
 public:
  virtual ~Request() = default;
  // Makes progress and returns true once complete. Throws trellis::Error (kLinkFailed,
  // kPeerFailed, kCorruptInput) naming the peer when the operation failed.
  virtual bool test() = 0;
  // Bytes moved: for a receive, the bytes that arrived.
  virtual std::size_t bytes() const = 0;
  // What this request is, for error messages: "receive of 4 KiB from rank 3 over ucx".
  virtual std::string describe() const = 0;

  // Polls test() until complete; throws ErrorCode::kTimeout with describe() in the
  // message when the deadline passes first. `policy` says how long to spin before yielding
  // and sleeping between polls (core/poll.hpp; wait_policy(config) reads the settings);
  // policy.spins is the most this thread spins: it spins less while its yields show that
  // its core is shared (src/wait.hpp).
  void wait(Deadline deadline, const PollPolicy& policy = {});
};

using RequestPtr = std::unique_ptr<Request>;

// A request that is already complete (zero-byte operations, self-sends).
RequestPtr make_completed_request(std::size_t bytes, std::string what);

}  // namespace trellis::transport
