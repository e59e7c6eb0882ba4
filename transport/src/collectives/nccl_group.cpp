// The NCCL Group (nccl_group.hpp), built when the build has CUDA and NCCL.
//
// Ordering: synchronous operations go on the caller's stream; the asynchronous all-reduce on
// a stream of the group's own, fenced by events both ways. NCCL serialises the operations of
// one communicator in issue order, so mixing the two streams keeps every member's sequence
// identical, which is all NCCL asks.
//
// Failure: the communicator is non-blocking (ncclConfig_t::blocking = 0). Then every call may
// answer ncclInProgress, and the next call may only be issued once ncclCommGetAsyncError says
// the last one was enqueued: enqueue() polls that against the deadline. Each collective also
// records an event; the watchdog thread (one per group) retires finished ones, and aborts the
// communicator when the oldest has been in flight longer than the deadline or NCCL reports an
// asynchronous error. ncclCommAbort may be called from another thread for exactly this: the
// kernels spinning on a dead peer return, so no stream and no host wait stays blocked.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "trellis/core/error.hpp"
#include "trellis/transport/bootstrap.hpp"
#include "trellis/transport/nccl_group.hpp"

namespace trellis::transport {
namespace {

using Clock = std::chrono::steady_clock;

void cuda_ok(cudaError_t e, const char* call, int gpu) {
  if (e != cudaSuccess) throw_error(ErrorCode::kIo, "CUDA call {} failed on GPU {}: {}", call, gpu, cudaGetErrorString(e));
}

ncclDataType_t nccl_type(DType t) { return t == DType::kBF16 ? ncclBfloat16 : ncclFloat32; }

std::string ranks_text(const std::vector<int>& members) {
  std::string s;
  for (int r : members) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

class NcclGroup final : public Group {
 public:
  NcclGroup(ncclComm_t comm, std::vector<int> members, int my_index, int gpu, cudaStream_t stream, Millis deadline)
      : comm_(comm), members_(std::move(members)), index_(my_index), gpu_(gpu), stream_(stream), deadline_(deadline) {
    cuda_ok(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", gpu_);
    cuda_ok(cudaMalloc(&one_, sizeof(float)), "cudaMalloc", gpu_);
    int v = 0;
    ncclGetVersion(&v);
    version_ = fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
    watchdog_ = std::thread([this] { watch(); });
  }
  ~NcclGroup() override {
    // Let the collectives in flight finish (or the watchdog abort them at their deadline)
    // before the communicator goes: ncclCommDestroy on queued work would block unbounded.
    for (;;) {
      std::unique_lock lk(mu_);
      if (in_flight_.empty() || !failure_.empty() || aborted_) break;
      lk.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    // Work still queued (an exception unwound past it) cannot be finalised politely. An
    // aborted communicator is already freed: aborting it again was a use after free (the
    // watchdog test crashed so on the H200, docs/gpu-runs/2026-11-27-h200-9).
    if (!in_flight_.empty()) abort_comm();
    else if (!aborted_) ncclCommDestroy(comm_);
    for (auto& f : in_flight_) cudaEventDestroy(f.event);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    cudaFree(one_);
    cudaStreamDestroy(side_);
  }

  int rank() const override { return index_; }
  int size() const override { return static_cast<int>(members_.size()); }
  const std::vector<int>& members() const override { return members_; }
  bool device_memory() const override { return true; }
  std::string describe() const override {
    return fmt::format("nccl {} (GPU memory, {} ranks on their own GPUs; this rank GPU {})", version_, members_.size(), gpu_);
  }

  void all_reduce(void* data, std::size_t count, DType dtype) override {
    enqueue("all-reduce", stream_, [&] { return ncclAllReduce(data, data, count, nccl_type(dtype), ncclSum, comm_, stream_); });
  }

  RequestPtr all_reduce_async(void* data, std::size_t count, DType dtype) override {
    cudaEvent_t ready = take_event();
    cuda_ok(cudaEventRecord(ready, stream_), "cudaEventRecord", gpu_);
    cuda_ok(cudaStreamWaitEvent(side_, ready, 0), "cudaStreamWaitEvent", gpu_);
    give_event(ready);  // a wait captured the record; the event can be recorded again
    enqueue("asynchronous all-reduce", side_,
            [&] { return ncclAllReduce(data, data, count, nccl_type(dtype), ncclSum, comm_, side_); });
    // The request's own event (the watchdog recycles the ones it tracks).
    cudaEvent_t done = nullptr;
    cuda_ok(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreateWithFlags", gpu_);
    cuda_ok(cudaEventRecord(done, side_), "cudaEventRecord", gpu_);
    return std::make_unique<Fence>(*this, done, count * dtype_size(dtype));
  }

  void broadcast(void* data, std::size_t bytes, int root) override {
    enqueue("broadcast", stream_, [&] { return ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_); });
  }
  void all_gather(const void* in, void* out, std::size_t bytes) override {
    enqueue("all-gather", stream_, [&] { return ncclAllGather(in, out, bytes, ncclUint8, comm_, stream_); });
  }
  void barrier() override {
    cuda_ok(cudaMemsetAsync(one_, 0, sizeof(float), stream_), "cudaMemsetAsync", gpu_);
    cudaEvent_t done = enqueue("barrier", stream_, [&] { return ncclAllReduce(one_, one_, 1, ncclFloat32, ncclSum, comm_, stream_); });
    const auto until = Clock::now() + deadline_;
    for (;;) {
      check_failed("barrier");
      std::lock_guard lk(mu_);
      bool pending = false;
      for (const auto& f : in_flight_) pending |= f.event == done;
      if (!pending) return;  // retired by the watchdog: finished
      if (Clock::now() > until) break;
      std::this_thread::yield();
    }
    fail_now(fmt::format("barrier did not finish within {} ms", deadline_.count()));
    check_failed("barrier");
  }

 private:
  struct InFlight {
    cudaEvent_t event;
    Clock::time_point since;
    std::uint64_t serial;
    const char* what;
  };

  // The asynchronous all-reduce's request: complete once the caller's stream waits for it.
  class Fence final : public Request {
   public:
    Fence(NcclGroup& g, cudaEvent_t done, std::size_t bytes) : g_(g), done_(done), bytes_(bytes) {}
    ~Fence() override { cudaEventDestroy(done_); }  // a recorded event may be destroyed: CUDA frees it once it completes
    Fence(const Fence&) = delete;
    Fence& operator=(const Fence&) = delete;
    bool test() override {
      if (!fenced_) {
        g_.check_failed("asynchronous all-reduce");
        cuda_ok(cudaStreamWaitEvent(g_.stream_, done_, 0), "cudaStreamWaitEvent", g_.gpu_);
        fenced_ = true;
      }
      return true;
    }
    std::size_t bytes() const override { return bytes_; }
    std::string describe() const override {
      return fmt::format("asynchronous NCCL all-reduce of {} bytes over ranks {}", bytes_, ranks_text(g_.members_));
    }

   private:
    NcclGroup& g_;
    cudaEvent_t done_;
    std::size_t bytes_;
    bool fenced_ = false;
  };

  cudaEvent_t take_event() {
    std::lock_guard lk(mu_);
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    cuda_ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags", gpu_);
    return e;
  }
  void give_event(cudaEvent_t e) {
    std::lock_guard lk(mu_);
    free_events_.push_back(e);
  }

  // Issues one NCCL call, waits (deadline-bounded) until the non-blocking communicator has
  // enqueued it, and hands an event recorded after it to the watchdog. Returns that event
  // (the watchdog recycles it once retired: only compare it to in_flight_ entries).
  template <typename Call>
  cudaEvent_t enqueue(const char* what, cudaStream_t stream, Call&& call) {
    check_failed(what);
    ncclResult_t r = call();
    const auto until = Clock::now() + deadline_;
    while (r == ncclInProgress) {
      if (Clock::now() > until) {
        fail_now(fmt::format("{}: NCCL did not enqueue it within {} ms", what, deadline_.count()));
        check_failed(what);
      }
      std::this_thread::yield();
      ncclCommGetAsyncError(comm_, &r);
    }
    if (r != ncclSuccess) {
      fail_now(fmt::format("{}: {} ({})", what, ncclGetErrorString(r), ncclGetLastError(comm_)));
      check_failed(what);
    }
    cudaEvent_t e = take_event();
    cuda_ok(cudaEventRecord(e, stream), "cudaEventRecord", gpu_);
    {
      std::lock_guard lk(mu_);
      in_flight_.push_back({e, Clock::now(), ++serial_, what});
    }
    return e;
  }

  // Throws the recorded failure, if any, naming the group and the call that found it.
  void check_failed(const char* what) {
    std::lock_guard lk(mu_);
    if (failure_.empty()) return;
    throw_scoped(ErrorScope::kLink, ErrorCode::kPeerFailed, "TP group of ranks {} (NCCL, GPU {}): {}; {} refused",
                 ranks_text(members_), gpu_, failure_, what);
  }
  void fail_now(std::string why) {
    {
      std::lock_guard lk(mu_);
      if (!failure_.empty()) return;
      failure_ = std::move(why);
    }
    abort_comm();
  }
  void abort_comm() {
    bool expected = false;
    if (aborted_.compare_exchange_strong(expected, true)) ncclCommAbort(comm_);
  }

  void watch() {
    cudaSetDevice(gpu_);
    std::unique_lock lk(mu_);
    while (!stop_) {
      while (!in_flight_.empty() && cudaEventQuery(in_flight_.front().event) == cudaSuccess) {
        free_events_.push_back(in_flight_.front().event);
        in_flight_.pop_front();
      }
      std::string why;
      if (failure_.empty() && !aborted_) {
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(comm_, &async);
        if (async != ncclSuccess && async != ncclInProgress)
          why = fmt::format("NCCL reported an asynchronous error: {} ({})", ncclGetErrorString(async), ncclGetLastError(comm_));
        else if (!in_flight_.empty() && Clock::now() - in_flight_.front().since > deadline_)
          why = fmt::format("{} #{} has not finished {} ms after it was enqueued (a member died or stopped calling)",
                            in_flight_.front().what, in_flight_.front().serial, deadline_.count());
      }
      if (!why.empty()) {
        failure_ = why;
        lk.unlock();
        abort_comm();
        lk.lock();
        continue;
      }
      cv_.wait_for(lk, std::chrono::milliseconds(2));
    }
  }

  ncclComm_t comm_;
  std::vector<int> members_;
  int index_, gpu_;
  cudaStream_t stream_, side_ = nullptr;
  Millis deadline_;
  float* one_ = nullptr;
  std::string version_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<InFlight> in_flight_;
  std::vector<cudaEvent_t> free_events_;
  std::uint64_t serial_ = 0;
  std::string failure_;
  std::atomic<bool> aborted_{false};
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace

bool nccl_group_built() { return true; }

std::unique_ptr<Group> make_nccl_group(Bootstrap& world, const std::vector<int>& members, int gpu, void* cuda_stream,
                                       Millis deadline, bool p2p_disable) {
  if (members.empty()) throw_error(ErrorCode::kInvalidArgument, "make_nccl_group: no members");
  const auto d = Deadline::after(deadline);
  int index = -1;
  for (std::size_t i = 0; i < members.size(); ++i)
    if (members[i] == world.rank()) index = static_cast<int>(i);
  // The unique id travels from the first member to everyone through the bootstrap.
  std::vector<std::byte> id(sizeof(ncclUniqueId));
  std::string why;
  if (world.rank() == members.front()) {
    ncclUniqueId uid;
    const ncclResult_t r = ncclGetUniqueId(&uid);
    if (r != ncclSuccess) why = fmt::format("rank {}: ncclGetUniqueId failed: {}", world.rank(), ncclGetErrorString(r));
    else std::memcpy(id.data(), &uid, sizeof uid);
  }
  if (world.any(!why.empty(), d))
    throw_error(ErrorCode::kIo, "NCCL TP group of ranks {}: {}", ranks_text(members),
                why.empty() ? std::string("the first member could not make NCCL's unique id") : why);
  world.broadcast(id, members.front(), d);
  if (index < 0) return nullptr;
  if (p2p_disable) setenv("NCCL_P2P_DISABLE", "1", 1);  // read by NCCL when the communicator is made
  cuda_ok(cudaSetDevice(gpu), "cudaSetDevice", gpu);
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), sizeof uid);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;  // so that a member that never joins is a timeout here, not a hang
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, static_cast<int>(members.size()), uid, index, &cfg);
  if (r != ncclSuccess && r != ncclInProgress)
    throw_error(ErrorCode::kIo, "NCCL TP group of ranks {}: ncclCommInitRankConfig on rank {} (GPU {}) failed: {} ({})",
                ranks_text(members), world.rank(), gpu, ncclGetErrorString(r), comm ? ncclGetLastError(comm) : "");
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) {
    ncclCommGetAsyncError(comm, &state);
    if (state == ncclInProgress && d.expired()) {
      ncclCommAbort(comm);
      throw_error(ErrorCode::kTimeout, "NCCL TP group of ranks {}: not every member joined within {} ms (rank {} waited)",
                  ranks_text(members), deadline.count(), world.rank());
    }
    if (state == ncclInProgress) std::this_thread::yield();
  }
  if (state != ncclSuccess) {
    const std::string last = ncclGetLastError(comm);
    ncclCommAbort(comm);
    throw_error(ErrorCode::kIo, "NCCL TP group of ranks {}: set-up on rank {} (GPU {}) failed: {} ({})", ranks_text(members),
                world.rank(), gpu, ncclGetErrorString(state), last);
  }
  return std::make_unique<NcclGroup>(comm, members, index, gpu, static_cast<cudaStream_t>(cuda_stream), deadline);
}

}  // namespace trellis::transport
