// MPI_Allreduce itself, blocking, as a Group: the peer `trellis bench comm` measures in the
// same run. Not for production use: MPI's blocking call has no deadline, which is why the
// fallback group (make_mpi_group) polls MPI_Iallreduce instead.
#include <mpi.h>

#include <algorithm>
#include <cstring>

#include "src/collectives/internal.hpp"
#include "trellis/core/error.hpp"
#include "trellis/transport/bootstrap.hpp"
#include "trellis/transport/dtype.hpp"

namespace trellis::transport {
namespace {

class MpiPeerGroup final : public Group {
 public:
  MpiPeerGroup(MPI_Comm comm, std::vector<int> members) : comm_(comm), members_(std::move(members)) {
    MPI_Comm_rank(comm_, &rank_);
  }
  ~MpiPeerGroup() override { MPI_Comm_free(&comm_); }
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  const std::vector<int>& members() const override { return members_; }
  std::string describe() const override { return "MPI_Allreduce"; }
  void all_reduce(void* data, std::size_t count, DType dtype) override {
    if (dtype == DType::kF32) {
      MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT, MPI_SUM, comm_);
      return;
    }
    wide_.resize(count);
    bf16_to_f32(static_cast<const std::uint16_t*>(data), wide_.data(), count);
    MPI_Allreduce(MPI_IN_PLACE, wide_.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, comm_);
    f32_to_bf16(wide_.data(), static_cast<std::uint16_t*>(data), count);
  }
  RequestPtr all_reduce_async(void* data, std::size_t count, DType dtype) override {
    all_reduce(data, count, dtype);
    return make_completed_request(count * dtype_size(dtype), "MPI_Allreduce (blocking)");
  }
  void broadcast(void* data, std::size_t bytes, int root) override {
    MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_);
  }
  void all_gather(const void* in, void* out, std::size_t bytes) override {
    MPI_Allgather(in, static_cast<int>(bytes), MPI_BYTE, out, static_cast<int>(bytes), MPI_BYTE, comm_);
  }
  void barrier() override { MPI_Barrier(comm_); }

 private:
  MPI_Comm comm_;
  std::vector<int> members_;
  int rank_ = 0;
  std::vector<float> wide_;
};

}  // namespace

std::unique_ptr<Group> make_mpi_peer_group(Bootstrap& world, const std::vector<int>& members) {
  if (!world.is_mpi()) throw_error(ErrorCode::kUnsupported, "MPI_Allreduce needs an MPI bootstrap");
  auto it = std::find(members.begin(), members.end(), world.rank());
  int color = it == members.end() ? MPI_UNDEFINED : members.front();
  int key = it == members.end() ? 0 : static_cast<int>(it - members.begin());
  MPI_Comm comm = MPI_COMM_NULL;
  if (MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm) != MPI_SUCCESS)
    throw_error(ErrorCode::kPeerFailed, "MPI_Comm_split for ranks {} failed", detail::list_ranks(members));
  if (comm == MPI_COMM_NULL) return nullptr;
  return std::make_unique<MpiPeerGroup>(comm, members);
}

}  // namespace trellis::transport
