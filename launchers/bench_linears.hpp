// `trellis bench model`'s matmuls-alone pass (LinearsPass): the weight matrices of one decode
// step timed without the rest of the step, the ceiling the decode is measured against.
#pragma once

#include <map>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "trellis/kernels/context.hpp"
#include "trellis/kernels/tensor.hpp"

namespace trellis::launchers {

// The matmuls of one decode step alone: every weight matrix the step streams, in its order,
// times one activation row (what the step's matmul calls do, without attention, norms, RoPE,
// SwiGLU and the step's bookkeeping). Its time against the whole step's is the share of the
// step outside the matmuls; its bytes per second against the read-only stream, how close the
// matmul kernels themselves come to the limit (issue 23.1's measured ceiling). Kept per
// weight type too (a GGUF's Q4_1 layers and Q8_0 head run different kernels).
class LinearsPass {
 public:
  LinearsPass(const kernels::Context& ctx, std::vector<kernels::TensorView> weights);
  // One pass over every matrix; returns its time.
  double run();
  // The JSON report: medians over the passes, against the read-only stream `read_bps` and
  // the median decode step `step_s` (JSON `linears` of bench model).
  nlohmann::json report(double read_bps, double step_s) const;

 private:
  struct Type {
    double bytes = 0, pass = 0;
    int matrices = 0;
    std::vector<double> passes;
  };
  const kernels::Context& ctx_;
  std::vector<kernels::TensorView> w_;
  std::vector<float> x_, y_;
  std::map<std::string, Type> types_;
  std::vector<double> passes_;
};

}  // namespace trellis::launchers
