// Private pieces of LlamaModel shared by its two .cpp files (loading and forward).
#pragma once

#include "trellis/runtime/model/llama.hpp"

namespace trellis::runtime {

struct LlamaModel::Layer {
  kernels::Tensor in_norm, post_norm;  // [H] f32
  kernels::Tensor wqkv;                // [q_cols + 2 kv_cols, H]: this rank's Q, K, V rows
  kernels::Tensor bqkv;                // [q_cols + 2 kv_cols] f32, empty without biases
  kernels::Tensor wo;                  // [H, q_cols]: this rank's O columns
  kernels::Tensor w_gate_up;           // [2 inter, H]: this rank's gate rows then up rows
  kernels::Tensor w_down;              // [H, inter]: this rank's down columns
};

// Scratch buffer slots (each a grow-only f32 tensor).
enum ScratchSlot : int { kNormed, kQkv, kAttn, kGateUp, kAct16, kPartial, kPartial2, kHidden, kSelected, kLogits, kScratchCount };

kernels::DType to_kernel_dtype(ElemType t);

}  // namespace trellis::runtime
