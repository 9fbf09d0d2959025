// vPIPE part 2 through the CLI: layers moved between stages while training (--migrate-at) give
// bitwise the per-step losses and final weights of the run without moves (synchronous schedules;
// local threads and MPI ranks; 1 and 2 groups); the asynchronous schedule's restart moves are
// bitwise a restart that moves nothing (the move itself changes no number); a checkpoint written
// after a move resumes exactly; bad --migrate-at values are refused before training.
#include <gtest/gtest.h>

#include <cmath>

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

// GPT-2 tiny (4 layers: embed, blocks.0, blocks.1, head) with dropout, on Brown-sized tokens of
// a small vocabulary.
const char* kGpt2 =
    "--model gpt2 --size tiny --dataset synthetic-tokens --synthetic-vocab 256 --seq-len 32 "
    "--train-samples 512 --test-samples 16 --steps 6 --batch-size 8 --micro-batches 4 --seed 5";

void expect_moves_change_nothing(const std::string& name, const std::string& layout,
                                 const std::string& moves, const std::string& launcher = "") {
  const std::string dir = strata::testing::fresh_temp_dir("strata_migration_cli_" + name);
  for (const char* schedule : {"gpipe", "1f1b"}) {
    SCOPED_TRACE(std::string(schedule));
    const std::string args = std::string(kGpt2) + " " + layout + " --schedule " + schedule;
    const TrainRun still = train_run(dir, "still", args, launcher);
    ASSERT_EQ(still.status, 0) << still.output;
    ASSERT_EQ(still.losses.size(), 6u);
    const TrainRun moved = train_run(dir, "moved", args + " " + moves, launcher);
    ASSERT_EQ(moved.status, 0) << moved.output;
    EXPECT_FALSE(moved.of("migration").empty()) << moved.output;
    for (const auto& m : moved.of("migration")) EXPECT_GT(m["bytes"].get<double>(), 0.0) << m;
    EXPECT_EQ(moved.losses, still.losses);
    EXPECT_TRUE(moved.weights == still.weights) << "the final weights differ";
  }
}

TEST(MigrationCli, TwoLocalStagesBothDirections) {
  expect_moves_change_nothing("s2", "--stages 2 --local --partition 0-1,2-3",
                              "--migrate-at 2:0-2,3 --migrate-at 4:0,1-3");
}

TEST(MigrationCli, TwoGroupsOfTwoLocalStages) {
  expect_moves_change_nothing("g2", "--stages 2 --groups 2 --local --partition 0-1,2-3",
                              "--migrate-at 3:0,1-3");
}

// cnn tiny: conv1 bn1 relu1 pool1 conv2 bn2 relu2 pool2 flatten fc1 relu3 fc2, uniformly
// 0-2,3-5,6-8,9-11; then layers move up (pool1, fc1), and down two at once (relu1, pool1) and up
// across a stage (relu2), by name.
const char* kCnnMoved1 = "conv1-pool1,conv2-bn2,relu2-fc1,relu3-fc2";
const char* kCnnMoved2 = "conv1-bn1,relu1-relu2,pool2-flatten,fc1-fc2";

// A CNN of batch norms on Fashion-MNIST over 4 stages: layers move down, up and two at once.
TEST(MigrationCli, CnnOverFourLocalStages) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist")) {
    GTEST_SKIP() << "no Fashion-MNIST";
  }
  const std::string dir = strata::testing::fresh_temp_dir("strata_migration_cli_cnn");
  for (const char* schedule : {"gpipe", "1f1b"}) {
    SCOPED_TRACE(std::string(schedule));
    const std::string args = std::string(
                                 "--model cnn --size tiny --dataset fashion-mnist "
                                 "--train-samples 256 --test-samples 64 --steps 5 "
                                 "--batch-size 16 --micro-batches 4 --stages 4 --local "
                                 "--partition uniform --seed 2 --schedule ") +
                             schedule;
    const TrainRun still = train_run(dir, "still", args);
    ASSERT_EQ(still.status, 0) << still.output;
    const TrainRun moved = train_run(
        dir, "moved", args + " --migrate-at 2:" + kCnnMoved1 + " --migrate-at 4:" + kCnnMoved2);
    ASSERT_EQ(moved.status, 0) << moved.output;
    EXPECT_EQ(moved.of("migration").size(), 2u) << moved.output;
    EXPECT_EQ(moved.losses, still.losses);
    EXPECT_TRUE(moved.weights == still.weights) << "the final weights differ";
  }
}

#ifdef STRATA_MPIEXEC
std::string mpirun(int ranks) {
  return std::string(
             "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
             "OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 ") +
         STRATA_MPIEXEC + " --oversubscribe -np " + std::to_string(ranks);
}

// 2 groups x 2 stages of MPI processes.
TEST(MigrationCli, TwoGroupsOfTwoMpiStages) {
  expect_moves_change_nothing("mpi", "--stages 2 --groups 2 --threads 1 --partition 0-1,2-3",
                              "--migrate-at 2:0-2,3 --migrate-at 4:0,1-3", mpirun(4));
}
#endif

// async-1f1b with --migration restart: the program (one run of M updates per step, without a
// flush between steps) drains at the move and starts again in the new layout. Up to the move the
// run is the run without migrations; after it the moved layer has the staleness of its new stage
// (vPIPE Eq. 4), so the numbers differ from a restart that moves nothing, and the run trains on.
// (The oracle for the numbers after a move, a replay of Eq. 4's weight versions, comes with the
// live protocol.)
TEST(MigrationCli, AsyncRestartMovesTheLayersAndTrainsOn) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_migration_cli_async");
  const std::string args = std::string(kGpt2) +
                           " --stages 2 --local --partition 0-1,2-3 --schedule async-1f1b "
                           "--migration restart";
  const TrainRun plain = train_run(dir, "plain", args);
  ASSERT_EQ(plain.status, 0) << plain.output;
  const TrainRun in_place = train_run(dir, "in_place", args + " --migrate-at 3:0-1,2-3");
  ASSERT_EQ(in_place.status, 0) << in_place.output;
  const TrainRun moved = train_run(dir, "moved", args + " --migrate-at 3:0-2,3");
  ASSERT_EQ(moved.status, 0) << moved.output;
  EXPECT_TRUE(contains(moved.output, "blocks.1 1->0")) << moved.output;
  ASSERT_EQ(moved.losses.size(), plain.losses.size());
  ASSERT_GT(plain.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {  // steps 1-3, before the move
    EXPECT_EQ(moved.losses[i], plain.losses[i]) << "step " << i + 1;
    EXPECT_EQ(in_place.losses[i], plain.losses[i]) << "step " << i + 1;
  }
  for (const std::string& loss : moved.losses) {
    EXPECT_TRUE(std::isfinite(std::stod(loss))) << loss;
  }
  EXPECT_FALSE(moved.weights == in_place.weights);
}

// A checkpoint written after a move resumes in the new layout and ends as the uninterrupted run.
TEST(MigrationCli, CheckpointAfterAMoveResumesExactly) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_migration_cli_ckpt");
  const std::string args =
      std::string(kGpt2) + " --stages 2 --local --partition 0-1,2-3 --migrate-at 2:0-2,3";
  const TrainRun whole = train_run(dir, "whole", args);
  ASSERT_EQ(whole.status, 0) << whole.output;
  const std::string ckpt = dir + "/ckpt";
  // Stop after step 4 (a checkpoint there), then resume to the end.
  const TrainRun first =
      train_run(dir, "first", args + " --checkpoint-dir " + ckpt + " --save-every 4");
  ASSERT_EQ(first.status, 0) << first.output;
  const TrainRun resumed = train_run(
      dir, "resumed", args + " --checkpoint-dir " + ckpt + " --resume " + ckpt + "/step-000004");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "resumed")) << resumed.output;
  EXPECT_TRUE(resumed.weights == whole.weights);
  // The same checkpoint also loads into another layout (a fresh uniform one).
  const TrainRun other = train_run(dir, "other",
                                   std::string(kGpt2) +
                                       " --stages 2 --local --partition 0,1-3 "
                                       "--checkpoint-dir " +
                                       ckpt + " --resume " + ckpt + "/step-000004");
  ASSERT_EQ(other.status, 0) << other.output;
  EXPECT_TRUE(other.weights == whole.weights);
}

TEST(MigrationCli, BadMigrationsAreRefusedBeforeTraining) {
  const std::string base = std::string(kGpt2) + " --stages 2 --local ";
  for (const auto& [flags, text] : std::vector<std::pair<std::string, std::string>>{
           {"--migrate-at 2:0-1", "has 1 ranges for 2 stages"},
           {"--migrate-at 2:0-1,2-9", "layer index 9 is out of range"},
           {"--migrate-at 2:embed,nope", "no layer is named 'nope'"},
           {"--migrate-at x:0,1-3", "the step 'x' is not a number"},
           {"--migrate-at 6:0,1-3", "a migration goes before one of steps 1..5"},
           {"--migrate-at 0-1,2-3", "expected STEP:PARTITION"}}) {
    const strata::testing::CliResult r = run_cli("train " + base + flags + " --progress off");
    EXPECT_NE(r.status, 0) << flags << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, text)) << flags << "\n" << r.output;
    EXPECT_FALSE(contains(r.output, "step 1/")) << "trained before refusing: " << flags;
  }
}

}  // namespace
