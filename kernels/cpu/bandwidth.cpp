// STREAM-style triad. Each thread touches (first-touch page placement) and then streams its
// own slice of the three arrays, so the measurement sees every thread's memory path at once.
#include "trellis/kernels/bandwidth.hpp"

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "trellis/core/clock.hpp"
#include "trellis/core/error.hpp"

namespace trellis::kernels {
namespace {

struct FreeDeleter {
  void operator()(double* p) const { std::free(p); }
};

std::unique_ptr<double, FreeDeleter> alloc_doubles(std::size_t n) {
  auto* p = static_cast<double*>(std::aligned_alloc(64, (n * sizeof(double) + 63) / 64 * 64));
  if (!p) throw_error(ErrorCode::kResourceExhausted, "measure_triad: cannot allocate {} bytes", n * sizeof(double));
  return std::unique_ptr<double, FreeDeleter>(p);
}

}  // namespace

TriadResult measure_triad(const Context& ctx, std::size_t array_bytes, int reps) {
  if (array_bytes < (std::size_t{1} << 20))
    throw_error(ErrorCode::kInvalidArgument, "measure_triad: array size {} B is below 1 MiB", array_bytes);
  if (reps < 1) throw_error(ErrorCode::kInvalidArgument, "measure_triad: reps must be >= 1 (got {})", reps);
  const int threads = ctx.threads();
  const std::size_t per_thread = array_bytes / sizeof(double) / static_cast<std::size_t>(threads);
  const std::size_t n = per_thread * static_cast<std::size_t>(threads);
  auto a = alloc_doubles(n), b = alloc_doubles(n), c = alloc_doubles(n);
  double* pa = a.get();
  double* pb = b.get();
  double* pc = c.get();
  const double s = 3.0;
  ctx.pool().run_on_threads(threads, [&](int t, int) {
    std::size_t lo = per_thread * static_cast<std::size_t>(t), hi = lo + per_thread;
    for (std::size_t i = lo; i < hi; ++i) {
      pa[i] = 0.0;
      pb[i] = 1.0;
      pc[i] = 2.0;
    }
  });
  auto triad = [&](int t, int) {
    std::size_t lo = per_thread * static_cast<std::size_t>(t), hi = lo + per_thread;
    for (std::size_t i = lo; i < hi; ++i) pa[i] = pb[i] + s * pc[i];
  };
  ctx.pool().run_on_threads(threads, triad);  // warm-up
  TriadResult r;
  r.array_bytes = n * sizeof(double);
  r.threads = threads;
  r.reps = reps;
  for (int i = 0; i < reps; ++i) {
    double t0 = now_seconds();
    ctx.pool().run_on_threads(threads, triad);
    double dt = now_seconds() - t0;
    r.samples.push_back(3.0 * static_cast<double>(r.array_bytes) / dt);
  }
  for (std::size_t i = 0; i < n; i += 4099)
    if (pa[i] != 7.0) throw_error(ErrorCode::kInternal, "measure_triad: element {} is {} instead of 7", i, pa[i]);
  std::vector<double> sorted = r.samples;
  std::sort(sorted.begin(), sorted.end());
  r.median_bytes_per_s = sorted[sorted.size() / 2];
  r.best_bytes_per_s = sorted.back();
  return r;
}

}  // namespace trellis::kernels
