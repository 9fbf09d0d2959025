// --repartition under the asynchronous schedules (async-1f1b, 2bw; --migration restart) through
// the CLI: the run is one program that drains only where the loop decides a move. A policy that
// never moves gives the numbers of the plain asynchronous run (no periodic drains); a policy that
// moves gives those of --migrate-at at the step its record names (apply_step), to the partition
// it proposed, where the layout changes.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "testing/cli.h"
#include "testing/train_run.h"

namespace {

using strata::testing::contains;
using strata::testing::train_run;
using strata::testing::TrainRun;

// cnn tiny on Fashion-MNIST, 12 steps; by default 2 stages, 2 micro-batches a step.
const char* kTwoStages = "--stages 2 --micro-batches 2 --partition conv1-conv2,bn2-fc2";
std::string cnn_args(const std::string& schedule, const std::string& ranks,
                     const std::string& layout = kTwoStages) {
  return "--model cnn --size tiny --dataset fashion-mnist --train-samples 256 --test-samples 32 "
         "--steps 12 --batch-size 16 --threads 1 --seed 3 --migration restart --schedule " +
         schedule + " " + ranks + " " + layout;
}

bool have_fashion_mnist() { return std::filesystem::exists("/usr/share/datasets/fashion-mnist"); }

// A policy that decides every 2 steps and applies nothing (no gain reaches a threshold of 99%):
// the run never drains, so its losses and final weights are those of the run without the loop.
// (When the run drained every 2 steps, where a move might go, async-1f1b's were not, from step 4
// on: a drain restarts the pipeline and its staleness. 2bw's were: its forwards use the weights of
// the step before whether the pipeline drained or not.)
TEST(AsyncRepartitionCli, APolicyThatNeverMovesRunsAsThePlainAsynchronousRun) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "no Fashion-MNIST";
  const std::string dir = strata::testing::fresh_temp_dir("strata_async_repartition_keep");
  for (const char* schedule : {"async-1f1b", "2bw"}) {
    SCOPED_TRACE(schedule);
    const std::string args = cnn_args(schedule, "--local");
    const TrainRun plain = train_run(dir, "plain", args);
    ASSERT_EQ(plain.status, 0) << plain.output;
    const TrainRun kept = train_run(dir, "kept",
                                    args +
                                        " --repartition dynpipe-no-rf --repartition-every 2 "
                                        "--repartition-threshold 0.99");
    ASSERT_EQ(kept.status, 0) << kept.output;
    ASSERT_GE(kept.of("repartition").size(), 4u) << kept.output;
    for (const nlohmann::json& r : kept.of("repartition")) {
      EXPECT_FALSE(r["applied"].get<bool>()) << r;
      EXPECT_EQ(r["apply_step"], 0) << r;
    }
    EXPECT_TRUE(kept.of("migration").empty()) << kept.output;
    ASSERT_EQ(kept.losses.size(), 12u);
    EXPECT_EQ(kept.losses, plain.losses);
    EXPECT_TRUE(kept.weights == plain.weights) << "the final weights differ";
  }
}

// The last stage slowed 20x (a sleep in proportion to the work): the policy moves layers off it.
// The run is bitwise the run told by --migrate-at to move to the partitions the records proposed,
// at their apply_step, and each move's migration record is at that step. The first move is decided
// after step 4 and told with step 5; the run is cut after step `first_apply`: 6 where stage 0
// forwards one micro-batch ahead into the next step (2 stages, 2 micro-batches a step), 7 where it
// forwards two steps ahead (3 stages, 1 micro-batch a step).
void expect_moves_where_the_record_says(const std::string& name, const std::string& args,
                                        const std::string& launcher, int slowed, int first_apply) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_async_repartition_" + name);
  const TrainRun moved = train_run(dir, "moved",
                                   args + " --inject \"rank=" + std::to_string(slowed) +
                                       ",kind=slow,factor=20\" --repartition vpipe "
                                       "--repartition-every 4",
                                   launcher);
  ASSERT_EQ(moved.status, 0) << moved.output;
  std::string migrate_at;
  std::vector<nlohmann::json> applied;
  for (const nlohmann::json& r : moved.of("repartition")) {
    if (!r["applied"].get<bool>()) continue;
    applied.push_back(r);
    migrate_at += " --migrate-at " + std::to_string(r["apply_step"].get<int>()) + ":" +
                  r["proposed"].get<std::string>();
  }
  ASSERT_FALSE(applied.empty()) << moved.output;
  const nlohmann::json& first = applied[0];
  EXPECT_EQ(first["step"], 4) << first;
  EXPECT_EQ(first["apply_step"], first_apply) << first;
  EXPECT_TRUE(contains(moved.output, "repartition | after step 4 | vpipe | " +
                                         first["current"].get<std::string>() + " -> " +
                                         first["proposed"].get<std::string>() +
                                         " | apply after step " + std::to_string(first_apply)))
      << moved.output;
  ASSERT_EQ(moved.of("migration").size(), applied.size()) << moved.output;
  for (size_t i = 0; i < applied.size(); ++i) {
    const nlohmann::json& m = moved.of("migration")[i];
    EXPECT_EQ(m["step"], applied[i]["apply_step"]) << m;
    EXPECT_EQ(m["partition"], applied[i]["proposed"]) << m;
  }
  const std::string off = std::to_string(slowed) + "->" + std::to_string(slowed - 1);
  EXPECT_TRUE(contains(moved.of("migration")[0]["moves"].get<std::string>(), off))
      << moved.of("migration")[0];
  const TrainRun replay = train_run(dir, "replay", args + migrate_at, launcher);
  ASSERT_EQ(replay.status, 0) << replay.output;
  ASSERT_EQ(moved.losses.size(), 12u);
  EXPECT_EQ(moved.losses, replay.losses);
  EXPECT_TRUE(moved.weights == replay.weights) << "the final weights differ";
}

TEST(AsyncRepartitionCli, AMoveGoesWhereTheRecordSaysOnLocalStages) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "no Fashion-MNIST";
  for (const char* schedule : {"async-1f1b", "2bw"}) {
    SCOPED_TRACE(schedule);
    expect_moves_where_the_record_says(std::string("local_") + schedule,
                                       cnn_args(schedule, "--local"), "", 1, 6);
  }
  SCOPED_TRACE("3 stages, 1 micro-batch a step");
  expect_moves_where_the_record_says(
      "local_3",
      cnn_args("async-1f1b", "--local",
               "--stages 3 --micro-batches 1 --partition conv1-relu1,pool1-relu2,pool2-fc2"),
      "", 2, 7);
}

#ifdef STRATA_MPIEXEC
TEST(AsyncRepartitionCli, AMoveGoesWhereTheRecordSaysOnMpiRanks) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "no Fashion-MNIST";
  expect_moves_where_the_record_says("mpi", cnn_args("async-1f1b", ""), strata::testing::mpirun(2),
                                     1, 6);
}
#endif

}  // namespace
