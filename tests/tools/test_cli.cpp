// The `strata` binary end to end: help, bad input of every kind, a short real training run
// whose metrics file is checked line by line, and `strata plan` on a crafted profile.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "io/bpe.h"
#include "io/idx.h"
#include "io/mnist.h"
#include "testing/cli.h"
#include "testing/image_files.h"

namespace {

using Result = strata::testing::CliResult;
using strata::testing::contains;
using strata::testing::run_cli;

std::string temp_dir(const std::string& name) {
  return strata::testing::fresh_temp_dir("strata_cli_" + name);
}

TEST(Cli, HelpListsEveryCommandAndFlagWithDefaults) {
  const Result r = run_cli("--help");
  EXPECT_EQ(r.status, 0) << r.output;
  for (const char* s : {"train", "profile", "plan", "bench", "--batch-size INT=64",
                        "--lr FLOAT=", "--mem-limit", "--metrics", "--log-every INT=100", "--seed",
                        "--device", "--threads", "--optimizer TEXT=adamw", "--weight-decay",
                        "--dataset", "--data-dir", "--epochs", "--steps"}) {
    EXPECT_TRUE(contains(r.output, s)) << "missing " << s << " in\n" << r.output;
  }
  EXPECT_EQ(run_cli("train --help").status, 0);
}

TEST(Cli, UnknownFlagListsTheValidOnes) {
  const Result r = run_cli("train --batchsize 3");
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.output, "--batchsize")) << r.output;
  EXPECT_TRUE(contains(r.output, "valid flags for strata train: --model")) << r.output;
}

TEST(Cli, UnknownModelAndDatasetListTheValidOnes) {
  Result r = run_cli("train --model alexnet --steps 1");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, "unknown model 'alexnet' (valid: cnn, mlp")) << r.output;
  r = run_cli("train --dataset imagenet --steps 1");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output,
                       "unknown dataset 'imagenet' (valid: fashion-mnist, mnist, cifar10, "
                       "image-folder, synthetic-images, tokens, brown, synthetic-tokens)"))
      << r.output;
}

TEST(Cli, MissingDatasetNamesThePackageAndTheFlag) {
  const Result r = run_cli("train --data-dir /nonexistent/fmnist --steps 1");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, "dataset-fashion-mnist")) << r.output;
  EXPECT_TRUE(contains(r.output, "--data-dir")) << r.output;
}

TEST(Cli, CorruptIdxNamesTheFileAndOffset) {
  const std::string dir = temp_dir("corrupt");
  // A label file cut short: the header promises 100 labels, the file holds 10.
  std::ofstream(dir + "/train-images-idx3-ubyte", std::ios::binary) << std::string(16, '\0');
  std::string labels("\x00\x00\x08\x01\x00\x00\x00\x64", 8);
  labels += std::string(10, '\x01');
  std::ofstream(dir + "/train-labels-idx1-ubyte", std::ios::binary) << labels;
  std::ofstream(dir + "/t10k-images-idx3-ubyte", std::ios::binary) << std::string(16, '\0');
  std::ofstream(dir + "/t10k-labels-idx1-ubyte", std::ios::binary) << labels;
  const Result r = run_cli("train --data-dir " + dir + " --steps 1");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, dir + "/train-")) << r.output;
  EXPECT_TRUE(contains(r.output, "offset")) << r.output;
}

TEST(Cli, MemoryLimitTooSmallIsAnOutOfMemoryError) {
  if (!std::filesystem::exists(strata::io::kFashionMnistDir)) GTEST_SKIP() << "no Fashion-MNIST";
  const Result r =
      run_cli("train --mem-limit 64KiB --steps 1 --train-samples 256 --test-samples 64");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, "out of memory on cpu")) << r.output;
  EXPECT_TRUE(contains(r.output, "limit 64.00 KiB")) << r.output;
  EXPECT_TRUE(contains(r.output, "peak")) << r.output;
}

// --comm and --device as `strata train --help` describes them.
TEST(Cli, HelpDescribesDevicesAndCommunicators) {
  const Result r = run_cli("train --help");
  EXPECT_EQ(r.status, 0) << r.output;
  for (const char* s : {"--comm TEXT:{auto,mpi,nccl}=auto", "host values over MPI",
                        "staged through pinned host memory", "cuda:(local rank % GPUs)",
                        "cuda:N every process on GPU N"}) {
    EXPECT_TRUE(contains(r.output, s)) << "missing " << s << " in\n" << r.output;
  }
}

// --comm nccl carries CUDA tensors: refused, naming the flag, for ranks on the CPU and for the
// threads of --local (before any data is read).
TEST(Cli, CommNcclOnCpuRanksIsRefusedByName) {
  Result r = run_cli("train --comm nccl --device cpu --steps 1");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--comm nccl")) << r.output;
  EXPECT_TRUE(contains(r.output, "CPU")) << r.output;
  r = run_cli("train --comm nccl --local --stages 2 --steps 1");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--comm nccl")) << r.output;
  r = run_cli("train --comm mpi --local --stages 2 --device cpu --steps 1");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--comm mpi")) << r.output;
  EXPECT_TRUE(contains(r.output, "--local")) << r.output;
  EXPECT_NE(run_cli("train --comm gloo --steps 1").status, 0);
}

TEST(Cli, BadValuesAreErrorsNotCrashes) {
  EXPECT_EQ(run_cli("train --device cuda:7 --steps 1").status, 1);
  EXPECT_TRUE(contains(run_cli("train --device cuda:7 --steps 1").output, "available: cpu"));
  EXPECT_EQ(run_cli("train --optimizer lion --steps 1 --train-samples 64 --test-samples 64").status,
            1);
  EXPECT_EQ(run_cli("train --mem-limit lots --steps 1").status, 1);
  // Mixed precision runs, and says how on the CPU; fp16 turns dynamic loss scaling on.
  const Result bf16 =
      run_cli("train --precision bf16 --steps 2 --train-samples 64 --test-samples 64");
  EXPECT_EQ(bf16.status, 0) << bf16.output;
  EXPECT_TRUE(contains(bf16.output, "bf16 mixed, emulated on cpu")) << bf16.output;
  EXPECT_TRUE(contains(bf16.output, "loss scale       off")) << bf16.output;
  const Result fp16 =
      run_cli("train --precision fp16 --steps 2 --train-samples 64 --test-samples 64");
  EXPECT_EQ(fp16.status, 0) << fp16.output;
  EXPECT_TRUE(contains(fp16.output, "loss scale       dynamic")) << fp16.output;
  // ... which the asynchronous schedule cannot have: the error says why and what to pass.
  const Result async_fp16 = run_cli(
      "train --precision fp16 --stages 2 --local --schedule async-1f1b --micro-batches 2 --steps 1 "
      "--train-samples 64 --test-samples 64");
  EXPECT_EQ(async_fp16.status, 1) << async_fp16.output;
  EXPECT_TRUE(contains(async_fp16.output, "--loss-scale off")) << async_fp16.output;
  EXPECT_NE(run_cli("train --precision fp64 --steps 1").status, 0);
  EXPECT_EQ(run_cli("train --batch-size 0 --steps 1 --train-samples 64 --test-samples 64").status,
            1);
}

// GPT-2 and BERT split into stages take --seq-len: the automatic partition once profiled them on
// samples of the flag's default length (128), longer than tiny's 64 positions, and refused.
TEST(Cli, TransformersOverStagesTakeTheSequenceLength) {
  if (!std::filesystem::exists(strata::io::gpt2_vocab_dir("") + "/encoder.json")) {
    GTEST_SKIP() << "GPT-2 vocabulary not installed (run tools/setup.sh)";
  }
  for (const char* model : {"gpt2", "bert"}) {
    const Result r = run_cli(std::string("train --model ") + model +
                             " --size tiny --dataset brown --seq-len 32 --stages 2 --local "
                             "--micro-batches 2 --batch-size 4 --steps 2 --train-samples 64 "
                             "--test-samples 8 --threads 2 --progress off");
    ASSERT_EQ(r.status, 0) << model << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "32 tokens per sample")) << r.output;
    EXPECT_TRUE(contains(r.output, "done: 2 steps")) << r.output;
  }
  // Samples longer than the model's positions: the error says which flag to change.
  const Result r = run_cli(
      "train --model gpt2 --size tiny --dataset brown --seq-len 128 --steps 1 --batch-size 2 "
      "--progress off");
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "gpt2 tiny has 64 positions; --seq-len 128 is longer "
                       "(use --seq-len 64 or less, or a larger --size)"))
      << r.output;
}

TEST(Cli, ShortTrainingRunWritesMetrics) {
  if (!std::filesystem::exists(strata::io::kFashionMnistDir)) GTEST_SKIP() << "no Fashion-MNIST";
  const std::string dir = temp_dir("metrics");
  const Result r = run_cli(
      "train --size tiny --steps 12 --log-every 4 --batch-size 32 "
      "--train-samples 1024 --test-samples 256 --metrics " +
      dir + "/m.jsonl --threads 1 --progress off");
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* s :
       {"dataset", "fashion-mnist/train", "parameters", "layout", "step 4/12 | epoch 1 | loss",
        "samples/s", "eval test | step 12", "accuracy", "done: 12 steps"}) {
    EXPECT_TRUE(contains(r.output, s)) << "missing '" << s << "' in\n" << r.output;
  }
  std::ifstream in(dir + "/m.jsonl");
  std::string line;
  int train = 0, eval = 0, stage = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j["type"] == "train") {
      ++train;
      for (const char* k : {"step", "epoch", "loss", "lr", "samples_per_s"}) {
        EXPECT_TRUE(j.contains(k)) << k << " missing in " << line;
      }
    } else if (j["type"] == "stage") {
      ++stage;
      for (const char* k : {"rank", "stage", "busy_s", "peak_bytes", "swapped_bytes", "recompute_s",
                            "max_micro_batches"}) {
        EXPECT_TRUE(j.contains(k)) << k << " missing in " << line;
      }
      EXPECT_GT(j["peak_bytes"].get<double>(), 0.0);
    } else {
      ++eval;
      for (const char* k : {"split", "step", "loss", "accuracy"}) {
        EXPECT_TRUE(j.contains(k)) << k << " missing in " << line;
      }
    }
  }
  EXPECT_EQ(train, 3);
  EXPECT_EQ(eval, 1);
  EXPECT_EQ(stage, 1);  // one rank
}

TEST(Cli, TrainsOnTinyCifar10Files) {
  const std::string dir = temp_dir("cifar");
  strata::testing::write_cifar_dir(dir, 8, 8);
  const Result r = run_cli("train --model cnn --size tiny --dataset cifar10 --data-dir " + dir +
                           " --steps 5 --batch-size 8 --threads 1 --progress off");
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* s : {"cifar10/train (40) / cifar10/test (8)", "(3, 32, 32) f32, 10 classes",
                        "random crop 32 (padding 4) + horizontal flip", "done: 5 steps"}) {
    EXPECT_TRUE(contains(r.output, s)) << "missing '" << s << "' in\n" << r.output;
  }
  EXPECT_FALSE(contains(r.output, "skipped")) << r.output;
  const Result plain = run_cli("train --dataset cifar10 --data-dir " + dir +
                               " --size tiny --steps 1 --batch-size 8 --no-augment --progress off");
  ASSERT_EQ(plain.status, 0) << plain.output;
  EXPECT_TRUE(contains(plain.output, "augmentation     none")) << plain.output;

  Result e = run_cli("train --dataset cifar10 --data-dir " + dir + " --image-size 64 --steps 1");
  EXPECT_EQ(e.status, 1);
  EXPECT_TRUE(contains(e.output, "--image-size 64 applies to image-folder and synthetic-images"))
      << e.output;
  e = run_cli("train --dataset cifar10 --data-dir " + dir + " --skip-bad-samples --steps 1");
  EXPECT_EQ(e.status, 1);
  EXPECT_TRUE(contains(e.output, "--skip-bad-samples applies to image-folder only")) << e.output;
  std::filesystem::resize_file(dir + "/data_batch_3.bin", 1000);
  e = run_cli("train --dataset cifar10 --data-dir " + dir + " --steps 1");
  EXPECT_EQ(e.status, 1);
  EXPECT_TRUE(contains(e.output, dir + "/data_batch_3.bin: expected a whole number")) << e.output;
  e = run_cli("train --dataset cifar10 --data-dir " + dir + "/missing --steps 1");
  EXPECT_EQ(e.status, 1);
  EXPECT_TRUE(contains(e.output, "--data-dir")) << e.output;
}

TEST(Cli, TrainsOnAnImageFolderAndReportsSkippedFiles) {
  const std::string dir = temp_dir("folder");
  int seed = 0;
  for (const std::string split : {"train", "val"}) {
    for (const std::string cls : {"ant", "bee", "cat"}) {
      std::filesystem::create_directories(dir + "/" + split + "/" + cls);
      for (int i = 0; i < 3; ++i, ++seed) {
        const std::vector<uint8_t> rgb = strata::testing::test_rgb_image(40, 30, seed);
        const std::string stem = dir + "/" + split + "/" + cls + "/" + std::to_string(i);
        strata::testing::write_bytes(stem + ".jpg", strata::testing::encode_jpeg(40, 30, rgb));
        strata::testing::write_bytes(stem + "b.png", strata::testing::encode_png(40, 30, 3, rgb));
      }
    }
  }
  // One truncated JPEG in the training split.
  std::vector<uint8_t> jpg = strata::testing::read_bytes(dir + "/train/bee/1.jpg");
  jpg.resize(jpg.size() / 3);
  strata::testing::write_bytes(dir + "/train/bee/1.jpg", jpg);

  Result r = run_cli("train --model cnn --size tiny --dataset image-folder --data-dir " + dir +
                     " --image-size 16 --steps 5 --batch-size 4 --threads 1 --progress off");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, dir + "/train/bee/1.jpg: cannot decode JPEG")) << r.output;
  EXPECT_TRUE(contains(r.output, "--skip-bad-samples")) << r.output;

  // 18 training images in batches of 4: 5 steps read every one of them.
  r = run_cli("train --model cnn --size tiny --dataset image-folder --data-dir " + dir +
              " --image-size 16 --steps 5 --batch-size 4 --threads 1 --progress off "
              "--skip-bad-samples");
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* s :
       {"image-folder/train (18) / image-folder/test (18)", "(3, 16, 16) f32, 3 classes",
        "random resized crop 16 + horizontal flip", "skipping unreadable sample", "done: 5 steps",
        "skipped 1 unreadable samples (train 1, test 0)"}) {
    EXPECT_TRUE(contains(r.output, s)) << "missing '" << s << "' in\n" << r.output;
  }
}

TEST(Cli, TrainsOnSyntheticImagesOfAnyShape) {
  const Result r = run_cli(
      "train --model cnn --size tiny --dataset synthetic-images --image-size 12 "
      "--synthetic-channels 2 --synthetic-classes 5 --steps 3 --batch-size 8 --train-samples 64 "
      "--test-samples 16 --threads 1 --progress off");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "(2, 12, 12) f32, 5 classes")) << r.output;
  EXPECT_TRUE(contains(r.output, "done: 3 steps")) << r.output;
  const Result e = run_cli("train --synthetic-classes 5 --steps 1");
  EXPECT_EQ(e.status, 1);
  EXPECT_TRUE(contains(e.output,
                       "--synthetic-channels and --synthetic-classes apply to "
                       "synthetic-images only"))
      << e.output;
}

// strata sleeps idle OpenMP threads (OMP_WAIT_POLICY=passive, which libgomp reads when it loads:
// strata re-executes itself with it), unless the user chose a wait policy or a spin count.
TEST(Cli, IdleOpenMpThreadsSleepUnlessTheUserChoseOtherwise) {
  auto run_with = [](const std::string& env) {
    const std::string cmd = "env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u STRATA_CPU_RUNTIME " +
                            env + " " + STRATA_CLI_PATH +
                            " train --model mlp --size tiny --dataset synthetic-images "
                            "--image-size 4 --steps 1 --batch-size 8 --train-samples 16 "
                            "--test-samples 8 --threads 1 --progress off 2>&1";
    FILE* pipe = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    for (size_t n; pipe != nullptr && (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) {
      out.append(buf, n);
    }
    const int status = pipe != nullptr ? pclose(pipe) : -1;
    EXPECT_EQ(status, 0) << out;
    return out;
  };
  std::string out = run_with("");
  EXPECT_TRUE(contains(out, "OMP_WAIT_POLICY=passive (set by strata)")) << out;
  out = run_with("OMP_WAIT_POLICY=active");
  EXPECT_TRUE(contains(out, "OMP_WAIT_POLICY=active")) << out;
  EXPECT_FALSE(contains(out, "set by strata")) << out;
  out = run_with("GOMP_SPINCOUNT=1000");
  EXPECT_TRUE(contains(out, "GOMP_SPINCOUNT=1000")) << out;
  out = run_with("STRATA_CPU_RUNTIME=keep");
  EXPECT_TRUE(contains(out, "idle OpenMP threads spin (OMP_WAIT_POLICY unset)")) << out;
}

TEST(Cli, ProfileAndBenchRun) {
  if (std::filesystem::exists(strata::io::kFashionMnistDir)) {
    const std::string dir = temp_dir("profile");
    const Result p =
        run_cli("profile --size tiny --steps 2 --batch-size 16 --output " + dir + "/p.json");
    EXPECT_EQ(p.status, 0) << p.output;
    EXPECT_TRUE(contains(p.output, "conv1")) << p.output;
    EXPECT_TRUE(std::filesystem::exists(dir + "/p.json"));
  }
  const Result b = run_cli("bench --filter linear_fc1 --min-seconds 0.01");
  EXPECT_EQ(b.status, 0) << b.output;
  EXPECT_TRUE(contains(b.output, "linear_fc1_fwd")) << b.output;
}

// A profile of cnn's twelve layers: conv1 costs 10 ms per sample, every other layer 1 ms, and no
// layer sends anything. Two stages balance at 11 ms either as {conv1 | the rest} or as
// {conv1 bn1 | the rest}; the documented tie-break moves layers to the later stage.
std::string write_cnn_profile(const std::string& dir, size_t layers) {
  const char* names[] = {"conv1", "bn1",   "relu1",   "pool1", "conv2", "bn2",
                         "relu2", "pool2", "flatten", "fc1",   "relu3", "fc2"};
  nlohmann::json list = nlohmann::json::array();
  for (size_t i = 0; i < layers; ++i) {
    list.push_back({{"name", names[i]},
                    {"forward_ms_per_sample", i == 0 ? 10.0 : 1.0},
                    {"backward_ms_per_sample", 0.0},
                    {"output_bytes_per_sample", 0.0},
                    {"activation_bytes_per_sample", 1024.0},
                    {"param_bytes", 4096.0}});
  }
  const std::string path = dir + "/profile" + std::to_string(layers) + ".json";
  std::ofstream(path) << nlohmann::json{{"layers", list}}.dump(2);
  return path;
}

TEST(Cli, PlanFromAProfileFile) {
  if (!std::filesystem::exists(strata::io::kFashionMnistDir)) GTEST_SKIP() << "no Fashion-MNIST";
  const std::string dir = temp_dir("plan");
  const std::string profile = write_cnn_profile(dir, 12);
  const std::string base = "plan --size tiny --micro-batches 4 --batch-size 8 --profile " + profile;
  Result r = run_cli(base + " --stages 2 --partition 0-3,4-11");
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* s :
       {"plan for cnn-tiny on fashion-mnist/train: 2 stages, 1f1b, batch 8 = 4 micro-batches of 2",
        "given partition: --partition conv1-pool1,conv2-fc2",
        "balanced partition (--partitioner dp: slowest stage minimized): --partition conv1,bn1-fc2",
        "projection partition (--partitioner projection: GroPipe AMPA",
        "uniform partition (by layer count): --partition conv1-bn2,relu2-fc2", "  stage 0: conv1\n",
        "  stage 1: bn1 relu1 pool1 conv2 bn2 relu2 pool2 flatten fc1 relu3 "
        "fc2\n",
        "slowest stage: 1, 22.000 ms per micro-batch", "predicted step time",
        "balanced vs uniform"}) {
    EXPECT_TRUE(contains(r.output, s)) << "missing '" << s << "' in\n" << r.output;
  }
  // Memory: 1 KiB of activations per sample and 4 KiB of parameters per layer.
  r = run_cli(base + " --stages 2 --mem-limit 1KiB");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "fits the memory limit of 1.00 KiB per stage")) << r.output;
  r = run_cli("plan --size tiny --profile " + write_cnn_profile(dir, 3));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "the profile has 3 layers, the model 12")) << r.output;
  r = run_cli(base + " --stages 2 --partition 0-3,5-11");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--partition range '5-11' leaves a gap")) << r.output;
  r = run_cli(base + " --stages 13");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "has only 12 layers")) << r.output;
  r = run_cli("plan --batch-size 10 --micro-batches 4");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "--batch-size 10 must be a positive multiple")) << r.output;
  r = run_cli("plan --schedule zero-bubble");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "unknown schedule 'zero-bubble'")) << r.output;
}

TEST(Cli, PlanProfilesOnTheSpot) {
  if (!std::filesystem::exists(strata::io::kFashionMnistDir)) GTEST_SKIP() << "no Fashion-MNIST";
  const Result r = run_cli(
      "plan --size tiny --stages 3 --micro-batches 2 --batch-size 8 --schedule gpipe "
      "--profile-steps 1 --threads 1");
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* s : {"costs: measured now: 1 steps of 4 samples", "balanced partition",
                        "uniform partition", "  stage 2:", "bubble"}) {
    EXPECT_TRUE(contains(r.output, s)) << "missing '" << s << "' in\n" << r.output;
  }
}

}  // namespace
