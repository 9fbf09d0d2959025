// DynPipe's slowdown model (parallel/dynpipe/slowdown_model.h), papers/dynpipe.md Sec. 5 item 11:
// the CSV data set and its errors, least squares exact on a linear target, the XGBoost forest
// deterministic with a seed and better than linear regression on a non-linear target, its file
// round trip, and the refusal of a missing, truncated, foreign or other-feature-set file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>
#include "engine/check.h"
#include "parallel/dynpipe/slowdown_model.h"
#include "parallel/dynpipe_test_util.h"

namespace strata::parallel::dynpipe {
namespace {

using testing::fresh_dir;
using testing::throws_message;

// An empty directory of its own under the test's temporary directory.
void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

// x0..x3 uniform in [0, 1]; target = `f` of them.
SlowdownData synthetic(size_t rows, uint32_t seed, const std::function<double(const float*)>& f) {
  SlowdownData d;
  d.features = {"x0", "x1", "x2", "x3"};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (size_t i = 0; i < rows; ++i) {
    float r[4];
    for (float& v : r) v = u(rng);
    d.x.insert(d.x.end(), r, r + 4);
    d.y.push_back(static_cast<float>(f(r)));
  }
  return d;
}

// A slowdown that steps with one feature and multiplies two others: no line fits it.
double nonlinear(const float* x) {
  return 1.0 + (x[0] > 0.5f ? 2.0 : 0.0) * x[1] + 3.0 * x[2] * x[3] * (x[2] > 0.3f ? 1.0 : -1.0);
}

TEST(DynPipeSlowdown, CsvReadsTheDefaultAndChosenColumns) {
  const std::string dir = fresh_dir("strata_dynpipe_slowdown_csv");
  const std::string path = dir + "/d.csv";
  std::ofstream(path) << "layer,window,a,load_threads,b,colocated_ms,slowdown\n"
                      << "conv1,0,1.5,2,3,4,1.25\n"
                      << "fc1,1,2.5,0,4,5,1.0\n";
  const SlowdownData d = read_slowdown_csv(path, {});
  EXPECT_EQ(d.features, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(d.x, (std::vector<float>{1.5f, 3.0f, 2.5f, 4.0f}));
  EXPECT_EQ(d.y, (std::vector<float>{1.25f, 1.0f}));
  EXPECT_EQ(d.group, (std::vector<int64_t>{0, 1}));
  const SlowdownData chosen = read_slowdown_csv(path, {"b", "load_threads"});
  EXPECT_EQ(chosen.x, (std::vector<float>{3.0f, 2.0f, 4.0f, 0.0f}));

  expect_contains(throws_message([&] { read_slowdown_csv(dir + "/none.csv", {}); }),
                  "cannot read the data set '" + dir + "/none.csv'");
  expect_contains(throws_message([&] { read_slowdown_csv(path, {"c"}); }),
                  "has no column 'c' (its columns: layer,window,a,load_threads,b,colocated_ms,"
                  "slowdown)");
  expect_contains(throws_message([&] { read_slowdown_csv(path, {}, 3); }),
                  "has 2 rows, needs at least 3");
  std::ofstream(dir + "/bad.csv") << "a,slowdown\n1,2\nx,3\n";
  expect_contains(throws_message([&] { read_slowdown_csv(dir + "/bad.csv", {"a"}); }),
                  "line 3, column 'a': 'x' is not a finite number");
  std::ofstream(dir + "/short.csv") << "a,slowdown\n1,2\n3\n";
  expect_contains(throws_message([&] { read_slowdown_csv(dir + "/short.csv", {"a"}); }),
                  "line 3 has 1 cells, the header 2");
  std::ofstream(dir + "/notarget.csv") << "a,b\n1,2\n";
  expect_contains(throws_message([&] { read_slowdown_csv(dir + "/notarget.csv", {}); }),
                  "has no column 'slowdown'");
}

TEST(DynPipeSlowdown, HoldoutSplitIsDeterministicAndDisjoint) {
  const SlowdownData d = synthetic(100, 1, [](const float* x) { return x[0]; });
  SlowdownData a, b, c, e;
  split_holdout(d, 0.2, 7, &a, &b);
  split_holdout(d, 0.2, 7, &c, &e);
  EXPECT_EQ(a.rows(), 80u);
  EXPECT_EQ(b.rows(), 20u);
  EXPECT_EQ(a.y, c.y);
  EXPECT_EQ(b.x, e.x);
  double sum = 0, parts = 0;
  for (float y : d.y) sum += y;
  for (float y : a.y) parts += y;
  for (float y : b.y) parts += y;
  EXPECT_NEAR(sum, parts, 1e-3);
  expect_contains(throws_message([&] { split_holdout(d, 1.0, 0, &a, &b); }),
                  "--holdout must be in (0, 1)");
}

TEST(DynPipeSlowdown, HoldoutKeepsWindowsWhole) {
  SlowdownData d = synthetic(120, 1, [](const float* x) { return x[0]; });
  for (size_t i = 0; i < d.rows(); ++i) d.group.push_back(static_cast<int64_t>(i / 12));
  SlowdownData train, test;
  split_holdout(d, 0.2, 3, &train, &test);
  EXPECT_EQ(test.rows(), 24u);  // two windows of 12 rows
  for (int64_t g : test.group) {
    EXPECT_EQ(std::count(train.group.begin(), train.group.end(), g), 0) << "window " << g;
    EXPECT_EQ(std::count(test.group.begin(), test.group.end(), g), 12) << "window " << g;
  }
}

TEST(DynPipeSlowdown, LinearRegressionIsExactOnALinearTarget) {
  const SlowdownData d =
      synthetic(200, 2, [](const float* x) { return 1.0 + 2.0 * x[0] - 0.5 * x[1] + 3.0 * x[3]; });
  const LinearModel m = LinearModel::fit(d);
  EXPECT_LT(mean_absolute_error(m.predict(d), d.y), 1e-3);
}

TEST(DynPipeSlowdown, ForestBeatsLinearRegressionOnANonLinearTarget) {
  if (!forest_available()) GTEST_SKIP() << "built with -DSTRATA_WITH_XGBOOST=OFF";
  const SlowdownData d = synthetic(600, 3, nonlinear);
  SlowdownData train, test;
  split_holdout(d, 0.2, 0, &train, &test);
  ForestOptions o;  // 128 trees
  o.threads = 1;
  const ForestModel forest = ForestModel::fit(train, o);
  const LinearModel linear = LinearModel::fit(train);
  const double forest_mae = mean_absolute_error(forest.predict(test), test.y);
  const double linear_mae = mean_absolute_error(linear.predict(test), test.y);
  EXPECT_LT(forest_mae, 0.6 * linear_mae) << "forest " << forest_mae << ", linear " << linear_mae;
  EXPECT_LT(forest_mae, 0.25);
  // Deterministic with a fixed seed; another seed draws other subsamples.
  EXPECT_EQ(ForestModel::fit(train, o).predict(test), forest.predict(test));
  o.seed = 9;
  EXPECT_NE(ForestModel::fit(train, o).predict(test), forest.predict(test));
}

TEST(DynPipeSlowdown, ForestFileRoundTripsWithItsFeatureSet) {
  if (!forest_available()) GTEST_SKIP() << "built with -DSTRATA_WITH_XGBOOST=OFF";
  const std::string dir = fresh_dir("strata_dynpipe_slowdown_file");
  const SlowdownData d = synthetic(300, 4, nonlinear);
  ForestOptions o;
  o.trees = 16;
  o.threads = 1;
  const ForestModel forest = ForestModel::fit(d, o);
  const std::string path = dir + "/model.json";
  forest.save(path);
  const ForestModel back = ForestModel::load(path, d.features);
  EXPECT_EQ(back.features(), d.features);
  EXPECT_EQ(back.predict(d), forest.predict(d));
  EXPECT_EQ(ForestModel::load(path).features(), d.features);

  // Another feature set: named, with what differs.
  expect_contains(throws_message([&] {
                    ForestModel::load(path, {"x0", "x1", "x2", "cpu"});
                  }),
                  "slowdown model '" + path +
                      "' was trained on another feature set: 'custom', 4 features (x0,x1,x2,x3), "
                      "expected 4 (x0,x1,x2,cpu); the file lacks cpu; the file has extra x3");
  expect_contains(throws_message([&] {
                    ForestModel::load(path, {"x1", "x0", "x2", "x3"});
                  }),
                  "same names in another order");
  // Missing, empty, truncated, not a Strata model.
  expect_contains(throws_message([&] { ForestModel::load(dir + "/none.json"); }),
                  "slowdown model '" + dir + "/none.json' is missing");
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(dir + "/cut.json", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  expect_contains(throws_message([&] { ForestModel::load(dir + "/cut.json"); }),
                  "slowdown model '" + dir + "/cut.json' is truncated or not JSON");
  std::ofstream(dir + "/empty.json");
  expect_contains(throws_message([&] { ForestModel::load(dir + "/empty.json"); }), "is empty");
  std::ofstream(dir + "/other.json") << R"({"learner": {"attributes": {}}, "version": [1, 7, 4]})";
  expect_contains(throws_message([&] { ForestModel::load(dir + "/other.json"); }),
                  "is not a Strata slowdown model");
  // The attributes right but the model inside broken: XGBoost's own error, with the file.
  std::string broken = bytes;
  const size_t trees = broken.find("\"trees\"");
  ASSERT_NE(trees, std::string::npos);
  broken.replace(trees, 7, "\"treez\"");
  std::ofstream(dir + "/broken.json", std::ios::binary) << broken;
  expect_contains(throws_message([&] { ForestModel::load(dir + "/broken.json"); }),
                  "slowdown model '" + dir + "/broken.json' is not a valid XGBoost model");
}

}  // namespace
}  // namespace strata::parallel::dynpipe
