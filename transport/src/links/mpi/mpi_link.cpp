// The mpi backend: MPI_Isend/MPI_Irecv on a private duplicate of MPI_COMM_WORLD, so link
// traffic never matches bootstrap or collective traffic. The fallback link: it works
// wherever mpirun does, and MPI picks its own wire (vader in a host, tcp/openib across).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>

#include "src/links/common.hpp"
#include "src/mpi_error.hpp"

namespace trellis::transport::links {
namespace {

[[noreturn]] void throw_mpi(int rc, const OpInfo& op) {
  int cls = 0;
  MPI_Error_class(rc, &cls);
  if (cls == MPI_ERR_TRUNCATE)
    throw_scoped(ErrorScope::kRequest, ErrorCode::kCorruptInput, "{}: rank {} sent more than the buffer holds",
                 describe_op(op), op.peer);
  throw_scoped(ErrorScope::kLink, ErrorCode::kPeerFailed, "{} failed: {}", describe_op(op), detail::mpi_error_text(rc));
}

class MpiRequest final : public LinkRequest {
 public:
  explicit MpiRequest(const OpInfo& info) : LinkRequest(info) {}
  ~MpiRequest() override {
    if (req_ == MPI_REQUEST_NULL) return;
    if (info_.kind == OpKind::kRecv) {
      // A late message must not land in a buffer its owner gave up on.
      MPI_Cancel(&req_);
      MPI_Wait(&req_, MPI_STATUS_IGNORE);
      return;
    }
    // Open MPI cannot cancel sends: give an eager/rendezvous send a moment, then let go.
    auto until = Clock::now() + std::chrono::milliseconds(200);
    int done = 0;
    while (!done && Clock::now() < until) MPI_Test(&req_, &done, MPI_STATUS_IGNORE);
    if (!done) MPI_Request_free(&req_);
  }
  MPI_Request* handle() { return &req_; }

  bool test() override {
    if (req_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    MPI_Status status;
    int rc = MPI_Test(&req_, &done, &status);
    if (rc != MPI_SUCCESS) throw_mpi(rc, info_);
    if (!done) return false;
    if (info_.kind == OpKind::kRecv) {
      int got = 0;
      MPI_Get_count(&status, MPI_BYTE, &got);
      done_bytes_ = static_cast<std::size_t>(got);
    } else {
      done_bytes_ = info_.bytes;
    }
    return true;
  }

 private:
  MPI_Request req_ = MPI_REQUEST_NULL;
};

class MpiLink final : public PeerLink {
 public:
  MpiLink(MPI_Comm comm, int peer, int tag_ub) : PeerLink(Backend::kMpi, peer), comm_(comm), tag_ub_(tag_ub) {}

  RequestPtr isend(std::span<const std::byte> data, std::uint32_t tag) override {
    const OpInfo info = op_info(OpKind::kSend, tag, data.size());
    auto r = std::make_unique<MpiRequest>(info);
    int rc = MPI_Isend(data.data(), count(data.size(), info), MPI_BYTE, peer_, check_tag(tag, info), comm_, r->handle());
    if (rc != MPI_SUCCESS) throw_mpi(rc, info);
    return r;
  }
  RequestPtr irecv(std::span<std::byte> data, std::uint32_t tag) override {
    const OpInfo info = op_info(OpKind::kRecv, tag, data.size());
    auto r = std::make_unique<MpiRequest>(info);
    int rc = MPI_Irecv(data.data(), count(data.size(), info), MPI_BYTE, peer_, check_tag(tag, info), comm_, r->handle());
    if (rc != MPI_SUCCESS) throw_mpi(rc, info);
    return r;
  }

 private:
  int check_tag(std::uint32_t tag, const OpInfo& info) const {
    if (tag > static_cast<std::uint32_t>(tag_ub_))
      throw_scoped(ErrorScope::kRequest, ErrorCode::kInvalidArgument, "{}: tag {} above MPI_TAG_UB {}",
                   describe_op(info), tag, tag_ub_);
    return static_cast<int>(tag);
  }
  static int count(std::size_t bytes, const OpInfo& info) {
    if (bytes > static_cast<std::size_t>(INT32_MAX))
      throw_scoped(ErrorScope::kRequest, ErrorCode::kInvalidArgument, "{}: MPI counts stop at 2 GiB", describe_op(info));
    return static_cast<int>(bytes);
  }

  MPI_Comm comm_;
  int tag_ub_;
};

class MpiTransport final : public TransportOf<MpiLink> {
 public:
  explicit MpiTransport(const std::vector<int>& peers) : TransportOf(Backend::kMpi) {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    int* ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    int tag_ub = flag ? *ub : 32767;
    for (int p : peers) links_.emplace(p, std::make_unique<MpiLink>(comm_, p, tag_ub));
  }
  ~MpiTransport() override { MPI_Comm_free(&comm_); }

  Capabilities capabilities() const override { return {false, false, false, std::size_t{INT32_MAX}}; }
  void progress() override {
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, MPI_STATUS_IGNORE);
  }
  std::string describe() const override { return fmt::format("mpi ({} peers)", links_.size()); }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

}  // namespace

std::unique_ptr<Transport> connect_mpi(Bootstrap& world, const std::vector<int>& peers, const Config& config) {
  if (!world.is_mpi())
    throw_error(ErrorCode::kUnsupported, "the mpi link needs a job started by mpirun (this world has no MPI)");
  // MPI_Comm_dup is collective over the world and cannot time out: a barrier with a
  // deadline first, so a rank that never arrives is an error here, not a hang there.
  world.barrier(Deadline::after(LinkSettings::from(config).connect_timeout));
  return std::make_unique<MpiTransport>(peers);
}

}  // namespace trellis::transport::links
