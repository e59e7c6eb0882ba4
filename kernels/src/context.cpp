#include "trellis/kernels/context.hpp"

#include <cblas.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "cuda/cuda_ops.hpp"
#include "trellis/core/error.hpp"

namespace trellis::kernels {

namespace {

// The CPUs this process may run on (taskset, cgroups, a launcher's or trellis's binding):
// more kernel threads than that only take turns on the same cores.
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// Tells the core this is a spin-wait (x86 `pause`: the sibling hyperthread gets the
// pipeline, and leaving the loop does not flush it).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace

template <class Pred>
bool ThreadPool::spin_until(Pred pred) const {
  if (spin_us_ <= 0) return pred();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
  for (;;) {
    // Reading the clock costs ~20 ns; every 32 pauses (~1 µs on current cores) is often enough.
    for (int i = 0; i < 32; ++i) {
      if (pred()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return pred();
  }
}

ThreadPool::ThreadPool(int threads, int spin_us) {
  const int cpus = usable_cpus();
  if (threads <= 0) threads = cpus;
  size_ = threads;
  spin_us_ = spin_us < 0 ? kDefaultSpinUs : spin_us;
  if (threads == 1 || threads > cpus) spin_us_ = 0;
  workers_.reserve(static_cast<std::size_t>(threads - 1));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks(std::unique_lock<std::mutex>& lock) {
  // The job pointer is read under the lock together with the claim, and the caller cannot
  // return before every claimed chunk finished, so `job` stays valid while it runs.
  while (job_ != nullptr && next_chunk_ < chunks_) {
    const auto* job = job_;
    std::int64_t c = next_chunk_++;
    ++in_flight_;
    lock.unlock();
    std::exception_ptr err;
    try {
      (*job)(c);
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    if (err && !error_) error_ = err;
    // The release half publishes the chunk's results to a caller that sees 0 while spinning.
    if (in_flight_.fetch_sub(1, std::memory_order_acq_rel) == 1 && next_chunk_ >= chunks_) done_.notify_all();
  }
}

void ThreadPool::worker() {
  std::uint64_t seen = 0;
  std::unique_lock lock(mu_);
  for (;;) {
    auto changed = [&] {
      return stop_.load(std::memory_order_relaxed) || generation_.load(std::memory_order_acquire) != seen;
    };
    if (!changed()) {
      lock.unlock();
      spin_until(changed);
      lock.lock();
      wake_.wait(lock, changed);
    }
    if (stop_) return;
    seen = generation_.load();
    run_chunks(lock);
  }
}

void ThreadPool::run_on_threads(int count, const std::function<void(int, int)>& fn) {
  count = std::clamp(count, 1, size_);
  parallel_for(count, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) fn(static_cast<int>(i), count);
  });
}

void ThreadPool::parallel_for(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& fn,
                              std::int64_t grain) {
  if (n <= 0) return;
  grain = std::max<std::int64_t>(grain, 1);
  // Up to 4 chunks per thread: enough to even out a late or slow thread, few enough that
  // each chunk still amortises its claim (a lock) and any per-chunk setup (GEMM packing).
  std::int64_t chunks = std::min<std::int64_t>(std::int64_t{size_} * 4, (n + grain - 1) / grain);
  if (chunks <= 1 || size_ == 1) {
    fn(0, n);
    return;
  }
  const std::function<void(std::int64_t)> run_chunk = [&](std::int64_t c) {
    std::int64_t begin = n * c / chunks, end = n * (c + 1) / chunks;
    if (begin < end) fn(begin, end);
  };
  std::unique_lock lock(mu_);
  job_ = &run_chunk;
  chunks_ = chunks;
  next_chunk_ = 0;
  in_flight_ = 0;
  error_ = nullptr;
  generation_.fetch_add(1, std::memory_order_release);
  wake_.notify_all();  // cheap when every worker is spinning rather than waiting
  run_chunks(lock);
  auto finished = [&] { return in_flight_.load(std::memory_order_acquire) == 0; };
  if (!finished()) {
    lock.unlock();
    spin_until(finished);
    lock.lock();
    done_.wait(lock, finished);
  }
  job_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

Context::Context(int threads, int spin_us) : pool_(std::make_unique<ThreadPool>(threads, spin_us)) {
  // Our pool and OpenBLAS's never run at the same time (ops are synchronous), so give
  // OpenBLAS the same number of threads rather than oversubscribing the cores.
  openblas_set_num_threads(pool_->size());
}

Context::Context(Device device, int index) {
  if (device == Device::kCpu) {
    *this = Context(index);
    return;
  }
  device_ = device;
  gpu_ = index;
  pool_ = std::make_unique<ThreadPool>(1);  // host-side work of a GPU rank is light
  cuda_.reset(cuda::create_state(index));
}

Context::~Context() = default;
Context::Context(Context&&) noexcept = default;
Context& Context::operator=(Context&&) noexcept = default;

void Context::CudaStateDeleter::operator()(CudaState* s) const noexcept { cuda::destroy_state(s); }

void Context::synchronize() const {
  if (cuda_) cuda::synchronize(*cuda_);
}

void* Context::cuda_stream() const { return cuda_ ? cuda::stream_of(*cuda_) : nullptr; }

CudaState& Context::cuda_state() const {
  if (!cuda_) throw_error(ErrorCode::kInternal, "cuda_state() called on a {} context", to_string(device_));
  return *cuda_;
}

void Context::check_device(const char* op, const TensorView& v) const {
  if (v.device != device_)
    throw_error(ErrorCode::kInvalidArgument, "{}: {} is on {} but the context runs on {}", op, v.describe(),
                to_string(v.device), to_string(device_));
}

}  // namespace trellis::kernels
