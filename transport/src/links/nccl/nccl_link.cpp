// The nccl backend (CUDA builds only): GPU buffers between ranks over NVLink, PCIe or the
// network, through one NCCL communicator over the world.
//
// NCCL has no tags and matches point-to-point operations in issue order per peer, with
// equal counts on both sides. So on this link: a receive's buffer must be exactly the size
// of the matching send, and tags are carried only for error messages. NCCL also needs
// matching sends and receives to be launched together, or two ranks that both send first
// deadlock: operations queue up here and are launched as one ncclGroupStart/End batch when
// any request is tested (or progress() runs).
//
// Failure: the communicator is created non-blocking and polled against the connect
// deadline; an asynchronous NCCL error (a peer died, a network error) fails every request
// with kPeerFailed; a wait past its deadline throws kTimeout like every other backend.
//
// Status: compiled in CI; NOT RUN on this project's machines (no GPU). See README.md.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <map>

#include "src/links/common.hpp"

namespace trellis::transport::links {
namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw_error(ErrorCode::kIo, "CUDA {} failed: {}", what, cudaGetErrorString(e));
}

struct Batch {
  cudaEvent_t done = nullptr;
  bool launched = false;
  Batch() = default;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  ~Batch() {
    if (done) cudaEventDestroy(done);
  }
};

struct PendingOp {
  OpInfo info;
  void* data;
  std::shared_ptr<Batch> batch;
};

class NcclTransport;

class NcclRequest final : public LinkRequest {
 public:
  NcclRequest(const OpInfo& info, NcclTransport& t, std::shared_ptr<Batch> batch)
      : LinkRequest(info), transport_(t), batch_(std::move(batch)) {}
  bool test() override;

 private:
  NcclTransport& transport_;
  std::shared_ptr<Batch> batch_;
};

class NcclLink final : public PeerLink {
 public:
  NcclLink(NcclTransport& t, int peer) : PeerLink(Backend::kNccl, peer), transport_(t) {}
  RequestPtr isend(std::span<const std::byte> data, std::uint32_t tag) override;
  RequestPtr irecv(std::span<std::byte> data, std::uint32_t tag) override;

 private:
  NcclTransport& transport_;
};

class NcclTransport final : public TransportOf<NcclLink> {
 public:
  NcclTransport(ncclComm_t comm, cudaStream_t stream) : TransportOf(Backend::kNccl), comm_(comm), stream_(stream) {}
  ~NcclTransport() override {
    // A communicator with work still queued cannot be finalised politely; abort it.
    if (failed_ != ncclSuccess) ncclCommAbort(comm_);
    else ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }
  void add(int peer) { links_.emplace(peer, std::make_unique<NcclLink>(*this, peer)); }

  Capabilities capabilities() const override { return {true, false, false, 0}; }
  void progress() override { launch(); }
  std::string describe() const override { return fmt::format("nccl ({} peers)", links_.size()); }

  std::shared_ptr<Batch> enqueue(const OpInfo& info, void* data) {
    if (!open_ || open_->launched) open_ = std::make_shared<Batch>();
    pending_.push_back({info, data, open_});
    return open_;
  }

  // Launches every queued operation as one group, then records the batch's event.
  void launch() {
    if (pending_.empty()) return;
    auto batch = pending_.front().batch;
    ncclGroupStart();
    for (const auto& op : pending_) {
      ncclResult_t r = op.info.kind == OpKind::kSend
                           ? ncclSend(op.data, op.info.bytes, ncclUint8, op.info.peer, comm_, stream_)
                           : ncclRecv(op.data, op.info.bytes, ncclUint8, op.info.peer, comm_, stream_);
      if (r != ncclSuccess) {
        ncclGroupEnd();
        fail(r, op.info);
      }
    }
    ncclResult_t r = ncclGroupEnd();
    if (r != ncclSuccess && r != ncclInProgress) fail(r, pending_.front().info);
    check_cuda(cudaEventCreateWithFlags(&batch->done, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(batch->done, stream_), "cudaEventRecord");
    batch->launched = true;
    pending_.clear();
  }

  // Throws when NCCL reported an asynchronous error (a peer or the network failed).
  void check_async(const OpInfo& info) {
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm_, &async);
    if (async != ncclSuccess && async != ncclInProgress) fail(async, info);
  }

  [[noreturn]] void fail(ncclResult_t r, const OpInfo& info) {
    failed_ = r;
    throw_scoped(ErrorScope::kLink, ErrorCode::kPeerFailed, "{}: NCCL error: {} ({})", describe_op(info),
                 ncclGetErrorString(r), ncclGetLastError(comm_));
  }

 private:
  ncclComm_t comm_;
  cudaStream_t stream_;
  std::vector<PendingOp> pending_;
  std::shared_ptr<Batch> open_;
  ncclResult_t failed_ = ncclSuccess;
};

bool NcclRequest::test() {
  if (!batch_->launched) transport_.launch();
  cudaError_t e = cudaEventQuery(batch_->done);
  if (e == cudaErrorNotReady) {
    transport_.check_async(info_);
    return false;
  }
  check_cuda(e, "cudaEventQuery");
  done_bytes_ = info_.bytes;
  return true;
}

RequestPtr NcclLink::isend(std::span<const std::byte> data, std::uint32_t tag) {
  const OpInfo info = op_info(OpKind::kSend, tag, data.size());
  auto batch = transport_.enqueue(info, const_cast<std::byte*>(data.data()));
  return std::make_unique<NcclRequest>(info, transport_, std::move(batch));
}

RequestPtr NcclLink::irecv(std::span<std::byte> data, std::uint32_t tag) {
  const OpInfo info = op_info(OpKind::kRecv, tag, data.size());
  auto batch = transport_.enqueue(info, data.data());
  return std::make_unique<NcclRequest>(info, transport_, std::move(batch));
}

// GPUs of this host are shared by its ranks in rank order.
int local_index(Bootstrap& world, Deadline d) {
  auto hosts = allgather_strings(world, world.hostname(), d);
  int idx = 0;
  for (int r = 0; r < world.rank(); ++r) idx += hosts[r] == hosts[world.rank()];
  return idx;
}

}  // namespace

std::unique_ptr<Transport> connect_nccl(Bootstrap& world, const std::vector<int>& peers, const Config& config) {
  auto d = Deadline::after(LinkSettings::from(config).connect_timeout);
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  std::string why = e != cudaSuccess ? cudaGetErrorString(e) : devices == 0 ? "no GPU visible" : "";
  if (world.any(!why.empty(), d))
    throw_error(ErrorCode::kUnsupported, "the nccl link needs a GPU on every rank: {}",
                why.empty() ? "another rank has none" : fmt::format("rank {}: {}", world.rank(), why));
  check_cuda(cudaSetDevice(local_index(world, d) % devices), "cudaSetDevice");
  std::vector<std::byte> id(sizeof(ncclUniqueId));
  if (world.rank() == 0) {
    ncclUniqueId uid;
    if (ncclGetUniqueId(&uid) != ncclSuccess) throw_error(ErrorCode::kIo, "ncclGetUniqueId failed");
    std::memcpy(id.data(), &uid, sizeof uid);
  }
  world.broadcast(id, 0, d);
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), sizeof uid);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;  // so that a missing peer becomes a timeout here, not a hang
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, world.size(), uid, world.rank(), &cfg);
  if (r != ncclSuccess && r != ncclInProgress)
    throw_error(ErrorCode::kIo, "ncclCommInitRankConfig failed: {}", ncclGetErrorString(r));
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress) {
    ncclCommGetAsyncError(comm, &state);
    if (state == ncclInProgress && d.expired()) {
      ncclCommAbort(comm);
      throw_error(ErrorCode::kTimeout, "nccl communicator set-up on rank {}: peers did not join in time", world.rank());
    }
  }
  if (state != ncclSuccess) {
    ncclCommAbort(comm);
    throw_error(ErrorCode::kIo, "nccl communicator set-up failed: {}", ncclGetErrorString(state));
  }
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  auto t = std::make_unique<NcclTransport>(comm, stream);
  for (int p : peers) t->add(p);
  return t;
}

}  // namespace trellis::transport::links
