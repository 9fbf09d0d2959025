// The slowdown model's one feature set (parallel/dynpipe/slowdown_features.h): a profile row and
// a monitor row of the same window are the same numbers, the forest's prediction in training is
// made on that row, a model of another set is refused naming what differs, and a forest of the
// set fitted on a small generated set tells an unloaded row from a loaded one. No timing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/check.h"
#include "parallel/dynpipe/colocation.h"
#include "parallel/dynpipe/monitor.h"
#include "parallel/dynpipe/repartition.h"
#include "parallel/dynpipe/slowdown_features.h"
#include "parallel/dynpipe/slowdown_model.h"
#include "parallel/dynpipe_test_util.h"

namespace strata::parallel::dynpipe {
namespace {

using testing::fresh_dir;
using testing::throws_message;

// Two readings of a window in which the process waited 0.8 s for a core per CPU second.
void window(CpuSnapshot* a, CpuSnapshot* b) {
  a->cores = {{100, 1000}, {300, 1000}};
  b->cores = {{700, 1800}, {1000, 1800}};
  a->involuntary = 10;
  b->involuntary = 40;
  a->exec_ns = 2000000000;
  b->exec_ns = 2500000000;
  a->run_delay_ns = 100000000;
  b->run_delay_ns = 500000000;
  a->load_exec_ns = 1000000000;
  b->load_exec_ns = 4000000000;
  a->load_delay_ns = 0;
  b->load_delay_ns = 1000000000;
  a->procs_running = 3;
  b->procs_running = 5;
  a->seconds = 10.0;
  b->seconds = 12.0;
}

LayerFeatures a_layer() {
  LayerFeatures l;
  l.solo_ms = 0.75;
  l.param_bytes = 4096;
  l.output_bytes = 1024;
  l.activation_bytes = 2048;
  return l;
}

// What the monitor of rank 0 of 1 holds after the all-reduce of its sample with `counters`.
MonitorSample through_the_monitor(const CpuCounters& counters) {
  StageMonitor monitor(100.0, 0, 0, 0, 1);
  std::vector<double> slot = {1, 0, 0, 5, 2.0, 1.5, 5, 1};
  for (double v : counter_values(counters)) slot.push_back(v);
  EXPECT_EQ(slot.size(), StageMonitor::kWidth);
  monitor.absorb(slot);
  return monitor.latest()[0];
}

TEST(DynPipeFeatures, AProfileRowAndAMonitorRowOfOneWindowAreTheSame) {
  CpuSnapshot a, b;
  window(&a, &b);
  // The profile's window (CounterWindow: the mean of the run queue's samples) and the monitor's
  // interval (the mean of its two readings) over the same readings.
  const CpuCounters profiled = counters_between(a, b, 4.0);
  const CpuCounters monitored =
      counters_between(a, b, 0.5 * static_cast<double>(a.procs_running + b.procs_running));
  const MonitorSample sample = through_the_monitor(monitored);
  const std::vector<double> profile_row = slowdown_feature_row(a_layer(), profiled);
  const std::vector<double> monitor_row =
      slowdown_feature_row(a_layer(), counters_from_map(sample.counter_map(), "rank 0"));
  EXPECT_EQ(profile_row, monitor_row);
  ASSERT_EQ(profile_row.size(), slowdown_features().size());
  EXPECT_EQ(slowdown_features()[0], "layer_solo_ms");
  EXPECT_DOUBLE_EQ(profile_row[0], 0.75);
  // colocated_threads: the load's 3 s on a CPU and 1 s waiting for one, in 2 s
  EXPECT_DOUBLE_EQ(profile_row[4], 2.0);
  // The machine's counters and the process's own are the monitor's, not features.
  EXPECT_DOUBLE_EQ(sample.counters.runq_per_core, 2.0);        // 4 over 2 cores
  EXPECT_DOUBLE_EQ(sample.counters.run_delay_per_cpu_s, 0.8);  // 0.4 s over 0.5 s of CPU
  EXPECT_DOUBLE_EQ(sample.counters.preempt_per_cpu_s, 60.0);   // 30 over 0.5 s of CPU
}

ForestModel fit(const std::vector<std::string>& features, const std::vector<float>& x,
                const std::vector<float>& y, int trees) {
  SlowdownData d;
  d.features = features;
  d.x = x;
  d.y = y;
  ForestOptions o;
  o.trees = trees;
  o.threads = 1;
  return ForestModel::fit(d, o);
}

// n rows of the set: half unloaded (no co-located load, slowdown 1 +- 0.05), half loaded (1 to 3
// of the load's threads, slowdown 1 + the threads), the other columns random.
void generated(size_t n, std::vector<float>* x, std::vector<float>* y) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  const size_t f = slowdown_features().size();
  for (size_t i = 0; i < n; ++i) {
    std::vector<float> row(f);
    for (float& v : row) v = u(rng);
    const bool loaded = i % 2 == 1;
    row[4] = loaded ? 1.0f + 2.0f * u(rng) : 0.02f * u(rng);  // colocated_threads
    x->insert(x->end(), row.begin(), row.end());
    y->push_back(loaded ? 1.0f + row[4] : 0.95f + 0.1f * u(rng));
  }
}

TEST(DynPipeFeatures, TrainingPredictsOnTheProfilesRow) {
  if (!forest_available()) GTEST_SKIP() << "built with -DSTRATA_WITH_XGBOOST=OFF";
  std::vector<float> x, y;
  generated(200, &x, &y);
  const ForestModel forest = fit(slowdown_features(), x, y, 8);
  CpuSnapshot a, b;
  window(&a, &b);
  const CpuCounters c = counters_between(a, b, 4.0);
  // A stage of one layer: make_forest_slowdown's slowdown is the forest's on the profile's row.
  LayerCost layer;
  layer.forward_ms = a_layer().solo_ms;
  layer.param_bytes = a_layer().param_bytes;
  layer.output_bytes = a_layer().output_bytes;
  layer.activation_bytes = a_layer().activation_bytes;
  const SlowdownFn fn =
      make_forest_slowdown(forest, {layer}, {through_the_monitor(c).counter_map()});
  std::vector<float> row;
  for (double v : slowdown_feature_row(a_layer(), c)) row.push_back(static_cast<float>(v));
  EXPECT_FLOAT_EQ(static_cast<float>(fn(0, {0, 1})), forest.predict(row.data()));
}

TEST(DynPipeFeatures, AModelOfAnotherFeatureSetIsRefusedNamingWhatDiffers) {
  if (!forest_available()) GTEST_SKIP() << "built with -DSTRATA_WITH_XGBOOST=OFF";
  const std::string dir = fresh_dir("strata_dynpipe_features");
  // The set before strata-cpu-2 (strata-cpu-1): the raw run queue and switch rates.
  const std::vector<std::string> old = {
      "layer_solo_ms",      "layer_param_bytes",   "layer_output_bytes", "layer_activation_bytes",
      "cpu_util_mean",      "cpu_util_max",        "procs_running",      "ctxt_per_s",
      "voluntary_cs_per_s", "involuntary_cs_per_s"};
  std::vector<float> x, y;
  for (int i = 0; i < 20; ++i) {
    for (size_t k = 0; k < old.size(); ++k) x.push_back(static_cast<float>(i + k));
    y.push_back(1.0f + 0.1f * static_cast<float>(i));
  }
  const ForestModel other = fit(old, x, y, 2);
  const std::string path = dir + "/old.json";
  other.save(path);
  const std::string message = throws_message([&] { ForestModel::load(path, slowdown_features()); });
  for (const std::string& part :
       {"slowdown model '" + path + "' was trained on another feature set: 'custom', 10 features",
        std::string("expected 'strata-cpu-3', 5 (layer_solo_ms,"),
        std::string("the file lacks colocated_threads"),
        std::string("the file has extra cpu_util_mean,cpu_util_max,procs_running,ctxt_per_s,"
                    "voluntary_cs_per_s,involuntary_cs_per_s")}) {
    EXPECT_NE(message.find(part), std::string::npos) << message;
  }
  // Predicting in training with it is refused too, by the set's name.
  std::map<std::string, double> counters;
  for (const std::string& n : counter_names()) counters[n] = 0.0;
  EXPECT_NE(throws_message([&] {
              make_forest_slowdown(other, {LayerCost{}}, {counters});
            }).find("are not feature set strata-cpu-3"),
            std::string::npos);
  // A model of the set records its name and loads.
  std::vector<float> sx, sy;
  generated(20, &sx, &sy);
  fit(slowdown_features(), sx, sy, 2).save(dir + "/set.json");
  EXPECT_EQ(ForestModel::load(dir + "/set.json", slowdown_features()).features(),
            slowdown_features());
}

TEST(DynPipeFeatures, AForestOfTheSetTellsAnUnloadedRowFromALoadedOne) {
  if (!forest_available()) GTEST_SKIP() << "built with -DSTRATA_WITH_XGBOOST=OFF";
  std::vector<float> x, y;
  generated(400, &x, &y);
  const ForestModel forest = fit(slowdown_features(), x, y, 32);
  const size_t f = slowdown_features().size();
  std::vector<float> unloaded(f, 0.5f), loaded(f, 0.5f);
  unloaded[4] = 0.0f;
  loaded[4] = 2.0f;
  EXPECT_NEAR(forest.predict(unloaded.data()), 1.0, 0.15);
  EXPECT_GT(forest.predict(loaded.data()), 1.5);
}

}  // namespace
}  // namespace strata::parallel::dynpipe
