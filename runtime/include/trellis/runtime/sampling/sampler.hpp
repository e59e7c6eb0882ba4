// Decoupled CPU sampling (SiPipe §5.1): logits of a microbatch in column-wise layout, penalty
// state kept incrementally, and a pool of sampler threads.
//
// Layout. Logits of a microbatch of B sequences over a vocabulary of V tokens are held
// transposed, Z^T in R^{V x B}: element (token v, column b) at index v*B + b. A vocabulary-
// parallel LM head gives TP rank k the rows [v_begin_k, v_end_k); in this layout that shard
// is one contiguous block, so shards are concatenated by writing (or receiving) each into its
// block of one buffer — no all-gather and no row-wise reconstruction (§5.1(3)). Use
// LogitsColumns::shard() as the destination and transpose_to_columns() on the producer.
//
// Penalty state. A PenaltyState belongs to one microbatch group (SiPipe keeps p replicas,
// one per pipeline slot, since batches n and n+p hold the same sequences). Column b holds
// one sequence: its output-token counts (frequency/presence) and its seen-token marks
// (repetition: prompt and output) live in preallocated V x Bmax buffers, updated only where
// a new token lands; penalties are applied to those entries only, in place.
//
// Reproducibility. The draw for a request's k-th new token uses a uniform number that is a
// pure function of (seed, k), so the same request gives the same tokens whatever its column,
// microbatch, thread or pipeline layout.
//
// Threading. PenaltyState: one thread at a time. Sampler::sample() is called by one thread
// at a time; it fans the columns out to its own worker threads and returns when all are done.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "trellis/runtime/workload/request.hpp"

namespace trellis::runtime {

// Z^T storage for up to max_columns columns; batch() columns are in use.
class LogitsColumns {
 public:
  LogitsColumns(int vocab, int max_columns);
  void set_batch(int batch);  // 1 <= batch <= max_columns
  int vocab() const { return vocab_; }
  int batch() const { return batch_; }
  float* data() { return data_.data(); }
  const float* data() const { return data_.data(); }
  // Destination of the shard holding tokens [v_begin, v_end): (v_end-v_begin)*batch floats.
  std::span<float> shard(int v_begin, int v_end);

 private:
  int vocab_, max_columns_, batch_ = 0;
  std::vector<float> data_;
};

// rows: B x Vs row-major (one row per sequence, as a LM head writes them) -> cols: Vs x B.
void transpose_to_columns(const float* rows, int batch, int vocab_shard, float* cols);

// The uniform number in [0, 1) for draw `step` of a request seeded `seed`.
double sampling_uniform(std::uint64_t seed, std::uint64_t step);

class PenaltyState {
 public:
  PenaltyState(int vocab, int max_columns);
  int vocab() const { return vocab_; }
  int max_columns() const { return max_columns_; }
  // Puts a new sequence into column `col` (clearing what the previous one left) with its
  // settings and prompt; `generated` is how many tokens it already has (0 for a new one).
  void bind(int col, const SamplingParams& params, std::span<const std::int32_t> prompt);
  // More of column `col`'s prompt (the next chunk of a chunked prefill): marked as seen like
  // the part given to bind().
  void extend_prompt(int col, std::span<const std::int32_t> prompt);
  // Frees column `col` (clears its marks).
  void release(int col);
  // Records token `t` as produced for column `col` (count, seen mark, step).
  void append(int col, std::int32_t t);
  bool bound(int col) const { return cols_[static_cast<std::size_t>(col)].bound; }
  const SamplingParams& params(int col) const { return cols_[static_cast<std::size_t>(col)].params; }
  std::uint64_t step(int col) const { return cols_[static_cast<std::size_t>(col)].step; }

  // Applies repetition, frequency and presence penalties of state column `col` in place to
  // column `zcol` of the column-wise logits zt (B columns), touching only the tokens this
  // sequence has seen.
  void apply_penalties(int col, float* zt, int batch, int zcol) const;

 private:
  struct Column {
    bool bound = false;
    SamplingParams params;
    std::uint64_t step = 0;
    std::vector<std::int32_t> touched;  // distinct tokens with a mark, for sparse updates
  };
  std::size_t at(std::int32_t t, int col) const {
    return static_cast<std::size_t>(t) * static_cast<std::size_t>(max_columns_) + static_cast<std::size_t>(col);
  }
  void clear(int col);
  int vocab_, max_columns_;
  std::vector<std::int32_t> counts_;  // V x Bmax: occurrences in the output
  std::vector<std::uint8_t> seen_;    // V x Bmax: 1 prompt/output seen
  std::vector<Column> cols_;
};

// Picks one token from already-penalized logits z (V entries, contiguous) with `params` and
// uniform draw `u`: temperature, top-k, top-p, min-p, then the draw (see request.hpp for the
// order); greedy takes the arg-max (lowest id on ties). `scratch` is reused between calls.
std::int32_t sample_token(std::span<const float> z, const SamplingParams& params, double u,
                          std::vector<std::int32_t>& scratch);
// The distribution sample_token draws from for `params` (after temperature, top-k, top-p and
// min-p), as probabilities over the whole vocabulary (0 outside the kept candidates; greedy:
// 1 on the arg-max). SWIFT's speculative sampling compares the draft's and the target's.
void sampling_distribution(std::span<const float> z, const SamplingParams& params, std::vector<std::int32_t>& scratch,
                           std::vector<float>& probs);

class Sampler {
 public:
  // `threads` workers besides the caller (0: the caller samples alone).
  Sampler(int vocab, int max_columns, int threads);
  ~Sampler();
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;

  // Samples one token per column of zt (vocab x batch, column-wise; modified in place by
  // the penalties), writes them to out[0..batch), and appends each to `state`. Logits column
  // j belongs to state column columns[j] (empty span: j itself), which must be bound; the
  // mapping lets a microbatch's rows be compact while each sequence keeps its column.
  void sample(float* zt, int batch, PenaltyState& state, std::span<std::int32_t> out,
              std::span<const std::int32_t> columns = {});
  int threads() const { return static_cast<int>(workers_.size()); }

 private:
  void sample_range(float* zt, int batch, PenaltyState& state, std::int32_t* out, const std::int32_t* cols, int c0,
                    int c1, int worker);
  void worker_loop(int index);

  int vocab_;
  std::vector<std::thread> workers_;
  std::vector<std::vector<float>> column_scratch_;  // per worker (+ caller): one column
  std::vector<std::vector<std::int32_t>> index_scratch_;
  std::vector<std::int32_t> identity_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  std::function<void(int)> job_;
  std::uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace trellis::runtime
