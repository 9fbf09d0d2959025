// `strata train --sync ...` as a user runs it (local threads on Fashion-MNIST; skipped without it):
// the SDPipe run reports its groups in the log, the metrics file and the summary, writes a trace
// that passes the offline check; the deadlock of the paper's Fig. 3 reproduced with --inject's
// scripted stragglers and --sync-token off (every rank ends within --comm-timeout) and gone with
// the token on; the baselines and adamw-vr run; trace files for --inject are checked; the trace
// passes `sdpipe_bench --mode check-trace` (the offline check and replay) with the run's settings
// and fails it with others.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "parallel/sdpipe/sync_graph.h"
#include "testing/cli.h"

namespace {

using strata::testing::CliResult;
using strata::testing::contains;
using strata::testing::run_cli;

// `command` through the shell: its exit status and its stdout and stderr together.
CliResult run_command(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  CliResult r{-1, ""};
  if (pipe == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) r.output.append(buf, n);
  const int raw = pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return r;
}

const char* kFashion = "/usr/share/datasets/fashion-mnist";

std::string base(int groups, int stages) {
  return "train --model mlp --size tiny --local --groups " + std::to_string(groups) + " --stages " +
         std::to_string(stages) +
         " --train-samples 512 --test-samples 128 --batch-size 32 --threads 1 --progress off "
         "--workers 0";
}

TEST(SdpipeCli, ReportsGroupsAndWritesACheckableTrace) {
  if (!std::filesystem::exists(kFashion)) GTEST_SKIP() << "no Fashion-MNIST";
  const std::string dir = strata::testing::fresh_temp_dir("strata_sdpipe_cli");
  const std::string metrics = dir + "/m.jsonl", trace = dir + "/t.jsonl";
  const auto r =
      run_cli(base(2, 2) +
              " --steps 8 --log-every 4 --sync sdpipe --sync-window 0.02 "
              "--sync-history 2 --metrics " +
              metrics + " --sync-trace " + trace + " --inject \"kind=straggler,p=0.2,delay=0.02\"");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "sdpipe over 2 groups: local update, then group averaging; "
                       "window 0.02 s, history P 2, token on, query async"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "kind=straggler,p=0.2,delay=0.02")) << r.output;
  EXPECT_TRUE(contains(r.output, "| sync: mean group ")) << r.output;
  EXPECT_TRUE(contains(r.output, "sync sdpipe: ")) << r.output;
  EXPECT_TRUE(contains(r.output, "done: 8 steps")) << r.output;
  std::ifstream in(metrics);
  std::string line;
  int train = 0, sync = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j["type"] == "train") {
      ++train;
      EXPECT_TRUE(j.contains("sync_mean_group")) << line;
      EXPECT_GE(j["sync_mean_group"].get<double>(), 1.0) << line;
      EXPECT_TRUE(j.contains("sync_enforcement_waits")) << line;
      EXPECT_TRUE(j.contains("sync_skipped_validations")) << line;
    }
    if (j["type"] == "sync") {
      ++sync;
      EXPECT_EQ(j["sync"], "sdpipe");
    }
  }
  EXPECT_EQ(train, 2);
  EXPECT_EQ(sync, 1);
  const auto check = strata::parallel::sdpipe::check_sync_trace(
      strata::parallel::sdpipe::read_sync_trace(trace), 2, 2);
  EXPECT_TRUE(check.violations.empty()) << check.violations.front();
  EXPECT_EQ(check.readies, 2 * 2 * 8);
  // The same, as a user checks it offline. A replay with another window decides otherwise.
  const std::string checker = std::string(SDPIPE_BENCH_PATH) + " --mode check-trace --trace " +
                              trace + " --sync-history 2 --sync-window ";
  const auto ok = run_command(checker + "0.02");
  EXPECT_EQ(ok.status, 0) << ok.output;
  EXPECT_TRUE(contains(ok.output, "2 stages x 2 replicas; 32 READYs")) << ok.output;
  EXPECT_TRUE(contains(ok.output,
                       "check (history P 2): passed; replay (window 0.02, token on): "
                       "same decisions"))
      << ok.output;
  const auto other = run_command(checker + "inf");
  EXPECT_EQ(other.status, 1) << other.output;
  EXPECT_TRUE(contains(other.output, "replay (window inf, token on): FAILED")) << other.output;
}

// Fig. 3 on G = 2 pipelines (A = group 0, B = group 1) x S = 2 stages, rank = group * 2 + stage.
// At step 3 the last stage of A (rank 1) sleeps 0.4 s and the first stage of B (rank 2) 1.0 s
// before their backward: with a window of 0.1 s each stage's replicas come apart, and with P = 2
// each stage's second group cannot connect. Token off: stage 1 waits for B, which waits for stage
// 0, which waits for A, which waits for stage 1: every rank fails within --comm-timeout. Token
// on: one stage accepts its group unchecked (a skipped validation) and the run ends.
std::string figure3(const std::string& token) {
  return base(2, 2) +
         " --micro-batches 1 --steps 6 --sync sdpipe --sync-window 0.1 --sync-history 2 "
         "--comm-timeout 4 --sync-token " +
         token +
         " --inject \"kind=straggler,p=1,delay=0.4,rank=1,from=3,to=3,op=backward;"
         "kind=straggler,p=1,delay=1.0,rank=2,from=3,to=3,op=backward\"";
}

TEST(SdpipeCli, Figure3DeadlockWithoutTheTokenAndNotWithIt) {
  if (!std::filesystem::exists(kFashion)) GTEST_SKIP() << "no Fashion-MNIST";
  const auto off = run_cli(figure3("off"));
  EXPECT_EQ(off.status, 1) << off.output;
  EXPECT_TRUE(contains(off.output, "timed out after 4000 ms")) << off.output;
  const auto on = run_cli(figure3("on"));
  ASSERT_EQ(on.status, 0) << on.output;
  EXPECT_TRUE(contains(on.output, "done: 6 steps")) << on.output;
  EXPECT_TRUE(contains(on.output, "enforcement waits, 1 skipped validations")) << on.output;
}

TEST(SdpipeCli, BaselinesAndVarianceReducedAdamRun) {
  if (!std::filesystem::exists(kFashion)) GTEST_SKIP() << "no Fashion-MNIST";
  for (const std::string& sync : {"adpsgd", "ps-ssp --ssp-staleness 1", "sdpipe"}) {
    const auto r = run_cli(base(2, 1) + " --steps 4 --optimizer adamw-vr --sync " + sync);
    EXPECT_EQ(r.status, 0) << sync << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "done: 4 steps")) << r.output;
  }
}

// With local updates the ranks agree on the loss only at log points: the live progress line says
// "loss -" between them, not "loss nan".
TEST(SdpipeCli, LiveProgressHasNoLossBeforeTheRanksAgree) {
  if (!std::filesystem::exists(kFashion)) GTEST_SKIP() << "no Fashion-MNIST";
  std::string args = base(2, 1) + " --steps 4 --log-every 4 --sync ps-ssp";
  args.replace(args.find("--progress off"), 14, "--progress on");
  const auto r = run_cli(args);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "step 1/4 | loss - |")) << r.output;
  EXPECT_FALSE(contains(r.output, "loss nan")) << r.output;
  EXPECT_TRUE(contains(r.output, "step 4/4 | epoch")) << r.output;
}

TEST(SdpipeCli, InjectTraceFilesAreCheckedNamingTheLine) {
  if (!std::filesystem::exists(kFashion)) GTEST_SKIP() << "no Fashion-MNIST";
  const std::string dir = strata::testing::fresh_temp_dir("strata_sdpipe_inject");
  std::ofstream(dir + "/slow.txt") << "# rank seconds fraction\n0 0 1\n7 0.5 0.5\n";
  const auto r = run_cli(base(2, 1) + " --steps 2 --inject kind=trace,file=" + dir + "/slow.txt");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "line 3")) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 7 is outside the 2 ranks")) << r.output;
  std::ofstream(dir + "/ok.txt") << "1 0 0.5\n";
  const auto ok = run_cli(base(2, 1) + " --steps 2 --inject kind=trace,file=" + dir + "/ok.txt");
  EXPECT_EQ(ok.status, 0) << ok.output;
}

}  // namespace
