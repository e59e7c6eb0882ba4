// Blocking on a 32-bit word in memory shared between processes (Linux futex, not private:
// the word lives in a shm segment mapped by several processes at different addresses).
//
// Why: a rank of the shm group that waits for its peer's flag by spinning or yielding keeps
// competing for the core; when the peer it waits for shares that core (more ranks than
// cores, or a loaded host) the peer only gets its share of it, and each sched_yield can
// hand the core to a third process for a whole slice. A futex waiter leaves the run queue
// until the peer publishes, so the core goes to the peer.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <ctime>

namespace trellis::transport::detail {

static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t) &&
              std::atomic<std::uint32_t>::is_always_lock_free);

// Blocks while *word == expected, for at most `timeout`; returns on a wake, a timeout, a
// signal, or at once when the word already differs. The caller re-checks its condition.
inline void futex_wait_shared(std::atomic<std::uint32_t>* word, std::uint32_t expected,
                              std::chrono::nanoseconds timeout) {
  if (timeout <= std::chrono::nanoseconds::zero()) return;
  struct timespec ts;
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

// Wakes every process blocked on `word`.
inline void futex_wake_shared(std::atomic<std::uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace trellis::transport::detail
