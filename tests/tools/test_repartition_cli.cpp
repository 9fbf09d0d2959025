// --inject's load, slow and grow kinds and --repartition vpipe through the CLI: the kinds are
// recorded per rank (end-of-run lines, the stage metrics records) and change no number; a stage
// slowed by the injector loses layers to its neighbour at the step the loop promises, and the run
// stays bitwise the run without repartition (synchronous schedules move at step boundaries);
// bad flags are refused before training.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
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

const nlohmann::json& stage_record(const TrainRun& run, int rank) {
  for (const nlohmann::json& j : run.of("stage")) {
    if (j["rank"] == rank) return j;
  }
  static const nlohmann::json kNone;
  ADD_FAILURE() << "no stage record of rank " << rank;
  return kNone;
}

// load on rank 1, slow on rank 0, grow on blocks.1 (stage 1): each where it was asked, and the
// numbers of the run without them.
TEST(InjectCli, LoadSlowAndGrowAreRecordedPerRankAndChangeNoNumber) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_inject_kinds_cli");
  const TrainRun plain = train_run(dir, "plain", kGpt2);
  ASSERT_EQ(plain.status, 0) << plain.output;
  const TrainRun slowed =
      train_run(dir, "slowed",
                std::string(kGpt2) +
                    " --inject \"rank=1,from=2,kind=load,threads=1; rank=0,kind=slow,factor=2; "
                    "kind=grow,layers=blocks.1,from=3,factor=3\"");
  ASSERT_EQ(slowed.status, 0) << slowed.output;
  EXPECT_EQ(slowed.losses, plain.losses);
  EXPECT_TRUE(slowed.weights == plain.weights) << "the final weights differ";
  const nlohmann::json& r0 = stage_record(slowed, 0);
  const nlohmann::json& r1 = stage_record(slowed, 1);
  EXPECT_GT(r0["injected_slow_s"].get<double>(), 0.0) << r0;
  EXPECT_EQ(r0["injected_grow_s"].get<double>(), 0.0) << r0;
  EXPECT_EQ(r0["injected_load_s"].get<double>(), 0.0) << r0;
  EXPECT_EQ(r1["injected_slow_s"].get<double>(), 0.0) << r1;
  EXPECT_GT(r1["injected_grow_s"].get<double>(), 0.0) << r1;
  EXPECT_GT(r1["injected_load_s"].get<double>(), 0.0) << r1;
  EXPECT_TRUE(contains(slowed.output, "--inject: rank 0 slept")) << slowed.output;
  EXPECT_TRUE(contains(slowed.output, "--inject: rank 1 slept")) << slowed.output;
  EXPECT_TRUE(contains(slowed.output, "load threads ran")) << slowed.output;
}

// cnn tiny on Fashion-MNIST, 2 stages, the second slowed 20x (kind=slow: a sleep in proportion
// to the work, so stage 1 is the slowest whatever the machine's load): after the first window
// (steps 2-4) the vpipe policy moves layers from stage 1 to stage 0, before step 6 (5 steps
// done), and the run is bitwise the run that moves nothing.
TEST(RepartitionCli, MovesLayersOffASlowedStageAndChangesNoNumber) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist")) {
    GTEST_SKIP() << "no Fashion-MNIST";
  }
  const std::string dir = strata::testing::fresh_temp_dir("strata_repartition_cli");
  for (const char* schedule : {"1f1b", "gpipe"}) {
    SCOPED_TRACE(schedule);
    const std::string args =
        std::string(
            "--model cnn --size tiny --dataset fashion-mnist --train-samples 256 "
            "--test-samples 32 --steps 9 --batch-size 16 --micro-batches 2 --stages 2 --local "
            "--threads 1 --partition conv1-conv2,bn2-fc2 --seed 3 --schedule ") +
        schedule;
    const TrainRun plain = train_run(dir, "plain", args);
    ASSERT_EQ(plain.status, 0) << plain.output;
    const TrainRun moved = train_run(dir, "moved",
                                     args +
                                         " --inject \"rank=1,kind=slow,factor=20\" --repartition "
                                         "vpipe --repartition-every 4");
    ASSERT_EQ(moved.status, 0) << moved.output;
    ASSERT_FALSE(moved.of("repartition").empty()) << moved.output;
    const nlohmann::json& first = moved.of("repartition")[0];
    EXPECT_EQ(first["step"], 4) << first;
    EXPECT_EQ(first["policy"], "vpipe") << first;
    EXPECT_EQ(first["current"], "conv1-conv2,bn2-fc2") << first;
    ASSERT_TRUE(first["applied"].get<bool>()) << first;
    EXPECT_EQ(first["apply_step"], 5) << first;
    EXPECT_GT(first["predicted_gain"].get<double>(), 0.05) << first;
    EXPECT_LT(first["predicted_slowest_s"].get<double>(), first["current_slowest_s"].get<double>());
    ASSERT_FALSE(moved.of("migration").empty()) << moved.output;
    const nlohmann::json& m = moved.of("migration")[0];
    EXPECT_EQ(m["step"], 5) << m;
    EXPECT_EQ(m["partition"], first["proposed"]) << m;
    EXPECT_TRUE(contains(m["moves"].get<std::string>(), "bn2 1->0")) << m;
    EXPECT_FALSE(contains(m["moves"].get<std::string>(), "0->1")) << m;
    EXPECT_EQ(first["layer_seconds"].size(), 12u) << first;
    EXPECT_TRUE(contains(moved.output, "repartition | after step 4 | vpipe")) << moved.output;
    EXPECT_EQ(moved.losses, plain.losses);
    EXPECT_TRUE(moved.weights == plain.weights) << "the final weights differ";
  }
}

// A checkpoint written after the loop moved layers resumes (into the start partition, without
// the loop) and ends with the uninterrupted run's losses and weights.
TEST(RepartitionCli, CheckpointAfterAMoveResumesExactly) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist")) {
    GTEST_SKIP() << "no Fashion-MNIST";
  }
  const std::string dir = strata::testing::fresh_temp_dir("strata_repartition_cli_ckpt");
  const std::string args =
      "--model cnn --size tiny --dataset fashion-mnist --train-samples 256 --test-samples 32 "
      "--steps 10 --batch-size 16 --micro-batches 2 --stages 2 --local --threads 1 "
      "--partition conv1-conv2,bn2-fc2 --seed 3 --checkpoint-dir " +
      dir + "/ckpt";
  const TrainRun whole = train_run(dir, "whole",
                                   args +
                                       " --save-every 8 --inject \"rank=1,kind=slow,factor=20\" "
                                       "--repartition vpipe --repartition-every 4");
  ASSERT_EQ(whole.status, 0) << whole.output;
  ASSERT_FALSE(whole.of("migration").empty()) << whole.output;
  EXPECT_LE(whole.of("migration")[0]["step"].get<int>(), 8);
  const TrainRun resumed =
      train_run(dir, "resumed", args + " --resume " + dir + "/ckpt/step-000008");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  ASSERT_EQ(resumed.losses.size(), 2u);
  EXPECT_EQ(resumed.losses[0], whole.losses[8]);
  EXPECT_EQ(resumed.losses[1], whole.losses[9]);
  EXPECT_TRUE(resumed.weights == whole.weights) << "the final weights differ";
}

TEST(RepartitionCli, RefusesBadFlagsBeforeTraining) {
  const std::string base = std::string("train ") + kGpt2 + " --progress off ";
  for (const auto& [flags, words] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"--repartition vpipe --schedule async-1f1b",
            {"--repartition vpipe", "async-1f1b", "--migration restart"}},
           {"--repartition vpipe --groups 2 --stages 2 --dp-delay 1", {"--dp-delay"}},
           {"--repartition vpipe --repartition-every 1", {"--repartition-every", ">= 2"}},
           {"--repartition vpipe --repartition-threshold 1.5", {"--repartition-threshold"}},
           {"--repartition vpipe --migrate-at 2:0-2,3", {"--repartition vpipe", "--migrate-at"}},
           {"--repartition vpipe --schedule async-1f1b --migration restart --memory-policy auto",
            {"--repartition vpipe", "async-1f1b", "--memory-policy auto", "swap"}},
           {"--repartition dynpipe", {"--repartition"}},
           {"--inject \"kind=grow,layers=blocks.7\"", {"--inject", "blocks.7"}},
       }) {
    SCOPED_TRACE(flags);
    const auto r = run_cli(base + flags);
    EXPECT_NE(r.status, 0) << r.output;
    for (const std::string& w : words) EXPECT_TRUE(contains(r.output, w)) << r.output;
  }
}

}  // namespace
