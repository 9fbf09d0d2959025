// vPIPE part 1 through the CLI, as a user runs it: every memory policy (keep, swap, recompute,
// auto) gives bitwise the per-step losses (--metrics) and final weights (--save-weights) of keep,
// for GPT-2 tiny (dropout on) and a ResNet with batch norm, one process, stages of --local
// threads and MPI ranks, each schedule; and the bound: under a --mem-limit where keep runs out of
// memory, auto trains, every rank's measured peak stays under the limit and the planner's
// predicted peak is within 15% of it.
#include <gtest/gtest.h>

#include <cstdio>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/mnist.h"
#include "testing/cli.h"
#include "testing/train_run.h"

namespace {

using strata::testing::contains;
using strata::testing::run_cli;

using strata::testing::train_run;
using strata::testing::TrainRun;

double max_peak(const TrainRun& r) {
  double peak = 0;
  for (const auto& s : r.of("stage")) peak = std::max(peak, s["peak_bytes"].get<double>());
  return peak;
}

bool planned_something(const TrainRun& r) {
  for (const auto& s : r.of("stage")) {
    if (s["swapped_bytes"].get<double>() > 0 || s["recompute_s"].get<double>() > 0) return true;
  }
  return false;
}

// GPT-2 tiny (dropout 0.1 everywhere) on tokens of a 256-word vocabulary, so that activations,
// not the embedding, fill a stage; a ResNet of batch norms on Fashion-MNIST.
const char* kGpt2 =
    "--model gpt2 --size tiny --dataset synthetic-tokens --synthetic-vocab 256 --seq-len 32 "
    "--train-samples 256 --test-samples 16";
const char* kResNet =
    "--model resnet --size tiny --dataset fashion-mnist --train-samples 256 --test-samples 64";

// `schedules` under every policy against keep. `layout` adds the stages (and --local), or
// `launcher` runs the ranks under mpirun.
void expect_policies_equal(const std::string& name, const std::string& model,
                           const std::string& layout, const std::vector<std::string>& schedules,
                           const std::string& launcher = "") {
  const std::string dir = strata::testing::fresh_temp_dir("strata_memory_cli_" + name);
  for (const std::string& schedule : schedules) {
    SCOPED_TRACE(schedule);
    // --partition uniform: a balanced partition follows the layers' measured times, so the
    // probe's stages and each auto run's could differ, and a limit under the probe's largest
    // stage need not be under another run's (the test failed so once in CI's clone).
    const std::string stages =
        layout.find("--stages") == std::string::npos ? "" : " --partition uniform";
    const std::string args = model + " " + layout + stages + " --schedule " + schedule +
                             " --steps 2 --batch-size 16 --micro-batches 4 --seed 3";
    const TrainRun keep = train_run(dir, "keep", args + " --memory-policy keep", launcher);
    ASSERT_EQ(keep.status, 0) << keep.output;
    ASSERT_EQ(keep.losses.size(), 2u) << keep.output;
    ASSERT_FALSE(keep.weights.empty());
    for (const char* policy : {"swap", "recompute"}) {
      const TrainRun other = train_run(dir, policy, args + " --memory-policy " + policy, launcher);
      ASSERT_EQ(other.status, 0) << policy << "\n" << other.output;
      EXPECT_TRUE(planned_something(other)) << policy << "\n" << other.output;
      EXPECT_EQ(other.losses, keep.losses) << policy;
      EXPECT_TRUE(other.weights == keep.weights) << policy << ": the final weights differ";
    }
    // auto under limits below the planner's own prediction for keep (the measured peak of an
    // unlimited run also counts what the caching allocator holds): the first limit where the
    // planner swaps or recomputes something must train to keep's losses and weights, and so must
    // every run under a limit before it, on every schedule.
    const TrainRun probe =
        train_run(dir, "probe", args + " --memory-policy auto --mem-limit 1GiB --eval-batch-size 4",
                  launcher);
    ASSERT_EQ(probe.status, 0) << probe.output;
    EXPECT_FALSE(planned_something(probe)) << probe.output;
    EXPECT_EQ(probe.losses, keep.losses) << "auto under 1GiB";
    double kept = 0;
    for (const auto& p : probe.of("memory_plan"))
      kept = std::max(kept, p["predicted_peak_bytes"].get<double>());
    ASSERT_GT(kept, 0.0) << probe.output;
    bool planned = false;
    for (double fraction : {0.9, 0.8, 0.7, 0.6}) {
      const long long limit = static_cast<long long>(fraction * kept);
      const TrainRun a = train_run(dir, "auto",
                                   args + " --memory-policy auto --mem-limit " +
                                       std::to_string(limit) + " --eval-batch-size 4",
                                   launcher);
      if (a.status != 0 && contains(a.output, "is too small for stage")) break;
      ASSERT_EQ(a.status, 0) << "auto under " << limit << " B\n" << a.output;
      EXPECT_EQ(a.losses, keep.losses) << "auto under " << limit << " B";
      EXPECT_TRUE(a.weights == keep.weights) << "auto: the final weights differ";
      if (planned_something(a)) {
        planned = true;
        break;
      }
    }
    EXPECT_TRUE(planned)
        << "auto swapped or recomputed nothing under 60-90% of keep's predicted peak";
  }
}

bool have_fashion_mnist() { return std::filesystem::exists(strata::io::kFashionMnistDir); }

TEST(MemoryCli, Gpt2OneProcess) { expect_policies_equal("gpt2_s1", kGpt2, "", {"gpipe"}); }
TEST(MemoryCli, Gpt2TwoLocalStages) {
  expect_policies_equal("gpt2_s2", kGpt2, "--stages 2 --local", {"gpipe", "1f1b", "async-1f1b"});
}
TEST(MemoryCli, Gpt2FourLocalStages) {
  expect_policies_equal("gpt2_s4", kGpt2, "--stages 4 --local", {"gpipe"});
}
TEST(MemoryCli, ResNetOneProcess) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "no Fashion-MNIST";
  expect_policies_equal("resnet_s1", kResNet, "", {"gpipe"});
}
TEST(MemoryCli, ResNetTwoLocalStages) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "no Fashion-MNIST";
  expect_policies_equal("resnet_s2", kResNet, "--stages 2 --local", {"gpipe", "async-1f1b"});
}
TEST(MemoryCli, ResNetFourLocalStages) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "no Fashion-MNIST";
  expect_policies_equal("resnet_s4", kResNet, "--stages 4 --local", {"1f1b"});
}

#ifdef STRATA_MPIEXEC
using strata::testing::mpirun;

// 2 groups x 2 stages of MPI processes.
TEST(MemoryCli, Gpt2TwoGroupsOfTwoMpiStages) {
  expect_policies_equal("gpt2_mpi", kGpt2, "--stages 2 --groups 2 --threads 1", {"gpipe"},
                        mpirun(4));
}
#endif

// The bound: with a limit keep cannot meet (it runs out of memory, naming the layer and the
// limit), auto trains under it, and every stage's measured peak is under the limit and under the
// planner's prediction (to 2%), which is at most 10% above it. gpipe on 4 stages (every micro-batch
// of the step in flight), and 1f1b and async-1f1b on 2 (p - k in flight, stashed weights) with
// micro-batches of 2 rows.
void expect_auto_under_a_limit(const std::string& name, const std::string& layout,
                               double fraction) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_memory_cli_bound_" + name);
  std::string gpt2 = kGpt2;
  gpt2.replace(gpt2.find("--seq-len 32"), 12, "--seq-len 64");
  const std::string args = gpt2 + " --local --steps 2 --partition uniform --seed 3 " + layout;
  const TrainRun unlimited = train_run(dir, "unlimited", args);
  ASSERT_EQ(unlimited.status, 0) << unlimited.output;
  const long long limit = static_cast<long long>(fraction * max_peak(unlimited));
  const std::string limited = args + " --mem-limit " + std::to_string(limit);
  const TrainRun keep = train_run(dir, "keep", limited + " --memory-policy keep");
  EXPECT_NE(keep.status, 0) << keep.output;
  EXPECT_TRUE(contains(keep.output, "out of memory on cpu")) << keep.output;
  const TrainRun a = train_run(dir, "auto", limited + " --memory-policy auto");
  ASSERT_EQ(a.status, 0) << a.output;
  EXPECT_EQ(a.losses, unlimited.losses);
  EXPECT_TRUE(a.weights == unlimited.weights);
  const size_t stages = unlimited.of("stage").size();
  ASSERT_EQ(a.of("memory_plan").size(), stages) << a.output;
  ASSERT_EQ(a.of("stage").size(), stages) << a.output;
  for (const auto& s : a.of("stage")) {
    const int stage = s["stage"].get<int>();
    const double measured = s["peak_bytes"].get<double>();
    const double predicted = a.of("memory_plan")[stage]["predicted_peak_bytes"].get<double>();
    EXPECT_LE(measured, static_cast<double>(limit)) << "stage " << stage;
    // The prediction bounds the peak (to 2%) without being far above it (here gpipe's swap
    // plans 1.014, 1f1b's and async-1f1b's recompute plans 1.000-1.001, keep plans 0.999-1.036).
    EXPECT_GE(predicted / measured, 0.98)
        << "stage " << stage << ": predicted " << predicted << " B, measured " << measured
        << " B; plan " << a.of("memory_plan")[stage]["plan"];
    EXPECT_LE(predicted / measured, 1.10)
        << "stage " << stage << ": predicted " << predicted << " B, measured " << measured
        << " B; plan " << a.of("memory_plan")[stage]["plan"];
    std::printf("%s stage %d: predicted / measured %.4f (%s)\n", name.c_str(), stage,
                predicted / measured, a.of("memory_plan")[stage]["plan"].dump().c_str());
  }
}

TEST(MemoryCli, AutoTrainsUnderALimitWhereKeepRunsOutOfMemory) {
  expect_auto_under_a_limit("gpipe",
                            "--stages 4 --schedule gpipe --batch-size 32 "
                            "--micro-batches 8 --eval-batch-size 4",
                            0.6);
}
TEST(MemoryCli, AutoUnderALimitWith1f1bAndAsync) {
  for (const char* schedule : {"1f1b", "async-1f1b"}) {
    expect_auto_under_a_limit(schedule,
                              std::string("--stages 2 --schedule ") + schedule +
                                  " --batch-size 16 --micro-batches 8 --eval-batch-size 2",
                              0.85);
  }
}

// The model's prediction of keep plans (auto with room for everything) on 4 stages under every
// schedule: within [0.98, 1.10] of every stage's measured peak (the receive buffers, the running
// micro-batch's moment and the first stage's batch are what made it up to 1.17 before).
TEST(MemoryCli, KeepPredictionsBoundEveryStagesPeakOnEverySchedule) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_memory_cli_keep_model");
  std::string gpt2 = kGpt2;
  gpt2.replace(gpt2.find("--seq-len 32"), 12, "--seq-len 64");
  for (const char* schedule : {"gpipe", "1f1b", "async-1f1b"}) {
    const TrainRun r = train_run(
        dir, schedule,
        gpt2 + " --local --steps 2 --partition uniform --seed 3 --stages 4 --schedule " + schedule +
            " --batch-size 32 --micro-batches 4 --eval-batch-size 8 "
            "--memory-policy auto --mem-limit 1GiB");
    ASSERT_EQ(r.status, 0) << r.output;
    ASSERT_EQ(r.of("stage").size(), 4u) << r.output;
    for (const auto& s : r.of("stage")) {
      const int stage = s["stage"].get<int>();
      const double measured = s["peak_bytes"].get<double>();
      const double predicted = r.of("memory_plan")[stage]["predicted_peak_bytes"].get<double>();
      EXPECT_EQ(r.of("memory_plan")[stage]["plan"].get<std::string>().rfind("keep ", 0), 0u);
      EXPECT_GE(predicted / measured, 0.98) << schedule << " stage " << stage;
      EXPECT_LE(predicted / measured, 1.10) << schedule << " stage " << stage;
      std::printf("%s stage %d: predicted / measured %.4f\n", schedule, stage,
                  predicted / measured);
    }
  }
}

}  // namespace
