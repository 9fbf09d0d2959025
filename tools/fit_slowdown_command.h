// `strata fit-slowdown`: trains DynPipe's slowdown forest (parallel/dynpipe/slowdown_model.h) on a
// co-location data set (`strata profile --colocation`, or any CSV with a "slowdown" column), saves
// it, and prints its held-out mean absolute error beside a linear regression's and the prediction
// latency of both.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace strata::tools {

struct FitSlowdownOptions {
  std::string data;
  std::string out;
  std::string features;  // comma-separated; empty: the data set's default columns
  double holdout = 0.2;
  uint64_t seed = 0;
  int trees = 128;
  double subsample = 0.8;
  double colsample = 0.8;
  int max_depth = 10;
  int threads = 0;
  int latency_repeats = 200;
};

CLI::App* add_fit_slowdown_command(CLI::App& app, FitSlowdownOptions& options);
int run_fit_slowdown(const FitSlowdownOptions& options);

}  // namespace strata::tools
