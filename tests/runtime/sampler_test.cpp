// The column-wise, incremental sampler against a naive row-wise reference that recomputes
// every penalty from the full history each step. Tokens must be identical.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>

#include "trellis/core/error.hpp"
#include "trellis/runtime/sampling/sampler.hpp"

using namespace trellis::runtime;

namespace {

// Naive reference: row-major logits, penalties rebuilt from prompt + output every call,
// softmax over the whole sorted vocabulary.
std::int32_t reference_sample(std::vector<float> z, const SamplingParams& p, const std::vector<std::int32_t>& prompt,
                              const std::vector<std::int32_t>& output) {
  std::map<int, int> count;
  for (auto t : output) ++count[t];
  std::vector<bool> seen(z.size(), false);
  for (auto t : prompt) seen[static_cast<std::size_t>(t)] = true;
  for (auto t : output) seen[static_cast<std::size_t>(t)] = true;
  for (std::size_t v = 0; v < z.size(); ++v) {
    if (seen[v] && p.repetition_penalty != 1.0f) z[v] = z[v] > 0 ? z[v] / p.repetition_penalty : z[v] * p.repetition_penalty;
    auto it = count.find(static_cast<int>(v));
    if (it != count.end() && (p.frequency_penalty != 0 || p.presence_penalty != 0)) {
      z[v] -= p.frequency_penalty * static_cast<float>(it->second);
      z[v] -= p.presence_penalty;
    }
  }
  if (p.is_greedy()) return static_cast<std::int32_t>(std::max_element(z.begin(), z.end()) - z.begin());
  std::vector<std::int32_t> order(z.size());
  for (std::size_t v = 0; v < z.size(); ++v) order[v] = static_cast<std::int32_t>(v);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return z[static_cast<std::size_t>(a)] > z[static_cast<std::size_t>(b)] || (z[static_cast<std::size_t>(a)] == z[static_cast<std::size_t>(b)] && a < b);
  });
  std::size_t n = p.top_k > 0 ? std::min<std::size_t>(static_cast<std::size_t>(p.top_k), order.size()) : order.size();
  float m = z[static_cast<std::size_t>(order[0])] / p.temperature;
  std::vector<double> w(n);
  double total = 0;
  for (std::size_t i = 0; i < n; ++i) {
    w[i] = std::exp(static_cast<double>(z[static_cast<std::size_t>(order[i])] / p.temperature - m));
    total += w[i];
  }
  std::size_t keep = n;
  if (p.top_p < 1.0f) {
    double cum = 0;
    for (std::size_t i = 0; i < n; ++i) {
      cum += w[i];
      if (cum >= static_cast<double>(p.top_p) * total) { keep = i + 1; break; }
    }
  }
  if (p.min_p > 0) {
    std::size_t k = 1;
    while (k < keep && w[k] >= static_cast<double>(p.min_p)) ++k;
    keep = k;
  }
  double kept = 0;
  for (std::size_t i = 0; i < keep; ++i) kept += w[i];
  double u = sampling_uniform(p.seed, output.size()), cum = 0;
  for (std::size_t i = 0; i < keep; ++i) {
    cum += w[i];
    if (cum > u * kept) return order[i];
  }
  return order[keep - 1];
}

SamplingParams random_params(std::mt19937& rng, int i) {
  SamplingParams p;
  std::uniform_real_distribution<float> f(0, 1);
  p.seed = 1000 + static_cast<std::uint64_t>(i);
  switch (i % 6) {
    case 0: p.greedy = true; break;
    case 1: p.temperature = 0.7f; p.top_k = 5; break;
    case 2: p.temperature = 1.3f; p.top_p = 0.8f; break;
    case 3: p.temperature = 0.9f; p.min_p = 0.1f; break;
    case 4: p.temperature = 1.0f; p.top_k = 20; p.top_p = 0.9f; p.min_p = 0.02f; break;
    default: p.greedy = true; break;
  }
  if (f(rng) < 0.6f) {
    p.frequency_penalty = 0.5f * f(rng);
    p.presence_penalty = 0.3f * f(rng);
    p.repetition_penalty = 1.0f + 0.5f * f(rng);
  }
  return p;
}

}  // namespace

TEST(Sampler, TransposeAndShardConcatenation) {
  const int B = 3, V = 10;
  std::vector<float> rows(B * V);
  for (int b = 0; b < B; ++b)
    for (int v = 0; v < V; ++v) rows[static_cast<std::size_t>(b * V + v)] = static_cast<float>(100 * b + v);
  // Two vocabulary shards [0,4) and [4,10), each produced row-major by "its TP rank",
  // transposed locally and written straight into its block: no gather.
  LogitsColumns zt(V, 8);
  zt.set_batch(B);
  std::vector<float> shard0(B * 4), shard1(B * 6);
  for (int b = 0; b < B; ++b) {
    for (int v = 0; v < 4; ++v) shard0[static_cast<std::size_t>(b * 4 + v)] = rows[static_cast<std::size_t>(b * V + v)];
    for (int v = 0; v < 6; ++v) shard1[static_cast<std::size_t>(b * 6 + v)] = rows[static_cast<std::size_t>(b * V + 4 + v)];
  }
  transpose_to_columns(shard0.data(), B, 4, zt.shard(0, 4).data());
  transpose_to_columns(shard1.data(), B, 6, zt.shard(4, 10).data());
  std::vector<float> full(B * V);
  transpose_to_columns(rows.data(), B, V, full.data());
  for (int i = 0; i < B * V; ++i) EXPECT_EQ(zt.data()[i], full[static_cast<std::size_t>(i)]);
  EXPECT_EQ(zt.data()[5 * B + 2], 205.0f);
}

// Greedy picks what `if (z[v] > z[best]) best = v` picks: the lowest id among ties, a NaN never
// (unless it is element 0), for every length around the vectorised pass's width, contiguous
// (sample_token, a batch of one) and strided (one column of a wider batch).
TEST(Sampler, GreedyArgmaxMatchesTheScalarLoop) {
  const auto scalar = [](const std::vector<float>& z, std::size_t stride, std::size_t col) {
    std::size_t best = 0;
    const std::size_t n = z.size() / stride;
    for (std::size_t v = 1; v < n; ++v)
      if (z[v * stride + col] > z[best * stride + col]) best = v;
    return static_cast<std::int32_t>(best);
  };
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> small(-3, 3);  // many ties
  const float nan = std::numeric_limits<float>::quiet_NaN();
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  ASSERT_TRUE(greedy.is_greedy());
  std::vector<std::int32_t> idx;
  for (int n = 1; n <= 40; ++n) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> z(static_cast<std::size_t>(n));
      for (auto& x : z) x = static_cast<float>(small(rng));
      if (trial % 4 == 1) z[rng() % z.size()] = nan;
      if (trial % 4 == 2) z[0] = nan;
      if (trial % 4 == 3) z[z.size() - 1] = 100.0f;  // the maximum in the scalar tail
      if (trial == 5) z.assign(z.size(), -0.0f), z.back() = 0.0f;  // -0 == +0: the first wins
      ASSERT_EQ(sample_token(z, greedy, 0.5, idx), scalar(z, 1, 0)) << "n " << n << " trial " << trial;
    }
  }
  // Through Sampler::sample: batches of 1 (contiguous) and 3 with a worker per column (strided).
  const int V = 1031;
  for (int B : {1, 3}) {
    Sampler sampler(V, B, B - 1);
    PenaltyState state(V, B);
    for (int c = 0; c < B; ++c) state.bind(c, greedy, {});
    std::vector<float> zt(static_cast<std::size_t>(V * B));
    for (auto& x : zt) x = static_cast<float>(small(rng));
    zt[static_cast<std::size_t>(17 * B)] = nan;
    std::vector<std::int32_t> got(static_cast<std::size_t>(B));
    sampler.sample(zt.data(), B, state, got);
    for (int c = 0; c < B; ++c)
      EXPECT_EQ(got[static_cast<std::size_t>(c)], scalar(zt, static_cast<std::size_t>(B), static_cast<std::size_t>(c)))
          << "batch " << B << " column " << c;
  }
}

TEST(Sampler, UniformDependsOnSeedAndStepOnly) {
  EXPECT_EQ(sampling_uniform(7, 3), sampling_uniform(7, 3));
  EXPECT_NE(sampling_uniform(7, 3), sampling_uniform(7, 4));
  EXPECT_NE(sampling_uniform(7, 3), sampling_uniform(8, 3));
  for (int i = 0; i < 1000; ++i) {
    double u = sampling_uniform(static_cast<std::uint64_t>(i), 0);
    EXPECT_TRUE(u >= 0 && u < 1);
  }
}

// Many steps of a batch with mixed settings, sequences replaced mid-way (continuous
// batching), for 0..3 worker threads: identical to the reference every step.
TEST(Sampler, MatchesNaiveReference) {
  const int V = 97, B = 7, steps = 12;
  for (int threads : {0, 1, 3}) {
    std::mt19937 rng(42);
    std::normal_distribution<float> logit(0, 2);
    Sampler sampler(V, B, threads);
    PenaltyState state(V, B);
    std::vector<SamplingParams> params(B);
    std::vector<std::vector<std::int32_t>> prompt(B), output(B);
    int next_id = 0;
    auto start = [&](int c) {
      params[static_cast<std::size_t>(c)] = random_params(rng, next_id++);
      prompt[static_cast<std::size_t>(c)].clear();
      for (int i = 0; i < 5; ++i) prompt[static_cast<std::size_t>(c)].push_back(static_cast<std::int32_t>(rng() % V));
      output[static_cast<std::size_t>(c)].clear();
      state.bind(c, params[static_cast<std::size_t>(c)], prompt[static_cast<std::size_t>(c)]);
    };
    for (int c = 0; c < B; ++c) start(c);
    std::vector<float> rows(V * B), zt(V * B);
    std::vector<std::int32_t> got(B);
    for (int s = 0; s < steps; ++s) {
      if (s == 5) start(2), start(6);  // two sequences finish, two new ones join
      for (auto& x : rows) x = logit(rng);
      // Make penalties matter: previously produced tokens get high logits.
      for (int c = 0; c < B; ++c)
        for (auto t : output[static_cast<std::size_t>(c)]) rows[static_cast<std::size_t>(c * V + t)] += 3.0f;
      transpose_to_columns(rows.data(), B, V, zt.data());
      sampler.sample(zt.data(), B, state, got);
      for (int c = 0; c < B; ++c) {
        std::vector<float> row(rows.begin() + c * V, rows.begin() + (c + 1) * V);
        auto want = reference_sample(row, params[static_cast<std::size_t>(c)], prompt[static_cast<std::size_t>(c)],
                                     output[static_cast<std::size_t>(c)]);
        ASSERT_EQ(got[static_cast<std::size_t>(c)], want) << "threads " << threads << " step " << s << " column " << c;
        output[static_cast<std::size_t>(c)].push_back(want);
      }
    }
  }
}

// Top-p without top-k sorts only the nucleus (the top 64, 256, ... candidates until their
// mass reaches top_p): a large vocabulary, peaked to flat distributions (nuclei of a few
// tokens to most of the vocabulary), ties, and the reference's full sort agree every draw.
TEST(Sampler, TopPAloneMatchesFullSort) {
  const int V = 5003;
  std::mt19937 rng(7);
  int draws = 0;
  for (float scale : {8.0f, 2.0f, 0.5f, 0.05f}) {
    std::normal_distribution<float> logit(0, scale);
    for (int trial = 0; trial < 6; ++trial) {
      std::vector<float> z(V);
      for (auto& x : z) x = logit(rng);
      if (trial == 5)
        for (int v = 0; v < V; v += 7) z[static_cast<std::size_t>(v)] = z[0];  // many ties with the first
      for (float top_p : {0.5f, 0.9f, 0.95f, 0.999f}) {
        SamplingParams p;
        p.temperature = trial % 2 ? 0.8f : 1.3f;
        p.top_p = top_p;
        p.seed = static_cast<std::uint64_t>(trial * 100 + draws);
        std::vector<std::int32_t> scratch, none;
        for (int step = 0; step < 3; ++step) {
          std::vector<std::int32_t> out(static_cast<std::size_t>(step), 0);
          const auto want = reference_sample(z, p, none, out);
          const auto got = sample_token(z, p, sampling_uniform(p.seed, static_cast<std::uint64_t>(step)), scratch);
          ASSERT_EQ(got, want) << "scale " << scale << " trial " << trial << " top_p " << top_p << " step " << step;
          ++draws;
        }
      }
    }
  }
  EXPECT_EQ(draws, 4 * 6 * 4 * 3);
}

TEST(Sampler, SameSeedSameTokensWhateverTheColumn) {
  const int V = 50;
  SamplingParams p;
  p.temperature = 1.5f;
  p.seed = 77;
  std::vector<float> row(V);
  for (int v = 0; v < V; ++v) row[static_cast<std::size_t>(v)] = std::sin(static_cast<float>(v));
  std::vector<std::int32_t> first;
  for (int col : {0, 3}) {
    Sampler s(V, 4, 2);
    PenaltyState st(V, 4);
    SamplingParams other;
    other.greedy = true;
    for (int c = 0; c < 4; ++c) st.bind(c, c == col ? p : other, {});
    std::vector<std::int32_t> toks;
    for (int step = 0; step < 6; ++step) {
      std::vector<float> zt(V * 4);
      for (int v = 0; v < V; ++v)
        for (int c = 0; c < 4; ++c) zt[static_cast<std::size_t>(v * 4 + c)] = row[static_cast<std::size_t>(v)];
      std::vector<std::int32_t> out(4);
      s.sample(zt.data(), 4, st, out);
      toks.push_back(out[static_cast<std::size_t>(col)]);
    }
    if (first.empty()) first = toks;
    else EXPECT_EQ(first, toks);
  }
  // Not all the same token: the draws really are random.
  EXPECT_NE(std::count(first.begin(), first.end(), first[0]), static_cast<long>(first.size()));
}

TEST(Sampler, GreedyTieTakesLowestIdAndTopKOneIsArgmax) {
  std::vector<float> z = {1, 5, 5, 2};
  std::vector<std::int32_t> scratch;
  SamplingParams g;
  g.greedy = true;
  EXPECT_EQ(sample_token(z, g, 0.5, scratch), 1);
  SamplingParams k1;
  k1.top_k = 1;
  for (double u : {0.0, 0.5, 0.999}) EXPECT_EQ(sample_token(z, k1, u, scratch), 1);
  SamplingParams mp;
  mp.min_p = 0.5f;  // token 3 has p/pmax = e^-3 -> dropped; 1 and 2 stay
  for (double u : {0.0, 0.3, 0.6, 0.999}) {
    auto t = sample_token(z, mp, u, scratch);
    EXPECT_TRUE(t == 1 || t == 2);
  }
}

// Compact logits rows mapped to stable state columns give the same tokens as identity.
TEST(Sampler, ColumnMappingMatchesIdentity) {
  const int V = 40;
  SamplingParams a, b;
  a.temperature = 0.8f;
  a.seed = 5;
  a.frequency_penalty = 0.7f;
  b.greedy = true;
  b.repetition_penalty = 1.5f;
  Sampler s(V, 4, 1);
  PenaltyState mapped(V, 4), ident(V, 2);
  std::vector<std::int32_t> prompt = {1, 2, 3};
  mapped.bind(3, a, prompt);
  mapped.bind(1, b, prompt);
  mapped.bind(0, b, {});  // an unrelated sequence in the group, not in this microbatch
  ident.bind(0, a, prompt);
  ident.bind(1, b, prompt);
  std::vector<std::int32_t> map = {3, 1};
  for (int step = 0; step < 8; ++step) {
    std::vector<float> zt(V * 2);
    for (int i = 0; i < V * 2; ++i) zt[static_cast<std::size_t>(i)] = std::cos(static_cast<float>(i * (step + 1)));
    auto zt2 = zt;
    std::vector<std::int32_t> o1(2), o2(2);
    s.sample(zt.data(), 2, mapped, o1, map);
    s.sample(zt2.data(), 2, ident, o2);
    ASSERT_EQ(o1, o2) << step;
  }
  EXPECT_EQ(mapped.step(3), 8u);
  EXPECT_EQ(mapped.step(0), 0u);
  std::vector<std::int32_t> bad = {2, 1}, o(2);
  std::vector<float> zt(V * 2);
  EXPECT_THROW(s.sample(zt.data(), 2, mapped, o, bad), trellis::Error);
}
