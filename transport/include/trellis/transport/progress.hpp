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
// Cooperative progress (poll()): the owner's thread can also test the outstanding requests
// from inside its own compute, e.g. from the kernels' progress hook between GEMM blocks
// (kernels/progress_hook.hpp), at most every `cooperative_interval`. That is how MPI
// libraries make progress on CPUs whose cores all compute: a background thread there gets a
// core only when the scheduler preempts the compute for it, while the compute loop itself
// reaches a poll every few tens of microseconds. With cooperative on and the thread off,
// drive() still wraps the request (so poll() knows it) but starts no thread.
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

#include "trellis/core/config.hpp"
#include "trellis/transport/request.hpp"

namespace trellis::transport {

// Defaults as the settings comm.progress_thread / _interval_us / _cooperative / _cooperative_us.
// Measured (docs/variants.md): on cores that all compute, cooperative progress hides as much
// of ladder's all-reduces as the thread or more, and the thread's wakes cost small-batch
// decode steps 0.07-0.5 ms; `enabled = false, cooperative = true` is the better choice there.
struct ProgressOptions {
  bool enabled = true;                        // the background thread (false: none started)
  std::chrono::microseconds interval{20};     // its sleep between tests while work is outstanding
  bool cooperative = true;                    // poll() tests the outstanding requests
  std::chrono::microseconds cooperative_interval{100};  // poll() tests at most this often

  // From the settings comm.progress_thread, comm.progress_interval_us,
  // comm.progress_cooperative and comm.progress_cooperative_us.
  static ProgressOptions from_config(const Config& config);
};

class ProgressThread {
 public:
  explicit ProgressThread(ProgressOptions options = {});
  ~ProgressThread();
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

  // Starts driving `r` (in the background and/or through poll()) and returns the request the
  // owner tests or waits on instead. Errors thrown by r->test() on the progress thread or in
  // poll() are rethrown by the returned request's test(). Neither thread nor cooperative:
  // returns r.
  RequestPtr drive(RequestPtr r);

  // Cooperative progress, on the owner's thread only: when `cooperative` is set, something is
  // outstanding and `cooperative_interval` has passed since the last poll that tested, tests
  // every outstanding request that the background thread is not testing at this moment.
  // Otherwise returns after one atomic load (and a clock read while work is outstanding).
  // Never throws (errors are kept for the owner's test()); noexcept so that the kernels'
  // progress hook can call it from inside an op.
  void poll() noexcept;
  // Trampoline for kernels::ScopedProgressHook: `arg` is the ProgressThread.
  static void poll_hook(void* arg) noexcept { static_cast<ProgressThread*>(arg)->poll(); }

  const ProgressOptions& options() const { return opts_; }
  // Tests the progress thread made (for tests and reports).
  std::uint64_t background_tests() const;
  // Tests poll() made (owner's thread).
  std::uint64_t cooperative_tests() const { return coop_tests_; }

  struct Item;  // shared by the thread and the returned request

 private:
  void loop();

  ProgressOptions opts_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Item>> items_;
  std::uint64_t background_tests_ = 0;
  bool stop_ = false;
  // poll(): requests driven and not yet seen complete, as the owner counts them (drive()
  // adds, poll() subtracts); when the next poll may test; tests made.
  std::vector<std::shared_ptr<Item>> owned_;
  std::chrono::steady_clock::time_point next_poll_{};
  std::uint64_t coop_tests_ = 0;
  std::thread thread_;  // started on the first drive()
};

}  // namespace trellis::transport
