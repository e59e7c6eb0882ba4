// Speculative sampling (Leviathan et al. 2023; Chen et al. 2023) for a drafted chain: the
// acceptance rule SWIFT uses under sampling (appendix B.2). Its output tokens are
// distributed exactly as if they were sampled from the target one by one.
//
// For i = 0, 1, ...: draft[i] = x is accepted with probability min(1, p_i(x) / q_i(x)). At
// the first rejection the final token is drawn from norm(max(0, p_i - q_i)) and the rest of
// the draft is discarded; when every draft is accepted the final token is drawn from p_n.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace trellis::runtime::swift {

// draft (n >= 0 tokens): draft[i] was drawn from q[i], a distribution over the vocabulary.
// p: n + 1 target distributions, p[i] at the position of draft[i] (conditioned on the same
// prefix as q[i]), p[n] the one after the last draft. Every distribution has the same size
// V >= 1, non-negative entries and sums to 1 (not re-checked: that would cost O(nV) per
// step; sampling only assumes a positive total). Returns the accepted prefix of `draft`
// followed by one final token: between 1 and n + 1 tokens.
//
// Throws kInvalidArgument on mismatched sizes or a draft token outside [0, V). Uses one
// uniform draw per examined draft token plus one for the final token.
std::vector<std::int32_t> speculative_accept(std::span<const std::int32_t> draft,
                                             std::span<const std::vector<float>> q,
                                             std::span<const std::vector<float>> p, std::mt19937_64& rng);

// A uniform double in [0, 1) with 53 random bits; the same on every platform, unlike
// std::uniform_real_distribution.
double uniform01(std::mt19937_64& rng);

// Draws an index from non-negative weights with a positive total (they need not sum to 1).
// Throws kInvalidArgument when the total is not positive.
std::int32_t sample_categorical(std::span<const float> weights, std::mt19937_64& rng);

}  // namespace trellis::runtime::swift
