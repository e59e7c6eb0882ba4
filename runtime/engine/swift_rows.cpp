// The sampler's answers to SWIFT iterations (scheduler/swift_control.hpp): per logits row the
// top candidates the scheduler needs, and for sampled (non-greedy) requests speculative
// sampling (Leviathan et al. 2023; runtime/swift/speculative.hpp), which keeps the target's
// sampling distribution exactly.
//
// Greedy sequences: a draft row answers its top kSwiftTopK tokens with softmax probabilities
// (the confidence and the tree's alternatives); a verify or scoring row only its arg-max.
// Sampled sequences: a draft row draws the drafted token from the draft's sampling
// distribution q (the request's temperature, top-k, top-p, min-p) and keeps q; the answer is
// that token alone (so the scheduler's tree is a chain) with max q as the confidence. Their
// verify rows run the acceptance rule against the target's distributions p and answer, per
// chain node, the token that greedy acceptance of the chain must see to accept exactly what
// speculative sampling accepted: the next draft while accepted, then the corrected (or extra)
// token, then nothing. The scheduler's greedy walk is then the speculative decision.
#include <algorithm>

#include "engine_internal.hpp"
#include "trellis/runtime/swift/speculative.hpp"

namespace trellis::runtime::detail {

SwiftRows::SwiftRows(int vocab, int groups, int max_cols)
    : vocab_(vocab), cols_(static_cast<std::size_t>(groups), std::vector<Col>(static_cast<std::size_t>(max_cols))) {}

void SwiftRows::bind(int group, int col, const SamplingParams& p) {
  auto& c = cols_.at(static_cast<std::size_t>(group)).at(static_cast<std::size_t>(col));
  // Its own stream, seeded by the request: reproducible for a seed, independent of the
  // plain sampler's draws.
  c.rng.seed(p.seed * 0x9E3779B97F4A7C15ull + 0x5157u);
  c.q.clear();
}

void SwiftRows::column(const float* zt, int batch, int b) {
  z_.resize(static_cast<std::size_t>(vocab_));
  for (int v = 0; v < vocab_; ++v) z_[static_cast<std::size_t>(v)] = zt[static_cast<std::size_t>(v) * batch + b];
}

void SwiftRows::answer(const StageInput& in, const PenaltyState& state, const float* zt, int batch,
                       std::vector<std::int32_t>& tokens, std::vector<float>& probs) {
  tokens.clear();
  probs.clear();
  int row = 0, tok = 0;
  for (int j = 0; j < in.n_seqs(); ++j) {
    const int n = in.lengths[static_cast<std::size_t>(j)];
    const int colno = in.columns[static_cast<std::size_t>(j)];
    const SamplingParams& p = state.params(colno);
    const bool tree = in.tree_offsets[static_cast<std::size_t>(j)] >= 0;
    const bool draft = !in.skip.empty() && !tree, verify = in.skip.empty() && tree;
    auto& c = cols_.at(static_cast<std::size_t>(in.group)).at(static_cast<std::size_t>(colno));
    if (p.is_greedy() || !(draft || verify)) {
      top_candidates(zt, vocab_, batch, row, row + n, draft ? kSwiftTopK : 1, tokens, probs);
    } else if (draft) {
      column(zt, batch, row);
      c.q.emplace_back();
      sampling_distribution(z_, p, idx_, c.q.back());
      const auto d = swift::sample_categorical(c.q.back(), c.rng);
      tokens.push_back(d);
      probs.push_back(*std::max_element(c.q.back().begin(), c.q.back().end()));
      tokens.insert(tokens.end(), kSwiftTopK - 1, -1);
      probs.insert(probs.end(), kSwiftTopK - 1, 0.0f);
    } else {
      // The chain: node 0 the input token, nodes 1..n-1 the drafts, each q kept in order.
      if (static_cast<int>(c.q.size()) != n - 1)
        throw_error(ErrorCode::kInternal, "swift sampling: a chain of {} drafts to verify but {} draft distributions "
                    "kept for column {}", n - 1, c.q.size(), colno);
      std::vector<std::vector<float>> target(static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i) {
        column(zt, batch, row + i);
        sampling_distribution(z_, p, idx_, target[static_cast<std::size_t>(i)]);
      }
      const std::span<const std::int32_t> drafts(in.tokens.data() + tok + 1, static_cast<std::size_t>(n - 1));
      const auto out = swift::speculative_accept(drafts, c.q, target, c.rng);
      for (int i = 0; i < n; ++i) {
        // Accepted drafts, then the corrected or extra token, then nothing to match.
        tokens.push_back(i < static_cast<int>(out.size()) ? out[static_cast<std::size_t>(i)] : -1);
        probs.push_back(1.0f);
        tokens.insert(tokens.end(), kSwiftTopK - 1, -1);
        probs.insert(probs.end(), kSwiftTopK - 1, 0.0f);
      }
      c.q.clear();
    }
    row += n;
    tok += n;
  }
}

}  // namespace trellis::runtime::detail
