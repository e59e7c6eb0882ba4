// LinearsPass (bench_linears.hpp).
#include "bench_linears.hpp"

#include <algorithm>

#include "cmd_bench_kernels.hpp"
#include "trellis/core/clock.hpp"
#include "trellis/kernels/ops.hpp"

namespace trellis::launchers {

LinearsPass::LinearsPass(const kernels::Context& ctx, std::vector<kernels::TensorView> weights)
    : ctx_(ctx), w_(std::move(weights)) {
  std::int64_t k = 1, n = 1;
  for (const auto& w : w_) {
    k = std::max(k, w.cols());
    n = std::max(n, w.rows());
    auto& t = types_[std::string(kernels::to_string(w.dtype))];
    t.bytes += static_cast<double>(kernels::dtype_bytes(w.dtype, w.rows() * w.cols()));
    t.matrices += 1;
  }
  // Activations of the size a real row has, so quantised weights quantise a real row too.
  x_.resize(static_cast<std::size_t>(k));
  for (std::size_t i = 0; i < x_.size(); ++i) x_[i] = 0.01f * static_cast<float>((i * 7919) % 101) - 0.5f;
  y_.resize(static_cast<std::size_t>(n));
}

double LinearsPass::run() {
  for (auto& [name, t] : types_) t.pass = 0;
  double total = 0;
  for (const auto& w : w_) {
    const double t0 = now_seconds();
    kernels::matmul(ctx_, kernels::TensorView::matrix(x_.data(), kernels::DType::kF32, 1, w.cols()), w,
                    kernels::TensorView::matrix(y_.data(), kernels::DType::kF32, 1, w.rows()));
    const double dt = now_seconds() - t0;
    types_[std::string(kernels::to_string(w.dtype))].pass += dt;
    total += dt;
  }
  for (auto& [name, t] : types_) t.passes.push_back(t.pass);
  passes_.push_back(total);
  return total;
}

nlohmann::json LinearsPass::report(double read_bps, double step_s) const {
  double bytes = 0;
  nlohmann::json types = nlohmann::json::object();
  for (const auto& [name, t] : types_) {
    bytes += t.bytes;
    const double s = median(t.passes);
    types[name] = {{"matrices", t.matrices}, {"bytes", t.bytes}, {"s", s}, {"fraction_of_read", t.bytes / s / read_bps}};
  }
  const double s = median(passes_);
  return {{"weight_bytes_per_token", bytes}, {"tokens_per_s", 1.0 / s}, {"fraction_of_read_limit", bytes / s / read_bps},
          {"share_of_step", s / step_s}, {"by_type", types}};
}

}  // namespace trellis::launchers
