// A small Gaussian process over skip sets, the surrogate behind SWIFT's Bayesian
// optimisation steps (§4.1.2, "Efficient Layer Set Suggestion").
//
// Model. Observations y (matchness scores) are standardised to zero mean and unit variance,
// so the signal variance is taken from the data. The prior covariance of two skip sets a, b
// over D = 2L sub-layers, with budget k (sub-layers skipped per set), is
//
//   k(a, b) = (1 - w) * exp(-(H(a,b)/D)^2 / (2 l^2))  +  w * |a AND b| / k
//
// where H is the Hamming distance. The squared-exponential term models local structure
// (sets one or two swaps apart score alike); the linear term is Bayesian linear regression
// on the indicator vector, i.e. "each skipped sub-layer costs something", which lets a few
// hundred scored sets tell which sub-layers are cheap to skip. Observation noise (matchness
// over γ tokens is quantised to 1/γ) is added on the diagonal. The solve is a Cholesky
// factorisation; a matrix that is not numerically positive definite gets more jitter.
//
// Cost. fit() is O(n^2 D/64 + n^3/6) and predict() O(m n^2 / 2) for n training points and
// m queries; callers cap n (LayerSkipOptimizer uses 200).
//
// Threading: one thread at a time per object; const methods may run concurrently.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "trellis/runtime/swift/settings.hpp"

namespace trellis::runtime::swift {

struct GpOptions {
  double length_scale = 0.25;  // l, in units of the normalised Hamming distance H/D
  double noise = 1e-2;         // observation noise variance, in standardised units
  double linear_weight = 0.5;  // w in [0, 1]: share of the prior variance in the linear term
};

struct GpPrediction {
  double mean = 0.0;    // posterior mean, in the units of the observations
  double stddev = 0.0;  // posterior standard deviation of the latent function, same units
};

class SkipSetGp {
 public:
  // sub_layers = D = 2L >= 1; budget = k >= 1 (normalises the linear term). Throws
  // kInvalidArgument otherwise or when options are out of range.
  SkipSetGp(int sub_layers, int budget, GpOptions options = {});

  // Replaces the training set. xs[i] must have size D; xs.size() == ys.size() >= 1.
  void fit(std::span<const SkipSet> xs, std::span<const double> ys);

  // Posterior at each query (size D each). Requires a prior fit().
  std::vector<GpPrediction> predict(std::span<const SkipSet> xs) const;

  int size() const { return static_cast<int>(train_.size()); }
  // Largest observation of the last fit(), in observation units.
  double best_observed() const { return best_y_; }

 private:
  using Bits = std::vector<std::uint64_t>;
  Bits pack(const SkipSet& z) const;
  double kernel(const Bits& a, const Bits& b) const;

  int d_, budget_, words_;
  GpOptions options_;
  std::vector<double> se_by_distance_;  // the squared-exponential term for H = 0..D
  double linear_per_common_ = 0.0;      // w / k
  std::vector<Bits> train_;
  std::vector<double> chol_;   // lower-triangular factor, n x n row-major
  std::vector<double> alpha_;  // K^-1 (y - mean) / scale
  double y_mean_ = 0.0, y_scale_ = 1.0, best_y_ = 0.0;
};

// Expected improvement of a maximisation over `best` (Jones et al. 1998) with exploration
// margin xi >= 0: E[max(0, f - best - xi)] for f ~ N(mean, stddev^2). Zero stddev gives
// max(0, mean - best - xi).
double expected_improvement(double mean, double stddev, double best, double xi);

}  // namespace trellis::runtime::swift
