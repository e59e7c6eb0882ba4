#include "trellis/runtime/model/tp_layout.hpp"

#include "trellis/core/error.hpp"

namespace trellis::runtime {

TpLayout TpLayout::make(const ModelConfig& c, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size)
    throw_error(ErrorCode::kInvalidArgument, "tensor-parallel rank {} of {} is not a valid position", rank, size);
  if (c.num_kv_heads % size != 0)
    throw_error(ErrorCode::kInvalidArgument,
                "tensor parallelism t={} needs num_key_value_heads ({}) divisible by t: each rank must hold "
                "whole KV heads; choose t among the divisors of {}",
                size, c.num_kv_heads, c.num_kv_heads);
  if (c.num_heads % size != 0)
    throw_error(ErrorCode::kInvalidArgument, "tensor parallelism t={} needs num_attention_heads ({}) divisible by t",
                size, c.num_heads);
  if (c.intermediate_size % size != 0)
    throw_error(ErrorCode::kInvalidArgument, "tensor parallelism t={} needs intermediate_size ({}) divisible by t",
                size, c.intermediate_size);
  TpLayout l;
  l.rank = rank;
  l.size = size;
  l.heads = c.num_heads / size;
  l.head_begin = rank * l.heads;
  l.kv_heads = c.num_kv_heads / size;
  l.kv_head_begin = rank * l.kv_heads;
  l.inter = c.intermediate_size / size;
  l.inter_begin = rank * l.inter;
  l.vocab_chunk = (c.vocab_size + size - 1) / size;
  l.vocab_begin = std::min<std::int64_t>(c.vocab_size, rank * l.vocab_chunk);
  l.vocab_end = std::min<std::int64_t>(c.vocab_size, l.vocab_begin + l.vocab_chunk);
  return l;
}

void check_layout_ranks(int pp, int tp, int world_size) {
  if (pp < 1 || tp < 1 || pp * tp != world_size)
    throw_error(ErrorCode::kInvalidArgument, "--pp {} x --tp {} = {} ranks, but the job has {} (mpirun -np {})", pp, tp,
                pp * tp, world_size, pp * tp);
}

}  // namespace trellis::runtime
