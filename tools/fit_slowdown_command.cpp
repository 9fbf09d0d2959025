#include "tools/fit_slowdown_command.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/check.h"
#include "parallel/dynpipe/slowdown_features.h"
#include "parallel/dynpipe/slowdown_model.h"

namespace strata::tools {

namespace dp = parallel::dynpipe;

CLI::App* add_fit_slowdown_command(CLI::App& app, FitSlowdownOptions& o) {
  CLI::App* cmd = app.add_subcommand(
      "fit-slowdown",
      "Train DynPipe's slowdown model (a 128-tree XGBoost random forest) on a co-location data "
      "set and compare its held-out error with a linear regression's");
  cmd->option_defaults()->always_capture_default();
  cmd->add_option("--data", o.data,
                  "The data set: a CSV with a header and a 'slowdown' column (strata profile "
                  "--colocation writes one)")
      ->required();
  cmd->add_option("--out", o.out, "Write the forest to this file (XGBoost JSON + feature set)")
      ->required();
  cmd->add_option("--features", o.features,
                  "Comma-separated feature columns (empty = feature set strata-cpu-3, the columns "
                  "strata profile --colocation writes and training provides; a model of other "
                  "columns is for study: plan and train refuse it)");
  cmd->add_option("--holdout", o.holdout,
                  "Fraction of the rows held out for the error (whole windows when the data set "
                  "has a 'window' column: its rows share the window's counters)");
  cmd->add_option("--seed", o.seed, "Seed of the held-out split and the forest's subsamples");
  cmd->add_option("--trees", o.trees, "Trees of the forest (one boosting round)");
  cmd->add_option("--subsample", o.subsample, "Fraction of the rows each tree sees");
  cmd->add_option("--colsample", o.colsample, "Fraction of the features each split considers");
  cmd->add_option("--max-depth", o.max_depth, "Depth limit of the trees");
  cmd->add_option("--threads", o.threads, "XGBoost's threads (0 = its default)");
  cmd->add_option("--latency-repeats", o.latency_repeats,
                  "Single-row predictions timed for the latency (median)");
  return cmd;
}

namespace {

// Median microseconds of `repeats` calls of f.
template <typename F>
double median_us(int repeats, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const auto a = std::chrono::steady_clock::now();
    f(i);
    t.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int run_fit_slowdown(const FitSlowdownOptions& o) {
  STRATA_CHECK(dp::forest_available())
      << "this strata was built with -DSTRATA_WITH_XGBOOST=OFF: fit-slowdown needs XGBoost "
         "(install libxgboost-dev and configure again)";
  STRATA_CHECK(o.latency_repeats >= 1) << "--latency-repeats must be positive";
  const std::vector<std::string> features =
      o.features.empty() ? dp::slowdown_features() : dp::split_names(o.features);
  const dp::SlowdownData data = dp::read_slowdown_csv(o.data, features, 10);
  dp::SlowdownData train, test;
  dp::split_holdout(data, o.holdout, o.seed, &train, &test);
  std::printf("data set %s: %zu rows, %zu features (%s: %s)\n", o.data.c_str(), data.rows(),
              data.features.size(),
              data.features == dp::slowdown_features() ? dp::kFeatureSet : "custom",
              dp::join_names(data.features).c_str());
  std::string unit = "rows";
  if (!test.group.empty()) {
    std::vector<int64_t> g = test.group;
    std::sort(g.begin(), g.end());
    unit =
        "rows of " + std::to_string(std::unique(g.begin(), g.end()) - g.begin()) + " whole windows";
  }
  std::printf("held out %zu %s (--holdout %g, --seed %llu), trained on %zu\n", test.rows(),
              unit.c_str(), o.holdout, static_cast<unsigned long long>(o.seed), train.rows());

  dp::ForestOptions fo;
  fo.trees = o.trees;
  fo.subsample = o.subsample;
  fo.colsample_bynode = o.colsample;
  fo.max_depth = o.max_depth;
  fo.seed = o.seed;
  fo.threads = o.threads;
  const auto t0 = std::chrono::steady_clock::now();
  const dp::ForestModel forest = dp::ForestModel::fit(train, fo);
  const double fit_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const dp::LinearModel linear = dp::LinearModel::fit(train);
  forest.save(o.out);
  // What a run will use: the file read back, its feature set checked.
  const dp::ForestModel loaded = dp::ForestModel::load(o.out, data.features);

  const std::vector<float> forest_pred = loaded.predict(test);
  const std::vector<float> linear_pred = linear.predict(test);
  double mean = 0.0;
  for (float y : train.y) mean += y;
  mean /= static_cast<double>(train.rows());
  const std::vector<float> constant(test.rows(), static_cast<float>(mean));
  const double forest_mae = dp::mean_absolute_error(forest_pred, test.y);
  const double linear_mae = dp::mean_absolute_error(linear_pred, test.y);
  const double constant_mae = dp::mean_absolute_error(constant, test.y);

  const size_t n = test.rows();
  volatile float sink = 0.0f;
  const double forest_us =
      median_us(o.latency_repeats, [&](int i) { sink = sink + loaded.predict(test.row(i % n)); });
  const double linear_us =
      median_us(o.latency_repeats, [&](int i) { sink = sink + linear.predict(test.row(i % n)); });
  const double forest_batch_us =
      median_us(5, [&](int) { sink = sink + loaded.predict(test)[0]; }) / static_cast<double>(n);

  std::printf(
      "forest: %d trees, subsample %g, colsample by node %g, max depth %d, fitted in %.3f s",
      o.trees, o.subsample, o.colsample, o.max_depth, fit_s);
  std::printf("; wrote %s\n\n", o.out.c_str());
  std::printf("  %-34s %14s %22s\n", "model (held-out rows)", "MAE slowdown", "predict us/row");
  std::printf("  %-34s %14.4f %11.2f (batch %.2f)\n", "random forest (XGBoost)", forest_mae,
              forest_us, forest_batch_us);
  std::printf("  %-34s %14.4f %11.3f\n", "linear regression (least squares)", linear_mae,
              linear_us);
  std::printf("  %-34s %14.4f %11s\n", "mean of the training targets", constant_mae, "-");
  double test_mean = 0.0;
  for (float y : test.y) test_mean += y;
  std::printf("  (held-out slowdowns: mean %.4f)\n", test_mean / static_cast<double>(n));
  // A stage's slowdown is the solo-time-weighted mean of its layers' (make_forest_slowdown): the
  // error weighted the same way is the one a stage's prediction sees (a layer of microseconds,
  // whose per-window time is mostly when a sleep was paid, weighs little).
  const auto solo = std::find(test.features.begin(), test.features.end(), "layer_solo_ms");
  if (solo != test.features.end()) {
    const size_t k = static_cast<size_t>(solo - test.features.begin());
    const auto weighted = [&](const std::vector<float>& p) {
      double sum = 0.0, weight = 0.0;
      for (size_t i = 0; i < n; ++i) {
        const double w = test.row(i)[k];
        sum += w * std::fabs(p[i] - test.y[i]);
        weight += w;
      }
      return weight > 0 ? sum / weight : 0.0;
    };
    std::printf(
        "  weighted by layer_solo_ms (as a stage's slowdown): MAE forest %.4f, linear %.4f, "
        "constant %.4f\n",
        weighted(forest_pred), weighted(linear_pred), weighted(constant));
  }
  std::printf("\nforest MAE / linear MAE = %.3f (single-row latency: median of %d predictions)\n",
              linear_mae > 0 ? forest_mae / linear_mae : 0.0, o.latency_repeats);
  return 0;
}

}  // namespace strata::tools
