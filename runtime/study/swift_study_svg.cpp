// The SWIFT study's chart (swift_study.hpp format_swift_svg): the paper's Figure 6 (left),
// written by hand in the style of the variant study's chart (variant_study.cpp) — one panel
// per task, matchness on the left axis, speedup on the right, the optimisation phase shaded.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "trellis/core/strings.hpp"
#include "trellis/runtime/study/swift_study.hpp"

namespace trellis::runtime {
namespace {

constexpr double kWidth = 820, kLeft = 60, kRight = 70, kTop = 56, kPanelH = 170, kGap = 70;
constexpr const char* kMatchColour = "#4c72b0";
constexpr const char* kSpeedColour = "#dd8452";
constexpr const char* kWallColour = "#55a868";
constexpr const char* kBadColour = "#c44e52";


// Every k-th point and the last, so that no series has more than `max_points`.
std::vector<std::pair<double, double>> thin(const std::vector<std::pair<double, double>>& v, int max_points) {
  if (max_points < 2 || static_cast<int>(v.size()) <= max_points) return v;
  const std::size_t stride = (v.size() + static_cast<std::size_t>(max_points) - 2) / static_cast<std::size_t>(max_points - 1);
  std::vector<std::pair<double, double>> out;
  for (std::size_t i = 0; i < v.size(); i += stride) out.push_back(v[i]);
  if (out.back() != v.back()) out.push_back(v.back());
  return out;
}

// A tick step of 1, 2 or 5 x 10^k giving about four ticks up to `top`.
double tick_step(double top) {
  const double raw = top / 4, mag = std::pow(10, std::floor(std::log10(raw)));
  for (double f : {1.0, 2.0, 5.0})
    if (raw <= f * mag) return f * mag;
  return 10 * mag;
}

struct Panel {
  double y0, tmax, smax;
  double x(double t) const { return kLeft + (kWidth - kLeft - kRight) * (tmax > 0 ? t / tmax : 0); }
  double y_match(double m) const { return y0 + kPanelH * (1 - m); }
  double y_speed(double s) const { return y0 + kPanelH * (1 - s / smax); }
};

std::string polyline(const std::vector<std::pair<double, double>>& pts, const char* colour, const char* what) {
  std::string p;
  for (const auto& [x, y] : pts) p += fmt::format("{:.1f},{:.1f} ", x, y);
  return fmt::format(R"(<polyline fill="none" stroke="{}" stroke-width="1.5" points="{}"><title>{}</title></polyline>)",
                     colour, p, what) + "\n";
}

void axes(std::ostringstream& o, const Panel& p) {
  const double right = kWidth - kRight;
  o << fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="none" stroke="#333333" stroke-width="0.5"/>)",
                   kLeft, p.y0, right - kLeft, kPanelH)
    << "\n";
  for (double m = 0; m <= 1.0 + 1e-9; m += 0.25) {
    o << fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#e0e0e0"/>)", kLeft, p.y_match(m),
                     right, p.y_match(m))
      << fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="end" fill="{}">{:.2f}</text>)", kLeft - 4,
                     p.y_match(m) + 4, kMatchColour, m)
      << "\n";
  }
  const double step = tick_step(p.smax);
  for (double s = 0; s <= p.smax + 1e-9; s += step)
    o << fmt::format(R"(<text x="{:.1f}" y="{:.1f}" fill="{}">{:g}x</text>)", right + 4, p.y_speed(s) + 4, kSpeedColour, s)
      << "\n";
  const double tstep = tick_step(p.tmax);
  for (double t = 0; t <= p.tmax + 1e-9; t += tstep)
    o << fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle">{:g}</text>)", p.x(t), p.y0 + kPanelH + 14, t)
      << "\n";
  o << fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle">seconds since the first SWIFT iteration</text>)",
                   (kLeft + right) / 2, p.y0 + kPanelH + 30)
    << "\n";
}

// While the optimiser runs, every SWIFT cycle scores one candidate before it drafts and
// verifies, so optimisation points (speedup 0) alternate with verify points; the phase ends
// where verify points follow each other with no optimisation between. Two optimisation
// points with at most this many verify points between them belong to one phase.
constexpr int kPhaseGap = 8;

// The optimisation phases (the first, and any re-entry), shaded.
void optimisation_phases(std::ostringstream& o, const Panel& p, const std::vector<SwiftReport::Point>& tl) {
  std::size_t i = 0;
  while (i < tl.size()) {
    if (tl[i].instance_speedup != 0) {
      ++i;
      continue;
    }
    std::size_t last = i, steps = 1;
    int gap = 0;
    for (std::size_t j = i + 1; j < tl.size() && gap <= kPhaseGap; ++j) {
      if (tl[j].instance_speedup == 0) {
        last = j;
        ++steps;
        gap = 0;
      } else {
        ++gap;
      }
    }
    const double x0 = p.x(tl[i].t_s), x1 = std::max(p.x(tl[last].t_s), x0 + 1);
    o << fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="#eeeeee">)", x0, p.y0, x1 - x0,
                     kPanelH)
      << fmt::format("<title>optimisation: {} steps, {:.3f}-{:.3f} s</title></rect>\n", steps, tl[i].t_s,
                     tl[last].t_s);
    i = last + 1;
  }
}

// The title in lines of about `width` characters, broken after "; " or ", ".
std::vector<std::string> wrap(const std::string& text, std::size_t width) {
  std::vector<std::string> lines(1);
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t cut = text.size();
    for (const char* sep : {"; ", ", "}) {
      const auto at = text.find(sep, start);
      if (at != std::string::npos) cut = std::min(cut, at + 2);
    }
    const std::string piece = text.substr(start, cut - start);
    if (!lines.back().empty() && lines.back().size() + piece.size() > width) lines.emplace_back();
    lines.back() += piece;
    start = cut;
  }
  return lines;
}

void panel(std::ostringstream& o, const SwiftTaskResult& t, double y0, int max_points) {
  const bool bad = !t.outputs.identical();
  std::string head = fmt::format("{}: wall-clock speedup {:.2f}x", t.task, t.speedup());
  if (t.swift)
    head += fmt::format(", M {:.2f}, α {:.2f}, skip {}/{}", t.swift->mean_generated_length(), t.swift->acceptance_rate(),
                        t.swift->skipped, t.swift->sub_layers);
  o << fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="12">{})", kLeft, y0 - 8, xml_escape(head));
  if (bad)
    o << fmt::format(R"( <tspan fill="{}" font-weight="bold">OUTPUTS DIFFER from plain decoding ({} of {})</tspan>)",
                     kBadColour, t.outputs.differing, t.outputs.requests + t.outputs.unmatched);
  o << "</text>\n";
  const std::vector<SwiftReport::Point> none;
  const auto& tl = t.swift ? t.swift->timeline : none;
  Panel p{y0, 0, std::max({1.5, 1.1 * t.speedup()})};
  for (const auto& q : tl) {
    p.tmax = std::max(p.tmax, q.t_s);
    p.smax = std::max(p.smax, 1.1 * q.instance_speedup);
  }
  if (p.tmax <= 0) p.tmax = 1;
  optimisation_phases(o, p, tl);
  axes(o, p);
  if (tl.empty())
    o << fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle">no SWIFT iterations</text>)",
                     (kLeft + kWidth - kRight) / 2, y0 + kPanelH / 2)
      << "\n";
  auto hline = [&](double y, const char* colour, const std::string& label) {
    o << fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="{}" stroke-dasharray="4,3"/>)", kLeft,
                     y, kWidth - kRight, y, colour)
      << fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="end" fill="{}">{}</text>)", kWidth - kRight - 4, y - 3,
                     colour, xml_escape(label))
      << "\n";
  };
  hline(p.y_speed(1), "#999999", "plain = 1x");
  if (t.speedup() > 0) hline(p.y_speed(t.speedup()), kWallColour, fmt::format("wall clock {:.2f}x", t.speedup()));
  std::vector<std::pair<double, double>> match, speed;
  for (const auto& q : tl) {
    if (q.matchness >= 0) match.emplace_back(p.x(q.t_s), p.y_match(q.matchness));
    if (q.instance_speedup > 0) speed.emplace_back(p.x(q.t_s), p.y_speed(q.instance_speedup));
  }
  if (!match.empty()) o << polyline(thin(match, max_points), kMatchColour, "matchness (best so far)");
  if (!speed.empty()) o << polyline(thin(speed, max_points), kSpeedColour, "speedup at each verify pass");
}

}  // namespace

std::string format_swift_svg(const SwiftStudy& s, int max_points) {
  const double n = static_cast<double>(std::max<std::size_t>(1, s.tasks.size()));
  const auto title = wrap(s.title, 110);
  const double top = kTop + 16 * static_cast<double>(title.size() - 1);  // below the title and legend
  const double height = top + n * (kPanelH + kGap) + 10;
  std::ostringstream o;
  o << fmt::format(R"(<svg xmlns="http://www.w3.org/2000/svg" width="{:.0f}" height="{:.0f}" font-family="sans-serif" font-size="11">)",
                   kWidth, height)
    << "\n"
    << R"(<rect width="100%" height="100%" fill="white"/>)" << "\n";
  for (std::size_t i = 0; i < title.size(); ++i)
    o << fmt::format(R"(<text x="{:.0f}" y="{:.0f}" font-size="13">{}</text>)", kLeft / 2, 18 + 16 * static_cast<double>(i),
                     xml_escape(title[i]))
      << "\n";
  // Legend, one line.
  const double ly = top - 28;
  double lx = kLeft;
  for (auto [colour, label] : {std::pair{kMatchColour, "matchness (left axis)"},
                               std::pair{kSpeedColour, "speedup at each verify pass (right axis)"},
                               std::pair{kWallColour, "wall-clock speedup over plain"},
                               std::pair{"#eeeeee", "optimisation phase"}}) {
    o << fmt::format(R"(<rect x="{:.1f}" y="{:.0f}" width="12" height="12" fill="{}" stroke="#333333" stroke-width="0.5"/>)",
                     lx, ly, colour)
      << fmt::format(R"(<text x="{:.1f}" y="{:.0f}">{}</text>)", lx + 16, ly + 10, label) << "\n";
    lx += 24 + 5.8 * static_cast<double>(std::string_view(label).size());
  }
  for (std::size_t i = 0; i < s.tasks.size(); ++i)
    panel(o, s.tasks[i], top + 20 + static_cast<double>(i) * (kPanelH + kGap), max_points);
  if (s.tasks.empty()) o << fmt::format(R"(<text x="{:.0f}" y="{:.0f}">no tasks</text>)", kLeft, top + 40) << "\n";
  o << "</svg>\n";
  return o.str();
}

}  // namespace trellis::runtime
