// GroPipe through the `strata` binary: the --system preset (printed in the configuration, flags
// given on the command line win and are named) and AMPA's flags (--ampa-normalize,
// --ampa-threshold, --ampa-guard) in strata train and strata plan.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "testing/cli.h"

namespace {

using strata::testing::contains;
using strata::testing::run_cli;

// cnn-tiny's twelve layers with near-uniform forward times (ms per sample) on which AMPA, whose
// min-max normalization makes the 10 ms layers free, cuts 5 | 7 layers: 54 | 73 ms against the
// even split's 65 | 62.
std::string write_near_uniform_profile(const std::string& dir) {
  const char* names[] = {"conv1", "bn1",   "relu1",   "pool1", "conv2", "bn2",
                         "relu2", "pool2", "flatten", "fc1",   "relu3", "fc2"};
  const double ms[] = {10, 11, 11, 12, 10, 11, 10, 10, 12, 10, 10, 10};
  nlohmann::json list = nlohmann::json::array();
  for (size_t i = 0; i < 12; ++i) {
    list.push_back({{"name", names[i]},
                    {"forward_ms_per_sample", ms[i]},
                    {"backward_ms_per_sample", 0.0},
                    {"output_bytes_per_sample", 0.0},
                    {"activation_bytes_per_sample", 64.0},
                    {"param_bytes", 64.0}});
  }
  const std::string path = dir + "/near_uniform.json";
  std::ofstream(path) << nlohmann::json{{"layers", list}}.dump(2);
  return path;
}

const std::string kTrain =
    "train --model cnn --size tiny --dataset synthetic-images --image-size 12 "
    "--synthetic-channels 1 --steps 2 --batch-size 8 --train-samples 64 --test-samples 16 "
    "--threads 1 --progress off --local --groups 2 --stages 2 --micro-batches 2";

TEST(GroPipeCli, SystemPresetIsPrintedAndFlagsGivenWin) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_gropipe_cli_preset");
  const std::string profile = " --profile " + write_near_uniform_profile(dir);
  auto r = run_cli(kTrain + " --system gropipe" + profile);
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* s :
       {"gropipe: --schedule gpipe --dp-bucket-mb 0 --dp-overlap on --dp-delay 0 --partition auto "
        "--partitioner projection",
        "gpipe, 2 micro-batches of 2", "overlap on, buckets per stage, delay 0",
        // AMPA's 5 | 7 is slower than the even split in profiled time: the guard keeps the latter.
        "stage 0: conv1..bn2, stage 1: relu2..fc2 (auto, projection: the even split (AMPA's "
        "partition",
        "--ampa-normalize on, --ampa-threshold 0.01, --ampa-guard even", "done: 2 steps"}) {
    EXPECT_TRUE(contains(r.output, s)) << "missing '" << s << "' in\n" << r.output;
  }
  // The paper's AMPA alone (--ampa-guard off), and a delay given on the command line.
  r = run_cli(kTrain + " --system gropipe --ampa-guard off --dp-delay 1" + profile);
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* s : {"overridden on the command line: --dp-delay 1", "delay 1",
                        "stage 0: conv1..conv2, stage 1: bn2..fc2 (auto, projection: AMPA"}) {
    EXPECT_TRUE(contains(r.output, s)) << "missing '" << s << "' in\n" << r.output;
  }
  // Without the preset, Strata's defaults.
  r = run_cli(kTrain + profile);
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* s :
       {"custom (no preset)", "1f1b, 2 micro-batches of 2", "buckets 25 MiB", "(auto, dp)"}) {
    EXPECT_TRUE(contains(r.output, s)) << "missing '" << s << "' in\n" << r.output;
  }
  r = run_cli("train --help");
  for (const char* s : {"--system", "gropipe (GroPipe's paper: --schedule gpipe", "--ampa-guard",
                        "--ampa-normalize", "--ampa-threshold"}) {
    EXPECT_TRUE(contains(r.output, s)) << "missing '" << s << "' in\n" << r.output;
  }
  r = run_cli(kTrain + " --system pipedream");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "--system")) << r.output;
  r = run_cli(kTrain + " --ampa-threshold -1");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, "--ampa-threshold must be >= 0")) << r.output;
}

TEST(GroPipeCli, PlanShowsAmpaAndWhatItsGuardReturns) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_gropipe_cli_plan");
  const std::string base =
      "plan --size tiny --stages 2 --micro-batches 4 --batch-size 8 --dataset synthetic-images "
      "--profile " +
      write_near_uniform_profile(dir);
  auto r = run_cli(base);
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* s :
       {"AMPA's own partition (slower than the one --ampa-guard even returns below): --partition "
        "conv1-conv2,bn2-fc2",
        "--ampa-guard even: the even split, faster than AMPA's): --partition "
        "conv1-bn2,relu2-fc2"}) {
    EXPECT_TRUE(contains(r.output, s)) << "missing '" << s << "' in\n" << r.output;
  }
  r = run_cli(base + " --ampa-guard off");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "--ampa-guard off: AMPA's partition): --partition "
                       "conv1-conv2,bn2-fc2"))
      << r.output;
  // Raw times (no Eq. 9) and a threshold that stops at once: the even split is AMPA's answer.
  r = run_cli(base + " --ampa-guard off --ampa-normalize off --ampa-threshold 1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "criterion met after 0 moves")) << r.output;
  EXPECT_TRUE(contains(r.output, "AMPA's partition): --partition conv1-bn2,relu2-fc2")) << r.output;
}

}  // namespace
