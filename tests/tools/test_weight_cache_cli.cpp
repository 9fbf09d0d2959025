// The weight cache through the CLI (--weight-cache on): async-1f1b and 2bw train to the same
// losses and final weights, byte for byte, as without it, while the first stage's measured device
// peak is lower and its stashed versions sit in the host pool; a synchronous schedule is refused
// by name.
#include <gtest/gtest.h>

#include <string>

#include "testing/cli.h"
#include "testing/train_run.h"

namespace {

using strata::testing::contains;
using strata::testing::train_run;
using strata::testing::TrainRun;

const char* kGpt2 =
    "--model gpt2 --size tiny --dataset synthetic-tokens --synthetic-vocab 256 --seq-len 32 "
    "--train-samples 256 --test-samples 16 --eval-batch-size 4 --steps 3 --batch-size 16 "
    "--micro-batches 4 --seed 3 "
    "--local";

const nlohmann::json& stage(const TrainRun& r, int s) {
  for (const auto& j : r.of("stage")) {
    if (j["stage"].get<int>() == s) return j;
  }
  static const nlohmann::json kNone;
  return kNone;
}

void expect_cache_saves(const std::string& name, const std::string& args) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_weight_cache_cli_" + name);
  const TrainRun off = train_run(dir, "off", args + " --weight-cache off");
  const TrainRun on = train_run(dir, "on", args + " --weight-cache on");
  ASSERT_EQ(off.status, 0) << off.output;
  ASSERT_EQ(on.status, 0) << on.output;
  ASSERT_EQ(off.losses.size(), 3u) << off.output;
  EXPECT_EQ(on.losses, off.losses);
  ASSERT_FALSE(off.weights.empty());
  EXPECT_TRUE(on.weights == off.weights) << "the final weights differ";
  const nlohmann::json &first_off = stage(off, 0), &first_on = stage(on, 0);
  ASSERT_TRUE(first_off.is_object() && first_on.is_object()) << on.output;
  EXPECT_LT(first_on["peak_bytes"].get<double>(), first_off["peak_bytes"].get<double>());
  EXPECT_GT(first_on["swap_pool_peak_bytes"].get<double>(), 0.0);
  EXPECT_EQ(first_off["swap_pool_peak_bytes"].get<double>(), 0.0);
  std::printf("%s: first stage peak %.0f B without the cache, %.0f B with it (host pool %.0f B)\n",
              name.c_str(), first_off["peak_bytes"].get<double>(),
              first_on["peak_bytes"].get<double>(), first_on["swap_pool_peak_bytes"].get<double>());
}

TEST(WeightCacheCli, Async1f1bOnFourStages) {
  expect_cache_saves("async_s4", std::string(kGpt2) + " --stages 4 --schedule async-1f1b");
}

TEST(WeightCacheCli, TwoBwOnTwoStages) {
  expect_cache_saves("2bw_s2", std::string(kGpt2) + " --stages 2 --schedule 2bw");
}

TEST(WeightCacheCli, SynchronousScheduleIsRefusedByName) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_weight_cache_cli_refused");
  const TrainRun r = train_run(
      dir, "refused", std::string(kGpt2) + " --stages 2 --schedule 1f1b --weight-cache on");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "--weight-cache on needs a schedule that stashes weight versions"))
      << r.output;
}

// `strata train --help` lists 2bw beside the other schedules, and the weight cache's flag.
TEST(WeightCacheCli, HelpListsTwoBwAndTheCache) {
  const strata::testing::CliResult r = strata::testing::run_cli("train --help");
  EXPECT_EQ(r.status, 0) << r.output;
  for (const char* s :
       {"Pipeline schedule: gpipe, 1f1b, async-1f1b, 2bw", "--weight-cache TEXT:{off,on}=off"}) {
    EXPECT_TRUE(contains(r.output, s)) << "missing " << s << " in\n" << r.output;
  }
}

}  // namespace
