// STREAM-style triad, and the read-only stream that weight-streaming decode faces. Each thread
// touches (first-touch page placement) and then streams its own slice, so the measurement sees
// every thread's memory path at once.
#include "trellis/kernels/bandwidth.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "trellis/core/clock.hpp"
#include "trellis/core/error.hpp"
#include "trellis/kernels/host_arena.hpp"

namespace trellis::kernels {
Triad::Triad(const Context& ctx, std::size_t array_bytes) : ctx_(ctx), threads_(ctx.threads()) {
  if (array_bytes < (std::size_t{1} << 20))
    throw_error(ErrorCode::kInvalidArgument, "triad: array size {} B is below 1 MiB", array_bytes);
  per_thread_ = array_bytes / sizeof(double) / static_cast<std::size_t>(threads_);
  const std::size_t n = per_thread_ * static_cast<std::size_t>(threads_);
  // The same kind of pages as the weights a decode streams (Context::huge_pages).
  HostArena arena({.huge_pages = ctx.huge_pages()});
  for (auto& m : mem_) m = arena.allocate(n * sizeof(double));
  a_ = reinterpret_cast<double*>(mem_[0].get());
  b_ = reinterpret_cast<double*>(mem_[1].get());
  c_ = reinterpret_cast<double*>(mem_[2].get());
  ctx_.pool().run_on_threads(threads_, [&](int t, int) {
    std::size_t lo = per_thread_ * static_cast<std::size_t>(t), hi = lo + per_thread_;
    for (std::size_t i = lo; i < hi; ++i) {
      a_[i] = 0.0;
      b_[i] = 1.0;
      c_[i] = 2.0;
    }
  });
}

double Triad::run() {
  double* pa = a_;
  const double* pb = b_;
  const double* pc = c_;
  const double s = 3.0;
  double t0 = now_seconds();
  ctx_.pool().run_on_threads(threads_, [&](int t, int) {
    std::size_t lo = per_thread_ * static_cast<std::size_t>(t), hi = lo + per_thread_;
    for (std::size_t i = lo; i < hi; ++i) pa[i] = pb[i] + s * pc[i];
  });
  double dt = now_seconds() - t0;
  const std::size_t n = per_thread_ * static_cast<std::size_t>(threads_);
  for (std::size_t i = 0; i < n; i += 4099)
    if (pa[i] != 7.0) throw_error(ErrorCode::kInternal, "triad: element {} is {} instead of 7", i, pa[i]);
  return 3.0 * static_cast<double>(array_bytes()) / dt;
}

namespace {

// Sum of n 64-bit words with 8 independent accumulators (enough loads in flight for the
// memory system; the compiler vectorises the adds at whatever width it targets).
std::uint64_t sum_words(const std::uint64_t* __restrict p, std::size_t n) {
  std::uint64_t acc[8] = {};
  for (std::size_t i = 0; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += p[i + static_cast<std::size_t>(k)];
  std::uint64_t s = 0;
  for (auto a : acc) s += a;
  return s;
}

}  // namespace

TriadResult measure_read(const Context& ctx, std::size_t buffer_bytes, int reps) {
  if (reps < 1) throw_error(ErrorCode::kInvalidArgument, "measure_read: reps must be >= 1 (got {})", reps);
  if (buffer_bytes < (std::size_t{1} << 20))
    throw_error(ErrorCode::kInvalidArgument, "measure_read: buffer size {} B is below 1 MiB", buffer_bytes);
  const int threads = ctx.threads();
  const std::size_t per_thread = buffer_bytes / static_cast<std::size_t>(threads) / 64 * 8;  // words, whole lines
  const std::size_t n = per_thread * static_cast<std::size_t>(threads);
  // The same kind of pages as the weights a decode streams (Context::huge_pages).
  HostArena arena({.huge_pages = ctx.huge_pages()});
  const std::shared_ptr<std::byte> mem = arena.allocate(n * sizeof(std::uint64_t));
  auto* buf = reinterpret_cast<std::uint64_t*>(mem.get());
  std::vector<std::uint64_t> partial(static_cast<std::size_t>(threads));
  TriadResult r;
  {
    // First touch on the thread that will read the slice (its NUMA node).
    ctx.pool().run_on_threads(threads, [&](int t, int) {
      const std::size_t lo = per_thread * static_cast<std::size_t>(t);
      for (std::size_t i = lo; i < lo + per_thread; ++i) buf[i] = i;
    });
    const std::uint64_t expected = n % 2 == 0 ? (n / 2) * (n - 1) : n * ((n - 1) / 2);  // sum of 0..n-1, mod 2^64
    auto pass = [&] {
      const double t0 = now_seconds();
      ctx.pool().run_on_threads(threads, [&](int t, int) {
        partial[static_cast<std::size_t>(t)] = sum_words(buf + per_thread * static_cast<std::size_t>(t), per_thread);
      });
      const double dt = now_seconds() - t0;
      std::uint64_t s = 0;
      for (auto v : partial) s += v;
      if (s != expected) throw_error(ErrorCode::kInternal, "measure_read: the buffer sums to {} instead of {}", s, expected);
      return static_cast<double>(n * sizeof(std::uint64_t)) / dt;
    };
    pass();  // warm-up
    r.array_bytes = n * sizeof(std::uint64_t);
    r.threads = threads;
    r.reps = reps;
    for (int i = 0; i < reps; ++i) r.samples.push_back(pass());
  }
  std::vector<double> sorted = r.samples;
  std::sort(sorted.begin(), sorted.end());
  r.median_bytes_per_s = sorted[sorted.size() / 2];
  r.best_bytes_per_s = sorted.back();
  return r;
}

TriadResult measure_triad(const Context& ctx, std::size_t array_bytes, int reps) {
  if (reps < 1) throw_error(ErrorCode::kInvalidArgument, "measure_triad: reps must be >= 1 (got {})", reps);
  Triad triad(ctx, array_bytes);
  triad.run();  // warm-up
  TriadResult r;
  r.array_bytes = triad.array_bytes();
  r.threads = ctx.threads();
  r.reps = reps;
  for (int i = 0; i < reps; ++i) r.samples.push_back(triad.run());
  std::vector<double> sorted = r.samples;
  std::sort(sorted.begin(), sorted.end());
  r.median_bytes_per_s = sorted[sorted.size() / 2];
  r.best_bytes_per_s = sorted.back();
  return r;
}

}  // namespace trellis::kernels
