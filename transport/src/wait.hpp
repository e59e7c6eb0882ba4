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
//
// Waits that can block (adaptive_wait with a `park` callable: the shm collectives, whose
// peers publish through a futex word) stop yielding after kYieldsBeforePark yields or
// kYieldBeforePark of yielding and block until the state may have changed: a yielding waiter
// stays on the run queue, so a peer that shares its core gets only part of that core and a
// yield can hand the core to a third process for a whole slice; a blocked one leaves the
// core to whoever needs it until the peer wakes it. Not at the first contended yield: with
// 4 ranks on 2 cores that blocked on waits the next slice would have ended, and a woken rank
// waits to be scheduled (4-rank 64 KiB all-reduce 33 us instead of 20 us).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <utility>

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

inline constexpr unsigned kYieldsBeforePark = 64;
inline constexpr auto kYieldBeforePark = std::chrono::microseconds(500);
// The longest single block: a park also ends on this timeout so that the caller's liveness
// checks (a dead peer wakes nobody) and the deadline are seen within a few milliseconds.
inline constexpr auto kParkSlice = std::chrono::milliseconds(5);

// Blocks of this thread's parking waits (for tests: proves a wait did block).
inline std::uint64_t& park_count() {
  thread_local std::uint64_t parks = 0;
  return parks;
}

// Polls done() until true; restarts the policy whenever steps() or progress_marks()
// changes (a long operation that makes progress never reaches the sleeping phase). Throws
// kTimeout naming what() (a string or a callable returning one) when the deadline passes.
// park(max) blocks until the state done() reads may have changed or `max` passed and
// returns true, or returns false when this wait cannot block (it then yields and sleeps).
template <typename Done, typename Steps, typename Park, typename What>
void adaptive_wait(Done&& done, Steps&& steps, Park&& park, Deadline deadline, What&& what,
                   const PollPolicy& policy) {
  const unsigned max_spins = std::max(policy.spins, 1u);
  const unsigned min_spins = std::min(kMinSpins, max_spins);
  unsigned& budget = spin_budget();
  if (budget == 0 || budget > max_spins) budget = max_spins;
  auto start = Clock::now();
  auto last = steps();
  auto last_mark = progress_marks();
  bool yielded = false, contended = false, parking = false, parked = false, can_park = true;
  unsigned yields = 0;
  Clock::time_point first_yield{};
  for (unsigned long spin = 0;; ++spin) {
    if (done()) break;
    if (auto now_steps = steps(); now_steps != last) {
      last = now_steps;
      spin = 0;
      yields = 0;
      parking = false;
    } else if (progress_marks() != last_mark) {
      last_mark = progress_marks();
      spin = 0;
      yields = 0;
      parking = false;
    }
    if ((parking || (spin & 63) == 0) && deadline.expired()) throw_wait_timeout(what, start);
    if (parking) {
      if (park(std::min<Clock::duration>(kParkSlice, deadline.remaining()))) {
        ++park_count();
        parked = true;
        continue;
      }
      parking = can_park = false;  // this wait cannot block: yield and sleep as before
    }
    if (spin > policy.yields) {
      std::this_thread::sleep_for(policy.sleep);
    } else if (spin > budget) {
      auto t0 = Clock::now();
      if (yields == 0) first_yield = t0;
      std::this_thread::yield();
      yielded = true;
      auto t1 = Clock::now();
      contended = contended || t1 - t0 > kContendedYield;
      parking = can_park && (++yields > kYieldsBeforePark || t1 - first_yield > kYieldBeforePark);
    }
  }
  if (contended) {
    budget = std::max(min_spins, budget / 2);
  } else if (yielded && !parked) {
    budget = std::min(max_spins, budget * 2);
  }
}

// The same for waits that cannot block.
template <typename Done, typename Steps, typename What>
void adaptive_wait(Done&& done, Steps&& steps, Deadline deadline, What&& what, const PollPolicy& policy) {
  adaptive_wait(std::forward<Done>(done), std::forward<Steps>(steps), [](Clock::duration) { return false; }, deadline,
                std::forward<What>(what), policy);
}

}  // namespace trellis::transport::detail
