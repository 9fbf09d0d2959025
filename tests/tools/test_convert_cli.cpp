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

namespace {

struct Result {
  int status;
  std::string output;  // stdout and stderr together
};

Result run(const std::string& args) {
  const std::string cmd = std::string(STRATA_CLI_PATH) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  Result r{-1, ""};
  if (pipe == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) r.output.append(buf, n);
  const int raw = pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return r;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::string temp_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/strata_convert_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

TEST(ConvertCli, HelpListsTheCommandAndItsFlags) {
  Result r = run("--help");
  EXPECT_EQ(r.status, 0);
  EXPECT_TRUE(contains(r.output, "convert")) << r.output;
  EXPECT_TRUE(contains(r.output, "--init-weights")) << r.output;
  r = run("convert --help");
  EXPECT_EQ(r.status, 0);
  for (const char* flag : {"--model", "--size", "--model-spec", "--input-shape", "--num-classes",
                           "--seed", "--input", "--weights", "--input-format", "--ignore-extra",
                           "--output", "--format TEXT:{hf,strata}=hf"}) {
    EXPECT_TRUE(contains(r.output, flag)) << "no " << flag << " in\n" << r.output;
  }
  r = run("convert --model gpt2 --size tiny");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--output is required")) << r.output;
}

TEST(ConvertCli, WritesReadsAndRoundTripsBetweenNamings) {
  const std::string dir = temp_dir("round_trip");
  const std::string a = dir + "/a.safetensors", b = dir + "/b.safetensors";
  const std::string c = dir + "/c.safetensors", d = dir + "/d.safetensors";
  const std::string e = dir + "/e.safetensors";
  Result r = run("convert --model gpt2 --size tiny --seed 3 --output " + a);
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
  r = run("convert --input " + a + " --output " + b + " --format strata");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, a + " (hf names, 28 tensors read)")) << r.output;
  {
    const strata::io::SafetensorsReader file(b);
    EXPECT_NE(file.find("blocks.1.attn.c_attn.weight"), nullptr);
    EXPECT_EQ(file.find("transformer.h.1.attn.c_attn.weight"), nullptr);
  }
  r = run("convert --input " + b + " --output " + c);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(bytes_of(c), bytes_of(a));
  // --weights with the model's flags: the same file again.
  r = run("convert --model gpt2 --size tiny --weights " + a + " --output " + e);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(bytes_of(e), bytes_of(a));
  r = run("convert --model gpt2 --size tiny --seed 4 --output " + d);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(bytes_of(d), bytes_of(a));
}

TEST(ConvertCli, RejectsFilesThatDoNotFitNamingTheTensor) {
  const std::string dir = temp_dir("errors");
  const std::string a = dir + "/gpt2.safetensors";
  ASSERT_EQ(run("convert --model gpt2 --size tiny --output " + a).status, 0);
  Result r = run("convert --model bert --size tiny --input " + a + " --output " + dir + "/x");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "safetensors file " + a)) << r.output;
  EXPECT_TRUE(contains(r.output, "needs tensor 'bert.embeddings.word_embeddings.weight'"))
      << r.output;
  r = run("convert --model gpt2 --size tiny --num-classes 300 --input " + a + " --output " + dir +
          "/x");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "tensor 'transformer.wte.weight' has shape (256, 64)"))
      << r.output;
  // A truncated file: its header promises bytes that are not there.
  const std::string cut = dir + "/cut.safetensors";
  std::filesystem::copy_file(a, cut);
  std::filesystem::resize_file(cut, std::filesystem::file_size(a) - 100);
  r = run("convert --input " + cut + " --output " + dir + "/x");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, cut)) << r.output;
  EXPECT_TRUE(contains(r.output, "beyond the data buffer")) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/x"));
  // A directory (a training checkpoint) is not read yet.
  r = run("convert --input " + dir + " --output " + dir + "/x");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "is a directory")) << r.output;
  r = run("convert --output " + dir + "/x");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "needs a model: --model")) << r.output;
}

TEST(ConvertCli, TrainStartsFromAConvertedResNet) {
  const std::string dir = temp_dir("train");
  const std::string w = dir + "/resnet.safetensors";
  Result r =
      run("convert --model resnet --size tiny --input-shape 3,32,32 --num-classes 10 "
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
  r = run(train + "--init-weights " + w);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "initial weights")) << r.output;
  EXPECT_TRUE(contains(r.output, w)) << r.output;
  // Weights of another model stop the run before it starts, naming the tensor.
  const std::string gpt2 = dir + "/gpt2.safetensors";
  ASSERT_EQ(run("convert --model gpt2 --size tiny --output " + gpt2).status, 0);
  r = run(train + "--init-weights " + gpt2);
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "needs tensor 'conv1.weight'")) << r.output;
}

}  // namespace
