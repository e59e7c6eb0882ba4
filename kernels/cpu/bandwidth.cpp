// STREAM-style triad. Each thread touches (first-touch page placement) and then streams its
// own slice of the three arrays, so the measurement sees every thread's memory path at once.
#include "trellis/kernels/bandwidth.hpp"

#include <algorithm>
#include <cstdlib>

#include "trellis/core/clock.hpp"
#include "trellis/core/error.hpp"

namespace trellis::kernels {
namespace {

double* alloc_doubles(std::size_t n) {
  auto* p = static_cast<double*>(std::aligned_alloc(64, (n * sizeof(double) + 63) / 64 * 64));
  if (!p) throw_error(ErrorCode::kResourceExhausted, "triad: cannot allocate {} bytes", n * sizeof(double));
  return p;
}

}  // namespace

Triad::Triad(const Context& ctx, std::size_t array_bytes) : ctx_(ctx), threads_(ctx.threads()) {
  if (array_bytes < (std::size_t{1} << 20))
    throw_error(ErrorCode::kInvalidArgument, "triad: array size {} B is below 1 MiB", array_bytes);
  per_thread_ = array_bytes / sizeof(double) / static_cast<std::size_t>(threads_);
  const std::size_t n = per_thread_ * static_cast<std::size_t>(threads_);
  try {
    a_ = alloc_doubles(n);
    b_ = alloc_doubles(n);
    c_ = alloc_doubles(n);
  } catch (...) {
    std::free(a_);
    std::free(b_);
    throw;
  }
  ctx_.pool().run_on_threads(threads_, [&](int t, int) {
    std::size_t lo = per_thread_ * static_cast<std::size_t>(t), hi = lo + per_thread_;
    for (std::size_t i = lo; i < hi; ++i) {
      a_[i] = 0.0;
      b_[i] = 1.0;
      c_[i] = 2.0;
    }
  });
}

Triad::~Triad() {
  std::free(a_);
  std::free(b_);
  std::free(c_);
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
