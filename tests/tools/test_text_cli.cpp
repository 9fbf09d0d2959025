// The text subcommands of the `strata` binary: tokenize (both ways), prepare-text on files and
// on the Brown corpus, and training on the shards it writes.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "io/bpe.h"
#include "io/brown.h"
#include "io/text_datasets.h"
#include "io/token_shard.h"
#include "testing/cli.h"

namespace strata::io {
namespace {

using Result = strata::testing::CliResult;
using strata::testing::contains;
using strata::testing::run_cli;

// The first number after `label` in `text` (NaN when there is none).
double number_after(const std::string& text, const std::string& label) {
  const size_t at = text.find(label);
  if (at == std::string::npos) return std::nan("");
  const size_t digit = text.find_first_of("0123456789", at + label.size());
  if (digit == std::string::npos) return std::nan("");
  return std::stod(text.substr(digit));
}

std::string temp_dir(const std::string& name) {
  return strata::testing::fresh_temp_dir("strata_text_cli_" + name);
}

const BpeTokenizer* tokenizer() {
  static const std::unique_ptr<BpeTokenizer> kTokenizer = []() -> std::unique_ptr<BpeTokenizer> {
    const std::string dir = gpt2_vocab_dir("");
    if (!std::filesystem::exists(dir + "/encoder.json")) return nullptr;
    return std::make_unique<BpeTokenizer>(dir);
  }();
  return kTokenizer.get();
}

#define REQUIRE_VOCAB()                                                        \
  const BpeTokenizer* bpe = tokenizer();                                       \
  if (bpe == nullptr) {                                                        \
    GTEST_SKIP() << "GPT-2 vocabulary not installed in " << gpt2_vocab_dir("") \
                 << " (run tools/setup.sh)";                                   \
  }

std::vector<int32_t> shard_tokens(const std::vector<std::string>& paths) {
  std::vector<int32_t> all;
  for (const std::string& p : paths) {
    for (uint16_t t : read_token_shard(p)) all.push_back(t);
  }
  return all;
}

TEST(TextCli, HelpListsTheTextCommandsAndFlags) {
  const Result r = run_cli("--help");
  EXPECT_EQ(r.status, 0) << r.output;
  for (const char* s : {"prepare-text", "tokenize", "--input", "--output-dir",
                        "--val-fraction FLOAT=0.1", "--vocab-dir", "--shard-tokens",
                        "--seq-len INT=128", "--text-task TEXT:{auto,lm,mlm}=auto", "--decode"}) {
    EXPECT_TRUE(contains(r.output, s)) << "missing " << s;
  }
}

TEST(TextCli, TokenizeAndDecodeBack) {
  REQUIRE_VOCAB();
  const std::string dir = temp_dir("tokenize");
  const std::string text = "Hello world! It's 2024.\n\tTabs,  spaces  and caf\xC3\xA9.\n";
  std::ofstream(dir + "/in.txt", std::ios::binary) << text;
  const Result r = run_cli("tokenize < " + dir + "/in.txt");
  ASSERT_EQ(r.status, 0) << r.output;
  std::string expected;
  for (int32_t id : bpe->encode(text))
    expected += (expected.empty() ? "" : " ") + std::to_string(id);
  EXPECT_EQ(r.output, expected + "\n");
  std::ofstream(dir + "/ids.txt") << r.output;
  const Result back = run_cli("tokenize --decode < " + dir + "/ids.txt");
  ASSERT_EQ(back.status, 0) << back.output;
  EXPECT_EQ(back.output, text);
  std::ofstream(dir + "/bad.txt") << "15496 hello";
  const Result bad = run_cli("tokenize --decode < " + dir + "/bad.txt");
  EXPECT_EQ(bad.status, 1);
  EXPECT_TRUE(contains(bad.output, "found 'hello' (id 2)")) << bad.output;
}

TEST(TextCli, MissingVocabularyNamesPathAndSetup) {
  const Result r = run_cli("tokenize --vocab-dir /nonexistent/vocab < /dev/null");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, "/nonexistent/vocab/encoder.json")) << r.output;
  EXPECT_TRUE(contains(r.output, "tools/setup.sh")) << r.output;
}

TEST(TextCli, PrepareTextWritesShardsOfTheSplitDocuments) {
  REQUIRE_VOCAB();
  const std::string dir = temp_dir("prepare");
  std::vector<std::string> docs{"The first document.\n", "A second one, for validation.\n",
                                "Third: train again, with more words than the others.\n",
                                "Fourth, validation."};
  std::string inputs;
  for (size_t i = 0; i < docs.size(); ++i) {
    const std::string path = dir + "/doc" + std::to_string(i) + ".txt";
    std::ofstream(path, std::ios::binary) << docs[i];
    inputs += " " + path;
  }
  const std::string out = dir + "/shards";
  const Result r = run_cli("prepare-text --input" + inputs + " --output-dir " + out +
                           " --val-fraction 0.5 --shard-tokens 10");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "4 documents from 4 files")) << r.output;
  // Documents 1 and 3 are validation (f = 0.5); each starts with <|endoftext|>.
  std::vector<int32_t> train, val;
  for (size_t d = 0; d < docs.size(); ++d) {
    std::vector<int32_t>& split = d % 2 == 1 ? val : train;
    split.push_back(kGpt2EndOfText);
    bpe->encode_append(docs[d], &split);
  }
  const std::vector<std::string> train_files = find_token_shards(out, "train");
  const std::vector<std::string> val_files = find_token_shards(out, "val");
  EXPECT_EQ(train_files.size(), (train.size() + 9) / 10);
  EXPECT_EQ(val_files.size(), (val.size() + 9) / 10);
  EXPECT_EQ(shard_tokens(train_files), train);
  EXPECT_EQ(shard_tokens(val_files), val);
  EXPECT_EQ(train_files.front(), out + "/train_000000.bin");
  // A second run into the same directory refuses to mix with the shards there.
  const Result again = run_cli("prepare-text --input" + inputs + " --output-dir " + out);
  EXPECT_EQ(again.status, 1);
  EXPECT_TRUE(contains(again.output, "already holds token shards")) << again.output;
  const Result missing =
      run_cli("prepare-text --input " + dir + "/nope.txt --output-dir " + dir + "/other");
  EXPECT_EQ(missing.status, 1);
  EXPECT_TRUE(contains(missing.output, "cannot open --input '" + dir + "/nope.txt'"))
      << missing.output;
}

TEST(TextCli, TokensDatasetErrorsNameTheFix) {
  Result r = run_cli("train --dataset tokens --model gpt2 --steps 1");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, "--data-dir")) << r.output;
  EXPECT_TRUE(contains(r.output, "prepare-text")) << r.output;
  const std::string dir = temp_dir("train_only");
  write_token_shard(dir + "/train_000000.bin", std::vector<int32_t>(1000, 7));
  r = run_cli("train --dataset tokens --data-dir " + dir + " --model gpt2 --steps 1");
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.output, "no val shards in '" + dir + "'")) << r.output;
  EXPECT_TRUE(contains(r.output, "--val-fraction")) << r.output;
}

TEST(TextCli, PrepareTheBrownCorpusThenTrainGpt2OnIt) {
  REQUIRE_VOCAB();
  if (!std::filesystem::exists(brown_corpus_dir("") + "/cats.txt")) {
    GTEST_SKIP() << "Brown corpus not installed (run tools/setup.sh)";
  }
  const std::string dir = temp_dir("brown");
  const Result p = run_cli("prepare-text --output-dir " + dir);
  ASSERT_EQ(p.status, 0) << p.output;
  EXPECT_TRUE(contains(p.output, "500 documents from the Brown corpus")) << p.output;
  EXPECT_TRUE(contains(p.output, "450 documents")) << p.output;
  EXPECT_TRUE(contains(p.output, "50 documents")) << p.output;
  const std::vector<int32_t> train = shard_tokens(find_token_shards(dir, "train"));
  const std::vector<int32_t> val = shard_tokens(find_token_shards(dir, "val"));
  // The shards decode to the corpus's documents, each after <|endoftext|>.
  const std::vector<BrownDocument> docs = read_brown_corpus(brown_corpus_dir(""));
  std::string train_text, val_text;
  for (size_t d = 0; d < docs.size(); ++d) {
    (is_validation_document(static_cast<int64_t>(d), 0.1) ? val_text : train_text) +=
        "<|endoftext|>" + docs[d].text;
  }
  EXPECT_TRUE(bpe->decode(train) == train_text);
  EXPECT_TRUE(bpe->decode(val) == val_text);

  // The unigram entropy prepare-text reports is the loss of a model that ignores context.
  const double unigram = number_after(p.output, "unigram entropy");
  EXPECT_GT(unigram, 5.0) << p.output;
  EXPECT_LT(unigram, 9.0) << p.output;

  // A few steps of the tiny GPT-2 on the shards (learning below the unigram entropy takes a
  // longer run than a unit test).
  const Result t = run_cli("train --model gpt2 --size tiny --dataset tokens --data-dir " + dir +
                           " --seq-len 32 --steps 3 --batch-size 4 --train-samples 64 "
                           "--test-samples 16 --threads 1 --progress off");
  ASSERT_EQ(t.status, 0) << t.output;
  for (const char* s :
       {"tokens/train", "tokens/val", "lm, 32 tokens per sample", "done: 3 steps"}) {
    EXPECT_TRUE(contains(t.output, s)) << "missing '" << s << "' in\n" << t.output;
  }
}

}  // namespace
}  // namespace strata::io
