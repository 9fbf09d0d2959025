// `strata plot`: pictures of training runs from their --metrics files (JSON Lines), as one SVG:
// training loss, test loss, test accuracy and throughput (samples/s), each against the step and
// against the training time, every run a line of its own colour (runs of several layouts or
// systems overlaid for comparison).
//
//   strata plot runs/1x4.jsonl runs/2x2.jsonl runs/4x1.jsonl --output layouts.svg
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace strata::tools {

struct PlotOptions {
  std::vector<std::string> inputs;
  std::vector<std::string> labels;  // empty: the file names
  std::string output = "metrics.svg";
  std::string title;
};

CLI::App* add_plot_command(CLI::App& app, PlotOptions& options);
int run_plot(const PlotOptions& options);

// The SVG document for `options` (what run_plot writes), for tests.
std::string plot_svg(const PlotOptions& options);

}  // namespace strata::tools
