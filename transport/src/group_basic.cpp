// The MPI-backed Group (fallback and test reference) and the single-rank Group.
#include <mpi.h>

#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

#include "src/mpi_error.hpp"
#include "trellis/core/error.hpp"
#include "trellis/transport/bootstrap.hpp"
#include "trellis/transport/dtype.hpp"
#include "trellis/transport/group.hpp"

namespace trellis::transport {

std::size_t dtype_size(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

namespace {

using detail::check_mpi;

// An MPI_Iallreduce in flight. bf16 travels as f32 (MPI has no bf16 sum): widened into a
// scratch buffer, reduced, then rounded back once when the request completes.
class MpiAllReduceRequest final : public Request {
 public:
  MpiAllReduceRequest(MPI_Comm comm, void* data, std::size_t count, DType dtype, std::string what)
      : data_(data), count_(count), dtype_(dtype), what_(std::move(what)) {
    void* buf = data;
    if (dtype == DType::kBF16) {
      scratch_.resize(count);
      bf16_to_f32(static_cast<const std::uint16_t*>(data), scratch_.data(), count);
      buf = scratch_.data();
    }
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, buf, static_cast<int>(count), MPI_FLOAT, MPI_SUM, comm, &req_),
              "allreduce");
  }
  ~MpiAllReduceRequest() override {
    // MPI cannot cancel a collective; completing it keeps the buffers valid until MPI is done.
    if (req_ != MPI_REQUEST_NULL) MPI_Wait(&req_, MPI_STATUS_IGNORE);
  }
  bool test() override {
    if (req_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    check_mpi(MPI_Test(&req_, &done, MPI_STATUS_IGNORE), "allreduce");
    if (done && dtype_ == DType::kBF16) f32_to_bf16(scratch_.data(), static_cast<std::uint16_t*>(data_), count_);
    return done != 0;
  }
  std::size_t bytes() const override { return count_ * dtype_size(dtype_); }
  std::string describe() const override { return what_; }

 private:
  MPI_Request req_ = MPI_REQUEST_NULL;
  void* data_;
  std::size_t count_;
  DType dtype_;
  std::vector<float> scratch_;
  std::string what_;
};

class MpiGroup final : public Group {
 public:
  MpiGroup(MPI_Comm comm, std::vector<int> members, Millis deadline)
      : comm_(comm), members_(std::move(members)), deadline_(deadline) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiGroup() override { MPI_Comm_free(&comm_); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::vector<int>& members() const override { return members_; }
  std::string describe() const override { return "mpi"; }

  void all_reduce(void* data, std::size_t count, DType dtype) override {
    all_reduce_async(data, count, dtype)->wait(Deadline::after(deadline_));
  }
  RequestPtr all_reduce_async(void* data, std::size_t count, DType dtype) override {
    return std::make_unique<MpiAllReduceRequest>(comm_, data, count, dtype,
                                                 fmt::format("all-reduce of {} elements over {}", count, who()));
  }
  void broadcast(void* data, std::size_t bytes, int root) override {
    MPI_Request r;
    check_mpi(MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_, &r), "broadcast");
    wait(r, fmt::format("broadcast of {} bytes from group rank {} over {}", bytes, root, who()));
  }
  void all_gather(const void* in, void* out, std::size_t bytes) override {
    MPI_Request r;
    check_mpi(MPI_Iallgather(in, static_cast<int>(bytes), MPI_BYTE, out, static_cast<int>(bytes), MPI_BYTE, comm_, &r),
              "allgather");
    wait(r, fmt::format("all-gather of {} bytes per rank over {}", bytes, who()));
  }
  void barrier() override {
    MPI_Request r;
    check_mpi(MPI_Ibarrier(comm_, &r), "barrier");
    wait(r, fmt::format("barrier over {}", who()));
  }

 private:
  std::string who() const {
    std::string s = "ranks";
    for (int m : members_) s += " " + std::to_string(m);
    return s;
  }
  void wait(MPI_Request& r, const std::string& what) {
    auto dl = Deadline::after(deadline_);
    while (true) {
      int done = 0;
      check_mpi(MPI_Test(&r, &done, MPI_STATUS_IGNORE), what.c_str());
      if (done) return;
      if (dl.expired()) throw_error(ErrorCode::kTimeout, "{}: no answer within {} ms", what, deadline_.count());
    }
  }

  MPI_Comm comm_;
  std::vector<int> members_;
  Millis deadline_;
  int rank_ = 0, size_ = 1;
};

class SingleGroup final : public Group {
 public:
  explicit SingleGroup(int world_rank) : members_{world_rank} {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::vector<int>& members() const override { return members_; }
  std::string describe() const override { return "single"; }
  void all_reduce(void*, std::size_t, DType) override {}
  RequestPtr all_reduce_async(void*, std::size_t count, DType dtype) override {
    return make_completed_request(count * dtype_size(dtype), "all-reduce over one rank");
  }
  void broadcast(void*, std::size_t, int) override {}
  void all_gather(const void* in, void* out, std::size_t bytes) override { std::memcpy(out, in, bytes); }
  void barrier() override {}
  // Private memory: with one member there is nobody to share with, and callers need no
  // special case for t = 1.
  std::span<std::byte> allocate_window(std::size_t bytes) override {
    windows_.push_back(std::make_unique<std::byte[]>(bytes));  // value-initialised: zeroed
    return {windows_.back().get(), bytes};
  }

 private:
  std::vector<int> members_;
  std::vector<std::unique_ptr<std::byte[]>> windows_;
};

}  // namespace

std::unique_ptr<Group> make_mpi_group(Bootstrap& world, const std::vector<int>& members, Millis deadline) {
  if (!world.is_mpi() && world.size() > 1)
    throw_error(ErrorCode::kUnsupported, "an MPI group needs an MPI bootstrap");
  int me = world.rank();
  int color = MPI_UNDEFINED, key = 0;
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (members[i] < 0 || members[i] >= world.size())
      throw_error(ErrorCode::kInvalidArgument, "group member {} is not a rank of a world of {}", members[i], world.size());
    if (members[i] == me) {
      color = members.front();  // groups are identified by their first member
      key = static_cast<int>(i);
    }
  }
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    if (color == MPI_UNDEFINED) return nullptr;
    return make_single_group(me);
  }
  MPI_Comm comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm), "comm split");
  if (comm == MPI_COMM_NULL) return nullptr;
  return std::make_unique<MpiGroup>(comm, members, deadline);
}

std::unique_ptr<Group> make_single_group(int world_rank) { return std::make_unique<SingleGroup>(world_rank); }

}  // namespace trellis::transport
