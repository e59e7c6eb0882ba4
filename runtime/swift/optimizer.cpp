#include "trellis/runtime/swift/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "trellis/core/error.hpp"
#include "trellis/runtime/swift/gaussian_process.hpp"

namespace trellis::runtime::swift {
namespace {

// The GP sees at most this many scored sets: half the best ones (they shape EI near the
// incumbent) and half the most recent (they reflect the current context). 200 keeps one
// Bayesian step around a millisecond for 2L = 60.
constexpr int kGpMaxPoints = 200;
constexpr int kGpBestPoints = 100;
// Candidate pool of one Bayesian step: fresh random sets for exploration plus single-swap
// neighbours of the best few sets for exploitation.
constexpr int kPoolRandom = 32;
constexpr int kPoolBases = 4;
constexpr int kPoolSwapsPerBase = 32;
// EI's exploration margin, in matchness units (one token in γ = 32 is 0.031).
constexpr double kExploration = 1e-3;
// Random proposals retry this often to avoid a set already scored; in large spaces the first
// draw is almost always new, in tiny ones a repeat is allowed rather than looping forever.
constexpr int kRandomRetries = 16;

// Modulo bias is below n / 2^64, far under anything a test could see; it keeps the stream
// identical across standard libraries, which std::uniform_int_distribution does not.
std::size_t random_below(std::mt19937_64& rng, std::size_t n) { return static_cast<std::size_t>(rng() % n); }

}  // namespace

SkipSet uniform_skip_set(int num_layers, int budget) {
  if (num_layers < 1 || budget < 0 || budget > 2 * num_layers) {
    throw_error(ErrorCode::kInvalidArgument, "uniform_skip_set: budget {} is not in [0, {}] for {} layers", budget,
                2 * num_layers, num_layers);
  }
  // The first and last layers are the least redundant (the paper's uniform pattern and
  // Self-SD's optimised sets both keep them), so spread over the interior when it fits.
  int first = 0;
  int layers = num_layers;
  if (num_layers > 2 && budget <= 2 * (num_layers - 2)) {
    first = 1;
    layers = num_layers - 2;
  }
  SkipSet z(static_cast<std::size_t>(2 * num_layers), 0);
  bool attention_next = true;
  for (int j = 0; j < layers; ++j) {
    // Bresenham: layer j gets floor((j+1)k/m) - floor(jk/m) skips, 0, 1 or 2 since k <= 2m.
    const long long here = (static_cast<long long>(j) + 1) * budget / layers - static_cast<long long>(j) * budget / layers;
    const auto l = static_cast<std::size_t>(first + j);
    if (here >= 2) {
      z[2 * l] = 1;
      z[2 * l + 1] = 1;
    } else if (here == 1) {
      z[2 * l + (attention_next ? 0 : 1)] = 1;
      attention_next = !attention_next;
    }
  }
  return z;
}

bool LayerSkipOptimizer::SetLess::operator()(const SkipSet& a, const SkipSet& b) const {
  if (a.size() != b.size()) return a.size() < b.size();
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return a[i] < b[i];
  }
  return false;
}

LayerSkipOptimizer::LayerSkipOptimizer(int num_layers, const SwiftSettings& s)
    : num_layers_(num_layers), sub_layers_(2 * num_layers), settings_(s), rng_(s.seed) {
  validate(s);
  check_model_skippable(num_layers, s);
  budget_ = skip_budget(num_layers, s);
  best_ = uniform_skip_set(num_layers, budget_);
}

SkipSet LayerSkipOptimizer::propose() {
  last_was_bayes_ = false;
  if (best_matchness_ < 0.0) return best_;
  const int step = steps_ + 1;
  if (step % settings_.bayes_interval == 0 && training_indices().size() >= 2) {
    last_was_bayes_ = true;
    ++bayes_proposals_;
    return bayes_set();
  }
  // Half the random candidates are a random unseen single swap of the best set (same skip
  // count), half uniform over all sets. Uniform sampling alone explores but cannot refine:
  // on a real model matchness is far from additive, and a best set one swap from the
  // optimum stayed there for 1000 steps in every seed tried (docs/swift.md).
  if (std::uniform_int_distribution<int>(0, 1)(rng_) == 0)
    if (auto z = random_swap_of_best()) return *z;
  return random_set();
}

std::optional<SkipSet> LayerSkipOptimizer::random_swap_of_best() {
  std::vector<std::size_t> on, off;
  for (std::size_t i = 0; i < best_.size(); ++i) (best_[i] != 0 ? on : off).push_back(i);
  if (on.empty() || off.empty()) return std::nullopt;
  const std::size_t all = on.size() * off.size();
  // A random start and a walk over every swap: unseen ones are found even when few are left.
  const std::size_t start = random_below(rng_, all);
  for (std::size_t k = 0; k < all; ++k) {
    const std::size_t pick = (start + k) % all;
    SkipSet z = best_;
    z[on[pick / off.size()]] = 0;
    z[off[pick % off.size()]] = 1;
    if (seen_.count(z) == 0) return z;
  }
  return std::nullopt;
}

SkipSet LayerSkipOptimizer::random_set() {
  std::vector<int> order(static_cast<std::size_t>(sub_layers_));
  SkipSet z;
  for (int attempt = 0; attempt < kRandomRetries; ++attempt) {
    std::iota(order.begin(), order.end(), 0);
    z.assign(static_cast<std::size_t>(sub_layers_), 0);
    // Partial Fisher-Yates: the first `budget_` slots become a uniform random subset.
    for (int i = 0; i < budget_; ++i) {
      const std::size_t j = static_cast<std::size_t>(i) + random_below(rng_, static_cast<std::size_t>(sub_layers_ - i));
      std::swap(order[static_cast<std::size_t>(i)], order[j]);
      z[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])] = 1;
    }
    if (seen_.count(z) == 0) break;
  }
  return z;
}

std::vector<int> LayerSkipOptimizer::training_indices() const {
  // Sets scored under the current budget only (set_budget).
  std::vector<int> all;
  for (int i = 0; i < static_cast<int>(history_.size()); ++i)
    if (history_[static_cast<std::size_t>(i)].skipped == budget_) all.push_back(i);
  const int n = static_cast<int>(all.size());
  if (n <= kGpMaxPoints) return all;
  // Best first; among equal scores the more recent first.
  std::vector<int> by_score = all;
  std::stable_sort(by_score.begin(), by_score.end(), [&](int a, int b) {
    const double ma = history_[static_cast<std::size_t>(a)].matchness;
    const double mb = history_[static_cast<std::size_t>(b)].matchness;
    return ma != mb ? ma > mb : a > b;
  });
  std::vector<char> taken(history_.size(), 0);
  std::vector<int> out;
  out.reserve(kGpMaxPoints);
  for (int i = 0; i < kGpBestPoints; ++i) {
    out.push_back(by_score[static_cast<std::size_t>(i)]);
    taken[static_cast<std::size_t>(by_score[static_cast<std::size_t>(i)])] = 1;
  }
  for (int k = n - 1; k >= 0 && static_cast<int>(out.size()) < kGpMaxPoints; --k) {
    const int i = all[static_cast<std::size_t>(k)];
    if (taken[static_cast<std::size_t>(i)] == 0) out.push_back(i);
  }
  return out;
}

SkipSet LayerSkipOptimizer::bayes_set() {
  const std::vector<int> idx = training_indices();
  std::vector<SkipSet> xs;
  std::vector<double> ys;
  xs.reserve(idx.size());
  ys.reserve(idx.size());
  for (const int i : idx) {
    xs.push_back(history_[static_cast<std::size_t>(i)].z);
    ys.push_back(history_[static_cast<std::size_t>(i)].matchness);
  }
  SkipSetGp gp(sub_layers_, budget_);
  gp.fit(xs, ys);

  // An ordered set both removes duplicates and fixes the candidates' order, so ties in EI
  // resolve the same way on every run.
  std::set<SkipSet, SetLess> pool;
  for (int i = 0; i < kPoolRandom; ++i) pool.insert(random_set());
  std::vector<int> order(idx);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return history_[static_cast<std::size_t>(a)].matchness > history_[static_cast<std::size_t>(b)].matchness;
  });
  std::set<SkipSet, SetLess> bases;
  for (std::size_t i = 0; i < order.size() && static_cast<int>(bases.size()) < kPoolBases; ++i) {
    bases.insert(history_[static_cast<std::size_t>(order[i])].z);
  }
  for (const SkipSet& base : bases) {
    std::vector<std::size_t> on;
    std::vector<std::size_t> off;
    for (std::size_t i = 0; i < base.size(); ++i) (base[i] != 0 ? on : off).push_back(i);
    if (on.empty() || off.empty()) continue;
    const std::size_t all_swaps = on.size() * off.size();
    const bool enumerate = all_swaps <= static_cast<std::size_t>(kPoolSwapsPerBase);
    const std::size_t count = enumerate ? all_swaps : static_cast<std::size_t>(kPoolSwapsPerBase);
    for (std::size_t s = 0; s < count; ++s) {
      const std::size_t pick = enumerate ? s : random_below(rng_, all_swaps);
      SkipSet z = base;
      z[on[pick / off.size()]] = 0;
      z[off[pick % off.size()]] = 1;
      pool.insert(std::move(z));
    }
  }
  // The incumbent's whole unseen single-swap neighbourhood is scored too, and a BO step
  // moves inside it when it can: the random steps explore globally, so the GP's job is to
  // pick the refinement of the best set most likely to pay. Matchness is far from additive
  // (one wrong sub-layer out of r*2L can cost a fifth of it), and sampling only some swaps
  // left a best set one swap from the optimum for hundreds of steps.
  std::vector<SkipSet> candidates;
  {
    std::vector<std::size_t> on, off;
    for (std::size_t i = 0; i < best_.size(); ++i) (best_[i] != 0 ? on : off).push_back(i);
    for (std::size_t a : on)
      for (std::size_t b : off) {
        SkipSet z = best_;
        z[a] = 0;
        z[b] = 1;
        if (seen_.count(z) == 0) candidates.push_back(std::move(z));
      }
  }
  if (candidates.empty())
    for (const SkipSet& z : pool) {
      if (seen_.count(z) == 0) candidates.push_back(z);
    }
  if (candidates.empty()) return random_set();

  const std::vector<GpPrediction> pred = gp.predict(candidates);
  std::size_t pick = 0;
  double best_ei = -1.0;
  for (std::size_t c = 0; c < candidates.size(); ++c) {
    const double ei = expected_improvement(pred[c].mean, pred[c].stddev, gp.best_observed(), kExploration);
    if (ei > best_ei) {
      best_ei = ei;
      pick = c;
    }
  }
  return candidates[pick];
}

void LayerSkipOptimizer::report(const SkipSet& z, double matchness) {
  if (static_cast<int>(z.size()) != sub_layers_) {
    throw_error(ErrorCode::kInvalidArgument, "swift: reported skip set has {} entries, the model has {} sub-layers",
                z.size(), sub_layers_);
  }
  if (!(matchness >= 0.0 && matchness <= 1.0)) {
    throw_error(ErrorCode::kInvalidArgument, "swift: matchness must be in [0, 1] (got {})", matchness);
  }
  history_.push_back({z, matchness, count_skipped(z)});
  seen_.insert(z);
  // A set of another budget (scored while set_budget changed it) is history, not a step.
  if (history_.back().skipped != budget_) return;
  ++steps_;
  if (matchness > best_matchness_) {
    best_ = z;
    best_matchness_ = matchness;
    stale_ = 0;
  } else {
    ++stale_;
  }
}

std::string LayerSkipOptimizer::stop_reason() const {
  if (best_matchness_ >= settings_.target_matchness) {
    return fmt::format("matchness {:.4g} >= {:.4g}", best_matchness_, settings_.target_matchness);
  }
  if (stale_ >= settings_.patience) return fmt::format("{} steps without improvement", stale_);
  if (steps_ >= settings_.max_steps) return fmt::format("{} steps", steps_);
  return "";
}

void LayerSkipOptimizer::set_budget(int budget) {
  if (budget < 1 || budget >= sub_layers_)
    throw_error(ErrorCode::kInvalidArgument, "swift: a skip budget of {} sub-layers is outside [1, {}) for this model",
                budget, sub_layers_);
  std::vector<std::size_t> on, off;
  for (std::size_t i = 0; i < best_.size(); ++i) (best_[i] != 0 ? on : off).push_back(i);
  // Random ones (not, say, the last): the scores say nothing yet about which sub-layer of
  // the best set matters least, and the search refines from here.
  while (static_cast<int>(on.size()) > budget) {
    const std::size_t k = random_below(rng_, on.size());
    best_[on[k]] = 0;
    on.erase(on.begin() + static_cast<std::ptrdiff_t>(k));
  }
  while (static_cast<int>(on.size()) < budget) {
    const std::size_t k = random_below(rng_, off.size());
    best_[off[k]] = 1;
    on.push_back(off[k]);
    off.erase(off.begin() + static_cast<std::ptrdiff_t>(k));
  }
  budget_ = budget;
  restart();
}

void LayerSkipOptimizer::restart() {
  steps_ = 0;
  stale_ = 0;
  best_matchness_ = -1.0;
  last_was_bayes_ = false;
}

}  // namespace trellis::runtime::swift
