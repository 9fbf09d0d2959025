// --repartition dynpipe, dynpipe-no-rf and pipedream-re and the runtime monitor through the CLI:
// each policy moves layers off a stage slowed by the injector at the step the loop promises, and
// the run stays bitwise the run without repartition (synchronous schedules move at step
// boundaries); a slowdown-model file that cannot be used stops the run naming the file, unless
// --slowdown-fallback no-rf, which says that it falls back; the monitor's samples of every stage
// are written as {"type":"monitor"} records and change no number; bad flags are refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "testing/cli.h"
#include "testing/train_run.h"

namespace {

using strata::testing::contains;
using strata::testing::run_cli;
using strata::testing::train_run;
using strata::testing::TrainRun;

const char* kGpt2 =
    "--model gpt2 --size tiny --dataset synthetic-tokens --synthetic-vocab 256 --seq-len 32 "
    "--train-samples 512 --test-samples 16 --steps 5 --batch-size 8 --micro-batches 4 --seed 5 "
    "--stages 2 --local --partition 0-1,2-3 --threads 1";

// A slowdown model on the features the trainer gives it (feature set strata-cpu-3, strata profile
// --colocation's columns), fitted by strata fit-slowdown on a synthetic set: slowdown 3 with more
// than 3 co-located load threads on the rank's device, else 1.
std::string fit_model(const std::string& dir) {
  const std::string csv = dir + "/synthetic.csv", model = dir + "/forest.json";
  std::ofstream out(csv);
  out << "layer,rank,window,layer_solo_ms,layer_param_bytes,layer_output_bytes,"
         "layer_activation_bytes,cpu_util_mean,cpu_util_max,runq_per_core,run_delay_per_cpu_s,"
         "preempt_per_cpu_s,colocated_threads,slowdown\n";
  std::mt19937 rng(2);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int i = 0; i < 200; ++i) {
    const double load = 6 * u(rng);
    out << "l" << i % 7 << ",0," << i / 7 << "," << u(rng) << "," << 1e5 * u(rng) << ","
        << 1e3 * u(rng) << "," << 2e3 * u(rng) << "," << u(rng) << "," << u(rng) << "," << u(rng)
        << "," << u(rng) << "," << 1e2 * u(rng) << "," << load << "," << (load > 3 ? 3.0 : 1.0)
        << "\n";
  }
  out.close();
  const auto r =
      run_cli("fit-slowdown --data " + csv + " --out " + model + " --threads 1 --trees 16");
  EXPECT_EQ(r.status, 0) << r.output;
  return model;
}

// cnn tiny on Fashion-MNIST, 2 stages, the second slowed 20x from the first step (a sleep in
// proportion to the work): the first window's layer times on stage 1 are its layers' costs, so
// every policy moves layers from stage 1 to stage 0 before step 6 (dynpipe-no-rf and dynpipe
// because the solo costs they see are heavy there; the model's counters are the same for local
// ranks), and the run is bitwise the run that moves nothing.
TEST(DynpipeCli, EachPolicyMovesLayersOffASlowedStageAndChangesNoNumber) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist")) {
    GTEST_SKIP() << "no Fashion-MNIST";
  }
  const std::string dir = strata::testing::fresh_temp_dir("strata_dynpipe_cli");
  const std::string model = fit_model(dir);
  const std::string args =
      "--model cnn --size tiny --dataset fashion-mnist --train-samples 256 --test-samples 32 "
      "--steps 9 --batch-size 16 --micro-batches 2 --stages 2 --local --threads 1 "
      "--partition conv1-conv2,bn2-fc2 --seed 3 --schedule 1f1b";
  const TrainRun plain = train_run(dir, "plain", args);
  ASSERT_EQ(plain.status, 0) << plain.output;
  for (const std::string policy : {"dynpipe-no-rf", "pipedream-re", "dynpipe"}) {
    SCOPED_TRACE(policy);
    const TrainRun moved =
        train_run(dir, "moved",
                  args + " --inject \"rank=1,kind=slow,factor=20\" --repartition " + policy +
                      " --repartition-every 4 --monitor-interval-ms 1" +
                      (policy == "dynpipe" ? " --slowdown-model " + model : ""));
    ASSERT_EQ(moved.status, 0) << moved.output;
    ASSERT_FALSE(moved.of("repartition").empty()) << moved.output;
    const nlohmann::json& first = moved.of("repartition")[0];
    EXPECT_EQ(first["step"], 4) << first;
    EXPECT_EQ(first["policy"], policy) << first;
    ASSERT_TRUE(first["applied"].get<bool>()) << first;
    EXPECT_EQ(first["apply_step"], 5) << first;
    EXPECT_LT(first["predicted_slowest_s"].get<double>(), first["current_slowest_s"].get<double>());
    ASSERT_FALSE(moved.of("migration").empty()) << moved.output;
    const nlohmann::json& m = moved.of("migration")[0];
    EXPECT_EQ(m["step"], 5) << m;
    EXPECT_EQ(m["partition"], first["proposed"]) << m;
    EXPECT_TRUE(contains(m["moves"].get<std::string>(), "1->0")) << m;
    EXPECT_FALSE(contains(m["moves"].get<std::string>(), "0->1")) << m;
    EXPECT_TRUE(contains(moved.output, "repartition | after step 4 | " + policy)) << moved.output;
    EXPECT_EQ(moved.losses, plain.losses);
    EXPECT_TRUE(moved.weights == plain.weights) << "the final weights differ";
  }
}

TEST(DynpipeCli, ABadModelFileStopsTheRunUnlessTheFallbackIsAsked) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_dynpipe_cli_model");
  const std::string model = fit_model(dir);
  std::ifstream in(model);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string truncated = dir + "/truncated.json";
  std::ofstream(truncated) << bytes.substr(0, bytes.size() / 3);
  for (const auto& [path, what] : std::vector<std::pair<std::string, std::string>>{
           {dir + "/missing.json", "missing"}, {truncated, "truncated"}}) {
    SCOPED_TRACE(path);
    const std::string args = std::string(kGpt2) +
                             " --repartition dynpipe --repartition-every 2 --slowdown-model " +
                             path;
    const TrainRun stopped = train_run(dir, "stopped", args);
    EXPECT_NE(stopped.status, 0) << stopped.output;
    EXPECT_TRUE(contains(stopped.output, path)) << stopped.output;
    EXPECT_TRUE(contains(stopped.output, what)) << stopped.output;
    EXPECT_TRUE(contains(stopped.output, "--slowdown-fallback no-rf")) << stopped.output;
    EXPECT_TRUE(stopped.losses.empty()) << "trained before refusing";
    const TrainRun fallback = train_run(dir, "fallback", args + " --slowdown-fallback no-rf");
    ASSERT_EQ(fallback.status, 0) << fallback.output;
    EXPECT_TRUE(contains(fallback.output, "falling back to dynpipe-no-rf")) << fallback.output;
    ASSERT_FALSE(fallback.of("repartition").empty()) << fallback.output;
    EXPECT_EQ(fallback.of("repartition")[0]["policy"], "dynpipe-no-rf (fallback)");
  }
  // The good file trains.
  const TrainRun good =
      train_run(dir, "good",
                std::string(kGpt2) +
                    " --repartition dynpipe --repartition-every 2 --slowdown-model " + model);
  ASSERT_EQ(good.status, 0) << good.output;
  ASSERT_FALSE(good.of("repartition").empty()) << good.output;
  EXPECT_EQ(good.of("repartition")[0]["policy"], "dynpipe");
}

// The monitor on a run without repartition: every rank's samples, in order, from the interval's
// first sample on; the losses and weights of the run without it.
TEST(MonitorCli, EveryStageIsSampledIntoTheMetricsAndNoNumberChanges) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_monitor_cli");
  const TrainRun plain = train_run(dir, "plain", kGpt2);
  ASSERT_EQ(plain.status, 0) << plain.output;
  const TrainRun monitored =
      train_run(dir, "monitored", std::string(kGpt2) + " --monitor-interval-ms 1");
  ASSERT_EQ(monitored.status, 0) << monitored.output;
  EXPECT_EQ(monitored.losses, plain.losses);
  EXPECT_TRUE(monitored.weights == plain.weights) << "the final weights differ";
  EXPECT_TRUE(plain.of("monitor").empty());
  std::map<int, int64_t> last_seq;
  for (const nlohmann::json& m : monitored.of("monitor")) {
    const int rank = m["rank"].get<int>();
    EXPECT_EQ(m["stage"].get<int>(), rank) << m;
    EXPECT_GT(m["seq"].get<int64_t>(), last_seq[rank]) << m;
    last_seq[rank] = m["seq"].get<int64_t>();
    EXPECT_GE(m["steps"].get<int64_t>(), 1) << m;
    EXPECT_GT(m["seconds"].get<double>(), 0.0) << m;
    EXPECT_GT(m["busy_seconds"].get<double>(), 0.0) << m;
    EXPECT_LE(m["busy_seconds"].get<double>(), m["seconds"].get<double>()) << m;
    for (const char* k : {"cpu_util_mean", "runq_per_core", "run_delay_per_cpu_s"}) {
      EXPECT_TRUE(m.contains(k)) << m;
    }
  }
  // 5 steps, the first starts the interval: 4 samples a rank at 1 ms.
  EXPECT_EQ(last_seq[0], 4);
  EXPECT_EQ(last_seq[1], 4);
}

TEST(DynpipeCli, RefusesBadFlagsBeforeTraining) {
  const std::string base = std::string("train ") + kGpt2 + " --progress off ";
  for (const auto& [flags, words] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"--repartition dynpipe", {"--repartition dynpipe", "--slowdown-model"}},
           {"--repartition dynpipe-no-rf --slowdown-model x.json", {"--slowdown-model"}},
           {"--repartition vpipe --slowdown-fallback no-rf", {"--slowdown-fallback"}},
           {"--repartition dynpipe --slowdown-model x.json --slowdown-fallback all",
            {"--slowdown-fallback"}},
           {"--repartition dynpipe --slowdown-model x.json --monitor-interval-ms 0",
            {"--monitor-interval-ms"}},
           {"--monitor-interval-ms -3", {"--monitor-interval-ms"}},
           {"--repartition pipedream-re --repartition-every 1", {"--repartition-every"}},
           {"--repartition pipedream-re --schedule async-1f1b",
            {"--repartition pipedream-re", "--migration restart"}},
           {"--repartition dynpipe-no-rf --repartition-top-k -1", {"--repartition-top-k"}},
       }) {
    SCOPED_TRACE(flags);
    const auto r = run_cli(base + flags);
    EXPECT_NE(r.status, 0) << r.output;
    for (const std::string& w : words) EXPECT_TRUE(contains(r.output, w)) << r.output;
  }
}

}  // namespace
