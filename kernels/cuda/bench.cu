// Device code for the bandwidth ceilings of `bench kernels --device cuda` (device_bench.hpp):
// a fill with a known pattern and a read-only stream that XORs every word, so the host can
// check that every byte was really read.
#include <cstdint>

#include "cuda/launch.hpp"

namespace trellis::kernels::cuda {
namespace {

__host__ __device__ inline std::uint32_t pattern(std::uint64_t i) {
  return static_cast<std::uint32_t>(i * 2654435761u) ^ 0x9e3779b9u;
}

__global__ void fill_pattern_kernel(std::uint32_t* p, std::uint64_t words) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < words;
       i += std::uint64_t{gridDim.x} * blockDim.x)
    p[i] = pattern(i);
}

// Four independent 16-byte loads per thread per step keep enough bytes in flight per SM to
// cover HBM latency; the grid-stride loop makes the grid size independent of the buffer.
__global__ void read_stream_kernel(const uint4* p, std::uint64_t n16, std::uint32_t* out) {
  const std::uint64_t stride = std::uint64_t{gridDim.x} * blockDim.x;
  std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x;
  std::uint32_t acc = 0;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n16; i += stride) {
    uint4 a = p[i];
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) atomicXor(out, acc);
}

}  // namespace

std::uint32_t pattern_xor(std::uint64_t words) {
  std::uint32_t x = 0;
  for (std::uint64_t i = 0; i < words; ++i) x ^= pattern(i);
  return x;
}

cudaError_t launch_fill_pattern(std::uint32_t* p, std::uint64_t words, cudaStream_t s) {
  fill_pattern_kernel<<<1024, 256, 0, s>>>(p, words);
  return cudaGetLastError();
}

cudaError_t launch_read_stream(const void* p, std::uint64_t bytes, std::uint32_t* xor_out, int sm_count,
                               cudaStream_t s) {
  read_stream_kernel<<<sm_count * 8, 256, 0, s>>>(static_cast<const uint4*>(p), bytes / 16, xor_out);
  return cudaGetLastError();
}

}  // namespace trellis::kernels::cuda
