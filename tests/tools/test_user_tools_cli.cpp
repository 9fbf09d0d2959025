// What a user reaches for after training, through the `strata` binary: generate (cached equals
// uncached), eval (equal to the evaluation the training run logged at that step), --tensorboard
// (read back by an independent reader and compared with --metrics), --sample-every over a
// pipeline, and plot.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/brown.h"
#include "io/mnist.h"
#include "testing/cli.h"
#include "testing/event_file.h"

namespace {

using strata::testing::CliResult;
using strata::testing::contains;
using strata::testing::run_cli;

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

nlohmann::json eval_record(const std::vector<nlohmann::json>& records, int64_t step) {
  for (const nlohmann::json& r : records) {
    if (r["type"] == "eval" && r["step"] == step) return r;
  }
  return nullptr;
}

bool have_brown() {
  return std::filesystem::exists(strata::io::brown_corpus_dir("") + "/cats.txt");
}

// A tiny GPT-2 trained 4 steps on Brown, with a checkpoint, metrics and TensorBoard events.
class Gpt2OnBrown : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!have_brown()) return;
    // ctest runs each test in a process of its own, two at a time: a directory per process.
    dir_ = new std::string(
        strata::testing::fresh_temp_dir("strata_user_tools_gpt2_" + std::to_string(getpid())));
    const std::string common =
        " --model gpt2 --size tiny --dataset brown --seq-len 32 --batch-size 4 --train-samples 64 "
        "--test-samples 16 --threads 1 --workers 0 --progress off --seed 3";
    train_ = new CliResult(
        run_cli("train" + common + " --steps 4 --eval-every 4 --log-every 1 --checkpoint-dir " +
                *dir_ + "/ck --metrics " + *dir_ + "/m.jsonl --tensorboard " + *dir_ + "/tb"));
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete train_;
    dir_ = nullptr;
    train_ = nullptr;
  }
  void SetUp() override {
    if (!have_brown()) GTEST_SKIP() << "Brown corpus not installed (run tools/setup.sh)";
    ASSERT_EQ(train_->status, 0) << train_->output;
  }
  static std::string* dir_;
  static CliResult* train_;
};
std::string* Gpt2OnBrown::dir_ = nullptr;
CliResult* Gpt2OnBrown::train_ = nullptr;

// `strata generate ARGS` with its stdout alone as the output (the statistics go to stderr).
CliResult generate(const std::string& args) {
  const std::string cmd = std::string(STRATA_CLI_PATH) + " generate " + args + " 2>/dev/null";
  CliResult r{-1, ""};
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) r.output.append(buf, n);
  const int raw = pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return r;
}

TEST_F(Gpt2OnBrown, GenerateWithTheCacheEqualsWithout) {
  const std::string w = " --weights " + *dir_ +
                        "/ck --prompt 'The jury said' --max-tokens 12 "
                        "--threads 1";
  for (const std::string sampling : {" --temperature 0", " --temperature 1 --top-k 40 --seed 9"}) {
    const CliResult cached = generate(w + sampling);
    const CliResult uncached = generate(w + sampling + " --kv-cache off");
    ASSERT_EQ(cached.status, 0) << cached.output;
    ASSERT_EQ(uncached.status, 0) << uncached.output;
    EXPECT_EQ(cached.output.rfind("The jury said", 0), 0u) << cached.output;
    EXPECT_GT(cached.output.size(), std::string("The jury said\n").size()) << cached.output;
    EXPECT_EQ(cached.output, uncached.output);
  }
  // The statistics line, and a request past the model's 64 positions.
  CliResult r = run_cli("generate --weights " + *dir_ + "/ck --max-tokens 3 --threads 1");
  EXPECT_TRUE(contains(r.output, "generated 3 tokens after a prompt of 1")) << r.output;
  r = run_cli("generate --weights " + *dir_ + "/ck --max-tokens 70");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output,
                       "has 64 positions; the prompt (1 tokens) and --max-tokens 70 "
                       "need 71: lower --max-tokens to 63"))
      << r.output;
}

TEST_F(Gpt2OnBrown, EvalGivesTheLossTheRunLoggedAtThatStep) {
  const nlohmann::json logged = eval_record(read_jsonl(*dir_ + "/m.jsonl"), 4);
  ASSERT_FALSE(logged.is_null());
  const CliResult r = run_cli("eval --weights " + *dir_ +
                              "/ck --dataset brown --seq-len 32 --samples 16 --batch-size 4 "
                              "--threads 1 --metrics " +
                              *dir_ + "/e.jsonl");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "eval test | step 4 | loss ")) << r.output;
  EXPECT_TRUE(contains(r.output, "perplexity")) << r.output;
  const std::vector<nlohmann::json> e = read_jsonl(*dir_ + "/e.jsonl");
  ASSERT_EQ(e.size(), 1u);
  EXPECT_NEAR(e[0]["loss"].get<double>(), logged["loss"].get<double>(),
              1e-6 * logged["loss"].get<double>());
  EXPECT_DOUBLE_EQ(e[0]["accuracy"].get<double>(), logged["accuracy"].get<double>());
  EXPECT_NEAR(e[0]["perplexity"].get<double>(), std::exp(logged["loss"].get<double>()), 1e-3);
}

TEST_F(Gpt2OnBrown, TensorBoardHoldsTheMetricsValues) {
  std::vector<std::string> files;
  for (const auto& f : std::filesystem::directory_iterator(*dir_ + "/tb")) {
    files.push_back(f.path().string());
  }
  ASSERT_EQ(files.size(), 1u);
  const strata::testing::EventFile tb = strata::testing::read_event_file(files[0]);
  ASSERT_EQ(tb.error, "");
  ASSERT_EQ(tb.records, static_cast<int>(tb.events.size()));
  EXPECT_EQ(tb.events.at(0).file_version, "brain.Event:2");
  // tag -> step -> value
  std::map<std::string, std::map<int64_t, float>> scalars;
  for (const strata::testing::ReadEvent& e : tb.events) {
    for (const strata::testing::EventScalar& s : e.scalars) scalars[s.tag][e.step] = s.value;
  }
  int compared = 0;
  for (const nlohmann::json& r : read_jsonl(*dir_ + "/m.jsonl")) {
    if (!r.contains("step")) continue;  // the run's stage records
    const int64_t step = r["step"].get<int64_t>();
    if (r["type"] == "train") {
      EXPECT_EQ(scalars["train/loss"].at(step), static_cast<float>(r["loss"].get<double>()));
      EXPECT_EQ(scalars["train/lr"].at(step), static_cast<float>(r["lr"].get<double>()));
      EXPECT_EQ(scalars["train/grad_norm"].at(step),
                static_cast<float>(r["grad_norm"].get<double>()));
      EXPECT_EQ(scalars["train/samples_per_s"].at(step),
                static_cast<float>(r["samples_per_s"].get<double>()));
      ++compared;
    } else if (r["type"] == "eval") {
      EXPECT_EQ(scalars["eval/loss"].at(step), static_cast<float>(r["loss"].get<double>()));
      EXPECT_EQ(scalars["eval/accuracy"].at(step), static_cast<float>(r["accuracy"].get<double>()));
      EXPECT_NEAR(scalars["eval/perplexity"].at(step), std::exp(r["loss"].get<double>()), 1e-2);
      ++compared;
    }
  }
  EXPECT_EQ(compared, 5);  // 4 train records (--log-every 1) and the evaluation at step 4
  EXPECT_EQ(scalars["train/loss"].size(), 4u);
  for (int64_t step = 1; step <= 4; ++step) {
    const float busy = scalars["rank0/busy_fraction"].at(step);
    EXPECT_GT(busy, 0.0f);
    EXPECT_LE(busy, 1.0f);
    EXPECT_FLOAT_EQ(busy + scalars["rank0/idle_fraction"].at(step), 1.0f);
    EXPECT_GT(scalars["rank0/peak_memory_mib"].at(step), 1.0f);  // the 3.2M-parameter embedding
  }
}

TEST_F(Gpt2OnBrown, SampleEveryPrintsTextFromAPipeline) {
  const std::string m = *dir_ + "/sample.jsonl";
  const CliResult r = run_cli(
      "train --model gpt2 --size tiny --dataset brown --seq-len 32 --batch-size 4 "
      "--train-samples 64 --test-samples 8 --threads 2 --workers 0 --progress off --steps 2 "
      "--stages 2 --local --partition uniform --sample-every 1 --sample-tokens 6 --metrics " +
      m);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "sample | step 1 | ")) << r.output;
  EXPECT_TRUE(contains(r.output, "sample | step 2 | ")) << r.output;
  int samples = 0;
  for (const nlohmann::json& j : read_jsonl(m)) {
    if (j["type"] != "sample") continue;
    ++samples;
    EXPECT_EQ(j["ids"].size(), 6u);
    EXPECT_FALSE(j["text"].get<std::string>().empty());
  }
  EXPECT_EQ(samples, 2);
}

TEST_F(Gpt2OnBrown, PlotOverlaysRuns) {
  const std::string out = *dir_ + "/p.svg";
  const CliResult r = run_cli("plot " + *dir_ + "/m.jsonl " + *dir_ +
                              "/m.jsonl --labels first second --output " + out);
  ASSERT_EQ(r.status, 0) << r.output;
  std::ifstream in(out);
  const std::string svg{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_TRUE(contains(svg, "</svg>"));
  EXPECT_TRUE(contains(svg, ">first</text>")) << svg.substr(0, 2000);
  EXPECT_TRUE(contains(svg, ">second</text>"));
  size_t polylines = 0;
  for (size_t at = svg.find("<polyline"); at != std::string::npos;
       at = svg.find("<polyline", at + 1)) {
    ++polylines;
  }
  // Training loss and throughput against step and time, for both runs; the single evaluation is
  // a point.
  EXPECT_EQ(polylines, 8u);
  EXPECT_TRUE(contains(svg, "<circle"));
  EXPECT_EQ(run_cli("plot " + *dir_ + "/nothing.jsonl").status, 1);
}

TEST(UserToolsCli, EvalOfAnImageModelEqualsTheLoggedEvaluation) {
  if (!std::filesystem::exists(strata::io::kFashionMnistDir)) GTEST_SKIP() << "no Fashion-MNIST";
  const std::string dir =
      strata::testing::fresh_temp_dir("strata_user_tools_mlp_" + std::to_string(getpid()));
  CliResult r = run_cli(
      "train --model mlp --steps 3 --eval-every 3 --batch-size 32 --train-samples 256 "
      "--test-samples 300 --eval-batch-size 128 --threads 1 --progress off --checkpoint-dir " +
      dir + "/ck --metrics " + dir + "/m.jsonl");
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json logged = eval_record(read_jsonl(dir + "/m.jsonl"), 3);
  ASSERT_FALSE(logged.is_null());
  r = run_cli("eval --weights " + dir +
              "/ck/step-000003 --samples 300 --batch-size 128 "
              "--threads 1 --metrics " +
              dir + "/e.jsonl");
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json e = read_jsonl(dir + "/e.jsonl").at(0);
  EXPECT_NEAR(e["loss"].get<double>(), logged["loss"].get<double>(),
              1e-6 * logged["loss"].get<double>());
  EXPECT_DOUBLE_EQ(e["accuracy"].get<double>(), logged["accuracy"].get<double>());
  EXPECT_DOUBLE_EQ(e["top5"].get<double>(), logged["top5"].get<double>());
  EXPECT_EQ(e["samples"], 300);
  EXPECT_FALSE(contains(r.output, "perplexity")) << r.output;
}

}  // namespace
