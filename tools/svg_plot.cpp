// SVG plots (see svg_plot.h): plain shapes and text, no scripts or external resources.
#include "tools/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "engine/check.h"

namespace strata::tools {
namespace {

const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<') {
      out += "&lt;";
    } else if (c == '>') {
      out += "&gt;";
    } else if (c == '&') {
      out += "&amp;";
    } else {
      out += c;
    }
  }
  return out;
}

void write(const std::string& path, const std::string& svg) {
  std::ofstream out(path);
  STRATA_CHECK(out.good()) << "cannot write --plot file '" << path << "'";
  out << svg;
  STRATA_CHECK(out.good()) << "short write to --plot file '" << path << "'";
}

std::string number(double v) {
  char text[32];
  if (v >= 1e6 || (v > 0 && v < 1e-2)) {
    std::snprintf(text, sizeof(text), "%.0e", v);
  } else {
    std::snprintf(text, sizeof(text), "%g", v);
  }
  return text;
}

}  // namespace

void write_line_chart_svg(const std::string& path, const std::string& title,
                          const std::string& x_label, const std::string& y_label,
                          const std::vector<Series>& series) {
  const double W = 820, H = 520, left = 90, right = 250, top = 50, bottom = 60;
  double x0 = 1e300, x1 = 0, y0 = 1e300, y1 = 0;
  for (const Series& s : series) {
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (s.y[i] <= 0 || s.x[i] <= 0) continue;
      x0 = std::min(x0, s.x[i]);
      x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, s.y[i]);
      y1 = std::max(y1, s.y[i]);
    }
  }
  STRATA_CHECK(x1 > 0) << "--plot '" << path << "': no layout to plot (none fits)";
  const double lx0 = std::floor(std::log2(x0)), lx1 = std::max(lx0 + 1, std::ceil(std::log2(x1)));
  const double ly0 = std::floor(std::log10(y0)), ly1 = std::max(ly0 + 1, std::ceil(std::log10(y1)));
  auto px = [&](double x) {
    return left + (std::log2(x) - lx0) / (lx1 - lx0) * (W - left - right);
  };
  auto py = [&](double y) {
    return H - bottom - (std::log10(y) - ly0) / (ly1 - ly0) * (H - top - bottom);
  };
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << W / 2 << "\" y=\"25\" text-anchor=\"middle\" font-size=\"15\">"
    << escape(title) << "</text>\n";
  for (double e = lx0; e <= lx1 + 1e-9; e += 1) {
    const double x = px(std::exp2(e));
    s << "<line x1=\"" << x << "\" y1=\"" << top << "\" x2=\"" << x << "\" y2=\"" << H - bottom
      << "\" stroke=\"#ddd\"/>\n<text x=\"" << x << "\" y=\"" << H - bottom + 18
      << "\" text-anchor=\"middle\">" << number(std::exp2(e)) << "</text>\n";
  }
  for (double e = ly0; e <= ly1 + 1e-9; e += 1) {
    const double y = py(std::pow(10.0, e));
    s << "<line x1=\"" << left << "\" y1=\"" << y << "\" x2=\"" << W - right << "\" y2=\"" << y
      << "\" stroke=\"#ddd\"/>\n<text x=\"" << left - 8 << "\" y=\"" << y + 4
      << "\" text-anchor=\"end\">" << number(std::pow(10.0, e)) << "</text>\n";
  }
  s << "<text x=\"" << (left + W - right) / 2 << "\" y=\"" << H - 15 << "\" text-anchor=\"middle\">"
    << escape(x_label) << "</text>\n"
    << "<text transform=\"translate(20," << (top + H - bottom) / 2
    << ") rotate(-90)\" text-anchor=\"middle\">" << escape(y_label) << "</text>\n";
  for (size_t k = 0; k < series.size(); ++k) {
    const Series& se = series[k];
    const char* color = kColors[k % 6];
    std::string points;
    for (size_t i = 0; i < se.x.size(); ++i) {
      if (se.y[i] <= 0) continue;
      points += std::to_string(px(se.x[i])) + "," + std::to_string(py(se.y[i])) + " ";
      s << "<circle cx=\"" << px(se.x[i]) << "\" cy=\"" << py(se.y[i]) << "\" r=\"4\" fill=\""
        << color << "\"/>\n";
    }
    s << "<polyline points=\"" << points << "\" fill=\"none\" stroke=\"" << color
      << "\" stroke-width=\"2\"/>\n";
    const double ly = top + 20 + 22 * static_cast<double>(k);
    s << "<rect x=\"" << W - right + 15 << "\" y=\"" << ly - 10
      << "\" width=\"14\" height=\"4\" fill=\"" << color << "\"/><text x=\"" << W - right + 35
      << "\" y=\"" << ly - 4 << "\">" << escape(se.name) << "</text>\n";
  }
  s << "</svg>\n";
  write(path, s.str());
}

void write_timeline_svg(const std::string& path, const std::string& title,
                        const parallel::sim::SimResult& result, int ranks, int stages) {
  using parallel::sim::TimelineEvent;
  const double W = 1200, left = 120, right = 20, top = 50, row = 26;
  const double H = top + row * ranks + 60;
  const double t1 = result.makespan_s;
  const double t0 = result.makespan_s - result.step_time_s;  // the last simulated step
  STRATA_CHECK(t1 > t0) << "--plot '" << path << "': an empty timeline";
  auto px = [&](double t) { return left + (t - t0) / (t1 - t0) * (W - left - right); };
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"11\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << W / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">"
    << escape(title) << " (last step, " << number(1e3 * (t1 - t0)) << " ms)</text>\n";
  for (int r = 0; r < ranks; ++r) {
    const double y = top + row * r;
    s << "<text x=\"" << left - 6 << "\" y=\"" << y + 14 << "\" text-anchor=\"end\">rank " << r
      << " (g" << r / stages << " s" << r % stages << ")</text>\n"
      << "<line x1=\"" << left << "\" y1=\"" << y + row - 2 << "\" x2=\"" << W - right << "\" y2=\""
      << y + row - 2 << "\" stroke=\"#eee\"/>\n";
  }
  for (const TimelineEvent& e : result.timeline) {
    if (e.rank >= ranks || e.end <= t0 || e.end <= e.start) continue;
    const double y = top + row * e.rank;
    const double x = px(std::max(e.start, t0)), w = std::max(0.5, px(e.end) - x);
    const char* color = nullptr;
    double h = 16, dy = 2;
    if (e.lane == TimelineEvent::kCompute) {
      color = e.name == "Forward" ? "#4c8be0" : e.name == "Backward" ? "#46a35a" : "#f0a030";
    } else if (e.lane == TimelineEvent::kGradSync) {
      color = "#9467bd";
      h = 5;
      dy = 19;
    } else if (e.lane == TimelineEvent::kComm) {
      color = "#d62728";  // waiting for a message
      h = 3;
      dy = 19;
    } else {
      continue;
    }
    s << "<rect x=\"" << x << "\" y=\"" << y + dy << "\" width=\"" << w << "\" height=\"" << h
      << "\" fill=\"" << color << "\"><title>" << escape(e.name)
      << (e.micro_batch >= 0 ? " " + std::to_string(e.micro_batch) : "") << "</title></rect>\n";
    if (h == 16 && w > 14 && e.micro_batch >= 0) {
      s << "<text x=\"" << x + w / 2 << "\" y=\"" << y + 14
        << "\" text-anchor=\"middle\" fill=\"white\">" << e.micro_batch << "</text>\n";
    }
  }
  const double ly = H - 30;
  const char* const names[] = {"Forward", "Backward", "OptimizerStep", "dp all-reduce",
                               "waiting for a message"};
  const char* const colors[] = {"#4c8be0", "#46a35a", "#f0a030", "#9467bd", "#d62728"};
  for (int k = 0; k < 5; ++k) {
    const double x = left + 180 * k;
    s << "<rect x=\"" << x << "\" y=\"" << ly - 10 << "\" width=\"14\" height=\"10\" fill=\""
      << colors[k] << "\"/><text x=\"" << x + 20 << "\" y=\"" << ly << "\">" << names[k]
      << "</text>\n";
  }
  s << "</svg>\n";
  write(path, s.str());
}

}  // namespace strata::tools
