// Plots `strata simulate` writes as SVG files (no library: a few rectangles, lines and labels).
#pragma once

#include <string>
#include <vector>

#include "parallel/sim/simulator.h"

namespace strata::tools {

struct Series {
  std::string name;
  std::vector<double> x, y;  // y <= 0: no point (a layout that does not fit)
};

// A line chart with a log2 x axis (GPU counts) and a log10 y axis; errors name the path.
void write_line_chart_svg(const std::string& path, const std::string& title,
                          const std::string& x_label, const std::string& y_label,
                          const std::vector<Series>& series);

// The simulated timeline of ranks [0, ranks) (one row per rank: forwards, backwards, updates,
// all-reduces and waits) of the last simulated step; errors name the path.
void write_timeline_svg(const std::string& path, const std::string& title,
                        const parallel::sim::SimResult& result, int ranks, int stages);

}  // namespace strata::tools
