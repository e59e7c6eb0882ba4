// `trellis bench kernels`: what its CPU (cmd_bench_kernels.cpp) and GPU
// (cmd_bench_kernels_cuda.cpp) halves share.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "session.hpp"
#include "trellis/kernels/tensor.hpp"

namespace trellis::launchers {

struct KernelBenchOptions {
  std::string device = "cpu";
  std::string preset = "llama-1b";
  std::string shapes = "all";
  std::string tokens = "128,512";
  int batch = 4;
  int reps = 5;
  std::string triad_size = "256MiB";
  std::string rotate_size = "256MiB";
  std::string bandwidth_size = "1GiB";  // GPU: bytes of the copy and read buffers
  bool json = false;
};

struct Shape {
  std::string name;
  std::int64_t n, k;
};

// The weight shapes [out, in] of one layer plus the LM head, as the model multiplies them
// (q, k and v fused into one matrix), filtered by --shapes.
std::vector<Shape> preset_shapes(const std::string& preset, const std::string& filter);
double median(std::vector<double> v);
// Host tensor of type t (f32, bf16 or f16) with deterministic values in [-0.5, 0.5); makes no
// Context (which would reset OpenBLAS's thread count); from `arena` when one is given.
kernels::Tensor random_tensor(kernels::DType t, std::int64_t rows, std::int64_t cols, std::uint32_t seed,
                              kernels::HostArena* arena = nullptr);

int run_bench_kernels_cuda(Session& s, const KernelBenchOptions& o);

}  // namespace trellis::launchers
