// Umbrella header: the whole public API of the kernels layer.
#pragma once

#include "trellis/kernels/async_copy.hpp"
#include "trellis/kernels/attention.hpp"
#include "trellis/kernels/bandwidth.hpp"
#include "trellis/kernels/context.hpp"
#include "trellis/kernels/device_bench.hpp"
#include "trellis/kernels/graph.hpp"
#include "trellis/kernels/library.hpp"
#include "trellis/kernels/ops.hpp"
#include "trellis/kernels/progress_hook.hpp"
#include "trellis/kernels/quant.hpp"
#include "trellis/kernels/rope.hpp"
#include "trellis/kernels/tensor.hpp"
