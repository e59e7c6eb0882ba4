// The alpha/bandwidth fit that turns bench comm's medians into the planner's link model.
#include <gtest/gtest.h>

#include "trellis/transport/calibration.hpp"

namespace trellis::transport {
namespace {

TEST(CalibrationFit, RecoversAlphaAndBandwidthOfALinearModel) {
  const double alpha = 2e-6, bw = 5e9;
  std::vector<TimedSize> pts;
  for (std::size_t n = 8; n <= (64u << 20); n *= 8) pts.push_back({n, alpha + static_cast<double>(n) / bw});
  std::swap(pts.front(), pts.back());  // any order
  auto f = fit_alpha_bandwidth(pts);
  EXPECT_NEAR(f.alpha_s, alpha, 0.02e-6);  // small messages still move a few bytes
  EXPECT_NEAR(f.bandwidth, bw, 0.01 * bw);
}

TEST(CalibrationFit, AlphaIsTheMedianOfSmallMessages) {
  auto f = fit_alpha_bandwidth({{8, 1e-6}, {16, 9e-6}, {32, 2e-6}, {1u << 20, 1e-3}});
  EXPECT_DOUBLE_EQ(f.alpha_s, 2e-6);
}

TEST(CalibrationFit, NoBandwidthWhenTheLargestSizeIsAllLatency) {
  auto f = fit_alpha_bandwidth({{8, 1e-6}, {64, 1.1e-6}});
  EXPECT_EQ(f.bandwidth, 0);
  EXPECT_EQ(fit_alpha_bandwidth({}).alpha_s, 0);
}

}  // namespace
}  // namespace trellis::transport
