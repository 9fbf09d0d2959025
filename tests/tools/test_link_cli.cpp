// `strata train --link-mbps` (tools/train_link.h, parallel/comm/shaped_comm.h) through the CLI:
// the emulated link delays messages and changes no number (an async-1f1b run with a live move is
// bit for bit the run without the link, with and without flow control); every link between the
// two stages reports its training messages, and the link that carried the move its bulk bytes
// and the steps they spanned (DynPipe's Table III ablation counts those); a restart move is bulk
// too; runs the link cannot shape are refused before training. No timing asserted.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "testing/cli.h"
#include "testing/train_run.h"

namespace {

using strata::testing::contains;
using strata::testing::run_cli;
using strata::testing::train_run;
using strata::testing::TrainRun;

const char* kCnnAsync =
    "--model cnn --size tiny --dataset fashion-mnist --train-samples 256 --test-samples 16 "
    "--steps 6 --batch-size 16 --micro-batches 4 --stages 2 --local --partition uniform --seed 2 "
    "--schedule async-1f1b --optimizer sgd --momentum 0.9 --lr 0.05 --lr-schedule constant "
    "--no-augment --threads 1";
const char* kMove = " --migrate-at 3:conv1-pool1,conv2-fc2";  // conv2, bn2 0->1

// The link from stage `from` to `to` of a run.
nlohmann::json link_of(const TrainRun& run, int from, int to) {
  for (const auto& r : run.of("link")) {
    if (r["from"] == from && r["to"] == to) return r;
  }
  return nullptr;
}

TEST(LinkCli, LiveMoveOverTheLinkChangesNoNumberAndCountsTheMovesIterations) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_link_cli_live");
  const std::string live =
      std::string(kCnnAsync) + kMove + " --migration live --migration-chunk-mb 0.004 ";
  const TrainRun plain = train_run(dir, "plain", live + "--migration-window-mb 0.016");
  ASSERT_EQ(plain.status, 0) << plain.output;
  EXPECT_TRUE(plain.of("link").empty()) << "no link without --link-mbps";
  for (const char* flow : {"on", "off"}) {
    SCOPED_TRACE(flow);
    const std::string window = std::string(flow) == "on" ? "0.016" : "0";
    const TrainRun run = train_run(dir, std::string("link_") + flow,
                                   live + "--migration-window-mb " + window + " --link-mbps 40 " +
                                       "--link-flow-control " + flow);
    ASSERT_EQ(run.status, 0) << run.output;
    EXPECT_EQ(run.losses, plain.losses);
    EXPECT_TRUE(run.weights == plain.weights) << "the final weights differ";
    ASSERT_EQ(run.of("migration").size(), 1u) << run.output;
    const nlohmann::json down = link_of(run, 0, 1), up = link_of(run, 1, 0);
    ASSERT_FALSE(down.is_null()) << run.output;
    ASSERT_FALSE(up.is_null()) << run.output;
    EXPECT_EQ(down["flow_control"], std::string(flow) == "on");
    EXPECT_GT(down["training_messages"].get<int64_t>(), 0);  // activations
    EXPECT_GT(up["training_messages"].get<int64_t>(), 0);    // gradients
    EXPECT_EQ(up["bulk_bytes"].get<double>(), 0.0) << "nothing moves up";
    // The move's inputs, weights and optimizer state: chunked bulk from stage 0 to stage 1.
    EXPECT_GT(down["bulk_messages"].get<int64_t>(), 1);
    EXPECT_GT(down["bulk_bytes"].get<double>(), 0.0);
    const int64_t first = down["bulk_first_step"], last = down["bulk_last_step"];
    EXPECT_GE(first, 3);  // not before the move's step (counted from 1: step 4)
    EXPECT_GE(last, first);
    EXPECT_LE(last, 6);
    EXPECT_EQ(down["bulk_iterations"].get<int64_t>(), last - first + 1);
    EXPECT_EQ(down["step_end_s"].size(), 6u);
    EXPECT_TRUE(contains(run.output, "emulated link 0->1")) << run.output;
  }
}

TEST(LinkCli, RestartMoveIsBulkTraffic) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_link_cli_restart");
  const TrainRun run = train_run(
      dir, "restart", std::string(kCnnAsync) + kMove + " --migration restart --link-mbps 40");
  ASSERT_EQ(run.status, 0) << run.output;
  ASSERT_EQ(run.of("migration").size(), 1u) << run.output;
  const nlohmann::json down = link_of(run, 0, 1);
  ASSERT_FALSE(down.is_null()) << run.output;
  EXPECT_GT(down["bulk_bytes"].get<double>(), 0.0);
  // The stop-and-copy happens inside the move's step (step 4, counted from 1).
  EXPECT_EQ(down["bulk_first_step"].get<int64_t>(), 4);
  EXPECT_EQ(down["bulk_last_step"].get<int64_t>(), 4);
  EXPECT_EQ(down["bulk_iterations"].get<int64_t>(), 1);
}

TEST(LinkCli, RefusesRunsItCannotShape) {
  const auto one = run_cli(
      "train --model mlp --size tiny --dataset fashion-mnist --train-samples 64 --steps 1 "
      "--batch-size 16 --link-mbps 8 --progress off");
  EXPECT_NE(one.status, 0);
  EXPECT_TRUE(contains(one.output, "--link-mbps")) << one.output;
  const auto bad = run_cli("train --link-flow-control maybe");
  EXPECT_NE(bad.status, 0);
  EXPECT_TRUE(contains(bad.output, "--link-flow-control")) << bad.output;
}

}  // namespace
