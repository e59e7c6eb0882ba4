// TpLayout: which part of every weight a tensor-parallel rank owns (Megatron, as in the
// tensor-parallelism primer):
//  * attention heads and KV heads split evenly (each KV head group stays on one rank):
//    Q/K/V column-parallel (output rows), O row-parallel (input columns);
//  * the MLP's intermediate dimension split evenly: gate/up column-parallel, down
//    row-parallel;
//  * the vocabulary split in equal chunks of ceil(vocab / t) (the last rank's may be
//    shorter): embedding rows and LM head rows, the vocab-parallel embedding and head.
// A pure value: no MPI, no I/O.
#pragma once

#include <cstdint>

#include "trellis/runtime/model/config.hpp"

namespace trellis::runtime {

struct TpLayout {
  int rank = 0, size = 1;
  int heads = 0, head_begin = 0;        // query heads on this rank
  int kv_heads = 0, kv_head_begin = 0;  // KV heads on this rank
  std::int64_t inter = 0, inter_begin = 0;
  std::int64_t vocab_chunk = 0;  // ceil(vocab / size): the padded per-rank vocabulary
  std::int64_t vocab_begin = 0, vocab_end = 0;

  std::int64_t vocab_local() const { return vocab_end - vocab_begin; }
  std::int64_t q_cols(int head_dim) const { return std::int64_t{heads} * head_dim; }
  std::int64_t kv_cols(int head_dim) const { return std::int64_t{kv_heads} * head_dim; }

  // Throws kInvalidArgument with the numbers when the model cannot be split t ways:
  // num_key_value_heads (and so num_attention_heads) and intermediate_size must be
  // divisible by t.
  static TpLayout make(const ModelConfig& cfg, int rank, int size);
};

// The whole grid: p pipeline stages x t tensor-parallel ranks must be exactly the world
// (rank = stage * t + k). Throws kInvalidArgument naming the flags otherwise, e.g.
// "--pp 2 x --tp 3 = 6 ranks, but the job has 4 (mpirun -np 6)". Checked by every job that
// lays a model out (prepare_job, evaluate_perplexity) before anything is loaded.
void check_layout_ranks(int pp, int tp, int world_size);

}  // namespace trellis::runtime
