// poll_until: the one busy-wait loop of trellis. Calls done() until it returns true or the
// deadline passes (then throws ErrorCode::kTimeout naming `what`). Spins first (lowest
// latency for short waits), then yields, then sleeps, so waiting ranks leave the cores to
// working ranks when there are more ranks than cores.
//
// Why the default spins only ~100 polls (about 1 us): when two ranks that talk share a
// core (more ranks than cores, or a loaded host), every poll the waiter spins is time the
// peer it waits for cannot run; 2000 spins made an in-host 8-byte round trip cost ~30 us
// instead of ~1 us on a loaded 2-core machine. A yield with nothing else runnable returns
// at once, so yielding early costs little on an idle host. Sleeping (which adds tens of
// microseconds) starts only after ~20000 polls, when the wait has clearly become idle.
// Callers with other needs pass their own policy (settings comm.wait_*, see
// transport::wait_policy).
#pragma once

#include <chrono>
#include <string_view>
#include <thread>
#include <type_traits>

#include "trellis/core/clock.hpp"
#include "trellis/core/error.hpp"

namespace trellis {

struct PollPolicy {
  unsigned spins = 100;     // polls before yielding between polls
  unsigned yields = 20000;  // polls (counted from the start) before sleeping between polls
  std::chrono::microseconds sleep{50};
};

// Throws kTimeout "<what>: no answer after N s" for a wait that began at `start`. `what` is
// a string or a callable returning one; a callable is called only here, when the wait has
// timed out, so hot paths need not format a description per wait. Shared by every wait loop.
template <typename What>
[[noreturn]] void throw_wait_timeout(What& what, Clock::time_point start) {
  double waited = std::chrono::duration<double>(Clock::now() - start).count();
  if constexpr (std::is_invocable_v<What&>) {
    throw_error(ErrorCode::kTimeout, "{}: no answer after {:.1f} s", what(), waited);
  } else {
    throw_error(ErrorCode::kTimeout, "{}: no answer after {:.1f} s", what, waited);
  }
}

// `what`: see throw_wait_timeout.
template <typename Done, typename What>
void poll_until(Done&& done, Deadline deadline, What&& what, PollPolicy policy = {}) {
  auto start = Clock::now();
  for (unsigned long spin = 0;; ++spin) {
    if (done()) return;
    if ((spin & 63) == 0 && deadline.expired()) throw_wait_timeout(what, start);
    if (spin > policy.yields) {
      std::this_thread::sleep_for(policy.sleep);
    } else if (spin > policy.spins) {
      std::this_thread::yield();
    }
  }
}

}  // namespace trellis
