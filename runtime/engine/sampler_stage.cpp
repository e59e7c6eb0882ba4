#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "engine_internal.hpp"
#include "trellis/core/shm_names.hpp"

namespace trellis::runtime::detail {

std::pair<int, int> vocab_range(int vocab, int tp, int k) {
  int chunk = (vocab + tp - 1) / tp;
  return {std::min(vocab, k * chunk), std::min(vocab, (k + 1) * chunk)};
}

}  // namespace trellis::runtime::detail

namespace trellis::runtime {

int StageInput::n_sampled() const {
  int n = 0;
  for (auto v : sampled) n += v != 0 ? 1 : 0;
  return n;
}

int StageInput::logit_rows() const {
  int n = 0;
  for (std::size_t i = 0; i < sampled.size(); ++i)
    n += i < candidates.size() && candidates[i] != 0 ? lengths[i] : (sampled[i] != 0 ? 1 : 0);
  return n;
}

}  // namespace trellis::runtime

namespace trellis::runtime::detail {

void prepare_input(const ScheduleOutput& s, StageInput& in) {
  in.iteration = static_cast<std::int64_t>(s.iteration);
  in.group = s.group;
  in.stop = s.stop();
  in.tokens.assign(s.tokens.begin(), s.tokens.end());
  in.positions.clear();
  in.slots.clear();
  in.starts.clear();
  in.lengths.clear();
  in.fresh.clear();
  in.prompt.clear();
  in.sampled.clear();
  in.columns.clear();
  in.candidates.clear();
  in.tree_offsets.clear();
  in.kv_pos.clear();
  in.prefix.clear();
  in.parents.clear();
  in.skip.assign(s.skip.begin(), s.skip.end());
  in.moves.assign(s.moves.begin(), s.moves.end());
  in.params.resize(s.seqs.size());
  for (std::size_t i = 0; i < s.seqs.size(); ++i) {
    const auto& q = s.seqs[i];
    in.candidates.push_back(q.candidates ? 1 : 0);
    in.kv_pos.push_back(q.kv_pos);
    in.prefix.push_back(q.prefix);
    in.tree_offsets.push_back(q.parents.empty() ? -1 : static_cast<std::int32_t>(in.parents.size()));
    if (q.parents.empty()) {
      for (int j = 0; j < q.n_tokens; ++j) in.positions.push_back(q.pos + j);
    } else {
      const std::size_t base = in.positions.size();  // a parent precedes its child
      for (auto p : q.parents)
        in.positions.push_back(p < 0 ? q.pos : in.positions[base + static_cast<std::size_t>(p)] + 1);
      in.parents.insert(in.parents.end(), q.parents.begin(), q.parents.end());
    }
    in.slots.push_back(q.slot);
    in.starts.push_back(q.pos);
    in.lengths.push_back(q.n_tokens);
    in.fresh.push_back(q.first ? 1 : 0);
    in.prompt.push_back(q.prompt ? 1 : 0);
    in.sampled.push_back(q.sample ? 1 : 0);
    in.columns.push_back(q.column);
    if (q.first) in.params[i] = q.params;
  }
}

void wait_request(transport::Request& r, Deadline deadline, const FailureFlag& failed, const std::string& what) {
  for (unsigned long spin = 0;; ++spin) {
    if (r.test()) return;
    if ((spin & 63) == 0) {
      if (failed.failed)
        throw_scoped(ErrorScope::kRank, ErrorCode::kPeerFailed, "{}: another engine thread failed", what);
      if (deadline.expired()) throw_error(ErrorCode::kTimeout, "{} ({}): nothing arrived in time", what, r.describe());
    }
    // Spin briefly, then yield, then sleep: engine threads share cores with the forwards.
    if (spin > 2000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    else if (spin > 200) std::this_thread::yield();
  }
}

std::string ring_name(const EngineOptions& opt, int leader, int host) {
  const auto l = static_cast<std::size_t>(leader);
  const std::int64_t pid = l < opt.host_pids.size() && opt.host_pids[l] > 0 ? opt.host_pids[l] : ::getpid();
  return shm_name(pid, fmt::format("{}-sched-h{}", opt.job, host));
}

SamplerStage::SamplerStage(int rank, const EngineGrid& grid, transport::Link* const* shard_links, int vocab,
                           int max_cols, int max_rows, int threads, const EngineOptions& opt, const FailureFlag& failed,
                           Tracer& trace, Lane lane)
    : rank_(rank), grid_(grid), shard_links_(shard_links, shard_links + grid.tp), vocab_(vocab), opt_(opt),
      failed_(failed), trace_(trace), lane_(lane), sampler_(vocab, max_cols, threads), zt_(vocab, max_rows),
      swift_(vocab, grid.pp, max_cols) {
  for (int g = 0; g < grid.pp; ++g) states_.emplace_back(vocab, max_cols);
}

void top_candidates(const float* zt, int vocab, int batch, int b0, int b1, int k, std::vector<std::int32_t>& tokens,
                    std::vector<float>& probs) {
  std::vector<std::pair<float, std::int32_t>> best;
  const auto at = [&](int v, int b) { return zt[static_cast<std::size_t>(v) * batch + b]; };
  for (int b = b0; b < b1; ++b) {
    if (k == 1) {  // the arg-max alone (lowest id on ties, as greedy sampling); no softmax
      int arg = 0;
      for (int v = 1; v < vocab; ++v)
        if (at(v, b) > at(arg, b)) arg = v;
      tokens.push_back(arg);
      probs.push_back(1.0f);  // not computed
      tokens.insert(tokens.end(), kSwiftTopK - 1, -1);
      probs.insert(probs.end(), kSwiftTopK - 1, 0.0f);
      continue;
    }
    float mx = -std::numeric_limits<float>::infinity();
    for (int v = 0; v < vocab; ++v) mx = std::max(mx, at(v, b));
    double sum = 0;
    best.clear();
    // A min-heap of the k largest logits (ties: the lower id wins, as greedy sampling does).
    const auto worse = [](const auto& a, const auto& c) { return a.first > c.first || (a.first == c.first && a.second < c.second); };
    for (int v = 0; v < vocab; ++v) {
      const float z = at(v, b);
      sum += std::exp(static_cast<double>(z - mx));
      if (static_cast<int>(best.size()) < k) {
        best.emplace_back(z, v);
        std::push_heap(best.begin(), best.end(), worse);
      } else if (z > best.front().first) {
        std::pop_heap(best.begin(), best.end(), worse);
        best.back() = {z, v};
        std::push_heap(best.begin(), best.end(), worse);
      }
    }
    std::sort_heap(best.begin(), best.end(), worse);  // most probable first
    for (int i = 0; i < kSwiftTopK; ++i) {
      const bool have = i < static_cast<int>(best.size());
      tokens.push_back(have ? best[static_cast<std::size_t>(i)].second : -1);
      probs.push_back(have ? static_cast<float>(std::exp(static_cast<double>(best[static_cast<std::size_t>(i)].first - mx)) / sum)
                           : 0.0f);
    }
  }
}

const std::vector<std::int32_t>& SamplerStage::run(const StageInput& in, const float* local) {
  // Logit rows come only for the sequences that are sampled (a prefill chunk before the last
  // has none) and every token of a SWIFT candidates sequence; an iteration of chunks alone has
  // no logits to wait for.
  const int B = in.logit_rows();
  const int n_sampled = in.n_sampled();
  if (n_sampled > 0 && n_sampled != B)
    throw_error(ErrorCode::kInternal, "sampler on rank {}: iteration {} mixes sampled and SWIFT candidates sequences",
                rank_, in.iteration);
  if (B > 0) zt_.set_batch(B);
  // Every TP shard lands in its own row block of Z^T: concatenation without an all-gather.
  std::vector<transport::RequestPtr> recvs(static_cast<std::size_t>(grid_.tp));
  for (int k = 0; k < grid_.tp && B > 0; ++k) {
    auto [vb, ve] = vocab_range(vocab_, grid_.tp, k);
    auto dst = zt_.shard(vb, ve);
    if (k == grid_.tp_of(rank_)) {
      std::memcpy(dst.data(), local, dst.size_bytes());
    } else {
      recvs[static_cast<std::size_t>(k)] = shard_links_[static_cast<std::size_t>(k)]->irecv(std::as_writable_bytes(dst), kTagLogits);
    }
  }
  auto& state = states_[static_cast<std::size_t>(in.group)];
  columns_.clear();
  std::size_t off = 0;
  for (std::size_t j = 0; j < static_cast<std::size_t>(in.n_seqs()); ++j) {
    const std::span<const std::int32_t> tokens(in.tokens.data() + off, static_cast<std::size_t>(in.lengths[j]));
    off += tokens.size();
    // A new sequence binds its column with its (first chunk of) prompt; later chunks of the
    // prompt extend the marks the repetition penalty looks at.
    if (in.fresh[j]) {
      state.bind(in.columns[j], in.params[j], tokens);
      swift_.bind(in.group, in.columns[j], in.params[j]);
    }
    else if (in.prompt[j]) state.extend_prompt(in.columns[j], tokens);
    if (in.sampled[j]) columns_.push_back(in.columns[j]);
  }
  {
    Tracer::Span span(trace_, lane_, TraceCat::kRecv, "recv logits", in.iteration);
    for (int k = 0; k < grid_.tp; ++k) {
      if (!recvs[static_cast<std::size_t>(k)]) continue;
      wait_request(*recvs[static_cast<std::size_t>(k)], Deadline::after(opt_.deadline), failed_,
                   fmt::format("sampler on rank {}: logits of iteration {} from rank {} (stage {}, tp {})", rank_,
                               in.iteration, grid_.rank_at(grid_.pp - 1, k), grid_.pp - 1, k));
      auto want = zt_.shard(vocab_range(vocab_, grid_.tp, k).first, vocab_range(vocab_, grid_.tp, k).second).size_bytes();
      if (recvs[static_cast<std::size_t>(k)]->bytes() != want)
        throw_error(ErrorCode::kCorruptInput, "sampler on rank {}: logits shard from rank {} has {} bytes, expected {}",
                    rank_, grid_.rank_at(grid_.pp - 1, k), recvs[static_cast<std::size_t>(k)]->bytes(), want);
    }
  }
  cand_tokens_.clear();
  cand_probs_.clear();
  if (B > 0 && n_sampled == 0) {  // SWIFT rows: each row's top candidates, no draw
    Tracer::Span span(trace_, lane_, TraceCat::kSample, "swift candidates", in.iteration);
    out_.clear();
    swift_.answer(in, state, zt_.data(), B, cand_tokens_, cand_probs_);
    return out_;
  }
  out_.resize(static_cast<std::size_t>(B));
  Tracer::Span span(trace_, lane_, TraceCat::kSample, "sample", in.iteration);
  if (B > 0) sampler_.sample(zt_.data(), B, state, out_, columns_);
  return out_;
}

}  // namespace trellis::runtime::detail
