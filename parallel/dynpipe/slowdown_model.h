// DynPipe's slowdown model (papers/dynpipe.md Sec. 2.7, the paper's Sec. V-A): a regressor from
// what a worker can observe of itself and its machine (a layer's solo time and bytes, the CPU's
// counters) to the slowdown of the layer beside an opaque co-located load (colocated time / solo
// time), trained on the data set of `strata profile --colocation` (colocation.h).
//
// The forest is XGBoost's random forest (its C API, Debian's libxgboost-dev): 128 parallel trees
// in one boosting round at learning rate 1, each on a row subsample and a column subsample per
// node, squared error, so that the prediction is the base score plus the mean of the trees. The
// comparison is a least-squares linear regression (with an intercept, on standardized features).
//
// Model file: XGBoost's JSON model with two attributes of Strata's, "strata_model" (the format,
// kModelFormat) and "strata_features" (the feature names, comma-separated, in column order). A
// file that is missing, not complete JSON (truncated), not a Strata slowdown model, or of another
// feature set than the caller's is refused naming the file and what differs.
//
// Built with -DSTRATA_WITH_XGBOOST=OFF, the forest's functions throw strata::Error saying so (the
// linear model and the data sets still work); there is no silent substitute.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace strata::parallel::dynpipe {

inline constexpr const char* kModelFormat = "strata-slowdown-forest-1";
inline constexpr const char* kTargetColumn = "slowdown";

// Whether this build has the forest (XGBoost).
bool forest_available();

// Rows of features and their target, row-major.
struct SlowdownData {
  std::vector<std::string> features;
  std::vector<float> x;  // rows() x features.size()
  std::vector<float> y;
  // The "window" column when the data set has one (rows of one measurement window share its
  // counters): split_holdout holds out whole windows. Empty: rows are independent.
  std::vector<int64_t> group;
  size_t rows() const { return y.size(); }
  const float* row(size_t i) const { return x.data() + i * features.size(); }
};

// The columns of a CSV file (header line) that are features when read_slowdown_csv is given
// none: every numeric column except the target ("slowdown"), "window", "rank", "colocated_ms",
// "layer_slowdown" (the target's parts) and the load's own settings "load_*" (a worker does not see
// a co-located job's settings, only the counters). Non-numeric columns (e.g. "layer") are never
// features. (strata fit-slowdown asks for feature set kFeatureSet by default:
// slowdown_features.h.)
bool default_feature_column(const std::string& name);

// Reads a CSV data set with a header line: `features` (empty: the default columns, in file order)
// and the target column. Throws strata::Error naming the file (and line, column) for a missing
// file, a missing column, a value that is not a finite number, or fewer than `min_rows` rows.
SlowdownData read_slowdown_csv(const std::string& path, const std::vector<std::string>& features,
                               size_t min_rows = 2);

// "a,b,c" -> {"a", "b", "c"} (empty string: none).
std::vector<std::string> split_names(const std::string& list);
std::string join_names(const std::vector<std::string>& names);

// A deterministic split: a `holdout` fraction (0, 1) of the rows, drawn by `seed`, held out;
// with groups, whole groups (windows) are held out until they hold that fraction of the rows, so
// that no held-out row shares its window's counters with a training row.
void split_holdout(const SlowdownData& data, double holdout, uint64_t seed, SlowdownData* train,
                   SlowdownData* test);

double mean_absolute_error(const std::vector<float>& predicted, const std::vector<float>& target);

// Least squares y ~ w . z + b on standardized features z (a tiny ridge keeps constant columns
// solvable).
class LinearModel {
 public:
  static LinearModel fit(const SlowdownData& data);
  float predict(const float* row) const;
  std::vector<float> predict(const SlowdownData& data) const;
  size_t features() const { return weights_.size(); }

 private:
  std::vector<double> mean_, scale_, weights_;
  double bias_ = 0.0;
};

struct ForestOptions {
  int trees = 128;
  double subsample = 0.8;         // rows per tree
  double colsample_bynode = 0.8;  // columns per split
  int max_depth = 10;
  uint64_t seed = 0;
  int threads = 0;  // 0: XGBoost's default
};

class ForestModel {
 public:
  ForestModel();
  ~ForestModel();
  ForestModel(ForestModel&&) noexcept;
  ForestModel& operator=(ForestModel&&) noexcept;

  // Throws strata::Error for an empty data set or options out of range.
  static ForestModel fit(const SlowdownData& data, const ForestOptions& options);
  // Loads `path` and checks its feature set against `expected` (empty: accept the file's own).
  static ForestModel load(const std::string& path, const std::vector<std::string>& expected = {});
  void save(const std::string& path) const;

  const std::vector<std::string>& features() const { return features_; }
  // One row of features().size() values.
  float predict(const float* row) const;
  // Rows x features().size() values, row-major.
  std::vector<float> predict(const float* rows, size_t count) const;
  std::vector<float> predict(const SlowdownData& data) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<std::string> features_;
};

}  // namespace strata::parallel::dynpipe
