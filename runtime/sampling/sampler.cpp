#include "trellis/runtime/sampling/sampler.hpp"

#include <algorithm>
#include <cmath>

#include "trellis/core/error.hpp"

namespace trellis::runtime {

LogitsColumns::LogitsColumns(int vocab, int max_columns)
    : vocab_(vocab), max_columns_(max_columns),
      data_(static_cast<std::size_t>(vocab) * static_cast<std::size_t>(max_columns)) {}

void LogitsColumns::set_batch(int batch) {
  if (batch < 1 || batch > max_columns_)
    throw_error(ErrorCode::kInvalidArgument, "logits batch {} outside [1, {}]", batch, max_columns_);
  batch_ = batch;
}

std::span<float> LogitsColumns::shard(int v_begin, int v_end) {
  if (v_begin < 0 || v_end > vocab_ || v_begin >= v_end)
    throw_error(ErrorCode::kInvalidArgument, "logits shard [{}, {}) outside the vocabulary of {}", v_begin,
                v_end, vocab_);
  auto b = static_cast<std::size_t>(batch_);
  return {data_.data() + static_cast<std::size_t>(v_begin) * b, static_cast<std::size_t>(v_end - v_begin) * b};
}

void transpose_to_columns(const float* rows, int batch, int vocab_shard, float* cols) {
  // Blocked so both sides stay in cache for large vocabularies.
  constexpr int kBlock = 64;
  for (int v0 = 0; v0 < vocab_shard; v0 += kBlock) {
    int v1 = std::min(vocab_shard, v0 + kBlock);
    for (int b = 0; b < batch; ++b) {
      const float* r = rows + static_cast<std::size_t>(b) * static_cast<std::size_t>(vocab_shard);
      for (int v = v0; v < v1; ++v) cols[static_cast<std::size_t>(v) * static_cast<std::size_t>(batch) + static_cast<std::size_t>(b)] = r[v];
    }
  }
}

double sampling_uniform(std::uint64_t seed, std::uint64_t step) {
  // splitmix64 of (seed, step): a counter-based generator, so no state travels with the request.
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * (step + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * (1.0 / 9007199254740992.0);
}

PenaltyState::PenaltyState(int vocab, int max_columns)
    : vocab_(vocab), max_columns_(max_columns),
      counts_(static_cast<std::size_t>(vocab) * static_cast<std::size_t>(max_columns)),
      seen_(counts_.size()), cols_(static_cast<std::size_t>(max_columns)) {}

void PenaltyState::clear(int col) {
  auto& c = cols_[static_cast<std::size_t>(col)];
  for (auto t : c.touched) {
    counts_[at(t, col)] = 0;
    seen_[at(t, col)] = 0;
  }
  c.touched.clear();
  c.step = 0;
}

void PenaltyState::bind(int col, const SamplingParams& params, std::span<const std::int32_t> prompt) {
  if (col < 0 || col >= max_columns_)
    throw_error(ErrorCode::kInvalidArgument, "sampler column {} outside [0, {})", col, max_columns_);
  clear(col);
  auto& c = cols_[static_cast<std::size_t>(col)];
  c.bound = true;
  c.params = params;
  extend_prompt(col, prompt);
}

void PenaltyState::extend_prompt(int col, std::span<const std::int32_t> prompt) {
  if (col < 0 || col >= max_columns_)
    throw_error(ErrorCode::kInvalidArgument, "sampler column {} outside [0, {})", col, max_columns_);
  auto& c = cols_[static_cast<std::size_t>(col)];
  // Only the repetition penalty looks at the prompt; skip the marks when it is off.
  if (c.params.repetition_penalty == 1.0f) return;
  for (auto t : prompt) {
    if (t < 0 || t >= vocab_) continue;
    if (!seen_[at(t, col)]) {
      seen_[at(t, col)] = 1;
      c.touched.push_back(t);
    }
  }
}

void PenaltyState::release(int col) {
  clear(col);
  cols_[static_cast<std::size_t>(col)].bound = false;
}

void PenaltyState::append(int col, std::int32_t t) {
  auto& c = cols_[static_cast<std::size_t>(col)];
  ++c.step;
  if (!c.params.has_penalties() || t < 0 || t >= vocab_) return;
  auto i = at(t, col);
  if (!seen_[i] && counts_[i] == 0) c.touched.push_back(t);
  seen_[i] = 1;
  ++counts_[i];
}

void PenaltyState::apply_penalties(int col, float* zt, int batch, int zcol) const {
  const auto& c = cols_[static_cast<std::size_t>(col)];
  if (!c.params.has_penalties()) return;
  const float r = c.params.repetition_penalty, fp = c.params.frequency_penalty, pp = c.params.presence_penalty;
  for (auto t : c.touched) {
    auto i = at(t, col);
    float& z = zt[static_cast<std::size_t>(t) * static_cast<std::size_t>(batch) + static_cast<std::size_t>(zcol)];
    if (seen_[i] && r != 1.0f) z = z > 0 ? z / r : z * r;
    if (counts_[i] > 0) {
      z -= fp * static_cast<float>(counts_[i]);
      z -= pp;
    }
  }
}

namespace {

// The candidates sample_token draws from: idx[0..keep) sorted by logit (ties: lower id),
// after top-k, top-p and min-p; weight of candidate i is exp(z[idx[i]] / T - m), summing to
// `kept`. Temperature is a positive scale, so the order of z/T equals the order of z; only
// the surviving candidates are divided.
struct Kept {
  int keep = 0;
  float T = 1, m = 0;
  double kept = 0;
};

Kept kept_candidates(std::span<const float> z, const SamplingParams& p, std::vector<std::int32_t>& idx) {
  const int V = static_cast<int>(z.size());
  auto before = [&](std::int32_t a, std::int32_t b) {
    float za = z[static_cast<std::size_t>(a)], zb = z[static_cast<std::size_t>(b)];
    return za > zb || (za == zb && a < b);
  };
  idx.resize(static_cast<std::size_t>(V));
  for (int v = 0; v < V; ++v) idx[static_cast<std::size_t>(v)] = v;
  Kept k;
  k.T = p.temperature;
  int n = V;
  double total = 0;
  bool have_total = false;
  if (p.top_k > 0 && p.top_k < V) {
    n = p.top_k;
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), before);
  } else if (p.top_p < 1.0f) {
    // Top-p alone: only the nucleus needs an order. Sorting the whole vocabulary per column
    // was most of the sampling time of a large vocabulary (docs/benchmarks.md, "Bubbles from
    // the trace"); instead the top c candidates (c = 64, 256, ...) are selected and sorted
    // until their mass reaches top_p of the total. Every other token has a smaller logit (or
    // the same with a larger id), so it comes after them in the full order: the nucleus and
    // its order are the full sort's. The total is summed in vocabulary order.
    const float zmax = *std::max_element(z.begin(), z.end());
    k.m = zmax / k.T;
    for (int v = 0; v < V; ++v) total += std::exp(static_cast<double>(z[static_cast<std::size_t>(v)] / k.T - k.m));
    have_total = true;
    const double need = static_cast<double>(p.top_p) * total;
    for (int c = 64;; c *= 4) {
      if (c >= V) {
        std::sort(idx.begin(), idx.end(), before);
        break;
      }
      std::nth_element(idx.begin(), idx.begin() + c, idx.end(), before);
      std::sort(idx.begin(), idx.begin() + c, before);
      double cum = 0;
      for (int i = 0; i < c; ++i)
        cum += std::exp(static_cast<double>(z[static_cast<std::size_t>(idx[static_cast<std::size_t>(i)])] / k.T - k.m));
      if (cum >= need) {
        n = c;
        break;
      }
    }
  } else {
    std::sort(idx.begin(), idx.end(), before);
  }
  k.m = z[static_cast<std::size_t>(idx[0])] / k.T;
  auto w = [&](int i) { return std::exp(static_cast<double>(z[static_cast<std::size_t>(idx[static_cast<std::size_t>(i)])] / k.T - k.m)); };
  if (!have_total)
    for (int i = 0; i < n; ++i) total += w(i);
  int keep = n;
  if (p.top_p < 1.0f) {
    double cum = 0, need = static_cast<double>(p.top_p) * total;
    for (int i = 0; i < n; ++i) {
      cum += w(i);
      if (cum >= need) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {
    int j = 1;
    while (j < keep && w(j) >= static_cast<double>(p.min_p)) ++j;
    keep = j;
  }
  k.keep = keep;
  for (int i = 0; i < keep; ++i) k.kept += w(i);
  return k;
}

// The lowest index of the largest of n floats `stride` apart, NaN never chosen unless it is
// the first (what `if (z[v] > z[best]) best = v` from best = 0 gives). The scalar loop's
// compare depends on the best so far, one element per step (55 us for a 128K vocabulary at
// batch 1 on a GPU host, on the critical path between decode steps); here eight independent
// running maxima the compiler can keep in vector registers, then a second pass for the first
// index holding the maximum (ties: the lowest id, as before).
int argmax_strided(const float* z, std::size_t n, std::size_t stride) {
  if (n == 0 || std::isnan(z[0])) return 0;
  constexpr std::size_t kLanes = 8;
  float m[kLanes];
  for (auto& x : m) x = z[0];
  std::size_t v = 0;
  if (stride == 1) {
    for (; v + kLanes <= n; v += kLanes)
      for (std::size_t l = 0; l < kLanes; ++l) m[l] = z[v + l] > m[l] ? z[v + l] : m[l];
  }
  for (; v < n; ++v) m[0] = z[v * stride] > m[0] ? z[v * stride] : m[0];
  float best = m[0];
  for (const float x : m) best = x > best ? x : best;
  for (std::size_t i = 0; i < n; ++i)
    if (z[i * stride] == best) return static_cast<int>(i);
  return 0;  // not reached: best is one of the values
}

}  // namespace

std::int32_t sample_token(std::span<const float> z, const SamplingParams& p, double u,
                          std::vector<std::int32_t>& idx) {
  const int V = static_cast<int>(z.size());
  if (p.is_greedy()) return argmax_strided(z.data(), static_cast<std::size_t>(V), 1);
  const Kept k = kept_candidates(z, p, idx);
  double target = u * k.kept, cum = 0;
  for (int i = 0; i < k.keep; ++i) {
    cum += std::exp(static_cast<double>(z[static_cast<std::size_t>(idx[static_cast<std::size_t>(i)])] / k.T - k.m));
    if (cum > target) return idx[static_cast<std::size_t>(i)];
  }
  return idx[static_cast<std::size_t>(k.keep - 1)];
}

void sampling_distribution(std::span<const float> z, const SamplingParams& p, std::vector<std::int32_t>& idx,
                           std::vector<float>& probs) {
  probs.assign(z.size(), 0.0f);
  if (p.is_greedy()) {
    std::vector<std::int32_t> unused;
    probs[static_cast<std::size_t>(sample_token(z, p, 0.0, unused))] = 1.0f;
    return;
  }
  const Kept k = kept_candidates(z, p, idx);
  for (int i = 0; i < k.keep; ++i) {
    const auto t = static_cast<std::size_t>(idx[static_cast<std::size_t>(i)]);
    probs[t] = static_cast<float>(std::exp(static_cast<double>(z[t] / k.T - k.m)) / k.kept);
  }
}

Sampler::Sampler(int vocab, int max_columns, int threads) : vocab_(vocab) {
  (void)max_columns;
  column_scratch_.resize(static_cast<std::size_t>(threads) + 1, std::vector<float>(static_cast<std::size_t>(vocab)));
  index_scratch_.resize(static_cast<std::size_t>(threads) + 1);
  for (auto& s : index_scratch_) s.reserve(static_cast<std::size_t>(vocab));
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

Sampler::~Sampler() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : workers_) t.join();
}

void Sampler::worker_loop(int index) {
  std::uint64_t seen = 0;
  for (;;) {
    std::function<void(int)> job;
    {
      std::unique_lock lock(mu_);
      cv_work_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    job(index + 1);
    {
      std::lock_guard lock(mu_);
      if (--pending_ == 0) cv_done_.notify_all();
    }
  }
}

void Sampler::sample_range(float* zt, int batch, PenaltyState& state, std::int32_t* out, const std::int32_t* cols,
                           int c0, int c1, int worker) {
  if (c0 >= c1) return;
  const auto B = static_cast<std::size_t>(batch);
  for (int c = c0; c < c1; ++c) state.apply_penalties(cols[c], zt, batch, c);
  // Greedy columns: one row-wise pass over Z^T computes every column's arg-max at once,
  // reading each row's slice of this range contiguously (the column-wise layout's win).
  bool any_greedy = false;
  for (int c = c0; c < c1; ++c) any_greedy = any_greedy || state.params(cols[c]).is_greedy();
  if (any_greedy && c1 - c0 == 1) {
    // One column (batch 1, or a range of one): contiguous when it is the whole batch.
    out[c0] = argmax_strided(zt + c0, static_cast<std::size_t>(vocab_), B);
  } else if (any_greedy) {
    for (int c = c0; c < c1; ++c) out[c] = 0;
    for (int v = 1; v < vocab_; ++v) {
      const float* row = zt + static_cast<std::size_t>(v) * B;
      for (int c = c0; c < c1; ++c)
        if (row[c] > zt[static_cast<std::size_t>(out[c]) * B + static_cast<std::size_t>(c)]) out[c] = v;
    }
  }
  auto& col = column_scratch_[static_cast<std::size_t>(worker)];
  for (int c = c0; c < c1; ++c) {
    const auto& p = state.params(cols[c]);
    if (p.is_greedy()) continue;
    for (int v = 0; v < vocab_; ++v) col[static_cast<std::size_t>(v)] = zt[static_cast<std::size_t>(v) * B + static_cast<std::size_t>(c)];
    out[c] = sample_token(col, p, sampling_uniform(p.seed, state.step(cols[c])),
                          index_scratch_[static_cast<std::size_t>(worker)]);
  }
  for (int c = c0; c < c1; ++c) state.append(cols[c], out[c]);
}

void Sampler::sample(float* zt, int batch, PenaltyState& state, std::span<std::int32_t> out,
                     std::span<const std::int32_t> columns) {
  if (static_cast<int>(out.size()) < batch || batch > state.max_columns())
    throw_error(ErrorCode::kInvalidArgument, "sampler: batch {} does not fit output {} / columns {}", batch,
                out.size(), state.max_columns());
  if (state.vocab() != vocab_)
    throw_error(ErrorCode::kInvalidArgument, "sampler vocab {} != penalty state vocab {}", vocab_, state.vocab());
  identity_.resize(static_cast<std::size_t>(batch));
  for (int c = 0; c < batch; ++c) identity_[static_cast<std::size_t>(c)] = c;
  if (columns.empty()) columns = identity_;
  if (static_cast<int>(columns.size()) < batch)
    throw_error(ErrorCode::kInvalidArgument, "sampler: {} column indices for a batch of {}", columns.size(), batch);
  for (int c = 0; c < batch; ++c) {
    auto sc = columns[static_cast<std::size_t>(c)];
    if (sc < 0 || sc >= state.max_columns() || !state.bound(sc))
      throw_error(ErrorCode::kInternal, "sampler: logits column {} maps to state column {}, which has no sequence", c,
                  sc);
  }
  const std::int32_t* cols = columns.data();
  const int parts = std::min(batch, threads() + 1);
  auto range = [batch, parts](int k) { return std::pair{batch * k / parts, batch * (k + 1) / parts}; };
  if (parts <= 1) {
    sample_range(zt, batch, state, out.data(), cols, 0, batch, 0);
    return;
  }
  // PenaltyState columns are disjoint per range, so workers never touch the same entries.
  {
    std::lock_guard lock(mu_);
    job_ = [&, range, cols](int w) {
      if (w < parts) {
        auto [a, b] = range(w);
        sample_range(zt, batch, state, out.data(), cols, a, b, w);
      }
    };
    pending_ = threads();
    ++generation_;
  }
  cv_work_.notify_all();
  auto [a, b] = range(0);
  sample_range(zt, batch, state, out.data(), cols, a, b, 0);
  std::unique_lock lock(mu_);
  cv_done_.wait(lock, [&] { return pending_ == 0; });
}

}  // namespace trellis::runtime
