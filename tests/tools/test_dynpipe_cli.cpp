// `strata plan --planner dynpipe` through the binary: DynPipe's plan and W(S) for every S beside
// the dp and projection partitions, each priced by Eq. 5 (numbers checked by hand on a profile
// file), Algorithm 1's stage count from flags and from a warm-up on Fashion-MNIST, --help, and
// bad input named by its flag.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "io/mnist.h"
#include "testing/cli.h"

namespace {

using strata::testing::contains;
using strata::testing::run_cli;

// cnn-tiny's twelve layers, each 1 ms forward and 2 ms backward per sample, 1 MB of parameters
// and no outputs (free links between stages).
std::string write_profile(const std::string& dir) {
  const char* names[] = {"conv1", "bn1",   "relu1",   "pool1", "conv2", "bn2",
                         "relu2", "pool2", "flatten", "fc1",   "relu3", "fc2"};
  nlohmann::json list = nlohmann::json::array();
  for (const char* name : names) {
    list.push_back({{"name", name},
                    {"forward_ms_per_sample", 1.0},
                    {"backward_ms_per_sample", 2.0},
                    {"output_bytes_per_sample", 0.0},
                    {"activation_bytes_per_sample", 64.0},
                    {"param_bytes", 1e6}});
  }
  const std::string path = dir + "/uniform.json";
  std::ofstream(path) << nlohmann::json{{"layers", list}}.dump(2);
  return path;
}

std::string base_command(const std::string& profile) {
  return "plan --model cnn --size tiny --dataset synthetic-images --stages 2 --micro-batches 4 "
         "--batch-size 16 --bandwidth 10 --planner dynpipe --gpus 4 --profile " +
         profile;
}

void expect_all(const std::string& output, const std::vector<std::string>& lines) {
  for (const std::string& s : lines) {
    EXPECT_TRUE(contains(output, s)) << "missing '" << s << "' in\n" << output;
  }
}

TEST(DynPipeCli, PlanBesideTheOtherPlannersWithEq5Prices) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_dynpipe_cli_plan");
  const auto r = run_cli(base_command(write_profile(dir)));
  ASSERT_EQ(r.status, 0) << r.output;
  // Micro-batches of 4 samples: 12 x 3 ms x 4 = 144 ms of work. S = 1 on 4 GPUs: 144 / 4 plus
  // the all-reduce of 12 MB among 4 at 10 GB/s (2 x 3/4 x 12e6 / 1e10 s = 1.8 ms): 37.8 ms.
  // The dp partition (6 | 6 layers, one GPU each, free links): 72 ms per iteration, 288 per step.
  expect_all(r.output,
             {"dynpipe (--planner dynpipe: Eqs. 4-7, corrected rule): 4 GPUs, 4 per machine",
              "an iteration is one micro-batch of 4 samples", "37.800",
              "conv1-fc2 on 4 GPUs (dp 4 x tp 1)",
              "chosen: S = 2 (--stages; give --dynpipe-epsilon", "dynpipe plan: --partition ",
              "predicted step time per planner", "W(S) = 36.600 ms per iteration (Eq. 5)"});
  // Each planner's row: name, stages, GPUs, W, M x W.
  const std::string dp_row = "dp               2     2       72.000        288.000";
  expect_all(r.output,
             {dp_row, "projection       2     2       72.000", "dynpipe          2     4"});
  // Two stages of 6 layers on 2 GPUs each: 72 / 2 + all-reduce of 6 MB by 2 (0.6 ms) = 36.6 ms.
  expect_all(r.output, {"dynpipe          2     4       36.600        146.400"});
  // Equal data-parallel widths are groups of the pipeline: the printed command trains.
  const std::string train = "--stages 2 --groups 2 --partition conv1-bn2,relu2-fc2";
  expect_all(r.output,
             {"train the dynpipe plan: mpirun -np 4 strata train " + train + " (or --local)"});
  const auto t =
      run_cli("train --model cnn --size tiny --dataset synthetic-images --local " + train +
              " --steps 2 --batch-size 16 --micro-batches 4 --threads 1 --progress off "
              "--train-samples 64 --test-samples 16");
  ASSERT_EQ(t.status, 0) << t.output;
  EXPECT_TRUE(contains(t.output, "done: 2 steps")) << t.output;
  // The paper's Eq. 4 on request.
  const auto paper = run_cli(base_command(write_profile(dir)) + " --dynpipe-rule paper");
  ASSERT_EQ(paper.status, 0) << paper.output;
  EXPECT_TRUE(contains(paper.output, "Eqs. 4-7, paper rule")) << paper.output;
}

TEST(DynPipeCli, Algorithm1ChoosesTheStagesFromTheConvergenceInputs) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_dynpipe_cli_alg1");
  const std::string base = base_command(write_profile(dir)) +
                           " --dynpipe-lr 0.1 --dynpipe-epsilon 1 --dynpipe-noise 1 "
                           "--dynpipe-initial-loss 2";
  // L = 1: T(1) = 4 / (0.1 x 0.98) = 40.8 updates of 37.8 ms beat T(2) = 47.6 of 36.6 ms; S = 4
  // never converges (2 x 0.01 x 64 > 1).
  auto r = run_cli(base + " --dynpipe-smoothness 1");
  ASSERT_EQ(r.status, 0) << r.output;
  expect_all(r.output, {"Algorithm 1 inputs: lr 0.1, epsilon 1, L 1 (--dynpipe-smoothness), "
                        "xi^2 1 (--dynpipe-noise), f(w0) 2 (--dynpipe-initial-loss)",
                        "chosen: S = 1, least T(S) x W(S)",
                        "mpirun -np 4 strata train --stages 1 --groups 4 --partition conv1-fc2",
                        "--partition conv1-fc2, GPUs per "
                        "stage 4"});
  EXPECT_TRUE(contains(r.output, "inf")) << r.output;
  // L = 0: no staleness penalty, so the S of least W: four stages of 3 layers, 36 ms.
  r = run_cli(base + " --dynpipe-smoothness 0");
  ASSERT_EQ(r.status, 0) << r.output;
  expect_all(r.output, {"chosen: S = 4", "GPUs per stage 1,1,1,1", "W(S) = 36.000 ms"});
  // The turning point stops the search where T x W first rises.
  r = run_cli(base + " --dynpipe-smoothness 1 --dynpipe-search turning-point");
  ASSERT_EQ(r.status, 0) << r.output;
  expect_all(r.output, {"chosen: S = 1", "(not searched: the turning point was S = 2)"});
}

TEST(DynPipeCli, WarmupOnFashionMnistMeasuresTheInputs) {
  if (!std::filesystem::exists(strata::io::kFashionMnistDir)) GTEST_SKIP() << "no Fashion-MNIST";
  const auto r = run_cli(
      "plan --model cnn --size tiny --stages 2 --micro-batches 2 --batch-size 8 --profile-steps 1 "
      "--threads 1 --planner dynpipe --gpus 4 --dynpipe-epsilon 50 --dynpipe-lr 0.001 "
      "--warmup-steps 5");
  ASSERT_EQ(r.status, 0) << r.output;
  expect_all(r.output, {"plan for cnn-tiny on fashion-mnist/train",
                        "warm-up: 5 steps of SGD at lr 0.001 on micro-batches of 4 samples",
                        "(warm-up: median of 5 samples (mean ", "(warm-up: mean squared gradient",
                        "(warm-up: first loss)", "chosen: S = ", "dynpipe plan: --partition "});
}

TEST(DynPipeCli, HelpAndBadInput) {
  auto r = run_cli("plan --help");
  expect_all(r.output, {"--planner", "--gpus", "--gpus-per-node", "--node-bandwidth",
                        "--tensor-parallel", "--dynpipe-rule", "--dynpipe-search", "--dynpipe-lr",
                        "--dynpipe-epsilon", "--dynpipe-smoothness", "--dynpipe-noise",
                        "--dynpipe-initial-loss", "--warmup-steps"});
  const std::string dir = strata::testing::fresh_temp_dir("strata_dynpipe_cli_bad");
  const std::string profile = write_profile(dir);
  const std::string plain =
      "plan --model cnn --size tiny --dataset synthetic-images --stages 2 --profile " + profile;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {plain + " --gpus 4", "--gpus is a flag of --planner dynpipe"},
      {plain + " --dynpipe-smoothness 2", "--dynpipe-smoothness is a flag of --planner dynpipe"},
      {plain + " --warmup-steps 4", "--warmup-steps is a flag of --planner dynpipe"},
      {plain + " --planner pipedream", "--planner"},
      {base_command(profile) + " --gpus-per-node 3",
       "--gpus 4 must be a multiple of "
       "--gpus-per-node 3"},
      {base_command(profile) + " --dynpipe-epsilon 1",
       "--dynpipe-epsilon needs the warm-up statistics: --dynpipe-smoothness"},
      {base_command(profile) + " --dynpipe-smoothness 2",
       "choose the stage count only with a target --dynpipe-epsilon"},
      {base_command(profile) + " --dynpipe-epsilon 0.001 --dynpipe-smoothness 1 "
                               "--dynpipe-noise 1 --dynpipe-initial-loss 1 --dynpipe-lr 0.1",
       "--dynpipe-epsilon 0.001: no stage count converges"},
      {base_command(profile) + " --dynpipe-epsilon 1 --warmup-steps 2", "--warmup-steps"},
      {base_command(profile) + " --dynpipe-lr 0", "--dynpipe-lr must be positive"},
      {plain + " --planner dynpipe --gpus 65", "--gpus must be 0 (= --stages) to 64, got 65"},
      {"plan --model cnn --size tiny --dataset synthetic-images --stages 3 --planner dynpipe "
       "--gpus 2 --profile " +
           profile,
       "--stages 3: no DynPipe plan of that many stages on --gpus 2"},
  };
  for (const auto& [command, says] : cases) {
    r = run_cli(command);
    EXPECT_NE(r.status, 0) << command;
    EXPECT_TRUE(contains(r.output, says)) << command << "\nmissing '" << says << "' in\n"
                                          << r.output;
  }
}

}  // namespace
