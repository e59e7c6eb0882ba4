#!/usr/bin/env bash
# The GPU checks of the CUDA kernel backend, for a machine with an NVIDIA GPU (sm_80/sm_90):
# configure with the cuda preset (or reuse BUILD), build what the checks need, print what
# `trellis info` sees, then run the gpu-labelled tests. Exit status: ctest's.
#   tests/kernels/run_gpu_checks.sh [BUILD_DIR]     (default build/cuda)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build/cuda}"
jobs="$(nproc)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S "$root" -B "$build" --preset cuda -DTRELLIS_BUILD_BENCHMARKS=OFF
fi
cmake --build "$build" -j "$jobs" --target trellis cuda_kernels_test cuda_wiring_test kernels_test
"$build/launchers/trellis" info | sed -n '/^libraries/,/^$/p'
cd "$build"
ctest -L gpu --output-on-failure --timeout 300
ctest -R 'cuda_wiring_test|kernels_test' --output-on-failure --timeout 300
