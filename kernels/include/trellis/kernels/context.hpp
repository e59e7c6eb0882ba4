// Execution context for ops: which device runs them and, on the CPU, the worker threads.
//
// Every op takes a `const Context&` first. A Context is used by one calling thread at a time
// (ops are not re-entrant on the same Context); create one per rank (or per thread that runs
// ops). On the CPU it owns a small thread pool; ops split their work over it and the calling
// thread takes part, so `threads == 1` runs everything inline with no extra threads.
//
// OpenBLAS keeps its own global thread count: a CPU Context sets it to the same number when
// constructed (openblas_set_num_threads), so the last Context made wins.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "trellis/kernels/tensor.hpp"

namespace trellis::kernels {

// A fixed set of worker threads running one parallel_for at a time.
class ThreadPool {
 public:
  // threads <= 0: all cores (std::thread::hardware_concurrency()). The caller counts as one
  // of the threads, so threads - 1 workers are started.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return size_; }

  // Runs fn(begin, end) over [0, n) split into at most size() contiguous chunks of at least
  // `grain` items each, one per thread; returns when all are done. An exception thrown by
  // any chunk is rethrown here (the first one). n <= grain runs inline on the caller.
  void parallel_for(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& fn,
                    std::int64_t grain = 1);

  // Runs fn(thread_index, thread_count) once on each of `count` threads (count <= size()).
  void run_on_threads(int count, const std::function<void(int, int)>& fn);

 private:
  void worker(int index);

  int size_ = 1;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  std::uint64_t generation_ = 0;
  int active_ = 0;   // threads taking part in the current job (including the caller)
  int pending_ = 0;  // workers of the current job not yet finished
  bool stop_ = false;
  const std::function<void(int, int)>* job_ = nullptr;
  std::exception_ptr error_;
};

class Context {
 public:
  // A CPU context with `threads` threads (<= 0: all cores).
  explicit Context(int threads = 0);
  static Context cpu(int threads = 0) { return Context(threads); }

  Device device() const { return device_; }
  int threads() const { return pool_->size(); }
  ThreadPool& pool() const { return *pool_; }

  // Throws kInvalidArgument naming `op` and the view when a view's device is not this
  // context's device.
  void check_device(const char* op, const TensorView& v) const;

 private:
  Device device_ = Device::kCpu;
  std::unique_ptr<ThreadPool> pool_;
};

}  // namespace trellis::kernels
