#include "trellis/kernels/context.hpp"

#include <cblas.h>

#include <algorithm>

#include "trellis/core/error.hpp"

namespace trellis::kernels {

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  size_ = threads;
  workers_.reserve(static_cast<std::size_t>(threads - 1));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker(int index) {
  std::uint64_t seen = 0;
  for (;;) {
    const std::function<void(int, int)>* job = nullptr;
    int count = 0;
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= active_) continue;  // this job does not use this worker
      job = job_;
      count = active_;
    }
    std::exception_ptr err;
    try {
      (*job)(index, count);
    } catch (...) {
      err = std::current_exception();
    }
    std::lock_guard lock(mu_);
    if (err && !error_) error_ = err;
    if (--pending_ == 0) done_.notify_one();
  }
}

void ThreadPool::run_on_threads(int count, const std::function<void(int, int)>& fn) {
  count = std::clamp(count, 1, size_);
  if (count == 1) {
    fn(0, 1);
    return;
  }
  {
    std::lock_guard lock(mu_);
    job_ = &fn;
    active_ = count;
    pending_ = count - 1;
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  std::exception_ptr mine;
  try {
    fn(0, count);
  } catch (...) {
    mine = std::current_exception();
  }
  std::unique_lock lock(mu_);
  done_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  if (error_) std::rethrow_exception(error_);
}

void ThreadPool::parallel_for(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& fn,
                              std::int64_t grain) {
  if (n <= 0) return;
  grain = std::max<std::int64_t>(grain, 1);
  std::int64_t chunks = std::min<std::int64_t>(size_, (n + grain - 1) / grain);
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  run_on_threads(static_cast<int>(chunks), [&](int t, int count) {
    std::int64_t begin = n * t / count, end = n * (t + 1) / count;
    if (begin < end) fn(begin, end);
  });
}

Context::Context(int threads) : pool_(std::make_unique<ThreadPool>(threads)) {
  // Our pool and OpenBLAS's never run at the same time (ops are synchronous), so give
  // OpenBLAS the same number of threads rather than oversubscribing the cores.
  openblas_set_num_threads(pool_->size());
}

void Context::check_device(const char* op, const TensorView& v) const {
  if (v.device != device_)
    throw_error(ErrorCode::kInvalidArgument, "{}: {} is on {} but the context runs on {}", op, v.describe(),
                to_string(v.device), to_string(device_));
}

}  // namespace trellis::kernels
