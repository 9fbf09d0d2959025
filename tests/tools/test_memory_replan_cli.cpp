// vPIPE's swap/recompute plan made again when layers move, through the CLI: under
// --memory-policy auto --mem-limit, a --migrate-at move to a partition whose first stage no
// longer fits keeping everything gets a new plan (logged as memory_plan records of the move's
// step), trains under the limit where keep runs out of memory, and stays bitwise the run without
// the move (swap and recompute are bitwise); a move to a partition no plan fits is refused
// before training, naming it; --repartition vpipe with an auto plan moves layers off a slowed
// rank and stays under the limit.
#include <gtest/gtest.h>

#include <algorithm>
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

// GPT-2 tiny (embed, blocks.0, blocks.1, head; dropout on) on tokens of a 256-word vocabulary,
// 1f1b on 2 stages with 8 micro-batches: stage 0 holds 2 micro-batches' activations, stage 1 one.
// The layers move from embed | blocks.0-head to embed-blocks.1 | head before step 3.
const char* kGpt2 =
    "--model gpt2 --size tiny --dataset synthetic-tokens --synthetic-vocab 256 --seq-len 64 "
    "--train-samples 256 --test-samples 16 --steps 5 --batch-size 16 --micro-batches 8 "
    "--eval-batch-size 2 --seed 3 --schedule 1f1b --stages 2 --threads 1 --partition 0,1-3";
const char* kMove = " --migrate-at 3:0-2,3";

std::vector<nlohmann::json> plans_at(const TrainRun& r, int step) {
  std::vector<nlohmann::json> out;
  for (const auto& p : r.of("memory_plan")) {
    if (p["step"].get<int>() == step) out.push_back(p);
  }
  return out;
}

double max_peak(const TrainRun& r) {
  double peak = 0;
  for (const auto& s : r.of("stage")) peak = std::max(peak, s["peak_bytes"].get<double>());
  return peak;
}

bool keeps_everything(const nlohmann::json& plan) {
  const std::string p = plan["plan"].get<std::string>();
  return !contains(p, "swap") && !contains(p, "recompute");
}

// `layout`: --local, or nothing under `launcher` (MPI ranks).
void expect_move_replans(const std::string& name, const std::string& layout,
                         const std::string& launcher) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_memory_replan_cli_" + name);
  const std::string args = std::string(kGpt2) + " " + layout;
  const TrainRun still = train_run(dir, "still", args, launcher);
  ASSERT_EQ(still.status, 0) << still.output;
  // The planner's predictions with room for everything: keep at the start and after the move.
  const TrainRun roomy =
      train_run(dir, "roomy", args + kMove + " --memory-policy auto --mem-limit 1GiB", launcher);
  ASSERT_EQ(roomy.status, 0) << roomy.output;
  const std::vector<nlohmann::json> before = plans_at(roomy, 0), after = plans_at(roomy, 3);
  ASSERT_EQ(before.size(), 2u) << roomy.output;
  ASSERT_EQ(after.size(), 2u) << roomy.output;
  EXPECT_EQ(roomy.losses, still.losses);
  double start = 0;
  for (const auto& p : before) start = std::max(start, p["predicted_peak_bytes"].get<double>());
  const double moved0 = after[0]["predicted_peak_bytes"].get<double>();
  // A limit the start partition meets keeping everything (with room for the prediction's 2%)
  // and the moved first stage does not.
  const double limit = std::max(1.05 * start, 0.5 * (1.05 * start + moved0));
  ASSERT_LT(limit, moved0) << "the moved first stage (" << moved0 << " B) is not above the start ("
                           << start << " B): the test's layout does not need a new plan";
  const std::string limited =
      args + kMove + " --mem-limit " + std::to_string(static_cast<long long>(limit));
  const TrainRun planned = train_run(dir, "auto", limited + " --memory-policy auto", launcher);
  ASSERT_EQ(planned.status, 0) << planned.output;
  const std::vector<nlohmann::json> first = plans_at(planned, 0), moved = plans_at(planned, 3);
  ASSERT_EQ(first.size(), 2u) << planned.output;
  ASSERT_EQ(moved.size(), 2u) << planned.output;
  EXPECT_TRUE(keeps_everything(first[0]) && keeps_everything(first[1])) << first[0] << first[1];
  EXPECT_FALSE(keeps_everything(moved[0])) << moved[0];
  EXPECT_LE(moved[0]["predicted_peak_bytes"].get<double>(), limit) << moved[0];
  EXPECT_TRUE(contains(planned.output, "memory plan | before step 3 | stage 0:")) << planned.output;
  ASSERT_EQ(planned.of("migration").size(), 1u) << planned.output;
  EXPECT_EQ(planned.of("migration")[0]["partition"], "embed-blocks.1,head");
  // Every rank's allocator peak (the run's, so after the move too) is under the limit, and the
  // numbers are the run's without the move or the limit.
  EXPECT_LE(max_peak(planned), limit);
  bool planned_stage0 = false;
  for (const auto& s : planned.of("stage")) {
    if (s["stage"] == 0) {
      planned_stage0 = s["swapped_bytes"].get<double>() > 0 || s["recompute_s"].get<double>() > 0;
    }
  }
  EXPECT_TRUE(planned_stage0) << planned.output;
  EXPECT_EQ(planned.losses, still.losses);
  EXPECT_TRUE(planned.weights == still.weights) << "the final weights differ";
  // The plan had to change: keeping everything under the same limit runs out of memory after
  // the move.
  const TrainRun keep = train_run(dir, "keep", limited + " --memory-policy keep", launcher);
  EXPECT_NE(keep.status, 0) << keep.output;
  EXPECT_TRUE(contains(keep.output, "out of memory")) << keep.output;
}

TEST(MemoryReplanCli, AMoveGetsANewPlanAndStaysUnderTheLimitOnLocalStages) {
  expect_move_replans("local", "--local", "");
}

#ifdef STRATA_MPIEXEC
TEST(MemoryReplanCli, AMoveGetsANewPlanAndStaysUnderTheLimitOnMpiRanks) {
  expect_move_replans("mpi", "", strata::testing::mpirun(2));
}
#endif

// Under a limit where embed-blocks.0 | blocks.1-head trains, embed-blocks.1 | head cannot fit
// however its first stage plans (every layer recomputed still needs 3.66 MiB): the move is
// refused before training, naming it, the stage and the bytes.
TEST(MemoryReplanCli, AMoveNoPlanFitsIsRefusedBeforeTraining) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_memory_replan_cli_refused");
  std::string args = std::string(kGpt2) + " --local --memory-policy auto --mem-limit 3200000";
  args.replace(args.find("--partition 0,1-3"), 17, "--partition 0-1,2-3");
  const TrainRun fits = train_run(dir, "fits", args);
  ASSERT_EQ(fits.status, 0) << fits.output;
  const TrainRun refused = train_run(dir, "refused", args + kMove);
  EXPECT_NE(refused.status, 0) << refused.output;
  for (const char* words : {"--migrate-at 3:embed-blocks.1,head", "too small for stage 0",
                            "layers embed..blocks.1", "--mem-limit 3200000"}) {
    EXPECT_TRUE(contains(refused.output, words)) << words << "\n" << refused.output;
  }
  EXPECT_TRUE(refused.losses.empty()) << "trained before refusing:\n" << refused.output;
}

// cnn tiny on Fashion-MNIST, 2 local stages under 1f1b, the second slowed 20x from step 2:
// --repartition vpipe with an auto plan under 2.1 MB. Stage 0 holds 2 micro-batches, and keeping
// everything it needs 2.23-2.61 MB with any layer more than conv1-conv2, so the layers the loop
// moves there come with a plan that swaps or recomputes: they move, every peak stays under the
// limit, and the numbers are the run's without any of it.
TEST(MemoryReplanCli, RepartitionMovesLayersOffASlowedRankWithinTheLimit) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist")) {
    GTEST_SKIP() << "no Fashion-MNIST";
  }
  const std::string dir = strata::testing::fresh_temp_dir("strata_memory_replan_cli_vpipe");
  const std::string args =
      "--model cnn --size tiny --dataset fashion-mnist --train-samples 256 --test-samples 32 "
      "--steps 9 --batch-size 16 --micro-batches 2 --stages 2 --local --threads 1 --partition "
      "conv1-conv2,bn2-fc2 --seed 3 --schedule 1f1b --eval-batch-size 8";
  const std::string loop =
      " --inject \"rank=1,from=2,kind=slow,factor=20\" --repartition vpipe --repartition-every 4 "
      "--memory-policy auto --mem-limit ";
  const TrainRun plain = train_run(dir, "plain", args);
  ASSERT_EQ(plain.status, 0) << plain.output;
  const TrainRun moved = train_run(dir, "moved", args + loop + "2100000");
  ASSERT_EQ(moved.status, 0) << moved.output;
  ASSERT_FALSE(moved.of("repartition").empty()) << moved.output;
  const nlohmann::json& first = moved.of("repartition")[0];
  ASSERT_TRUE(first["applied"].get<bool>()) << first;
  EXPECT_FALSE(first["memory_plan"].get<std::string>().empty()) << first;
  ASSERT_FALSE(moved.of("migration").empty()) << moved.output;
  const nlohmann::json& m = moved.of("migration")[0];
  EXPECT_EQ(m["partition"], first["proposed"]) << m;
  EXPECT_TRUE(contains(m["moves"].get<std::string>(), "bn2 1->0")) << m;
  EXPECT_FALSE(contains(m["moves"].get<std::string>(), "0->1")) << m;
  const std::vector<nlohmann::json> plans = plans_at(moved, m["step"].get<int>());
  ASSERT_EQ(plans.size(), 2u) << moved.output;
  EXPECT_FALSE(keeps_everything(plans[0])) << plans[0];
  EXPECT_LE(max_peak(moved), 2100000.0);
  EXPECT_EQ(moved.losses, plain.losses);
  EXPECT_TRUE(moved.weights == plain.weights) << "the final weights differ";
}

// GPT-2 tiny, embed-blocks.0 | blocks.1-head under 3.2 MB, the head grown 60x from step 2 (so
// that stage 1 is the slowest by far, whatever the machine's load): the only move to stage 0
// (embed-blocks.1 | head) cannot fit however stage 0 plans (3.66 MiB), so the loop drops it,
// says why in its record, and nothing moves.
TEST(MemoryReplanCli, RepartitionDropsAMoveNoPlanFits) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_memory_replan_cli_held");
  std::string args = std::string(kGpt2) + " --local --mem-limit 3200000";
  args.replace(args.find("--partition 0,1-3"), 17, "--partition 0-1,2-3");
  args.replace(args.find("--steps 5"), 9, "--steps 7");
  const TrainRun plain = train_run(dir, "plain", args);
  ASSERT_EQ(plain.status, 0) << plain.output;
  const TrainRun held = train_run(dir, "held",
                                  args +
                                      " --inject \"kind=grow,layers=head,from=2,factor=60\" "
                                      "--repartition vpipe --repartition-every 4 "
                                      "--memory-policy auto");
  ASSERT_EQ(held.status, 0) << held.output;
  EXPECT_TRUE(held.of("migration").empty()) << held.output;
  ASSERT_FALSE(held.of("repartition").empty()) << held.output;
  const nlohmann::json& kept = held.of("repartition")[0];
  EXPECT_FALSE(kept["applied"].get<bool>()) << kept;
  ASSERT_EQ(kept["infeasible"].size(), 1u) << kept;
  const std::string why = kept["infeasible"][0].get<std::string>();
  EXPECT_EQ(why.rfind("embed-blocks.1,head: ", 0), 0u) << why;
  EXPECT_TRUE(contains(why, "too small for stage 0 (layers embed..blocks.1)")) << why;
  EXPECT_TRUE(contains(kept["reason"].get<std::string>(), "no plan fits --mem-limit")) << kept;
  EXPECT_LE(max_peak(held), 3200000.0);
  EXPECT_EQ(held.losses, plain.losses);
  EXPECT_TRUE(held.weights == plain.weights) << "the final weights differ";
}

}  // namespace
