// Built when the CUDA/NCCL path is not: says why, so `trellis info` can tell the user.
#include "trellis/transport/libraries.hpp"

namespace trellis::transport {

CudaInfo query_cuda() {
  CudaInfo info;
  info.built = false;
  info.why = TRELLIS_CUDA_WHY;
  return info;
}

}  // namespace trellis::transport
