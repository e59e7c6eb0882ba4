#include "trellis/kernels/context.hpp"

#include <cblas.h>
#include <sched.h>

#include <algorithm>
#include <utility>

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

}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = usable_cpus();
  size_ = threads;
  workers_.reserve(static_cast<std::size_t>(threads - 1));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
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
    if (--in_flight_ == 0 && next_chunk_ >= chunks_) done_.notify_all();
  }
}

void ThreadPool::worker() {
  std::uint64_t seen = 0;
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
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
  ++generation_;
  wake_.notify_all();
  run_chunks(lock);
  done_.wait(lock, [&] { return in_flight_ == 0; });
  job_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

Context::Context(int threads) : pool_(std::make_unique<ThreadPool>(threads)) {
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
