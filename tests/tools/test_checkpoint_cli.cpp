// `strata train` checkpoints end to end: periodic saves and --keep-last, SIGTERM to a running
// trainer (single process and a pipeline of local ranks) then --resume auto ending bitwise equal
// to an uninterrupted run, SIGHUP saving while training goes on, --nan-policy, and bad
// checkpoints refused with the file named.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "io/mnist.h"
#include "testing/cli.h"
#include "testing/train_run.h"

namespace {

namespace fs = std::filesystem;

using Result = strata::testing::CliResult;
using strata::testing::contains;
using strata::testing::run_cli;

// A tiny model on synthetic images: fast steps, no files needed.
const std::string kData =
    " --model mlp --size tiny --dataset synthetic-images --image-size 8 --train-samples 512"
    " --test-samples 64 --batch-size 16 --threads 1 --workers 0 --seed 5";

// A `strata` process whose output is read through a pipe, to be signalled while it runs.
class Child {
 public:
  explicit Child(const std::string& args) {
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);
      dup2(fds[1], STDERR_FILENO);
      close(fds[0]);
      close(fds[1]);
      const std::string cmd = "exec " + std::string(STRATA_CLI_PATH) + " " + args;
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    close(fds[1]);
    fd_ = fds[0];
  }
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }
  // Reads output until `needle` appears (true) or the process ends or `seconds` pass (false).
  bool wait_for(const std::string& needle, double seconds = 60) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (!contains(output_.substr(scanned_), needle)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !read_some(static_cast<int>(left.count()))) return false;
    }
    scanned_ = output_.find(needle, scanned_) + needle.size();
    return true;
  }
  void signal(int sig) { kill(pid_, sig); }
  // Reads the rest and waits: the exit status, or -1 when killed by a signal.
  Result finish() {
    while (read_some(120000)) {
    }
    int raw = 0;
    waitpid(pid_, &raw, 0);
    pid_ = -1;
    return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, output_};
  }

 private:
  bool read_some(int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return false;
    char buf[4096];
    const ssize_t n = read(fd_, buf, sizeof(buf));
    if (n <= 0) return false;
    output_.append(buf, static_cast<size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  std::string output_;
  size_t scanned_ = 0;
};

std::string temp_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/strata_ckpt_cli_" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The tensor files of two checkpoints hold the same bytes (weights, buffers, optimizer state).
::testing::AssertionResult same_tensors(const std::string& a, const std::string& b) {
  int files = 0;
  for (const auto& e : fs::directory_iterator(a + "/tensors")) {
    const std::string other = b + "/tensors/" + e.path().filename().string();
    if (read_file(e.path().string()) != read_file(other)) {
      return ::testing::AssertionFailure() << e.path() << " differs from " << other;
    }
    ++files;
  }
  if (files == 0) return ::testing::AssertionFailure() << "no tensor files in " << a;
  return ::testing::AssertionSuccess() << files << " files";
}

TEST(CheckpointCli, HelpDescribesTheFlags) {
  const Result r = run_cli("train --help");
  EXPECT_EQ(r.status, 0);
  for (const char* s : {"--checkpoint-dir", "--save-every INT=0", "--keep-last INT=0", "--resume",
                        "--nan-policy TEXT:{abort,skip}=abort", "SIGTERM"}) {
    EXPECT_TRUE(contains(r.output, s)) << "missing " << s;
  }
}

TEST(CheckpointCli, PeriodicCheckpointsKeepTheLastAndResumeContinues) {
  const std::string dir = temp_dir("periodic");
  Result r = run_cli("train" + kData + " --steps 10 --checkpoint-dir " + dir +
                     " --save-every 3 --keep-last 2");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "checkpoint " + dir + "/step-000003 (periodic")) << r.output;
  EXPECT_TRUE(contains(r.output, "step-000010 (end of training")) << r.output;
  EXPECT_FALSE(fs::exists(dir + "/step-000003"));
  EXPECT_FALSE(fs::exists(dir + "/step-000006"));
  EXPECT_TRUE(fs::exists(dir + "/step-000009/manifest.pb"));
  EXPECT_TRUE(fs::exists(dir + "/step-000010/manifest.pb"));
  EXPECT_EQ(read_file(dir + "/latest"), "step-000010\n");
  // The same --steps again: nothing left to do.
  r = run_cli("train" + kData + " --steps 10 --checkpoint-dir " + dir + " --resume auto");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "nothing to train")) << r.output;
  // A longer run continues from step 10.
  r = run_cli("train" + kData + " --steps 12 --checkpoint-dir " + dir + " --resume auto");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "done: 12 steps (resumed at step 10 from " + dir + "/step-000010"))
      << r.output;
  // --resume auto in an empty directory is a fresh start, said in the log.
  const std::string empty = temp_dir("periodic_empty");
  r = run_cli("train" + kData + " --steps 2 --checkpoint-dir " + empty + " --resume auto");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "no complete checkpoint in " + empty + ", starting from step 0"))
      << r.output;
}

// SIGTERM while training: a checkpoint at the next step boundary, exit 0; --resume auto then ends
// with the bytes of an uninterrupted run.
void sigterm_then_resume(const std::string& name, const std::string& layout) {
  const std::string straight = temp_dir(name + "_straight");
  const std::string dir = temp_dir(name);
  const std::string common = "train" + kData + layout + " --steps 80";
  Result r = run_cli(common + " --checkpoint-dir " + straight);
  ASSERT_EQ(r.status, 0) << r.output;

  // --save-every 1 slows each step down to a checkpoint's fsyncs: time to signal mid-run.
  Child child(common + " --checkpoint-dir " + dir + " --save-every 1 --keep-last 3 --log-every 1");
  ASSERT_TRUE(child.wait_for("step 10/80")) << "the run did not get to step 10";
  child.signal(SIGTERM);
  r = child.finish();
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "strata: SIGTERM")) << r.output;
  const size_t at = r.output.find("stopped at step ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const int stopped = std::stoi(r.output.substr(at + 16));
  EXPECT_GE(stopped, 10);
  ASSERT_LT(stopped, 80) << "the signal arrived after the end";
  char name_buf[32];
  std::snprintf(name_buf, sizeof(name_buf), "step-%06d", stopped);
  EXPECT_EQ(read_file(dir + "/latest"), std::string(name_buf) + "\n");
  EXPECT_TRUE(contains(r.output, "checkpoint " + dir + "/" + name_buf + " (stop request"))
      << r.output;

  r = run_cli(common + " --checkpoint-dir " + dir + " --resume auto");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "resumed at step " + std::to_string(stopped))) << r.output;
  EXPECT_TRUE(same_tensors(dir + "/step-000080", straight + "/step-000080"));
}

TEST(CheckpointCli, SigtermStopsAfterACheckpointAndResumeIsExact) {
  sigterm_then_resume("sigterm", "");
}

TEST(CheckpointCli, SigtermStopsEveryLocalRankAndResumeIsExact) {
  sigterm_then_resume("sigterm_local", " --local --stages 2 --groups 2 --micro-batches 2");
}

TEST(CheckpointCli, SighupSavesAndTrainingGoesOn) {
  const std::string dir = temp_dir("sighup");
  Child child("train" + kData + " --steps 100000 --checkpoint-dir " + dir +
              " --log-every 1 --local --stages 2 --micro-batches 2");
  ASSERT_TRUE(child.wait_for("step 5/100000"));
  child.signal(SIGHUP);
  ASSERT_TRUE(child.wait_for("(save request")) << "no checkpoint after SIGHUP";
  ASSERT_TRUE(child.wait_for("step ")) << "training did not go on after SIGHUP";
  child.signal(SIGTERM);
  const Result r = child.finish();
  EXPECT_EQ(r.status, 0) << r.output;
  int checkpoints = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    checkpoints += e.path().filename().string().rfind("step-", 0) == 0;
  }
  EXPECT_EQ(checkpoints, 2) << r.output;  // the SIGHUP one and the SIGTERM one
}

TEST(CheckpointCli, NanPolicyAbortNamesTheStepAndSkipCountsThem) {
  // A learning rate of 1e30 sends the weights to infinity after the first update.
  Result r = run_cli("train" + kData + " --steps 6 --lr 1e30");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "error: ")) << r.output;
  EXPECT_TRUE(contains(r.output, "step 2 (epoch 1): the loss is")) << r.output;
  EXPECT_TRUE(contains(r.output, "first in parameter ")) << r.output;
  EXPECT_TRUE(contains(r.output, "(--nan-policy abort)")) << r.output;

  const std::string metrics = temp_dir("nan") + "/metrics.jsonl";
  r = run_cli("train" + kData + " --steps 6 --lr 1e30 --nan-policy skip --log-every 3 --metrics " +
              metrics);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "| skipped 5")) << r.output;
  EXPECT_TRUE(contains(r.output, "skipped 5 steps with a non-finite loss or gradient")) << r.output;
  EXPECT_TRUE(contains(read_file(metrics), "\"skipped\":5")) << read_file(metrics);
}

TEST(CheckpointCli, BadCheckpointsAreRefusedNamingTheFile) {
  const std::string dir = temp_dir("bad");
  Result r = run_cli("train" + kData + " --steps 3 --checkpoint-dir " + dir);
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string ckpt = dir + "/step-000003";
  // Corrupt one byte of a tensor: refused, naming the file and the tensor; exit status 1.
  std::string path;
  for (const auto& e : fs::directory_iterator(ckpt + "/tensors")) path = e.path().string();
  std::string bytes = read_file(path);
  bytes[bytes.size() - 1] ^= 0x20;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  r = run_cli("train" + kData + " --steps 5 --checkpoint-dir " + dir + " --resume auto");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, path + ": checksum mismatch in ")) << r.output;
  // Another model: refused, naming the layer and the checkpoint.
  r = run_cli(
      "train --model cnn --size tiny --dataset synthetic-images --image-size 8 --steps 1 "
      "--batch-size 16 --train-samples 64 --test-samples 16 --resume " +
      ckpt);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "checkpoint " + ckpt)) << r.output;
  // Not a checkpoint at all.
  r = run_cli("train" + kData + " --steps 1 --resume " + dir + "/missing");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--resume " + dir + "/missing: no such checkpoint")) << r.output;
  // Flags that do not fit together.
  r = run_cli("train" + kData + " --steps 1 --save-every 2");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--save-every needs --checkpoint-dir")) << r.output;
}

#ifdef STRATA_MPIEXEC
// A peer that fails mid-migration (--inject kind=fail: rank 1 stalls, or exits, when the move
// after step 4 begins) ends the run within --comm-timeout, a stalled peer's error naming the move;
// the last complete checkpoint resumes to the uninterrupted run's losses and weights, bitwise.
TEST(CheckpointCli, APeerThatFailsMidMigrationEndsTheRunAndTheCheckpointResumes) {
  if (!fs::exists(strata::io::kFashionMnistDir)) GTEST_SKIP() << "Fashion-MNIST is not installed";
  using strata::testing::train_run;
  const std::string dir = temp_dir("peer_fails_mid_migration");
  const std::string args =
      "--model cnn --size tiny --dataset fashion-mnist --train-samples 512 --test-samples 64 "
      "--stages 2 --threads 1 --batch-size 16 --micro-batches 2 --steps 8 --seed 3 "
      "--partition conv1-pool1,conv2-fc2 --migrate-at 4:conv1-conv2,bn2-fc2 --comm-timeout 5";
  const std::string mpirun = strata::testing::mpirun(2);
  const strata::testing::TrainRun whole = train_run(dir, "whole", args, mpirun);
  ASSERT_EQ(whole.status, 0) << whole.output;
  ASSERT_EQ(whole.losses.size(), 8u) << whole.output;
  for (const std::string how : {"stall", "exit"}) {
    SCOPED_TRACE(how);
    const std::string ckpt = dir + "/ckpt_" + how;
    const auto start = std::chrono::steady_clock::now();
    const strata::testing::TrainRun failed =
        train_run(dir, how,
                  args + " --checkpoint-dir " + ckpt + " --save-every 2 --inject \"rank=1," +
                      "kind=fail,how=" + how + ",at=migration\"",
                  mpirun);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_NE(failed.status, 0) << failed.output;
    // Not a hang: the stalled peer is given up after --comm-timeout 5 (a bound far above it).
    EXPECT_LT(seconds, 120.0) << failed.output;
    EXPECT_TRUE(contains(failed.output, "kind=fail,how=" + how + ",at=migration\": " +
                                            (how == "exit" ? "exits" : "stalls")))
        << failed.output;
    if (how == "stall") {
      EXPECT_TRUE(contains(failed.output,
                           "moving the layers to conv1-conv2,bn2-fc2 after step 4 (conv2 1->0): "))
          << failed.output;
      EXPECT_TRUE(contains(failed.output, "timed out after 5000 ms")) << failed.output;
    }
    ASSERT_TRUE(fs::exists(ckpt + "/step-000002/manifest.pb")) << failed.output;
    const strata::testing::TrainRun resumed = train_run(
        dir, how + "_resumed", args + " --checkpoint-dir " + ckpt + " --resume auto", mpirun);
    ASSERT_EQ(resumed.status, 0) << resumed.output;
    EXPECT_TRUE(contains(resumed.output, "resumed at step")) << resumed.output;
    ASSERT_LE(resumed.losses.size(), 6u) << resumed.output;
    const std::vector<std::string> tail(whole.losses.end() - resumed.losses.size(),
                                        whole.losses.end());
    EXPECT_EQ(resumed.losses, tail);
    EXPECT_TRUE(resumed.weights == whole.weights) << "the resumed run ends elsewhere";
  }
}
#endif

}  // namespace

TEST(CheckpointCli, LossScaleIsShownInTheLogAndMetrics) {
  const std::string metrics = temp_dir("loss_scale") + "/metrics.jsonl";
  Result r = run_cli("train" + kData +
                     " --steps 4 --loss-scale dynamic --loss-scale-window 2 --log-every 2 "
                     "--metrics " +
                     metrics);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "dynamic, doubled after 2 good steps")) << r.output;
  EXPECT_TRUE(contains(r.output, "| loss scale 131072")) << r.output;  // 2^16, doubled once
  EXPECT_TRUE(contains(r.output, "loss scale at the end: 262144")) << r.output;
  EXPECT_TRUE(contains(read_file(metrics), "\"loss_scale\":262144")) << read_file(metrics);
  r = run_cli("train" + kData + " --steps 2 --loss-scale 1000");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--loss-scale must be off, dynamic, or a power of two"))
      << r.output;
  r = run_cli("train --help");
  EXPECT_TRUE(contains(r.output, "--loss-scale TEXT=auto")) << r.output;
  EXPECT_TRUE(contains(r.output, "--loss-scale-window INT=2000")) << r.output;
}
