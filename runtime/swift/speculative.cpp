#include "trellis/runtime/swift/speculative.hpp"

#include "trellis/core/error.hpp"

namespace trellis::runtime::swift {

double uniform01(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

std::int32_t sample_categorical(std::span<const float> weights, std::mt19937_64& rng) {
  double total = 0.0;
  for (const float w : weights) total += w > 0.0F ? w : 0.0F;
  if (!(total > 0.0)) {
    throw_error(ErrorCode::kInvalidArgument, "swift: cannot sample from {} weights with total {}", weights.size(),
                total);
  }
  const double u = uniform01(rng) * total;
  double acc = 0.0;
  std::int32_t last_positive = 0;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    if (!(weights[i] > 0.0F)) continue;
    acc += weights[i];
    last_positive = static_cast<std::int32_t>(i);
    if (u < acc) return last_positive;
  }
  // Rounding can leave u just above the running sum; the last positive entry owns that mass.
  return last_positive;
}

std::vector<std::int32_t> speculative_accept(std::span<const std::int32_t> draft,
                                             std::span<const std::vector<float>> q,
                                             std::span<const std::vector<float>> p, std::mt19937_64& rng) {
  const std::size_t n = draft.size();
  if (q.size() != n || p.size() != n + 1) {
    throw_error(ErrorCode::kInvalidArgument,
                "swift: speculative_accept needs one draft distribution per draft token and one more target one "
                "(draft {}, q {}, p {})",
                n, q.size(), p.size());
  }
  const std::size_t vocab = p[0].size();
  if (vocab == 0) throw_error(ErrorCode::kInvalidArgument, "swift: speculative_accept with an empty vocabulary");
  for (std::size_t i = 0; i <= n; ++i) {
    if (p[i].size() != vocab || (i < n && q[i].size() != vocab)) {
      throw_error(ErrorCode::kInvalidArgument, "swift: distribution {} does not have the vocabulary size {}", i, vocab);
    }
  }

  std::vector<std::int32_t> out;
  out.reserve(n + 1);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int32_t x = draft[i];
    if (x < 0 || static_cast<std::size_t>(x) >= vocab) {
      throw_error(ErrorCode::kInvalidArgument, "swift: draft token {} at position {} is outside the vocabulary [0, {})",
                  x, i, vocab);
    }
    const double px = p[i][static_cast<std::size_t>(x)];
    const double qx = q[i][static_cast<std::size_t>(x)];
    // u < p/q, multiplied out so q(x) = 0 (a token the draft could not have drawn) neither
    // divides by zero nor is accepted unless the target gives it mass.
    if (uniform01(rng) * qx < px) {
      out.push_back(x);
      continue;
    }
    // Rejected, so p(x) < q(x) and the residual has positive mass (up to rounding: where it
    // vanishes p and q agree and p itself is the right distribution).
    std::vector<float> residual(vocab);
    double total = 0.0;
    for (std::size_t v = 0; v < vocab; ++v) {
      const float d = p[i][v] - q[i][v];
      residual[v] = d > 0.0F ? d : 0.0F;
      total += residual[v];
    }
    out.push_back(total > 0.0 ? sample_categorical(residual, rng) : sample_categorical(p[i], rng));
    return out;
  }
  out.push_back(sample_categorical(p[n], rng));
  return out;
}

}  // namespace trellis::runtime::swift
