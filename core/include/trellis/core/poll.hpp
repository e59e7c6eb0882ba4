// poll_until: the one busy-wait loop of trellis. Calls done() until it returns true or the
// deadline passes (then throws ErrorCode::kTimeout naming `what`). Spins first (lowest
// latency for short waits), then yields, then sleeps 50 us, so waiting ranks leave the
// cores to working ranks when there are more ranks than cores.
#pragma once

#include <chrono>
#include <string_view>
#include <thread>

#include "trellis/core/clock.hpp"
#include "trellis/core/error.hpp"

namespace trellis {

struct PollPolicy {
  unsigned spins = 2000;    // iterations before yielding
  unsigned yields = 20000;  // iterations before sleeping
  std::chrono::microseconds sleep{50};
};

template <typename Done, typename What>
void poll_until(Done&& done, Deadline deadline, What&& what, PollPolicy policy = {}) {
  auto start = Clock::now();
  for (unsigned long spin = 0;; ++spin) {
    if (done()) return;
    if ((spin & 63) == 0 && deadline.expired()) {
      throw_error(ErrorCode::kTimeout, "{}: no answer after {:.1f} s", what,
                  std::chrono::duration<double>(Clock::now() - start).count());
    }
    if (spin > policy.yields) {
      std::this_thread::sleep_for(policy.sleep);
    } else if (spin > policy.spins) {
      std::this_thread::yield();
    }
  }
}

}  // namespace trellis
