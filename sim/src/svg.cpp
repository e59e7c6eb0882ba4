// The throughput-latency chart, written by hand: axes with "nice" ticks, one polyline with
// markers per variant (its Pareto frontier), a legend. X is TPOT in ms on a log scale
// (decode latencies span orders of magnitude between batch 1 and 256), Y is tokens/s.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "trellis/sim/planner.hpp"

namespace trellis::sim {
namespace {

constexpr double kW = 760, kH = 480, kLeft = 80, kRight = 170, kTop = 40, kBottom = 60;
constexpr const char* kColours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#7f7f7f"};

std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else o += c;
  }
  return o;
}

double nice_step(double range) {
  const double raw = range / 5, mag = std::pow(10, std::floor(std::log10(raw)));
  for (double f : {1.0, 2.0, 5.0, 10.0})
    if (raw <= f * mag) return f * mag;
  return 10 * mag;
}

}  // namespace

std::string pareto_svg(const PlanResult& result, const std::string& title) {
  std::vector<std::pair<Variant, std::vector<const Candidate*>>> series;
  double xmin = 1e300, xmax = 0, ymax = 0;
  for (Variant v : all_variants()) {
    auto front = pareto_front(result.feasible(), v);
    if (front.empty()) continue;
    for (const Candidate* c : front) {
      xmin = std::min(xmin, c->prediction.tpot_s * 1e3);
      xmax = std::max(xmax, c->prediction.tpot_s * 1e3);
      ymax = std::max(ymax, c->total_tokens_per_s);
    }
    series.emplace_back(v, std::move(front));
  }
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"22\" font-size=\"15\" text-anchor=\"middle\">{}</text>\n",
      kW, kH, (kW - kRight + kLeft) / 2, escape(title));
  if (series.empty()) return s + "<text x=\"100\" y=\"200\">no feasible configuration</text>\n</svg>\n";
  const double lx0 = std::floor(std::log10(xmin)), lx1 = std::max(lx0 + 1, std::ceil(std::log10(xmax)));
  const double ystep = nice_step(ymax), ytop = std::ceil(ymax / ystep) * ystep;
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  auto X = [&](double ms) { return kLeft + (std::log10(ms) - lx0) / (lx1 - lx0) * pw; };
  auto Y = [&](double v) { return kTop + ph - v / ytop * ph; };
  s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#333\"/>\n", kLeft, kTop, pw, ph);
  for (double e = lx0; e <= lx1; ++e)
    for (double f : {1.0, 2.0, 5.0}) {
      const double v = f * std::pow(10, e);
      if (std::log10(v) > lx1 + 1e-9) break;
      s += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#ddd\"/>"
                       "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4:g}</text>\n",
                       X(v), kTop, kTop + ph, kTop + ph + 16, v);
    }
  for (double v = 0; v <= ytop + 1e-9; v += ystep)
    s += fmt::format("<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#ddd\"/>"
                     "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5:g}</text>\n",
                     kLeft, Y(v), kLeft + pw, kLeft - 6, Y(v) + 4, v);
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">TPOT (ms, log scale)</text>\n", kLeft + pw / 2, kH - 18);
  s += fmt::format("<text transform=\"translate(18,{}) rotate(-90)\" text-anchor=\"middle\">throughput "
                   "(generated tokens/s, whole cluster)</text>\n", kTop + ph / 2);
  for (std::size_t i = 0; i < series.size(); ++i) {
    const char* col = kColours[static_cast<std::size_t>(series[i].first) % 7];
    std::string pts;
    for (const Candidate* c : series[i].second)
      pts += fmt::format("{:.1f},{:.1f} ", X(c->prediction.tpot_s * 1e3), Y(c->total_tokens_per_s));
    // parallel and desync2 block on the same all-reduces and coincide: dash the later one.
    const bool dashed = series[i].first == Variant::kDesync2 || series[i].first == Variant::kNoComm;
    s += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\"{} points=\"{}\"/>\n", col,
                     dashed ? " stroke-dasharray=\"6,4\"" : "", pts);
    for (const Candidate* c : series[i].second)
      s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"><title>{} d={} p={} t={} m={} "
                       "batch {}: {:.0f} tok/s, TPOT {:.2f} ms</title></circle>\n",
                       X(c->prediction.tpot_s * 1e3), Y(c->total_tokens_per_s), col, to_string(c->layout.variant),
                       c->replicas, c->layout.p, c->layout.t, c->layout.microbatches, c->batch, c->total_tokens_per_s,
                       c->prediction.tpot_s * 1e3);
    const double ly = kTop + 10 + 20.0 * static_cast<double>(i);
    s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"{3}\" stroke-width=\"3\"/>"
                     "<text x=\"{4}\" y=\"{5}\">{6}{7}</text>\n",
                     kW - kRight + 14, ly, kW - kRight + 38, col, kW - kRight + 44, ly + 4,
                     to_string(series[i].first), series[i].first == Variant::kNoComm ? " (bound)" : "");
  }
  return s + "</svg>\n";
}

}  // namespace trellis::sim
