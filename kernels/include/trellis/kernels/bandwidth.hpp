// Memory bandwidth as STREAM's triad measures it: a[i] = b[i] + s * c[i] over three arrays of
// doubles much larger than the caches, split over the Context's threads, counting 3 * 8 bytes
// per element (reads of b and c, write of a; write-allocate traffic not counted, as STREAM).
// `trellis bench kernels` and `trellis bench model` use it as the roofline for memory-bound
// decode, measured in the same run as what they compare against it.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "trellis/kernels/context.hpp"

namespace trellis::kernels {

struct TriadResult {
  std::size_t array_bytes = 0;   // bytes per array
  int threads = 0;
  int reps = 0;
  double median_bytes_per_s = 0;  // median over reps
  double best_bytes_per_s = 0;    // fastest rep (STREAM reports this one)
  std::vector<double> samples;    // bytes/s of each rep
};

// Triad arrays kept allocated, for interleaving single passes with another measurement so
// both see the same machine state (a shared machine's load changes by the second).
// Construction allocates and first-touches 3 arrays of `array_bytes` (rounded down to whole
// doubles per thread; kInvalidArgument below 1 MiB) on the Context's threads; the Context
// must outlive the Triad. Not thread-safe.
class Triad {
 public:
  Triad(const Context& ctx, std::size_t array_bytes);
  Triad(const Triad&) = delete;
  Triad& operator=(const Triad&) = delete;

  // One pass a[i] = b[i] + 3 * c[i] on all threads; returns 3 * array_bytes() / seconds.
  // Throws kInternal if a sampled element is wrong afterwards.
  double run();
  std::size_t array_bytes() const { return per_thread_ * static_cast<std::size_t>(threads_) * sizeof(double); }

 private:
  const Context& ctx_;
  int threads_ = 1;
  std::size_t per_thread_ = 0;  // doubles per thread
  std::shared_ptr<std::byte> mem_[3];  // the arrays' memory (host_arena.hpp)
  double* a_ = nullptr;
  double* b_ = nullptr;
  double* c_ = nullptr;
};

// Runs `reps` timed triads (after one untimed warm-up pass that also faults the pages in)
// with arrays of `array_bytes` each (allocated here and freed on return). The result is
// checked: a wrong element throws kInternal. array_bytes is rounded down to a whole number of
// doubles per thread; throws kInvalidArgument below 1 MiB or for reps < 1.
TriadResult measure_triad(const Context& ctx, std::size_t array_bytes = std::size_t{256} << 20,
                          int reps = 10);

// The limit a weight-streaming decode faces: a read-only pass over one buffer of
// `buffer_bytes` (much larger than the caches), split over the Context's threads, counting
// buffer_bytes per pass. Triad also writes (and write-allocates) a third of its traffic, so
// it is not the ceiling of a kernel that only reads its weights; this is. Same threads and
// placement as the decode that runs on `ctx`. The sum of the buffer is checked after every
// pass (a wrong sum throws kInternal), so the reads cannot be optimised away. Rounded down to
// whole 64-byte lines per thread; kInvalidArgument below 1 MiB or for reps < 1. The result's
// array_bytes is the buffer's size.
TriadResult measure_read(const Context& ctx, std::size_t buffer_bytes = std::size_t{512} << 20, int reps = 10);

}  // namespace trellis::kernels
