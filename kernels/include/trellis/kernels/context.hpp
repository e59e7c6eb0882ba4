// Execution context for ops: which device runs them and, on the CPU, the worker threads; on
// a GPU, the CUDA stream, cuBLASLt handle and scratch memory the ops use.
//
// Every op takes a `const Context&` first. A Context is used by one calling thread at a time
// (ops are not re-entrant on the same Context); create one per rank (or per thread that runs
// ops). On the CPU it owns a small thread pool; ops split their work over it and the calling
// thread takes part, so `threads == 1` runs everything inline with no extra threads.
//
// CUDA (Context(Device::kCuda, gpu), built with -DTRELLIS_CUDA=ON/AUTO and a toolkit): ops on
// such a context take views of device memory (Device::kCuda: Tensor::empty/zeros on the
// GPU, or memory the caller allocated) and are *enqueued* on the context's stream: they
// return before the GPU has finished, in stream order with each other. Host arrays an op
// takes (tokens, positions, lengths, KV views) are copied before it returns, so the caller
// may reuse them at once. copy() to or from host memory, and synchronize(), wait for the
// stream. Errors of a CUDA or cuBLAS call throw trellis::Error naming the call, the error
// and the GPU; an asynchronous kernel fault surfaces at the next checked call.
//
// OpenBLAS keeps its own global thread count: a CPU Context sets it to the same number when
// constructed (openblas_set_num_threads), so the last Context made wins.
#pragma once

#include <atomic>
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
//
// Work is split into chunks that threads claim one at a time, the caller included, and the
// caller waits only for chunks already claimed. A worker that the OS has not scheduled yet
// (a loaded machine) therefore delays nothing: the threads that run take its chunks.
//
// Between jobs a worker spins for `spin_us` microseconds before it sleeps on a condition
// variable, and the caller spins as long for its last chunks: a decode step runs hundreds of
// short parallel_fors (tens of microseconds each), and waking a sleeping thread costs about
// as much as the work itself. Spinning is off when the pool has more threads than CPUs it may
// run on (a spinner would take the core from the thread it waits for).
class ThreadPool {
 public:
  // Default spin before sleeping: covers the gaps between the ops of one decode step, not the
  // gap between steps (kernels.spin_us).
  static constexpr int kDefaultSpinUs = 100;

  // threads <= 0: every CPU this process may run on (its affinity: taskset, cgroups, core
  // binding; else std::thread::hardware_concurrency()). The caller counts as one
  // of the threads, so threads - 1 workers are started. spin_us < 0 means the default.
  explicit ThreadPool(int threads = 0, int spin_us = -1);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return size_; }
  // The spin before sleeping actually used (0 when oversubscribed), in microseconds.
  int spin_us() const { return spin_us_; }

  // Runs fn(begin, end) over [0, n) split into contiguous chunks of at least `grain` items
  // (up to 4 per thread, for balance); returns when all are done. An exception thrown by any
  // chunk is rethrown here (the first one); the remaining chunks still run. One chunk (n <=
  // grain, or a single thread) runs inline on the caller.
  void parallel_for(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& fn,
                    std::int64_t grain = 1);

  // Runs fn(index, count) once for each index in [0, count) (count is clamped to size()),
  // spread over the threads that are free: normally one index per thread, but on a loaded
  // machine one thread may run several.
  void run_on_threads(int count, const std::function<void(int, int)>& fn);

 private:
  void worker();
  // Claims and runs chunks of the current job until none is left. Called with `lock` held;
  // returns with it held.
  void run_chunks(std::unique_lock<std::mutex>& lock);

  // Spins until pred() holds or spin_us_ has passed; true when pred() held.
  template <class Pred>
  bool spin_until(Pred pred) const;

  int size_ = 1;
  int spin_us_ = 0;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  // Written under mu_; atomic so that spinning threads can watch them without the lock.
  std::atomic<std::uint64_t> generation_{0};  // bumped per job, so idle workers notice a new one
  std::atomic<bool> stop_{false};
  std::atomic<int> in_flight_{0};  // chunks claimed and still running
  const std::function<void(std::int64_t)>* job_ = nullptr;  // runs one chunk by index
  std::int64_t chunks_ = 0;      // chunks in the current job
  std::int64_t next_chunk_ = 0;  // next chunk to claim
  std::exception_ptr error_;
};

// The CUDA backend's per-context state (stream, cuBLASLt handle, workspace, scratch); opaque
// outside kernels/cuda/.
struct CudaState;

class Context {
 public:
  // A CPU context with `threads` threads (<= 0: all cores); spin_us as ThreadPool's.
  explicit Context(int threads = 0, int spin_us = -1);
  // A context on `device`: Device::kCpu with `index` threads (as Context(index)), or
  // Device::kCuda on GPU `index` (an index among the GPUs this process sees), which it makes
  // the calling thread's current device. Throws kUnsupported naming the reason when the
  // CUDA backend is not built or there is no CUDA device (driver missing, no GPU), and
  // kInvalidArgument when `index` is not a visible GPU. A CUDA context's pool() has 1 thread.
  Context(Device device, int index);
  static Context cpu(int threads = 0) { return Context(threads); }
  static Context cuda(int gpu = 0) { return Context(Device::kCuda, gpu); }
  ~Context();
  Context(Context&&) noexcept;
  Context& operator=(Context&&) noexcept;

  Device device() const { return device_; }
  // The GPU index of a CUDA context; -1 on the CPU.
  int gpu() const { return gpu_; }
  int threads() const { return pool_->size(); }
  ThreadPool& pool() const { return *pool_; }
  // Waits until every op enqueued on this context has finished (no-op on the CPU); throws
  // if one of them failed on the GPU.
  void synchronize() const;
  // The cudaStream_t the ops run on, for callers that order their own GPU work (NCCL, CUDA
  // graphs) with them; nullptr on the CPU.
  void* cuda_stream() const;
  // The CUDA backend's state; only kernels/cuda/ uses it. Throws on a CPU context.
  CudaState& cuda_state() const;

  // Throws kInvalidArgument naming `op` and the view when a view's device is not this
  // context's device.
  void check_device(const char* op, const TensorView& v) const;

  // Batch invariance (CPU): every matmul row gets bit-for-bit the result it would get alone,
  // whatever the other rows of its batch — the small-M kernel's arithmetic for any M (in
  // chunks of 4 rows) instead of the GEMM's for M > 8. SWIFT needs it: a token verified in a
  // tree must get the logits plain decoding gives it. Off by default (the GEMM is faster
  // for long prefills). Block-quantised weights (WeightsFormat::kNative) are not covered.
  void set_batch_invariant(bool on) { batch_invariant_ = on; }
  bool batch_invariant() const { return batch_invariant_; }

  // Whether large long-lived host buffers made for this context (a model's weights, the
  // read-limit and triad buffers) ask the kernel for 2 MiB pages (host_arena.hpp; setting
  // kernels.huge_pages). On by default.
  void set_huge_pages(bool on) { huge_pages_ = on; }
  bool huge_pages() const { return huge_pages_; }

  // CUDA graphs (graph.hpp): the inputs a graph stages reach the device in one copy per
  // launch (the default), or false: one copy node per input, as before (setting
  // kernels.graph_one_copy, the ablation). Read when a graph is captured.
  void set_graph_one_copy(bool on) { graph_one_copy_ = on; }
  bool graph_one_copy() const { return graph_one_copy_; }

 private:
  struct CudaStateDeleter {
    void operator()(CudaState* s) const noexcept;
  };
  Device device_ = Device::kCpu;
  int gpu_ = -1;
  bool batch_invariant_ = false;
  bool huge_pages_ = true;
  bool graph_one_copy_ = true;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<CudaState, CudaStateDeleter> cuda_;
};

}  // namespace trellis::kernels
