// The wait loop of Request::wait and of the collectives' wait_stepped: core/poll.hpp's
// spin-yield-sleep policy, with the spin phase adapted per thread to how this rank's cores
// are shared.
//
// Why: a spinning waiter is the fastest when the peer it waits for runs on another core
// (no system call between arrival and detection), and the slowest when the peer needs this
// core (every spin is time the peer cannot run). Which case holds depends on the machine's
// load and the scheduler, and changes during a job. The yields tell them apart: a
// sched_yield that comes back only after kContendedYield means another task ran on this
// core meanwhile (the peer or someone else that wants it), so the next waits spin less
// (down to kMinSpins); a wait that ended while yielding, with every yield returning at
// once, would have ended sooner spinning, so the next waits spin more (up to
// policy.spins). Thread-local, so each thread learns its own situation.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>
#include <type_traits>

#include "trellis/core/clock.hpp"
#include "trellis/core/error.hpp"
#include "trellis/core/poll.hpp"

namespace trellis::transport::detail {

inline constexpr unsigned kMinSpins = 32;
inline constexpr auto kContendedYield = std::chrono::microseconds(3);

// Bumped by a link backend whenever its progress moved data (a ring record, bytes on a
// socket, a UCX event). A wait that sees it change starts its policy over, as it does for a
// change of steps(): a long transfer that is moving never reaches the sleeping phase.
// Why: a 64 MiB UCX-over-TCP message needs thousands of progress calls; after
// policy.yields polls the wait slept 50 us between them and the message took 140-170 ms
// instead of the 24-38 ms that polling without pause (and ucx_perftest) gets.
inline std::uint64_t& progress_marks() {
  thread_local std::uint64_t marks = 0;
  return marks;
}
inline void note_progress() { ++progress_marks(); }

// The current spin budget of this thread (polls before yielding); 0 = not yet set.
inline unsigned& spin_budget() {
  thread_local unsigned budget = 0;
  return budget;
}

// Polls done() until true; restarts the policy whenever steps() or progress_marks()
// changes (a long operation that makes progress never reaches the sleeping phase). Throws
// kTimeout naming what() (a string or a callable returning one) when the deadline passes.
template <typename Done, typename Steps, typename What>
void adaptive_wait(Done&& done, Steps&& steps, Deadline deadline, What&& what, const PollPolicy& policy) {
  const unsigned max_spins = std::max(policy.spins, 1u);
  const unsigned min_spins = std::min(kMinSpins, max_spins);
  unsigned& budget = spin_budget();
  if (budget == 0 || budget > max_spins) budget = max_spins;
  auto start = Clock::now();
  auto last = steps();
  auto last_mark = progress_marks();
  bool yielded = false, contended = false;
  for (unsigned long spin = 0;; ++spin) {
    if (done()) break;
    if (auto now_steps = steps(); now_steps != last) {
      last = now_steps;
      spin = 0;
    } else if (progress_marks() != last_mark) {
      last_mark = progress_marks();
      spin = 0;
    }
    if ((spin & 63) == 0 && deadline.expired()) throw_wait_timeout(what, start);
    if (spin > policy.yields) {
      std::this_thread::sleep_for(policy.sleep);
    } else if (spin > budget) {
      auto t0 = Clock::now();
      std::this_thread::yield();
      yielded = true;
      if (Clock::now() - t0 > kContendedYield) contended = true;
    }
  }
  if (contended) {
    budget = std::max(min_spins, budget / 2);
  } else if (yielded) {
    budget = std::min(max_spins, budget * 2);
  }
}

}  // namespace trellis::transport::detail
