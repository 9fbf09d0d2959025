// `strata plot` (see the header). The SVG is written by hand: a grid of panels (rows: the
// metrics; columns: against step, against training time), each with its axes, "nice" ticks
// (1, 2 or 5 times a power of ten) and one polyline per run. Evaluation records carry no time of
// their own: each is placed at the training time of the last train record at or before its step.
#include "tools/plot_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/check.h"

namespace strata::tools {
namespace {

struct Point {
  double step, time, value;
};

struct Run {
  std::string label;
  std::vector<Point> loss, eval_loss, accuracy, throughput;
};

Run read_run(const std::string& path, const std::string& label) {
  std::ifstream in(path);
  STRATA_CHECK(in.good()) << "strata plot: cannot open " << path;
  Run run;
  run.label = label;
  std::vector<std::pair<double, double>> times;  // (step, elapsed_s) of the train records
  std::vector<nlohmann::json> evals;
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      STRATA_THROW() << "strata plot: " << path << " line " << number
                     << " is not JSON (a --metrics file of strata train holds one object a line)";
    }
    const std::string type = j.value("type", "");
    if (type == "train" && j.contains("step") && j.contains("loss")) {
      const double step = j["step"].get<double>();
      const double t = j.value("elapsed_s", std::numeric_limits<double>::quiet_NaN());
      times.push_back({step, t});
      if (j["loss"].is_number()) run.loss.push_back({step, t, j["loss"].get<double>()});
      if (j.contains("samples_per_s")) {
        run.throughput.push_back({step, t, j["samples_per_s"].get<double>()});
      }
    } else if (type == "eval" && j.contains("step")) {
      evals.push_back(j);
    }
  }
  for (const nlohmann::json& j : evals) {
    const double step = j["step"].get<double>();
    double t = std::numeric_limits<double>::quiet_NaN();
    for (const auto& [s, e] : times) {
      if (s <= step) t = e;
    }
    if (j.contains("loss")) run.eval_loss.push_back({step, t, j["loss"].get<double>()});
    if (j.contains("accuracy")) {
      run.accuracy.push_back({step, t, 100.0 * j["accuracy"].get<double>()});
    }
  }
  STRATA_CHECK(!run.loss.empty() || !run.eval_loss.empty())
      << "strata plot: " << path << " holds no train or eval records (write one with strata train "
      << "--metrics FILE)";
  return run;
}

// A tick step of 1, 2 or 5 x 10^k giving about `count` ticks over `span`.
double nice_step(double span, int count) {
  const double raw = span / count;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * p >= raw) return m * p;
  }
  return 10 * p;
}

std::string fmt(double v) {
  char buf[32];
  if (v != 0 && (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-3)) {
    std::snprintf(buf, sizeof(buf), "%.0e", v);
  } else {
    std::snprintf(buf, sizeof(buf), "%g", v);
  }
  return buf;
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                         "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

constexpr double kPanelW = 420, kPanelH = 250, kMarginL = 64, kMarginT = 34, kGapX = 40, kGapY = 60;

// One panel at (x0, y0): `series[r]` of run r against step or time.
void panel(std::ostringstream& svg, double x0, double y0, const std::string& title,
           const std::string& xlabel,
           const std::vector<std::vector<std::pair<double, double>>>& s) {
  double xmin = std::numeric_limits<double>::infinity(), xmax = -xmin, ymin = xmin, ymax = -xmin;
  for (const auto& run : s) {
    for (const auto& [x, y] : run) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      xmin = std::min(xmin, x), xmax = std::max(xmax, x);
      ymin = std::min(ymin, y), ymax = std::max(ymax, y);
    }
  }
  svg << "<g transform=\"translate(" << x0 << "," << y0 << ")\">\n";
  svg << "<text x=\"" << kPanelW / 2 << "\" y=\"-10\" text-anchor=\"middle\" font-weight=\"bold\">"
      << escape(title) << "</text>\n";
  svg << "<rect width=\"" << kPanelW << "\" height=\"" << kPanelH
      << "\" fill=\"none\" stroke=\"#444\"/>\n";
  svg << "<text x=\"" << kPanelW / 2 << "\" y=\"" << kPanelH + 34 << "\" text-anchor=\"middle\">"
      << escape(xlabel) << "</text>\n";
  if (!std::isfinite(xmin)) {
    svg << "<text x=\"" << kPanelW / 2 << "\" y=\"" << kPanelH / 2
        << "\" text-anchor=\"middle\" fill=\"#888\">no data</text>\n</g>\n";
    return;
  }
  if (xmax == xmin) xmax = xmin + 1;
  if (ymax == ymin) ymax = ymin + std::max(1e-9, std::fabs(ymin) * 0.1), ymin -= (ymax - ymin);
  const double pad = 0.05 * (ymax - ymin);
  ymin -= pad, ymax += pad;
  auto px = [&](double x) { return (x - xmin) / (xmax - xmin) * kPanelW; };
  auto py = [&](double y) { return kPanelH - (y - ymin) / (ymax - ymin) * kPanelH; };
  const double xs = nice_step(xmax - xmin, 5), ys = nice_step(ymax - ymin, 5);
  for (double x = std::ceil(xmin / xs) * xs; x <= xmax + 1e-9 * xs; x += xs) {
    svg << "<line x1=\"" << px(x) << "\" y1=\"0\" x2=\"" << px(x) << "\" y2=\"" << kPanelH
        << "\" stroke=\"#eee\"/><text x=\"" << px(x) << "\" y=\"" << kPanelH + 16
        << "\" text-anchor=\"middle\" font-size=\"11\">" << fmt(x) << "</text>\n";
  }
  for (double y = std::ceil(ymin / ys) * ys; y <= ymax + 1e-9 * ys; y += ys) {
    svg << "<line x1=\"0\" y1=\"" << py(y) << "\" x2=\"" << kPanelW << "\" y2=\"" << py(y)
        << "\" stroke=\"#eee\"/><text x=\"-6\" y=\"" << py(y) + 4
        << "\" text-anchor=\"end\" font-size=\"11\">" << fmt(y) << "</text>\n";
  }
  for (size_t r = 0; r < s.size(); ++r) {
    std::ostringstream points;
    size_t n = 0;
    for (const auto& [x, y] : s[r]) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      points << (n++ ? " " : "") << px(x) << "," << py(y);
    }
    if (n == 0) continue;
    const char* color = kColors[r % (sizeof(kColors) / sizeof(kColors[0]))];
    if (n == 1) {
      svg << "<circle r=\"3\" cx=\"" << points.str().substr(0, points.str().find(',')) << "\" cy=\""
          << points.str().substr(points.str().find(',') + 1) << "\" fill=\"" << color << "\"/>\n";
    } else {
      svg << "<polyline fill=\"none\" stroke-width=\"1.6\" stroke=\"" << color << "\" points=\""
          << points.str() << "\"/>\n";
    }
  }
  svg << "</g>\n";
}

}  // namespace

CLI::App* add_plot_command(CLI::App& app, PlotOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "plot", "Plot loss, accuracy and throughput of --metrics files (runs overlaid) as SVG");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("inputs", o.inputs, "--metrics files (JSON Lines) of strata train runs")
      ->required();
  cmd->add_option("--labels", o.labels, "A legend label per input (default: the file names)");
  cmd->add_option("--output", o.output, "SVG file to write");
  cmd->add_option("--title", o.title, "Title above the panels");
  return cmd;
}

std::string plot_svg(const PlotOptions& o) {
  STRATA_CHECK(o.labels.empty() || o.labels.size() == o.inputs.size())
      << "--labels gives " << o.labels.size() << " labels for " << o.inputs.size() << " inputs";
  std::vector<Run> runs;
  for (size_t i = 0; i < o.inputs.size(); ++i) {
    runs.push_back(read_run(o.inputs[i], o.labels.empty() ? o.inputs[i] : o.labels[i]));
  }
  struct Metric {
    const char* title;
    std::vector<Point> Run::*series;
  };
  const Metric metrics[] = {{"training loss", &Run::loss},
                            {"test loss", &Run::eval_loss},
                            {"test accuracy (%)", &Run::accuracy},
                            {"throughput (samples/s)", &Run::throughput}};
  const int rows = 4;
  const double legend_h = 22.0 * static_cast<double>(runs.size()) + 10;
  const double top = kMarginT + (o.title.empty() ? 0 : 30) + legend_h;
  const double width = kMarginL + 2 * kPanelW + kGapX + 30;
  const double height = top + rows * (kPanelH + kGapY) + 10;
  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" "
      << "width=\"" << width << "\" height=\"" << height << "\" font-family=\"sans-serif\" "
      << "font-size=\"13\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  double y = kMarginT;
  if (!o.title.empty()) {
    svg << "<text x=\"" << width / 2 << "\" y=\"" << y
        << "\" text-anchor=\"middle\" font-size=\"17\" font-weight=\"bold\">" << escape(o.title)
        << "</text>\n";
    y += 30;
  }
  for (size_t r = 0; r < runs.size(); ++r) {
    const char* color = kColors[r % (sizeof(kColors) / sizeof(kColors[0]))];
    svg << "<line x1=\"" << kMarginL << "\" y1=\"" << y - 4 << "\" x2=\"" << kMarginL + 30
        << "\" y2=\"" << y - 4 << "\" stroke=\"" << color << "\" stroke-width=\"3\"/><text x=\""
        << kMarginL + 38 << "\" y=\"" << y << "\">" << escape(runs[r].label) << "</text>\n";
    y += 22;
  }
  for (int m = 0; m < rows; ++m) {
    std::vector<std::vector<std::pair<double, double>>> by_step, by_time;
    for (const Run& run : runs) {
      by_step.emplace_back();
      by_time.emplace_back();
      for (const Point& p : run.*(metrics[m].series)) {
        by_step.back().push_back({p.step, p.value});
        by_time.back().push_back({p.time, p.value});
      }
    }
    const double py = top + kMarginT + m * (kPanelH + kGapY);
    panel(svg, kMarginL, py, metrics[m].title, "step", by_step);
    panel(svg, kMarginL + kPanelW + kGapX, py, metrics[m].title, "training time (s)", by_time);
  }
  svg << "</svg>\n";
  return svg.str();
}

int run_plot(const PlotOptions& o) {
  const std::string svg = plot_svg(o);
  std::ofstream out(o.output);
  STRATA_CHECK(out.good()) << "--output " << o.output << ": cannot write the SVG file";
  out << svg;
  out.close();
  STRATA_CHECK(out.good()) << "--output " << o.output << ": the write failed";
  std::printf(
      "strata plot: %zu run%s -> %s (training loss, test loss, test accuracy, "
      "throughput; against step and training time)\n",
      o.inputs.size(), o.inputs.size() == 1 ? "" : "s", o.output.c_str());
  return 0;
}

}  // namespace strata::tools
