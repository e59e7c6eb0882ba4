// Internal: the quantised matmul for one activation row (decode at batch 1), split from
// quant.cpp. Several weight rows share each pass over the activation blocks.
#pragma once

#include "cpu/cpu_ops.hpp"

namespace trellis::kernels::cpu {

// y = x w^T for g.m == 1 and Q4_1 / Q8_0 weights (g.b_type), computed as quant.cpp's
// quant_matmul computes it (the same integer block sums; f32 sums in another order).
// Returns false, doing nothing, where this build has no such path (it needs AVX-512 F, BW,
// VL and VNNI) or for Q4_1 weights not 4-byte aligned (its loads are of whole cache lines,
// realigned by dwords); the caller then takes the general one. Reads nothing outside the
// rows' blocks.
bool quant_gemv(ThreadPool& pool, const GemmArgs& g);

}  // namespace trellis::kernels::cpu
