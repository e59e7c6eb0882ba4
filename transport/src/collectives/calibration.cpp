#include "trellis/transport/calibration.hpp"

#include <algorithm>

namespace trellis::transport {

AlphaBandwidth fit_alpha_bandwidth(std::vector<TimedSize> points, std::size_t small_bytes) {
  AlphaBandwidth f;
  if (points.empty()) return f;
  std::sort(points.begin(), points.end(), [](const TimedSize& a, const TimedSize& b) { return a.bytes < b.bytes; });
  std::vector<double> small;
  for (const auto& p : points)
    if (p.bytes <= small_bytes) small.push_back(p.seconds);
  if (small.empty()) small.push_back(points.front().seconds);
  std::sort(small.begin(), small.end());
  f.alpha_s = small[small.size() / 2];
  const auto& big = points.back();
  // A fitted bandwidth from a size whose time is dominated by alpha would be noise.
  if (big.seconds > f.alpha_s * 1.5) f.bandwidth = static_cast<double>(big.bytes) / (big.seconds - f.alpha_s);
  return f;
}

}  // namespace trellis::transport
