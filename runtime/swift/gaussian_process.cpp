#include "trellis/runtime/swift/gaussian_process.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numbers>

#include "trellis/core/error.hpp"

namespace trellis::runtime::swift {
namespace {

// Eight independent partial sums: the compiler keeps them in one vector register, whereas a
// single running sum (or a few scalar ones) forces in-order adds it may not reorder.
double dot(const double* a, const double* b, int n) {
  constexpr int kLanes = 8;
  double acc[kLanes] = {};
  int t = 0;
  for (; t + kLanes <= n; t += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += a[t + l] * b[t + l];
  }
  double sum = 0.0;
  for (; t < n; ++t) sum += a[t] * b[t];
  for (int l = 0; l < kLanes; ++l) sum += acc[l];
  return sum;
}

// In-place Cholesky of an n x n row-major SPD matrix into its lower factor L (A = L L^T),
// with zeros above the diagonal. Returns false when a pivot is not positive, leaving `a`
// partly overwritten. Row by row, so every inner product runs over two contiguous rows.
bool cholesky(std::vector<double>& a, int n) {
  for (int i = 0; i < n; ++i) {
    double* ri = &a[static_cast<std::size_t>(i) * n];
    for (int j = 0; j < i; ++j) {
      const double* rj = &a[static_cast<std::size_t>(j) * n];
      ri[j] = (ri[j] - dot(ri, rj, j)) / rj[j];
    }
    const double pivot = ri[i] - dot(ri, ri, i);
    if (!(pivot > 0.0)) return false;
    ri[i] = std::sqrt(pivot);
    for (int j = i + 1; j < n; ++j) ri[j] = 0.0;
  }
  return true;
}

}  // namespace

SkipSetGp::SkipSetGp(int sub_layers, int budget, GpOptions options)
    : d_(sub_layers), budget_(budget), words_((sub_layers + 63) / 64), options_(options) {
  if (sub_layers < 1 || budget < 1) {
    throw_error(ErrorCode::kInvalidArgument, "SkipSetGp needs sub_layers >= 1 and budget >= 1 (got {} and {})",
                sub_layers, budget);
  }
  if (!(options.length_scale > 0.0) || !(options.noise > 0.0) ||
      !(options.linear_weight >= 0.0 && options.linear_weight <= 1.0)) {
    throw_error(ErrorCode::kInvalidArgument,
                "SkipSetGp options out of range: length_scale {} and noise {} must be > 0, linear_weight {} in [0, 1]",
                options.length_scale, options.noise, options.linear_weight);
  }
  linear_per_common_ = options_.linear_weight / budget_;
  // The Hamming distance takes only D + 1 values, so the exponential is tabulated once.
  se_by_distance_.resize(static_cast<std::size_t>(d_) + 1);
  for (int h = 0; h <= d_; ++h) {
    const double x = static_cast<double>(h) / d_;
    se_by_distance_[static_cast<std::size_t>(h)] =
        (1.0 - options_.linear_weight) * std::exp(-x * x / (2.0 * options_.length_scale * options_.length_scale));
  }
}

SkipSetGp::Bits SkipSetGp::pack(const SkipSet& z) const {
  if (static_cast<int>(z.size()) != d_) {
    throw_error(ErrorCode::kInvalidArgument, "skip set has {} entries, the GP was built for {}", z.size(), d_);
  }
  Bits bits(static_cast<std::size_t>(words_), 0);
  for (int i = 0; i < d_; ++i) {
    if (z[static_cast<std::size_t>(i)] != 0) bits[static_cast<std::size_t>(i / 64)] |= std::uint64_t{1} << (i % 64);
  }
  return bits;
}

double SkipSetGp::kernel(const Bits& a, const Bits& b) const {
  int hamming = 0;
  int common = 0;
  for (int w = 0; w < words_; ++w) {
    hamming += std::popcount(a[static_cast<std::size_t>(w)] ^ b[static_cast<std::size_t>(w)]);
    common += std::popcount(a[static_cast<std::size_t>(w)] & b[static_cast<std::size_t>(w)]);
  }
  return se_by_distance_[static_cast<std::size_t>(hamming)] + linear_per_common_ * common;
}

void SkipSetGp::fit(std::span<const SkipSet> xs, std::span<const double> ys) {
  if (xs.empty() || xs.size() != ys.size()) {
    throw_error(ErrorCode::kInvalidArgument, "SkipSetGp::fit needs as many scores as sets, at least one (got {} and {})",
                xs.size(), ys.size());
  }
  const int n = static_cast<int>(xs.size());
  train_.clear();
  train_.reserve(xs.size());
  for (const SkipSet& z : xs) train_.push_back(pack(z));

  double mean = 0.0;
  best_y_ = ys[0];
  for (const double y : ys) {
    mean += y;
    best_y_ = std::max(best_y_, y);
  }
  mean /= n;
  double var = 0.0;
  for (const double y : ys) var += (y - mean) * (y - mean);
  var /= n;
  y_mean_ = mean;
  // All-equal scores carry no scale; 1 keeps the prior broad instead of dividing by zero.
  y_scale_ = var > 1e-18 ? std::sqrt(var) : 1.0;

  std::vector<double> gram(static_cast<std::size_t>(n) * n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j <= i; ++j) {
      const double k = kernel(train_[static_cast<std::size_t>(i)], train_[static_cast<std::size_t>(j)]);
      gram[static_cast<std::size_t>(i) * n + j] = k;
      gram[static_cast<std::size_t>(j) * n + i] = k;
    }
  }
  // Duplicated sets make the Gram matrix singular up to the noise term; rounding can still
  // push a pivot below zero, so retry with ten times more jitter a few times.
  double jitter = options_.noise;
  for (int attempt = 0;; ++attempt) {
    chol_ = gram;
    for (int i = 0; i < n; ++i) chol_[static_cast<std::size_t>(i) * n + i] += jitter;
    if (cholesky(chol_, n)) break;
    if (attempt == 6) {
      throw_error(ErrorCode::kInternal, "SkipSetGp: Gram matrix of {} points is not positive definite", n);
    }
    jitter *= 10.0;
  }

  // alpha = L^-T L^-1 y, by forward then backward substitution.
  alpha_.assign(static_cast<std::size_t>(n), 0.0);
  for (int i = 0; i < n; ++i) {
    const double sum = (ys[static_cast<std::size_t>(i)] - y_mean_) / y_scale_ -
                       dot(&chol_[static_cast<std::size_t>(i) * n], alpha_.data(), i);
    alpha_[static_cast<std::size_t>(i)] = sum / chol_[static_cast<std::size_t>(i) * n + i];
  }
  for (int i = n - 1; i >= 0; --i) {
    double sum = alpha_[static_cast<std::size_t>(i)];
    for (int t = i + 1; t < n; ++t) sum -= chol_[static_cast<std::size_t>(t) * n + i] * alpha_[static_cast<std::size_t>(t)];
    alpha_[static_cast<std::size_t>(i)] = sum / chol_[static_cast<std::size_t>(i) * n + i];
  }
}

std::vector<GpPrediction> SkipSetGp::predict(std::span<const SkipSet> xs) const {
  if (train_.empty()) throw_error(ErrorCode::kInvalidArgument, "SkipSetGp::predict before fit");
  const int n = size();
  const int m = static_cast<int>(xs.size());
  std::vector<Bits> query;
  query.reserve(xs.size());
  for (const SkipSet& z : xs) query.push_back(pack(z));

  // v holds k(train_i, query_c) as n rows of m; the forward substitution L v' = v then runs
  // along rows, so its inner loop is over the m queries and vectorises.
  std::vector<double> v(static_cast<std::size_t>(n) * m);
  std::vector<GpPrediction> out(xs.size());
  std::vector<double> reduction(xs.size(), 0.0);  // |L^-1 k*|^2 per query
  for (int i = 0; i < n; ++i) {
    for (int c = 0; c < m; ++c) {
      v[static_cast<std::size_t>(i) * m + c] =
          kernel(train_[static_cast<std::size_t>(i)], query[static_cast<std::size_t>(c)]);
    }
  }
  for (int i = 0; i < n; ++i) {
    const double a = alpha_[static_cast<std::size_t>(i)];
    for (int c = 0; c < m; ++c) out[static_cast<std::size_t>(c)].mean += v[static_cast<std::size_t>(i) * m + c] * a;
  }
  for (int i = 0; i < n; ++i) {
    double* vi = &v[static_cast<std::size_t>(i) * m];
    const double* li = &chol_[static_cast<std::size_t>(i) * n];
    int t = 0;
    // Four rows per pass: a quarter of the loads and stores of row i, which bound this loop.
    for (; t + 4 <= i; t += 4) {
      const double* v0 = &v[static_cast<std::size_t>(t) * m];
      const double* v1 = v0 + m;
      const double* v2 = v1 + m;
      const double* v3 = v2 + m;
      for (int c = 0; c < m; ++c) vi[c] -= (li[t] * v0[c] + li[t + 1] * v1[c]) + (li[t + 2] * v2[c] + li[t + 3] * v3[c]);
    }
    for (; t < i; ++t) {
      const double* vt = &v[static_cast<std::size_t>(t) * m];
      for (int c = 0; c < m; ++c) vi[c] -= li[t] * vt[c];
    }
    const double inv = 1.0 / chol_[static_cast<std::size_t>(i) * n + i];
    for (int c = 0; c < m; ++c) {
      vi[c] *= inv;
      reduction[static_cast<std::size_t>(c)] += vi[c] * vi[c];
    }
  }
  for (int c = 0; c < m; ++c) {
    const Bits& q = query[static_cast<std::size_t>(c)];
    const double var = std::max(0.0, kernel(q, q) - reduction[static_cast<std::size_t>(c)]);
    GpPrediction& p = out[static_cast<std::size_t>(c)];
    p.mean = y_mean_ + y_scale_ * p.mean;
    p.stddev = y_scale_ * std::sqrt(var);
  }
  return out;
}

double expected_improvement(double mean, double stddev, double best, double xi) {
  const double gain = mean - best - xi;
  if (!(stddev > 0.0)) return std::max(0.0, gain);
  const double z = gain / stddev;
  const double pdf = std::exp(-0.5 * z * z) / std::sqrt(2.0 * std::numbers::pi);
  const double cdf = 0.5 * std::erfc(-z / std::numbers::sqrt2);
  return gain * cdf + stddev * pdf;
}

}  // namespace trellis::runtime::swift
