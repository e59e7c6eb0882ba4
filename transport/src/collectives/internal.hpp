// Shared pieces of the collective algorithms: the reduction kernel, the asynchronous Group
// interface the composite algorithms (hierarchical) build on, and sequences of requests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trellis/core/clock.hpp"
#include "trellis/transport/collectives.hpp"
#include "trellis/transport/group.hpp"
#include "trellis/transport/request.hpp"

namespace trellis::transport::detail {

// dst[i] = srcs[0][i] + srcs[1][i] + ... (in that order), accumulated in f32; bf16 inputs and
// output are bf16 bits, rounded once. When dst2 is given, the result is written there too
// (the shm reduce-scatter publishes its chunk and keeps it in one pass; the window all-reduce
// writes both members' regions). dst and dst2 may each be one of the sources, at the same
// index: every element is read from all sources before it is written.
void sum_into(DType dtype, const void* const* srcs, int nsrc, void* dst, std::size_t count,
              void* dst2 = nullptr);

// A Group whose every operation also exists in a non-blocking form, so that composite
// algorithms can chain them into one request.
// A request that counts the steps it made, so that a waiter can tell a wait that is making
// progress (a multi-piece all-reduce) from one that idles (a peer that does not come).
class SteppedRequest : public Request {
 public:
  virtual std::uint64_t steps_done() const = 0;
  // Blocks the calling thread until test() may be able to move (a peer published something
  // or failed) or `max` passed, and returns true; false (at once) when this request cannot
  // block, so the waiter yields and sleeps instead. wait_stepped calls it once spinning and
  // yielding did not end the wait.
  virtual bool park(Clock::duration /*max*/) { return false; }
};

// Waits for `r` like Request::wait, but restarts the spin-then-yield-then-sleep policy
// whenever the request made a step: a long operation never falls into the sleeping phase
// between its pieces, while an idle wait still leaves the cores to others.
void wait_stepped(Request& r, Deadline deadline, const PollPolicy& policy);

class AsyncGroup : public Group {
 public:
  virtual RequestPtr broadcast_async(void* data, std::size_t bytes, int root) = 0;
  virtual RequestPtr all_gather_async(const void* in, void* out, std::size_t bytes) = 0;

  void broadcast(void* data, std::size_t bytes, int root) override {
    wait_stepped(*broadcast_async(data, bytes, root), Deadline::after(deadline()), wait_policy());
  }
  void all_gather(const void* in, void* out, std::size_t bytes) override {
    wait_stepped(*all_gather_async(in, out, bytes), Deadline::after(deadline()), wait_policy());
  }
  void all_reduce(void* data, std::size_t count, DType dtype) override {
    wait_stepped(*all_reduce_async(data, count, dtype), Deadline::after(deadline()), wait_policy());
  }
  virtual Millis deadline() const = 0;
  virtual const PollPolicy& wait_policy() const = 0;
};

// Runs phases one after another: each phase is started (called) once the previous request
// completed and returns the request of that phase (nullptr: nothing to wait for). `finish`
// runs once after the last phase.
using Phase = std::function<RequestPtr()>;
RequestPtr make_sequence(std::vector<Phase> phases, std::function<void()> finish, std::string what,
                         std::size_t bytes);

// "ranks 0 1 2" for messages.
std::string list_ranks(const std::vector<int>& ranks);

}  // namespace trellis::transport::detail
