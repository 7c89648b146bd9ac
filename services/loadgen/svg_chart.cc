#include "services/loadgen/svg_chart.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace cleave::loadgen {
namespace {

constexpr double kWidth = 600, kHeight = 380;
constexpr double kLeft = 70, kRight = 20, kTop = 40, kBottom = 50;
constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c",
                                   "#ff7f0e", "#9467bd", "#8c564b"};

// The smallest 1, 2 or 5 times a power of ten that splits [0, max] into at most 6 steps.
double tickStep(double max) {
  if (max <= 0) return 1;
  const double raw = max / 6;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * power >= raw) return m * power;
  }
  return 10 * power;
}

// Tick labels: whole numbers as such (12000, not 1.2e+04), others to 3 digits.
std::string tickLabel(double v) {
  if (std::abs(v) >= 1 && std::abs(v) < 1e9 && v == std::round(v)) {
    return absl::StrFormat("%.0f", v);
  }
  return absl::StrFormat("%.3g", v);
}

// Values in data attributes and tooltips.
std::string number(double v) { return absl::StrFormat("%.6g", v); }

}  // namespace

std::string xmlEscape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string renderSvg(const Chart& chart) {
  double max_x = 0, max_y = 0;
  for (const ChartSeries& s : chart.series) {
    for (double v : s.x) max_x = std::max(max_x, v);
    for (double v : s.y) max_y = std::max(max_y, v);
  }
  const double step_x = tickStep(max_x), step_y = tickStep(max_y);
  const double top_x = std::max(step_x, std::ceil(max_x / step_x) * step_x);
  const double top_y = std::max(step_y, std::ceil(max_y / step_y) * step_y);
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  auto px = [&](double x) { return kLeft + plot_w * x / top_x; };
  auto py = [&](double y) { return kTop + plot_h * (1 - y / top_y); };

  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" viewBox=\"0 0 %g %g\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n",
      kWidth, kHeight, kWidth, kHeight);
  absl::StrAppend(&svg, "<title>", xmlEscape(chart.title), "</title>\n");
  absl::StrAppendFormat(&svg,
                        "<text x=\"%g\" y=\"22\" font-size=\"15\" font-weight=\"bold\">%s</text>\n",
                        kLeft, xmlEscape(chart.title));
  // Grid, ticks and axis labels.
  for (double v = 0; v <= top_x + step_x / 2; v += step_x) {
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                          px(v), py(0), px(v), py(top_y), px(v), py(0) + 16, tickLabel(v));
  }
  for (double v = 0; v <= top_y + step_y / 2; v += step_y) {
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                          px(0), py(v), px(top_x), py(v), px(0) - 6, py(v) + 4, tickLabel(v));
  }
  absl::StrAppendFormat(&svg,
                        "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
                        "stroke=\"#444\"/>\n",
                        kLeft, kTop, plot_w, plot_h);
  absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                        kLeft + plot_w / 2, kHeight - 10, xmlEscape(chart.x_label));
  absl::StrAppendFormat(&svg,
                        "<text transform=\"translate(16 %.1f) rotate(-90)\" "
                        "text-anchor=\"middle\">%s</text>\n",
                        kTop + plot_h / 2, xmlEscape(chart.y_label));
  // Series and legend.
  for (size_t i = 0; i < chart.series.size(); ++i) {
    const ChartSeries& s = chart.series[i];
    const char* color =
        kColors[(s.color >= 0 ? static_cast<size_t>(s.color) : i) % std::size(kColors)];
    const char* dash = s.dashed ? " stroke-dasharray=\"6 4\"" : "";
    std::string points;
    for (size_t j = 0; j < s.x.size(); ++j) {
      absl::StrAppendFormat(&points, "%s%.1f,%.1f", j ? " " : "", px(s.x[j]), py(s.y[j]));
    }
    absl::StrAppendFormat(&svg,
                          "<g class=\"series\" data-name=\"%s\">\n<polyline points=\"%s\" "
                          "fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s/>\n",
                          xmlEscape(s.name), points, color, dash);
    for (size_t j = 0; j < s.x.size(); ++j) {
      const std::string tip = j < s.tips.size() ? s.tips[j] : "";
      absl::StrAppendFormat(&svg,
                            "<circle class=\"point\" cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\" "
                            "data-x=\"%s\" data-y=\"%s\"><title>%s: %s, %s %s</title></circle>\n",
                            px(s.x[j]), py(s.y[j]), color, number(s.x[j]), number(s.y[j]),
                            xmlEscape(s.name), number(s.x[j]), number(s.y[j]), xmlEscape(tip));
    }
    const double ly = kTop + 14 + 16 * static_cast<double>(i);
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                          "stroke-width=\"2\"%s/><text x=\"%.1f\" y=\"%.1f\">%s</text>\n</g>\n",
                          kLeft + 10, ly - 4, kLeft + 34, ly - 4, color, dash, kLeft + 40, ly,
                          xmlEscape(s.name));
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace cleave::loadgen
