// nccl_group.hpp in a build without CUDA/NCCL: the factory refuses, naming why.
#include "trellis/core/error.hpp"
#include "trellis/transport/nccl_group.hpp"

namespace trellis::transport {

bool nccl_group_built() { return false; }

std::unique_ptr<Group> make_nccl_group(Bootstrap&, const std::vector<int>& members, int, void*, Millis, bool) {
  throw_error(ErrorCode::kUnsupported, "NCCL TP group of {} ranks: this build has no NCCL ({})", members.size(),
              TRELLIS_CUDA_WHY);
}

}  // namespace trellis::transport
