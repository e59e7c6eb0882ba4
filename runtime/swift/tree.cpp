#include "trellis/runtime/swift/tree.hpp"

#include <algorithm>

#include "trellis/core/error.hpp"

namespace trellis::runtime::swift {

int topk_for_confidence(float p) {
  // Written as "not above" so NaN lands in the widest band: an unknown confidence should
  // buy more alternatives, not fewer.
  if (!(p > 0.5F)) return 10;
  if (p <= 0.8F) return 5;
  if (p <= 0.95F) return 3;
  return 1;
}

bool keep_drafting(const DraftStep& last, int drafted, const SwiftSettings& s) {
  if (last.top.empty()) throw_error(ErrorCode::kInvalidArgument, "swift: a draft step with no candidates");
  return static_cast<double>(last.top[0].prob) >= s.epsilon && drafted < s.max_draft;
}

TokenTree build_tree(std::int32_t root, std::span<const DraftStep> steps) {
  const int n = static_cast<int>(steps.size());
  std::size_t total = 1 + steps.size();
  for (int d = 0; d < n; ++d) {
    const std::vector<Candidate>& top = steps[static_cast<std::size_t>(d)].top;
    if (top.empty()) throw_error(ErrorCode::kInvalidArgument, "swift: draft step {} has no candidates", d);
    for (std::size_t i = 1; i < top.size(); ++i) {
      if (top[i].prob > top[i - 1].prob) {
        throw_error(ErrorCode::kInvalidArgument,
                    "swift: draft step {} candidates are not sorted by probability ({} at rank {} > {} at rank {})", d,
                    top[i].prob, i, top[i - 1].prob, i - 1);
      }
    }
    const std::size_t k = std::min(static_cast<std::size_t>(topk_for_confidence(top[0].prob)), top.size());
    total += k - 1;
  }

  TokenTree t;
  t.tokens.reserve(total);
  t.parents.reserve(total);
  t.depth.reserve(total);
  t.tokens.push_back(root);
  t.parents.push_back(-1);
  t.depth.push_back(0);
  for (int d = 1; d <= n; ++d) {
    t.tokens.push_back(steps[static_cast<std::size_t>(d - 1)].top[0].token);
    t.parents.push_back(d - 1);
    t.depth.push_back(d);
  }
  t.backbone = n;
  // Alternatives after the whole backbone, not interleaved with it: the backbone then sits
  // in slots 1..n exactly as a plain chain would, and accepting a prefix of it needs no KV
  // compaction.
  for (int d = 1; d <= n; ++d) {
    const std::vector<Candidate>& top = steps[static_cast<std::size_t>(d - 1)].top;
    const std::size_t k = std::min(static_cast<std::size_t>(topk_for_confidence(top[0].prob)), top.size());
    for (std::size_t i = 1; i < k; ++i) {
      t.tokens.push_back(top[i].token);
      t.parents.push_back(d - 1);
      t.depth.push_back(d);
    }
  }
  return t;
}

std::vector<std::vector<bool>> tree_mask(const TokenTree& t) {
  const int n = t.size();
  std::vector<std::vector<bool>> mask(static_cast<std::size_t>(n), std::vector<bool>(static_cast<std::size_t>(n)));
  for (int i = 0; i < n; ++i) {
    for (int j = i; j >= 0; j = t.parents[static_cast<std::size_t>(j)]) {
      mask[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] = true;
    }
  }
  return mask;
}

Acceptance accept_greedy(const TokenTree& t, std::span<const std::int32_t> target_next) {
  const int n = t.size();
  if (n < 1 || static_cast<int>(target_next.size()) != n) {
    throw_error(ErrorCode::kInvalidArgument, "swift: accept_greedy needs one target token per tree node ({} for {})",
                target_next.size(), n);
  }
  Acceptance out;
  int current = 0;
  for (;;) {
    const std::int32_t want = target_next[static_cast<std::size_t>(current)];
    int next = -1;
    // Children have larger indices than their parent; the first match is the lowest index,
    // which is the backbone child when it matches (the only child that may have children).
    for (int c = current + 1; c < n; ++c) {
      if (t.parents[static_cast<std::size_t>(c)] == current && t.tokens[static_cast<std::size_t>(c)] == want) {
        next = c;
        break;
      }
    }
    if (next < 0) break;
    out.nodes.push_back(next);
    out.tokens.push_back(want);
    current = next;
  }
  out.tokens.push_back(target_next[static_cast<std::size_t>(current)]);
  return out;
}

}  // namespace trellis::runtime::swift
