// `strata train --migration dynpipe` (parallel/runtime/live_pause.h) as a user runs it: cnn tiny on
// Fashion-MNIST, 2 stages as local threads, async-1f1b, a move of relu2-fc1 from stage 1 to stage
// 0 before step 3, without and with the emulated link (--link-mbps, flow control on and off). The
// run finishes; its migration record gives the pause, the take-over and the resume in order
// inside the run; over the link the moved state is bulk traffic from stage 1 to stage 0. What the
// protocol does not move is refused, named. The numbers themselves are checked bit for bit
// against a replay in tests/parallel/test_live_pause.cpp; no timing asserted.
#include <gtest/gtest.h>

#include <cmath>
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
    "--model cnn --size tiny --dataset fashion-mnist --train-samples 512 --test-samples 16 "
    "--steps 12 --batch-size 16 --micro-batches 4 --stages 2 --local --partition uniform --seed 2 "
    "--schedule async-1f1b --optimizer sgd --momentum 0.9 --lr 0.05 --lr-schedule constant "
    "--no-augment --threads 1 --migration-chunk-mb 0.016 --migration-window-mb 0.064";

void check_record(const TrainRun& run) {
  ASSERT_EQ(run.status, 0) << run.output;
  ASSERT_EQ(run.of("migration").size(), 1u) << run.output;
  const nlohmann::json& m = run.of("migration")[0];
  EXPECT_EQ(m["mode"], "dynpipe");
  EXPECT_EQ(m["partition"], "conv1-fc1,relu3-fc2");
  const int64_t P = m["pause_at"], K = m["take_over"], R = m["resume"];
  EXPECT_EQ(P, 3 * 4);       // the first micro-batch of the move's step
  EXPECT_GE(K, P + 2);       // S micro-batches after a forward at or after P
  EXPECT_LE(K, 12 * 4 - 1);  // F = K for a move up from the last stage: inside the run
  EXPECT_GE(R, K);
  EXPECT_LE(R, 12 * 4 - 1);
  EXPECT_GT(m["bytes"].get<double>(), 0.0);
  ASSERT_EQ(run.losses.size(), 12u);
  for (const std::string& l : run.losses) EXPECT_TRUE(std::isfinite(std::stod(l))) << l;
  EXPECT_FALSE(run.weights.empty());
  EXPECT_TRUE(contains(run.output, "updates paused from micro-batch 12")) << run.output;
}

TEST(DynpipeMigrationCli, PausedMoveFinishesWithAndWithoutTheLink) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_dynpipe_migration_cli");
  const std::string move =
      std::string(kCnnAsync) + " --migrate-at 3:conv1-fc1,relu3-fc2 --migration dynpipe";
  {
    SCOPED_TRACE("no link");
    const TrainRun run = train_run(dir, "plain", move);
    check_record(run);
    EXPECT_TRUE(run.of("link").empty());
  }
  for (const char* flow : {"on", "off"}) {
    SCOPED_TRACE(std::string("link, flow control ") + flow);
    const TrainRun run = train_run(dir, std::string("link_") + flow,
                                   move + " --link-mbps 16 --link-flow-control " + flow);
    check_record(run);
    bool bulk = false;
    for (const nlohmann::json& l : run.of("link")) {
      if (l["from"] == 1 && l["to"] == 0) bulk = l["bulk_bytes"].get<double>() > 0.0;
    }
    EXPECT_TRUE(bulk) << "the moved state is bulk traffic from stage 1 to stage 0";
  }
}

TEST(DynpipeMigrationCli, RefusesWhatItDoesNotMove) {
  const std::string base = std::string("train ") + kCnnAsync + " --progress off";
  // bn2's running statistics change with every forward at the source while the state travels.
  const auto bn = run_cli(base + " --migrate-at 3:conv1-conv2,bn2-fc2 --migration dynpipe");
  EXPECT_NE(bn.status, 0);
  EXPECT_TRUE(contains(bn.output, "running statistics")) << bn.output;
  EXPECT_TRUE(contains(bn.output, "--migration live")) << bn.output;
  // A synchronous schedule has no update to pause.
  std::string sync_args = base;
  sync_args.replace(sync_args.find("async-1f1b"), 10, "1f1b");
  const auto sync = run_cli(sync_args + " --migrate-at 3:conv1-fc1,relu3-fc2 --migration dynpipe");
  EXPECT_NE(sync.status, 0);
  EXPECT_TRUE(contains(sync.output, "--migration dynpipe needs --schedule async-1f1b"))
      << sync.output;
  const auto bad = run_cli("train --migration trickle");
  EXPECT_NE(bad.status, 0);
  EXPECT_TRUE(contains(bad.output, "--migration")) << bad.output;
}

}  // namespace
