// SWIFT's pure parts: settings, the confidence-aware token tree and greedy acceptance (§4.2),
// speculative sampling (Leviathan et al. 2023) and the expected speedup of Eq. (6).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "trellis/core/error.hpp"
#include "trellis/runtime/swift/settings.hpp"
#include "trellis/runtime/swift/speculative.hpp"
#include "trellis/runtime/swift/speedup.hpp"
#include "trellis/runtime/swift/tree.hpp"

namespace trellis::runtime::swift {
namespace {

// The message of the Error `f` throws with `code`; fails the test if it throws nothing.
std::string error_of(const std::function<void()>& f, ErrorCode code) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

TEST(SwiftSettings, ValidateNamesTheBadField) {
  EXPECT_NO_THROW(validate(SwiftSettings{}));
  const auto bad = [](const std::function<void(SwiftSettings&)>& edit) {
    SwiftSettings s;
    edit(s);
    return error_of([&] { validate(s); }, ErrorCode::kInvalidArgument);
  };
  EXPECT_EQ(bad([](SwiftSettings& s) { s.gamma = 0; }), "swift.gamma must be in [1, 1024] (got 0)");
  EXPECT_EQ(bad([](SwiftSettings& s) { s.skip_ratio = 1.5; }), "swift.skip_ratio must be in (0, 1) (got 1.5)");
  EXPECT_EQ(bad([](SwiftSettings& s) { s.patience = 0; }), "swift.patience must be >= 1 (got 0)");
  EXPECT_NE(bad([](SwiftSettings& s) { s.gamma = 1025; }).find("swift.gamma"), std::string::npos);
  EXPECT_NE(bad([](SwiftSettings& s) { s.bayes_interval = 0; }).find("swift.bayes_interval"), std::string::npos);
  EXPECT_NE(bad([](SwiftSettings& s) { s.max_steps = -1; }).find("swift.max_steps"), std::string::npos);
  EXPECT_NE(bad([](SwiftSettings& s) { s.target_matchness = 0.0; }).find("swift.target_matchness"),
            std::string::npos);
  EXPECT_NE(bad([](SwiftSettings& s) { s.skip_ratio = 0.0; }).find("swift.skip_ratio"), std::string::npos);
  EXPECT_NE(bad([](SwiftSettings& s) { s.epsilon = -0.1; }).find("swift.epsilon"), std::string::npos);
  EXPECT_NE(bad([](SwiftSettings& s) { s.epsilon = std::nan(""); }).find("swift.epsilon"), std::string::npos);
  EXPECT_NE(bad([](SwiftSettings& s) { s.max_draft = 65; }).find("swift.max_draft"), std::string::npos);
  EXPECT_NE(bad([](SwiftSettings& s) { s.reenter_acceptance = 1.1; }).find("swift.reenter_acceptance"),
            std::string::npos);
  EXPECT_NE(bad([](SwiftSettings& s) { s.acceptance_window = 0; }).find("swift.acceptance_window"),
            std::string::npos);
  EXPECT_NE(bad([](SwiftSettings& s) { s.ratio_tolerance = 1.5; }).find("swift.ratio_tolerance"), std::string::npos);
  EXPECT_NE(bad([](SwiftSettings& s) { s.ratio_step = 0.0; }).find("swift.ratio_step"), std::string::npos);
  EXPECT_NE(bad([](SwiftSettings& s) { s.min_skip_ratio = 1.0; }).find("swift.min_skip_ratio"), std::string::npos);
  EXPECT_NE(bad([](SwiftSettings& s) { s.min_skip_ratio = std::nan(""); }).find("swift.min_skip_ratio"),
            std::string::npos);
  EXPECT_NE(bad([](SwiftSettings& s) { s.min_speedup = -1.0; }).find("swift.min_speedup"), std::string::npos);
  EXPECT_NE(bad([](SwiftSettings& s) { s.speedup_window = 0; }).find("swift.speedup_window"), std::string::npos);
  // Range ends that are allowed.
  SwiftSettings edge;
  edge.gamma = 1024;
  edge.max_steps = 0;
  edge.target_matchness = 1.0;
  edge.epsilon = 0.0;
  edge.max_draft = 64;
  EXPECT_NO_THROW(validate(edge));
}

TEST(SwiftSettings, ModelMustBeSkippable) {
  const SwiftSettings s;
  const std::string why = error_of([&] { check_model_skippable(3, s); }, ErrorCode::kUnsupported);
  EXPECT_NE(why.find("at least 4 layers"), std::string::npos) << why;
  EXPECT_NO_THROW(check_model_skippable(4, s));
  SwiftSettings tiny;
  tiny.skip_ratio = 0.05;  // round(0.05 * 8) = 0 sub-layers
  EXPECT_NE(error_of([&] { check_model_skippable(4, tiny); }, ErrorCode::kUnsupported).find("skips 0 of the 8"),
            std::string::npos);
  SwiftSettings huge;
  huge.skip_ratio = 0.97;  // round(0.97 * 8) = 8: everything
  EXPECT_THROW(check_model_skippable(4, huge), Error);
  EXPECT_EQ(skip_budget(40, s), 40);
}

TEST(SwiftSettings, DescribeAndCount) {
  SkipSet z(20, 0);
  for (const int i : {6, 10, 14, 5, 19}) z[static_cast<std::size_t>(i)] = 1;
  EXPECT_EQ(describe(z), "attn 3,5,7 mlp 2,9");
  EXPECT_EQ(count_skipped(z), 5);
  EXPECT_EQ(describe(SkipSet(8, 0)), "attn - mlp -");
}

TEST(SwiftTree, ConfidenceBands) {
  EXPECT_EQ(topk_for_confidence(0.0F), 10);
  EXPECT_EQ(topk_for_confidence(0.3F), 10);
  EXPECT_EQ(topk_for_confidence(0.5F), 10);
  EXPECT_EQ(topk_for_confidence(0.5001F), 5);
  EXPECT_EQ(topk_for_confidence(0.8F), 5);
  EXPECT_EQ(topk_for_confidence(0.8001F), 3);
  EXPECT_EQ(topk_for_confidence(0.95F), 3);
  EXPECT_EQ(topk_for_confidence(0.9501F), 1);
  EXPECT_EQ(topk_for_confidence(1.0F), 1);
}

TEST(SwiftTree, KeepDrafting) {
  SwiftSettings s;
  s.epsilon = 0.8;
  s.max_draft = 4;
  EXPECT_TRUE(keep_drafting({{{1, 0.8F}}}, 3, s));
  EXPECT_FALSE(keep_drafting({{{1, 0.79F}}}, 1, s));
  EXPECT_FALSE(keep_drafting({{{1, 0.99F}}}, 4, s));
  EXPECT_THROW(keep_drafting(DraftStep{}, 0, s), Error);
}

// Root 7; depth 1: confident (k = 1); depth 2: p = 0.6 (k = 5); depth 3: p = 0.9 (k = 3);
// depth 4: p = 0.3 (k = 10, but only 2 candidates given).
std::vector<DraftStep> four_steps() {
  return {
      {{{11, 0.97F}, {12, 0.02F}}},
      {{{21, 0.6F}, {22, 0.2F}, {23, 0.1F}, {24, 0.05F}, {25, 0.03F}, {26, 0.02F}}},
      {{{31, 0.9F}, {32, 0.05F}, {33, 0.03F}, {34, 0.02F}}},
      {{{41, 0.3F}, {42, 0.2F}}},
  };
}

TEST(SwiftTree, Layout) {
  const TokenTree t = build_tree(7, four_steps());
  EXPECT_EQ(t.backbone, 4);
  EXPECT_EQ(t.size(), 12);
  EXPECT_EQ(t.tokens, (std::vector<std::int32_t>{7, 11, 21, 31, 41, 22, 23, 24, 25, 32, 33, 42}));
  EXPECT_EQ(t.parents, (std::vector<std::int32_t>{-1, 0, 1, 2, 3, 1, 1, 1, 1, 2, 2, 3}));
  EXPECT_EQ(t.depth, (std::vector<std::int32_t>{0, 1, 2, 3, 4, 2, 2, 2, 2, 3, 3, 4}));

  const TokenTree only_root = build_tree(5, {});
  EXPECT_EQ(only_root.size(), 1);
  EXPECT_EQ(only_root.backbone, 0);
  EXPECT_EQ(only_root.parents, std::vector<std::int32_t>{-1});

  std::vector<DraftStep> unsorted = four_steps();
  std::swap(unsorted[1].top[1], unsorted[1].top[2]);
  EXPECT_THROW(build_tree(7, unsorted), Error);
  std::vector<DraftStep> empty = four_steps();
  empty[2].top.clear();
  EXPECT_THROW(build_tree(7, empty), Error);
}

TEST(SwiftTree, Mask) {
  const TokenTree t = build_tree(7, four_steps());
  const std::vector<std::vector<bool>> m = tree_mask(t);
  ASSERT_EQ(m.size(), 12U);
  const auto row = [&](int i) {
    std::vector<int> on;
    for (int j = 0; j < 12; ++j) {
      if (m[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)]) on.push_back(j);
    }
    return on;
  };
  EXPECT_EQ(row(0), (std::vector<int>{0}));
  EXPECT_EQ(row(4), (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(row(6), (std::vector<int>{0, 1, 6}));       // token 23: alternative at depth 2
  EXPECT_EQ(row(10), (std::vector<int>{0, 1, 2, 10}));  // token 33: alternative at depth 3
  EXPECT_EQ(row(11), (std::vector<int>{0, 1, 2, 3, 11}));
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(static_cast<int>(row(i).size()), t.depth[static_cast<std::size_t>(i)] + 1) << i;
  }
}

TEST(SwiftTree, AcceptGreedy) {
  const TokenTree t = build_tree(7, four_steps());
  std::vector<std::int32_t> next(12, 99);
  // Everything accepted: bonus after the last backbone node.
  next[0] = 11, next[1] = 21, next[2] = 31, next[3] = 41, next[4] = 50;
  Acceptance a = accept_greedy(t, next);
  EXPECT_EQ(a.nodes, (std::vector<std::int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(a.tokens, (std::vector<std::int32_t>{11, 21, 31, 41, 50}));
  // An alternative at depth 3 (node 10, token 33), then its bonus.
  next[2] = 33, next[10] = 77;
  a = accept_greedy(t, next);
  EXPECT_EQ(a.nodes, (std::vector<std::int32_t>{1, 2, 10}));
  EXPECT_EQ(a.tokens, (std::vector<std::int32_t>{11, 21, 33, 77}));
  // Nothing matches at depth 1: only the bonus.
  next[0] = 55;
  a = accept_greedy(t, next);
  EXPECT_TRUE(a.nodes.empty());
  EXPECT_EQ(a.tokens, std::vector<std::int32_t>{55});

  // Rejected at depth 1 with an alternative there matching.
  const std::vector<DraftStep> steps = {{{{11, 0.4F}, {12, 0.3F}, {13, 0.2F}}}, {{{21, 0.99F}}}};
  const TokenTree u = build_tree(7, steps);
  EXPECT_EQ(u.tokens, (std::vector<std::int32_t>{7, 11, 21, 12, 13}));
  a = accept_greedy(u, std::vector<std::int32_t>{13, 21, 0, 0, 8});
  EXPECT_EQ(a.nodes, std::vector<std::int32_t>{4});
  EXPECT_EQ(a.tokens, (std::vector<std::int32_t>{13, 8}));
  EXPECT_THROW(accept_greedy(u, std::vector<std::int32_t>{1, 2}), Error);
}

TEST(SwiftTree, AcceptGreedyEqualsPlainGreedyDecoding) {
  // A made-up target whose greedy next token is a hash of the path; over random trees the
  // accepted tokens must be exactly what decoding that target one token at a time gives.
  constexpr std::int32_t kVocab = 5;
  const auto greedy = [](const std::vector<std::int32_t>& path) {
    std::uint64_t h = 7;
    for (const std::int32_t x : path) h = (h ^ static_cast<std::uint64_t>(x)) * 0x100000001b3ULL;
    return static_cast<std::int32_t>((h >> 29) % kVocab);
  };
  std::mt19937_64 g(21);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<DraftStep> steps(1 + g() % 6);
    for (DraftStep& s : steps) {
      std::vector<std::int32_t> perm = {0, 1, 2, 3, 4};
      std::shuffle(perm.begin(), perm.end(), g);
      const float p0 = static_cast<float>(0.2 + 0.8 * static_cast<double>(g() % 1000) / 1000.0);
      for (std::size_t i = 0; i < perm.size(); ++i) s.top.push_back({perm[i], p0 / static_cast<float>(1U << i)});
    }
    const TokenTree t = build_tree(3, steps);
    std::vector<std::int32_t> next(static_cast<std::size_t>(t.size()));
    for (int i = 0; i < t.size(); ++i) {
      std::vector<std::int32_t> path;
      for (int j = i; j >= 0; j = t.parents[static_cast<std::size_t>(j)]) path.insert(path.begin(), t.tokens[j]);
      next[static_cast<std::size_t>(i)] = greedy(path);
    }
    const Acceptance a = accept_greedy(t, next);
    std::vector<std::int32_t> path = {3};
    for (const std::int32_t tok : a.tokens) {
      ASSERT_EQ(tok, greedy(path)) << "trial " << trial;
      path.push_back(tok);
    }
    ASSERT_LE(a.nodes.size(), steps.size());
  }
}

// --- speculative sampling ---------------------------------------------------------------

constexpr int kV = 6;
constexpr int kN = 3;  // draft length

std::vector<float> random_distribution(std::mt19937_64& g) {
  std::vector<float> d(kV);
  float sum = 0.0F;
  for (float& x : d) sum += (x = 0.1F + static_cast<float>(uniform01(g)));
  for (float& x : d) x /= sum;
  return d;
}

// A Markov "model": the distribution at position i depends on the token at i - 1.
struct Chain {
  std::vector<float> p0, q0;
  std::vector<std::vector<float>> p[kN + 1], q[kN];  // [i][previous token], i >= 1
};

Chain make_chain(std::uint64_t seed) {
  std::mt19937_64 g(seed);
  Chain c;
  c.p0 = random_distribution(g);
  c.q0 = random_distribution(g);
  for (int i = 1; i <= kN; ++i) {
    for (int a = 0; a < kV; ++a) {
      c.p[i].push_back(random_distribution(g));
      if (i < kN) c.q[i].push_back(random_distribution(g));
    }
  }
  return c;
}

using AcceptRule = std::function<std::vector<std::int32_t>(
    std::span<const std::int32_t>, std::span<const std::vector<float>>, std::span<const std::vector<float>>,
    std::mt19937_64&)>;

struct ChiSquare {
  double first;        // first output token vs p0, 5 degrees of freedom
  double second;       // second token given the first was accepted vs p1[first], 30
  double acceptances;  // share of trials accepting the first draft
};

ChiSquare chi_square(const Chain& c, const AcceptRule& rule, int trials) {
  std::mt19937_64 draw(5), accept(6);
  std::vector<double> first(kV, 0.0);
  std::vector<std::vector<double>> second(kV, std::vector<double>(kV, 0.0));
  std::vector<double> accepted_first(kV, 0.0);
  for (int t = 0; t < trials; ++t) {
    std::vector<std::int32_t> draft;
    std::vector<std::vector<float>> q = {c.q0}, p = {c.p0};
    for (int i = 0; i < kN; ++i) {
      draft.push_back(sample_categorical(q.back(), draw));
      const auto prev = static_cast<std::size_t>(draft.back());
      p.push_back(c.p[i + 1][prev]);
      if (i + 1 < kN) q.push_back(c.q[i + 1][prev]);
    }
    const std::vector<std::int32_t> out = rule(draft, q, p, accept);
    first[static_cast<std::size_t>(out[0])] += 1;
    if (out.size() >= 2) {
      accepted_first[static_cast<std::size_t>(out[0])] += 1;
      second[static_cast<std::size_t>(out[0])][static_cast<std::size_t>(out[1])] += 1;
    }
  }
  ChiSquare r{0.0, 0.0, 0.0};
  for (int a = 0; a < kV; ++a) {
    const double e = trials * static_cast<double>(c.p0[a]);
    r.first += (first[a] - e) * (first[a] - e) / e;
    r.acceptances += accepted_first[a] / trials;
    for (int b = 0; b < kV; ++b) {
      const double e2 = accepted_first[a] * static_cast<double>(c.p[1][a][b]);
      r.second += (second[a][b] - e2) * (second[a][b] - e2) / e2;
    }
  }
  return r;
}

// 0.999 quantiles of the chi-square distribution.
constexpr double kChi2Df5 = 20.515;
constexpr double kChi2Df30 = 59.703;
constexpr int kTrials = 120000;

TEST(SwiftSpeculative, OutputFollowsTheTargetDistribution) {
  for (const std::uint64_t seed : {1, 2, 3}) {
    const ChiSquare r = chi_square(make_chain(seed), speculative_accept, kTrials);
    std::printf("seed %d: chi2 first %.1f (df 5), second %.1f (df 30), first accepted %.2f\n", static_cast<int>(seed),
                r.first, r.second, r.acceptances);
    EXPECT_LT(r.first, kChi2Df5) << "seed " << seed;
    EXPECT_LT(r.second, kChi2Df30) << "seed " << seed;
    EXPECT_GT(r.acceptances, 0.3);  // the conditional test saw enough accepted trials
    EXPECT_LT(r.acceptances, 0.95);  // and enough rejections to exercise the residual
  }
}

TEST(SwiftSpeculative, TheTestRejectsWrongRules) {
  // Negative controls: the same statistic must fail for rules that do not keep the target
  // distribution, or the test above proves nothing.
  const AcceptRule accept_all = [](std::span<const std::int32_t> draft, std::span<const std::vector<float>>,
                                   std::span<const std::vector<float>> p, std::mt19937_64& rng) {
    std::vector<std::int32_t> out(draft.begin(), draft.end());
    out.push_back(sample_categorical(p.back(), rng));
    return out;
  };
  // Accepts with min(1, p/q) but redraws from p instead of the residual max(0, p - q).
  const AcceptRule no_residual = [](std::span<const std::int32_t> draft, std::span<const std::vector<float>> q,
                                    std::span<const std::vector<float>> p, std::mt19937_64& rng) {
    std::vector<std::int32_t> out;
    for (std::size_t i = 0; i < draft.size(); ++i) {
      const auto x = static_cast<std::size_t>(draft[i]);
      if (uniform01(rng) * q[i][x] >= p[i][x]) {
        out.push_back(sample_categorical(p[i], rng));
        return out;
      }
      out.push_back(draft[i]);
    }
    out.push_back(sample_categorical(p.back(), rng));
    return out;
  };
  const Chain c = make_chain(1);
  const ChiSquare all = chi_square(c, accept_all, kTrials);
  const ChiSquare nores = chi_square(c, no_residual, kTrials);
  std::printf("wrong rules: accept-all chi2 first %.1f; no-residual chi2 first %.1f, second %.1f\n", all.first,
              nores.first, nores.second);
  EXPECT_GT(all.first, kChi2Df5);
  EXPECT_GT(nores.first, kChi2Df5);
  EXPECT_GT(nores.second, kChi2Df30);
}

TEST(SwiftSpeculative, EdgeCases) {
  std::mt19937_64 rng(1);
  const std::vector<float> a = {0.5F, 0.5F, 0.0F}, b = {0.0F, 0.0F, 1.0F};
  // Identical draft and target: everything accepted, plus one token from p[n].
  const std::vector<std::int32_t> draft = {1, 0};
  const std::vector<std::vector<float>> same = {a, a};
  const std::vector<std::vector<float>> p_same = {a, a, b};
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(speculative_accept(draft, same, p_same, rng), (std::vector<std::int32_t>{1, 0, 2}));
  }
  // The target gives the draft token no mass: always rejected, resampled elsewhere.
  const std::vector<std::vector<float>> q1 = {b}, p1 = {a, a};
  for (int i = 0; i < 50; ++i) {
    const std::vector<std::int32_t> out = speculative_accept(std::vector<std::int32_t>{2}, q1, p1, rng);
    ASSERT_EQ(out.size(), 1U);
    EXPECT_NE(out[0], 2);
  }
  // No draft: one token from p[0].
  EXPECT_EQ(speculative_accept({}, {}, std::vector<std::vector<float>>{b}, rng), std::vector<std::int32_t>{2});
  EXPECT_THROW(speculative_accept(draft, same, same, rng), Error);                        // p too short
  EXPECT_THROW(speculative_accept(std::vector<std::int32_t>{3}, q1, p1, rng), Error);    // token outside V
  EXPECT_THROW(sample_categorical(std::vector<float>{0.0F, 0.0F}, rng), Error);
}

// --- Eq. (6) ----------------------------------------------------------------------------

TEST(SwiftSpeedup, MatchesTable4) {
  struct Row {
    double m, alpha, r, speedup;
  };
  // LLaMA-2-13B (r = 0.45) and LLaMA-2-70B (r = 0.5): CNN/DM, GSM8K, TinyStories.
  for (const Row& row : {Row{4.34, 0.99, 0.45, 1.52}, Row{3.13, 0.98, 0.45, 1.43}, Row{8.21, 1.00, 0.45, 1.65},
                         Row{3.85, 0.99, 0.5, 1.58}, Row{2.99, 0.98, 0.5, 1.48}, Row{6.17, 0.99, 0.5, 1.71}}) {
    EXPECT_NEAR(expected_speedup(row.m, row.alpha, row.r), row.speedup, 0.01) << row.m;
  }
  EXPECT_DOUBLE_EQ(expected_speedup(1.0, 0.5, 0.5), 1.0);
  EXPECT_THROW(expected_speedup(0.5, 0.9, 0.5), Error);
  EXPECT_THROW(expected_speedup(3.0, 0.0, 0.5), Error);
  EXPECT_THROW(expected_speedup(3.0, 0.9, 1.0), Error);
}

TEST(SwiftSpeedup, Stats) {
  SwiftStats s;
  EXPECT_EQ(s.mean_generated_length(), 0.0);
  EXPECT_EQ(s.acceptance_rate(), 0.0);
  s.record_verify(5, 4);  // 5 tokens from one pass
  s.record_verify(3, 1);  // 2 tokens
  s.record_verify(0, 0);  // a plain step: 1 token
  EXPECT_EQ(s.generated_tokens, 8U);
  EXPECT_DOUBLE_EQ(s.mean_generated_length(), 8.0 / 3.0);
  EXPECT_DOUBLE_EQ(s.acceptance_rate(), 5.0 / 8.0);
  SwiftStats total;
  total += s;
  total += s;
  EXPECT_EQ(total.verify_passes, 6U);
  EXPECT_DOUBLE_EQ(total.acceptance_rate(), 5.0 / 8.0);
  EXPECT_THROW(s.record_verify(2, 3), Error);
}

}  // namespace
}  // namespace trellis::runtime::swift
