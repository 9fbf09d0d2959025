// `strata bench --model`: a few training steps of tiny models on the CPU print the report lines
// and a JSON Lines record; bf16/fp16 mixed precision is refused on the CPU (a GPU's to run), and
// the help says so. The op benchmark without --model is covered by test_cli
// (Cli.ProfileAndBenchRun).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "testing/cli.h"

namespace {

using strata::testing::contains;
using strata::testing::run_cli;

TEST(BenchCli, Gpt2TinyReportsThroughputAndFlops) {
  const std::string dir = strata::testing::fresh_temp_dir("strata_bench_gpt2");
  const auto r = run_cli(
      "bench --model gpt2 --size tiny --batch-size 2 --seq-len 16 --steps 2 --warmup 1 "
      "--device cpu --threads 2 --json " +
      dir + "/bench.jsonl");
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* s :
       {"model", "gpt2-tiny", "parameters", "device", "cpu", "precision", "fp32", "batch",
        "2 x 16 tokens", "synthetic-tokens, vocabulary 256", "step time", "median", "mean",
        "samples/s", "tokens/s", "6 N + 12 L C T", "TFLOP/s", "peak unknown", "loss"}) {
    EXPECT_TRUE(contains(r.output, s)) << "missing '" << s << "' in\n" << r.output;
  }
  EXPECT_FALSE(contains(r.output, "\n  MFU ")) << r.output;  // no MFU row without a peak
  std::ifstream in(dir + "/bench.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_EQ(j["model"], "gpt2");
  EXPECT_EQ(j["seq_len"], 16);
  EXPECT_EQ(j["batch_size"], 2);
  EXPECT_EQ(j["steps"], 2);
  EXPECT_GT(j["tokens_per_s"].get<double>(), 0.0);
  EXPECT_GT(j["step_ms_median"].get<double>(), 0.0);
  EXPECT_GT(j["flops_per_step"].get<double>(), 0.0);
  EXPECT_TRUE(j["mfu"].is_null());
  EXPECT_TRUE(j["peak_tflops"].is_null());
}

TEST(BenchCli, ResNetTinyReportsImagesPerSecond) {
  const auto r = run_cli(
      "bench --model resnet --size tiny --batch-size 2 --steps 2 --warmup 1 --device cpu "
      "--threads 2");
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* s : {"resnet-tiny", "2 images", "synthetic-images 3 x 32 x 32, 10 classes",
                        "step time", "samples/s", "3 x forward FLOPs", "peak unknown"}) {
    EXPECT_TRUE(contains(r.output, s)) << "missing '" << s << "' in\n" << r.output;
  }
  EXPECT_FALSE(contains(r.output, "tokens/s")) << r.output;
}

// bf16/fp16 run on CUDA only: the CPU emulates 16 bits through its f32 kernels (slower than
// fp32), so the model benchmark refuses them there, naming --precision, before building anything.
TEST(BenchCli, MixedPrecisionIsRefusedOnTheCpu) {
  for (const char* p : {"bf16", "fp16"}) {
    const auto r = run_cli(std::string("bench --model gpt2 --size tiny --batch-size 2 --seq-len 32 "
                                       "--steps 1 --warmup 0 --device cpu --precision ") +
                           p);
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_TRUE(contains(r.output, std::string("--precision ") + p)) << r.output;
    EXPECT_TRUE(contains(r.output, "emulates 16-bit mixed precision")) << r.output;
    EXPECT_TRUE(contains(r.output, "--device cuda:N")) << r.output;
    EXPECT_FALSE(contains(r.output, "not implemented")) << r.output;
    EXPECT_FALSE(contains(r.output, "step time")) << r.output;
  }
  // The CPU op benchmark (no --model) runs fp32 only.
  const auto ops = run_cli("bench --precision bf16 --filter linear_fc1 --min-seconds 0.01");
  EXPECT_EQ(ops.status, 1) << ops.output;
  EXPECT_TRUE(contains(ops.output, "--precision bf16: the CPU op benchmark runs fp32 only"))
      << ops.output;
}

TEST(BenchCli, UnknownPrecisionIsAnError) {
  const auto r = run_cli(
      "bench --model gpt2 --size tiny --batch-size 2 --seq-len 16 --steps 1 --device cpu "
      "--precision fp8");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--precision fp8 is not one of fp32, tf32, bf16, fp16"))
      << r.output;
}

// The help says what bf16/fp16 do and that fp16 runs without loss scaling.
TEST(BenchCli, HelpDescribesMixedPrecision) {
  const auto r = run_cli("bench --help");
  EXPECT_EQ(r.status, 0) << r.output;
  for (const char* s : {"--precision", "bf16 or fp16", "f32 master weights", "without loss",
                        "throughput only", "the CPU runs fp32 only"}) {
    EXPECT_TRUE(contains(r.output, s)) << "missing '" << s << "' in\n" << r.output;
  }
  EXPECT_FALSE(contains(r.output, "not implemented")) << r.output;
}

TEST(BenchCli, ModelNeedsABatchSize) {
  const auto r = run_cli("bench --model gpt2 --size tiny --device cpu --steps 1");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--batch-size")) << r.output;
}

}  // namespace
