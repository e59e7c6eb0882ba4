// Token-safe execution (SiPipe §5.2): two versions of every input buffer, so the CPU
// executor prepares iteration i+1 while the forward of iteration i reads the other version.
//
// Two indicators govern who may proceed: CI, the last iteration the CPU executor prepared,
// and GI, the last iteration the forward executor took. Both start at -1.
//  * The CPU executor may prepare when CI == GI (every prepared input was taken); it writes
//    version (CI+1) mod 2 and then publishes, CI += 1.
//  * The forward executor may start when CI > GI; it increments GI at once (so the CPU may
//    start the next preparation while this forward runs) and reads version GI mod 2.
// The CPU is thus at most one iteration ahead and never writes the version being read: a
// write-after-read hazard cannot happen. A GPU build binds version v of the buffers to one
// captured CUDA graph per (v, batch size), as the paper does; nothing here assumes a CPU.
//
// Threading: exactly one CPU-executor thread and one forward-executor thread. Waits use a
// condition variable (on small machines the executors share cores with the ranks), or with
// set_spin(true) poll and yield for up to 20 ms first (run.host_waits: a GPU rank with cores
// to spare wakes within a microsecond; an idle one then blocks); either way they end with
// kTimeout naming `what` when the deadline passes.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "trellis/core/clock.hpp"
#include "trellis/core/error.hpp"

namespace trellis::runtime {

template <typename Buffers>
class TokenSafe {
 public:
  explicit TokenSafe(std::string what) : what_(std::move(what)) {}
  void set_spin(bool spin) { spin_ = spin; }  // before the executors start

  // CPU executor: waits until CI == GI, returns the version to fill for iteration CI+1.
  Buffers& cpu_acquire(Deadline deadline) {
    std::unique_lock lock(mu_);
    wait(lock, deadline, [&] { return ci_ == gi_ || closed_; }, "the forward to take the prepared input");
    return version_[static_cast<std::size_t>((ci_ + 1) & 1)];
  }
  // CPU executor: the version from cpu_acquire() is ready.
  void cpu_publish() {
    {
      std::lock_guard lock(mu_);
      ++ci_;
    }
    cv_.notify_all();
  }
  // CPU executor: no more iterations; the forward executor's next acquire returns nullptr.
  void close() {
    {
      std::lock_guard lock(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }
  // Forward executor: waits until CI > GI, takes the next iteration (GI += 1) and returns its
  // version (valid until the next forward_acquire), or nullptr once closed and drained.
  const Buffers* forward_acquire(Deadline deadline) {
    std::unique_lock lock(mu_);
    wait(lock, deadline, [&] { return ci_ > gi_ || closed_; }, "the CPU executor to prepare the next input");
    if (ci_ <= gi_) return nullptr;
    ++gi_;
    const Buffers* b = &version_[static_cast<std::size_t>(gi_ & 1)];
    lock.unlock();
    cv_.notify_all();
    return b;
  }
  // Forward executor: whether forward_acquire() would return at once.
  bool forward_ready() const {
    std::lock_guard lock(mu_);
    return ci_ > gi_ || closed_;
  }
  std::int64_t ci() const {
    std::lock_guard lock(mu_);
    return ci_;
  }
  std::int64_t gi() const {
    std::lock_guard lock(mu_);
    return gi_;
  }
  // Direct access for setup (preallocating both versions) before the executors start.
  Buffers& version(int v) { return version_[static_cast<std::size_t>(v & 1)]; }

 private:
  template <typename Pred>
  void wait(std::unique_lock<std::mutex>& lock, Deadline deadline, Pred pred, const char* for_what) {
    if (spin_) {
      // Up to 20 ms (a decode step's wait); a longer one (an idle server) blocks below.
      const auto spin_until = Clock::now() + std::chrono::milliseconds(20);
      for (unsigned polls = 1; !pred(); ++polls) {
        if ((polls & 63) == 0) {
          if (deadline.expired()) timed_out(for_what);
          if (Clock::now() >= spin_until) break;
        }
        lock.unlock();
        std::this_thread::yield();
        lock.lock();
      }
      if (pred()) return;
    }
    if (deadline.is_never()) {
      cv_.wait(lock, pred);
    } else if (!cv_.wait_until(lock, deadline.at(), pred)) {
      timed_out(for_what);
    }
  }
  [[noreturn]] void timed_out(const char* for_what) {
    // Rank-scoped: a starved executor is a symptom; the wait on the peer names the cause.
    throw_scoped(ErrorScope::kRank, ErrorCode::kTimeout, "{}: timed out waiting for {} (CI {}, GI {})", what_, for_what,
                 ci_, gi_);
  }

  std::string what_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::array<Buffers, 2> version_{};
  std::int64_t ci_ = -1, gi_ = -1;
  bool closed_ = false;
  bool spin_ = false;
};

}  // namespace trellis::runtime
