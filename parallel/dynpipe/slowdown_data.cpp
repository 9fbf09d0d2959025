// The slowdown model's data sets and its linear baseline (slowdown_model.h); the forest is in
// slowdown_forest.cpp.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>

#include "engine/check.h"
#include "parallel/dynpipe/slowdown_model.h"

namespace strata::parallel::dynpipe {

namespace {

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> cells;
  std::string cell;
  std::istringstream in(line);
  while (std::getline(in, cell, ',')) {
    while (!cell.empty() && (cell.back() == '\r' || cell.back() == ' ')) cell.pop_back();
    while (!cell.empty() && cell.front() == ' ') cell.erase(cell.begin());
    cells.push_back(cell);
  }
  if (!line.empty() && line.back() == ',') cells.emplace_back();
  return cells;
}

bool parse_number(const std::string& s, double* v) {
  if (s.empty()) return false;
  char* end = nullptr;
  *v = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(*v);
}

}  // namespace

bool default_feature_column(const std::string& name) {
  return name != kTargetColumn && name != "window" && name != "colocated_ms" &&
         name != "layer_slowdown" && name != "layer" && name != "rank" &&
         name.rfind("load_", 0) != 0;
}

std::vector<std::string> split_names(const std::string& list) {
  std::vector<std::string> names;
  if (list.empty()) return names;
  for (std::string& n : split_csv_line(list)) names.push_back(n);
  return names;
}

std::string join_names(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ",") + n;
  return s;
}

SlowdownData read_slowdown_csv(const std::string& path, const std::vector<std::string>& features,
                               size_t min_rows) {
  std::ifstream in(path);
  STRATA_CHECK(in.good()) << "cannot read the data set '" << path << "'";
  std::string line;
  STRATA_CHECK(static_cast<bool>(std::getline(in, line)))
      << "data set '" << path << "' is empty (expected a header line)";
  const std::vector<std::string> header = split_csv_line(line);
  const auto column_of = [&](const std::string& name) -> size_t {
    const auto it = std::find(header.begin(), header.end(), name);
    STRATA_CHECK(it != header.end()) << "data set '" << path << "' has no column '" << name
                                     << "' (its columns: " << join_names(header) << ")";
    return static_cast<size_t>(it - header.begin());
  };
  const size_t target = column_of(kTargetColumn);
  const auto window_it = std::find(header.begin(), header.end(), "window");
  const bool has_window = window_it != header.end();
  const size_t window = static_cast<size_t>(window_it - header.begin());

  // The first data line tells the numeric columns apart (for the default feature set).
  std::vector<std::string> lines;
  while (std::getline(in, line)) {
    if (!line.empty() && line != "\r") lines.push_back(line);
  }
  SlowdownData data;
  std::vector<size_t> columns;
  if (features.empty()) {
    STRATA_CHECK(!lines.empty()) << "data set '" << path << "' has no rows";
    const std::vector<std::string> first = split_csv_line(lines[0]);
    for (size_t c = 0; c < header.size() && c < first.size(); ++c) {
      double v = 0.0;
      if (default_feature_column(header[c]) && parse_number(first[c], &v)) {
        columns.push_back(c);
        data.features.push_back(header[c]);
      }
    }
    STRATA_CHECK(!columns.empty()) << "data set '" << path << "' has no numeric feature columns";
  } else {
    for (const std::string& f : features) {
      STRATA_CHECK(f != kTargetColumn) << "the target '" << f << "' cannot be a feature";
      columns.push_back(column_of(f));
      data.features.push_back(f);
    }
  }
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::vector<std::string> cells = split_csv_line(lines[i]);
    const size_t line_no = i + 2;
    STRATA_CHECK(cells.size() == header.size())
        << "data set '" << path << "' line " << line_no << " has " << cells.size()
        << " cells, the header " << header.size();
    double v = 0.0;
    for (size_t k = 0; k < columns.size(); ++k) {
      STRATA_CHECK(parse_number(cells[columns[k]], &v))
          << "data set '" << path << "' line " << line_no << ", column '" << header[columns[k]]
          << "': '" << cells[columns[k]] << "' is not a finite number";
      data.x.push_back(static_cast<float>(v));
    }
    STRATA_CHECK(parse_number(cells[target], &v))
        << "data set '" << path << "' line " << line_no << ", column '" << kTargetColumn << "': '"
        << cells[target] << "' is not a finite number";
    data.y.push_back(static_cast<float>(v));
    if (has_window) {
      STRATA_CHECK(parse_number(cells[window], &v) && v == std::floor(v))
          << "data set '" << path << "' line " << line_no << ", column 'window': '" << cells[window]
          << "' is not a whole number";
      data.group.push_back(static_cast<int64_t>(v));
    }
  }
  STRATA_CHECK(data.rows() >= min_rows)
      << "data set '" << path << "' has " << data.rows() << " rows, needs at least " << min_rows;
  return data;
}

void split_holdout(const SlowdownData& data, double holdout, uint64_t seed, SlowdownData* train,
                   SlowdownData* test) {
  STRATA_CHECK(holdout > 0 && holdout < 1) << "--holdout must be in (0, 1), got " << holdout;
  const size_t n = data.rows();
  const size_t held = static_cast<size_t>(std::lround(holdout * static_cast<double>(n)));
  STRATA_CHECK(held >= 1 && held < n)
      << "--holdout " << holdout << " of " << n << " rows leaves no training or held-out rows";
  std::mt19937_64 rng(seed);
  std::vector<bool> held_out(n, false);
  if (data.group.empty()) {
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t k = 0; k < held; ++k) held_out[order[k]] = true;
  } else {
    STRATA_CHECK(data.group.size() == n) << "a group per row";
    std::vector<int64_t> groups = data.group;
    std::sort(groups.begin(), groups.end());
    groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
    STRATA_CHECK(groups.size() >= 2)
        << "the data set has " << groups.size() << " window: no whole window to hold out";
    std::shuffle(groups.begin(), groups.end(), rng);
    size_t count = 0;
    for (size_t g = 0; g + 1 < groups.size() && count < held; ++g) {
      for (size_t i = 0; i < n; ++i) {
        if (data.group[i] == groups[g]) {
          held_out[i] = true;
          ++count;
        }
      }
    }
  }
  const size_t f = data.features.size();
  for (SlowdownData* d : {train, test}) {
    d->features = data.features;
    d->x.clear();
    d->y.clear();
    d->group.clear();
  }
  for (size_t i = 0; i < n; ++i) {
    SlowdownData* d = held_out[i] ? test : train;
    const float* r = data.row(i);
    d->x.insert(d->x.end(), r, r + f);
    d->y.push_back(data.y[i]);
    if (!data.group.empty()) d->group.push_back(data.group[i]);
  }
}

double mean_absolute_error(const std::vector<float>& predicted, const std::vector<float>& target) {
  STRATA_CHECK_EQ(predicted.size(), target.size());
  STRATA_CHECK(!target.empty()) << "mean absolute error of no rows";
  double sum = 0.0;
  for (size_t i = 0; i < target.size(); ++i) sum += std::fabs(predicted[i] - target[i]);
  return sum / static_cast<double>(target.size());
}

LinearModel LinearModel::fit(const SlowdownData& data) {
  const size_t n = data.rows(), f = data.features.size();
  STRATA_CHECK(n >= 1 && f >= 1) << "linear regression needs rows and features";
  LinearModel m;
  m.mean_.assign(f, 0.0);
  m.scale_.assign(f, 1.0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < f; ++j) m.mean_[j] += data.row(i)[j];
  }
  for (double& v : m.mean_) v /= static_cast<double>(n);
  std::vector<double> var(f, 0.0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < f; ++j) {
      const double d = data.row(i)[j] - m.mean_[j];
      var[j] += d * d;
    }
  }
  for (size_t j = 0; j < f; ++j) {
    const double sd = std::sqrt(var[j] / static_cast<double>(n));
    m.scale_[j] = sd > 0 ? sd : 1.0;
  }
  // Normal equations on [z, 1]: (Z^T Z + ridge) w = Z^T y, solved by Gaussian elimination with
  // partial pivoting.
  const size_t d = f + 1;
  std::vector<double> a(d * d, 0.0), b(d, 0.0), z(d, 1.0);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < f; ++j) z[j] = (data.row(i)[j] - m.mean_[j]) / m.scale_[j];
    for (size_t r = 0; r < d; ++r) {
      for (size_t c = 0; c < d; ++c) a[r * d + c] += z[r] * z[c];
      b[r] += z[r] * data.y[i];
    }
  }
  for (size_t r = 0; r < f; ++r) a[r * d + r] += 1e-6 * static_cast<double>(n);
  for (size_t col = 0; col < d; ++col) {
    size_t pivot = col;
    for (size_t r = col + 1; r < d; ++r) {
      if (std::fabs(a[r * d + col]) > std::fabs(a[pivot * d + col])) pivot = r;
    }
    STRATA_CHECK(std::fabs(a[pivot * d + col]) > 0) << "linear regression: singular system";
    if (pivot != col) {
      for (size_t c = 0; c < d; ++c) std::swap(a[col * d + c], a[pivot * d + c]);
      std::swap(b[col], b[pivot]);
    }
    for (size_t r = col + 1; r < d; ++r) {
      const double k = a[r * d + col] / a[col * d + col];
      for (size_t c = col; c < d; ++c) a[r * d + c] -= k * a[col * d + c];
      b[r] -= k * b[col];
    }
  }
  std::vector<double> w(d, 0.0);
  for (size_t r = d; r-- > 0;) {
    double s = b[r];
    for (size_t c = r + 1; c < d; ++c) s -= a[r * d + c] * w[c];
    w[r] = s / a[r * d + r];
  }
  m.weights_.assign(w.begin(), w.begin() + static_cast<std::ptrdiff_t>(f));
  m.bias_ = w[f];
  return m;
}

float LinearModel::predict(const float* row) const {
  double s = bias_;
  for (size_t j = 0; j < weights_.size(); ++j) s += weights_[j] * (row[j] - mean_[j]) / scale_[j];
  return static_cast<float>(s);
}

std::vector<float> LinearModel::predict(const SlowdownData& data) const {
  STRATA_CHECK_EQ(data.features.size(), weights_.size());
  std::vector<float> out(data.rows());
  for (size_t i = 0; i < data.rows(); ++i) out[i] = predict(data.row(i));
  return out;
}

}  // namespace strata::parallel::dynpipe
