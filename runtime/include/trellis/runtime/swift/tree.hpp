// SWIFT's confidence-aware inference acceleration (§4.2): when to stop drafting, how wide to
// make each drafted position, the token tree the target verifies in one forward pass, and
// greedy acceptance on that tree.
//
// Drafting. The skipping model drafts greedily; after each draft step the engine calls
// keep_drafting() with the step's top candidates. The step that fails the check is still
// part of the draft (its token was produced); drafting simply stops there.
//
// Tree. Each drafted position d is widened by its next-best tokens, k - 1 of them, with k
// from topk_for_confidence(top-1 probability). The tree is linearised in a fixed order (see
// build_tree) so the engine can place nodes in KV slots and build the attention mask.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "trellis/runtime/swift/settings.hpp"

namespace trellis::runtime::swift {

struct Candidate {
  std::int32_t token;
  float prob;
};

// The draft's top candidates at one depth, sorted by prob descending; top[0] is the drafted
// token; size >= 1. Extra candidates beyond the band's k are ignored by build_tree.
struct DraftStep {
  std::vector<Candidate> top;
};

// The paper's bands: p in (0, 0.5] -> 10, (0.5, 0.8] -> 5, (0.8, 0.95] -> 3, (0.95, 1] -> 1.
// p <= 0 (and NaN) count as the lowest band, p > 1 as the highest.
int topk_for_confidence(float p);

// Whether to draft another token after `last`, having drafted `drafted` tokens so far:
// last.top[0].prob >= epsilon and drafted < max_draft. Throws kInvalidArgument on an empty
// `last.top`.
bool keep_drafting(const DraftStep& last, int drafted, const SwiftSettings& s);

struct TokenTree {
  std::vector<std::int32_t> tokens;   // node 0 = root (the input token, not a draft)
  std::vector<std::int32_t> parents;  // parents[0] = -1; parents[i] < i
  std::vector<std::int32_t> depth;    // depth[0] = 0
  int backbone = 0;                   // nodes 1..backbone are the drafted chain, node i at depth i
  int size() const { return static_cast<int>(tokens.size()); }
};

// Layout (the engine relies on it): node 0 is the root; nodes 1..n are the backbone
// (steps[i].top[0].token at depth i+1, parent i); then, for each depth d = 1..n in order,
// the alternatives steps[d-1].top[1..k-1], k = min(topk_for_confidence(top[0].prob),
// top.size()), as leaves at depth d whose parent is the backbone node at depth d-1. So a
// backbone node's slot offset equals its depth, and every alternative is a leaf.
// Throws kInvalidArgument when a step has no candidates or is not sorted by prob.
TokenTree build_tree(std::int32_t root, std::span<const DraftStep> steps);

// The attention mask of the linearised tree: mask[i][j] is true when node j is node i or an
// ancestor of it (so node i attends to the committed prefix plus its own root path).
std::vector<std::vector<bool>> tree_mask(const TokenTree& t);

struct Acceptance {
  std::vector<std::int32_t> nodes;   // accepted draft nodes (root excluded), root to leaf
  std::vector<std::int32_t> tokens;  // their tokens followed by the bonus token (size nodes.size()+1)
};

// Greedy verification. target_next[i] (size t.size()) is the target's greedy next token
// after node i's path. Starting at the root, while some child of the current node carries
// token target_next[current], that child is accepted (the lowest-numbered such child, i.e.
// the backbone one when it matches) and becomes current. The bonus token is target_next of
// the last accepted node (of the root when none is). The output equals what plain greedy
// decoding of the target would produce, token for token.
Acceptance accept_greedy(const TokenTree& t, std::span<const std::int32_t> target_next);

}  // namespace trellis::runtime::swift
