// ProgressThread: drives asynchronous requests (an all-reduce of a Group, a send or receive
// of a Link) on a background thread while the owner's thread computes.
//
// Why: every Request progresses only when test() or wait() is called on it (request.hpp).
// Ladder Residual issues a module's all-reduce and then computes the next module; without a
// second thread, nothing moves between the first step the all-reduce posts and the wait at
// the end of the next module (multi-step ring all-reduces, rendezvous messages, the shm
// group's two-shot steps all stall). drive() hands the request to a thread that keeps
// testing it.
//
// Policy (the trade-off on machines with few cores): the thread never spins. With work it
// calls test() and then sleeps `interval` (std::this_thread::sleep_for: the core goes back to
// the compute threads between tests; each wake costs a few microseconds of a core, and a step
// of the collective can start up to `interval` late); with nothing outstanding it blocks on a
// condition variable. interval = 0 means yield() instead of sleeping (lowest latency, but a
// runnable thread competes with compute for the core).
//
// Ownership and threading: the returned request wraps the original; the wrapped request is
// tested by at most one thread at a time (a mutex guards it), so the Group's "one thread at
// a time" rule holds as long as the owner does not issue other operations on that Group
// before the request completed. The owner's test()/wait() also drive it directly (when the
// progress thread is not inside test() at that moment), so a waiting owner is never slower
// than without the thread. The ProgressThread must outlive the requests it returned.
// drive() and the returned requests' methods are called from the owner's thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "trellis/transport/request.hpp"

namespace trellis::transport {

struct ProgressOptions {
  bool enabled = true;                        // false: drive() returns the request unchanged
  std::chrono::microseconds interval{20};     // sleep between tests while work is outstanding
};

class ProgressThread {
 public:
  explicit ProgressThread(ProgressOptions options = {});
  ~ProgressThread();
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

  // Starts driving `r` in the background and returns the request the owner tests or waits
  // on instead. Errors thrown by r->test() on the progress thread are rethrown by the
  // returned request's test(). Disabled: returns r.
  RequestPtr drive(RequestPtr r);

  const ProgressOptions& options() const { return opts_; }
  // Tests the progress thread made (for tests and reports).
  std::uint64_t background_tests() const;

  struct Item;  // shared by the thread and the returned request

 private:
  void loop();

  ProgressOptions opts_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Item>> items_;
  std::uint64_t background_tests_ = 0;
  bool stop_ = false;
  std::thread thread_;  // started on the first drive()
};

}  // namespace trellis::transport
