// `strata convert` and `strata train --init-weights` end to end: files written from a seed, read
// back and rewritten under the other naming and back to the same bytes; files that do not fit the
// model rejected naming the file and the tensor; a training run started from a converted file.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "io/safetensors.h"
#include "testing/cli.h"

namespace {

using Result = strata::testing::CliResult;
using strata::testing::contains;
using strata::testing::run_cli;

std::string temp_dir(const std::string& name) {
  return strata::testing::fresh_temp_dir("strata_convert_" + name);
}

std::string bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

TEST(ConvertCli, HelpListsTheCommandAndItsFlags) {
  Result r = run_cli("--help");
  EXPECT_EQ(r.status, 0);
  EXPECT_TRUE(contains(r.output, "convert")) << r.output;
  EXPECT_TRUE(contains(r.output, "--init-weights")) << r.output;
  r = run_cli("convert --help");
  EXPECT_EQ(r.status, 0);
  for (const char* flag :
       {"--model", "--size", "--model-spec", "--input-shape", "--num-classes", "--seed", "--input",
        "--weights", "--input-format", "--ignore-extra", "--output", "--format TEXT:{hf,strata}=hf",
        "--output-checkpoint", "--optimizer", "--momentum", "--checkpoint-dir"}) {
    EXPECT_TRUE(contains(r.output, flag)) << "no " << flag << " in\n" << r.output;
  }
  r = run_cli("convert --model gpt2 --size tiny");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "needs --output (a safetensors file) or --output-checkpoint"))
      << r.output;
}

TEST(ConvertCli, WritesReadsAndRoundTripsBetweenNamings) {
  const std::string dir = temp_dir("round_trip");
  const std::string a = dir + "/a.safetensors", b = dir + "/b.safetensors";
  const std::string c = dir + "/c.safetensors", d = dir + "/d.safetensors";
  const std::string e = dir + "/e.safetensors";
  Result r = run_cli("convert --model gpt2 --size tiny --seed 3 --output " + a);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "gpt2-tiny")) << r.output;
  EXPECT_TRUE(contains(r.output, "initialization, seed 3")) << r.output;
  EXPECT_TRUE(contains(r.output, a + " (hf names, 28 tensors")) << r.output;
  {
    const strata::io::SafetensorsReader file(a);
    EXPECT_NE(file.find("transformer.h.1.attn.c_attn.weight"), nullptr);
    EXPECT_EQ(file.metadata().at("strata.naming"), "hf");
    EXPECT_TRUE(contains(file.metadata().at("strata.model_spec"), "gpt2-tiny"));
  }
  // The model comes from the input's metadata; the names change, the values do not.
  r = run_cli("convert --input " + a + " --output " + b + " --format strata");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, a + " (hf names, 28 tensors read)")) << r.output;
  {
    const strata::io::SafetensorsReader file(b);
    EXPECT_NE(file.find("blocks.1.attn.c_attn.weight"), nullptr);
    EXPECT_EQ(file.find("transformer.h.1.attn.c_attn.weight"), nullptr);
  }
  r = run_cli("convert --input " + b + " --output " + c);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(bytes_of(c), bytes_of(a));
  // --weights with the model's flags: the same file again.
  r = run_cli("convert --model gpt2 --size tiny --weights " + a + " --output " + e);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(bytes_of(e), bytes_of(a));
  r = run_cli("convert --model gpt2 --size tiny --seed 4 --output " + d);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(bytes_of(d), bytes_of(a));
}

TEST(ConvertCli, RejectsFilesThatDoNotFitNamingTheTensor) {
  const std::string dir = temp_dir("errors");
  const std::string a = dir + "/gpt2.safetensors";
  ASSERT_EQ(run_cli("convert --model gpt2 --size tiny --output " + a).status, 0);
  Result r = run_cli("convert --model bert --size tiny --input " + a + " --output " + dir + "/x");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "safetensors file " + a)) << r.output;
  EXPECT_TRUE(contains(r.output, "needs tensor 'bert.embeddings.word_embeddings.weight'"))
      << r.output;
  r = run_cli("convert --model gpt2 --size tiny --num-classes 300 --input " + a + " --output " +
              dir + "/x");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "tensor 'transformer.wte.weight' has shape (256, 64)"))
      << r.output;
  // A truncated file: its header promises bytes that are not there.
  const std::string cut = dir + "/cut.safetensors";
  std::filesystem::copy_file(a, cut);
  std::filesystem::resize_file(cut, std::filesystem::file_size(a) - 100);
  r = run_cli("convert --input " + cut + " --output " + dir + "/x");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, cut)) << r.output;
  EXPECT_TRUE(contains(r.output, "beyond the data buffer")) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/x"));
  // A directory without a checkpoint.
  r = run_cli("convert --input " + dir + " --output " + dir + "/x");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, dir + " is a directory without a complete checkpoint"))
      << r.output;
  r = run_cli("convert --output " + dir + "/x");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "needs a model: --model")) << r.output;
}

TEST(ConvertCli, TrainStartsFromAConvertedResNet) {
  const std::string dir = temp_dir("train");
  const std::string w = dir + "/resnet.safetensors";
  Result r = run_cli(
      "convert --model resnet --size tiny --input-shape 3,32,32 --num-classes 10 "
      "--seed 5 --output " +
      w);
  ASSERT_EQ(r.status, 0) << r.output;
  {
    const strata::io::SafetensorsReader file(w);
    EXPECT_NE(file.find("layer2.0.downsample.1.running_var"), nullptr);
    EXPECT_EQ(file.find("layer1.0.bn1.num_batches_tracked")->dtype, "I64");
  }
  const std::string train =
      "train --model resnet --size tiny --dataset synthetic-images --steps 1 --batch-size 8 "
      "--train-samples 16 --test-samples 8 --workers 0 --device cpu --threads 1 --progress off ";
  r = run_cli(train + "--init-weights " + w);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "initial weights")) << r.output;
  EXPECT_TRUE(contains(r.output, w)) << r.output;
  // Weights of another model stop the run before it starts, naming the tensor.
  const std::string gpt2 = dir + "/gpt2.safetensors";
  ASSERT_EQ(run_cli("convert --model gpt2 --size tiny --output " + gpt2).status, 0);
  r = run_cli(train + "--init-weights " + gpt2);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "needs tensor 'conv1.weight'")) << r.output;
}

// Training checkpoints: tiny MLP runs on synthetic images (as in test_checkpoint_cli.cpp).
const std::string kTrain =
    "train --model mlp --size tiny --dataset synthetic-images --image-size 8 --train-samples 512"
    " --test-samples 64 --batch-size 16 --threads 1 --workers 0 --seed 5 --progress off ";

// The loss of the last "eval test | step N | ... | loss X |" line ("" when none).
std::string last_test_loss(const std::string& output) {
  const size_t line = output.rfind("eval test");
  if (line == std::string::npos) return "";
  const size_t at = output.find("| loss ", line);
  if (at == std::string::npos) return "";
  return output.substr(at + 7, output.find(' ', at + 7) - (at + 7));
}

TEST(ConvertCli, CheckpointToSafetensorsAndBackRoundTrips) {
  const std::string dir = temp_dir("checkpoint");
  const std::string ck = dir + "/ck", ck2 = dir + "/ck2";
  const std::string a = dir + "/a.safetensors", b = dir + "/b.safetensors";
  const std::string c = dir + "/c.safetensors";
  Result r = run_cli(kTrain + "--steps 2 --checkpoint-dir " + ck);
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_TRUE(std::filesystem::exists(ck + "/step-000002/manifest.pb")) << r.output;
  // A --checkpoint-dir root: its newest checkpoint; the model comes from the manifest.
  r = run_cli("convert --weights " + ck + " --output " + a);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "checkpoint " + ck + "/step-000002 (step 2")) << r.output;
  // The step directory itself: the same bytes.
  r = run_cli("convert --weights " + ck + "/step-000002 --output " + b);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(bytes_of(b), bytes_of(a));
  // Back into a checkpoint of step 0, and out again: the same tensors, byte for byte.
  r = run_cli("convert --input " + a + " --output-checkpoint " + ck2);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(ck2 + "/step-000000/manifest.pb")) << r.output;
  EXPECT_TRUE(contains(r.output, "--resume auto --optimizer adamw")) << r.output;
  r = run_cli("convert --input " + ck2 + " --output " + c);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(bytes_of(c), bytes_of(a));
  // An existing checkpoint root is not overwritten.
  r = run_cli("convert --input " + a + " --output-checkpoint " + ck2);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, ck2 + " exists and is not an empty directory")) << r.output;
}

TEST(ConvertCli, ConvertedCheckpointEvaluatesLikeResuming) {
  const std::string dir = temp_dir("checkpoint_eval");
  const std::string ck = dir + "/ck", ck2 = dir + "/ck2", w = dir + "/w.safetensors";
  Result r = run_cli(kTrain + "--steps 3 --checkpoint-dir " + ck);
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_EQ(run_cli("convert --weights " + ck + " --output " + w).status, 0);
  ASSERT_EQ(run_cli("convert --input " + w + " --output-checkpoint " + ck2).status, 0);
  // --lr 0: the one step taken leaves the weights as loaded, so the evaluation after it measures
  // them (an MLP: no running statistics that a training step would move).
  const std::string eval = kTrain + "--lr 0 --eval-every 1 ";
  r = run_cli(eval + "--steps 4 --resume " + ck + "/step-000003");
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string resumed = last_test_loss(r.output);
  ASSERT_FALSE(resumed.empty()) << r.output;
  r = run_cli(eval + "--steps 1");  // the seed's initialization: another loss
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(last_test_loss(r.output), resumed) << r.output;
  r = run_cli(eval + "--steps 1 --init-weights " + w);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(last_test_loss(r.output), resumed) << r.output;
  // The converted checkpoint of step 0 resumes (same --optimizer, adamw by default).
  r = run_cli(eval + "--steps 1 --checkpoint-dir " + ck2 + " --resume auto");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(last_test_loss(r.output), resumed) << r.output;
  EXPECT_FALSE(contains(r.output, "no complete checkpoint")) << r.output;
  // A run with another optimizer is refused, as for any checkpoint.
  r = run_cli(eval + "--steps 1 --optimizer sgd --resume " + ck2);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "resume with the same --optimizer")) << r.output;
}

TEST(ConvertCli, MissingOrCorruptCheckpointNamesThePath) {
  const std::string dir = temp_dir("checkpoint_errors");
  const std::string ck = dir + "/ck", empty = dir + "/empty";
  std::filesystem::create_directories(empty);
  Result r = run_cli("convert --weights " + empty + " --output " + dir + "/x");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, empty + " is a directory without a complete checkpoint"))
      << r.output;
  ASSERT_EQ(run_cli(kTrain + "--steps 1 --checkpoint-dir " + ck).status, 0);
  const std::string step = ck + "/step-000001";
  // A truncated layer file.
  std::string file;
  for (const auto& e : std::filesystem::directory_iterator(step + "/tensors")) {
    file = e.path().string();
    break;
  }
  ASSERT_FALSE(file.empty());
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 8);
  r = run_cli("convert --weights " + step + " --output " + dir + "/x");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, step)) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/x"));
  // A root whose only checkpoint is incomplete holds none.
  r = run_cli("convert --weights " + ck + " --output " + dir + "/x");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, ck + " is a directory without a complete checkpoint")) << r.output;
}

}  // namespace
