// Clocks and deadlines. Every blocking wait in trellis takes a Deadline, so nothing can
// hang forever: a wait that runs past it throws ErrorCode::kTimeout naming what it waited for.
#pragma once

#include <chrono>
#include <cstdint>

namespace trellis {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

// Seconds since an arbitrary fixed point, as a double; for measurements and traces.
inline double now_seconds() {
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

// Nanoseconds on the steady clock; for traces and fine timing.
inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

class Deadline {
 public:
  static Deadline after(Clock::duration d) { return Deadline(Clock::now() + d); }
  static Deadline after_ms(std::int64_t ms) { return after(Millis(ms)); }
  static Deadline never() { return Deadline(Clock::time_point::max()); }

  bool expired() const { return Clock::now() >= at_; }
  bool is_never() const { return at_ == Clock::time_point::max(); }
  Clock::time_point at() const { return at_; }
  // Time left, never negative.
  Clock::duration remaining() const {
    auto now = Clock::now();
    return now >= at_ ? Clock::duration::zero() : at_ - now;
  }
  double remaining_seconds() const { return std::chrono::duration<double>(remaining()).count(); }

 private:
  explicit Deadline(Clock::time_point at) : at_(at) {}
  Clock::time_point at_;
};

}  // namespace trellis
