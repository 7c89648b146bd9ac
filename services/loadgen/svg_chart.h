// A line chart as a self-contained SVG element: axes with round ticks, one polyline and
// labelled points per series, a legend. Every point is a <circle class="point"> carrying
// data-x / data-y (its values) and a <title> tooltip, so the chart can be checked by
// parsing it.
#pragma once

#include <string>
#include <vector>

namespace cleave::loadgen {

struct ChartSeries {
  std::string name;
  std::vector<double> x, y;       // Same length; drawn in this order.
  std::vector<std::string> tips;  // Optional tooltip per point.
  bool dashed = false;
  int color = -1;  // Index into the palette; -1: the series' position.
};

struct Chart {
  std::string title, x_label, y_label;
  std::vector<ChartSeries> series;
};

// Values must be finite; both axes start at 0.
std::string renderSvg(const Chart& chart);

// Escapes &, <, >, " for XML text and attributes.
std::string xmlEscape(const std::string& text);

}  // namespace cleave::loadgen
