// Text datasets: language-model windows over shards, BERT masking statistics and determinism,
// synthetic tokens, the document split, the catalog entries, and a small model trained through
// the Trainer on an LM dataset (the text path end to end, without the GPT-2 model family).
#include "io/text_datasets.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "engine/check.h"
#include "graph/layers.h"
#include "graph/model.h"
#include "graph/model_spec.h"
#include "graph/param_store.h"
#include "io/data_loader.h"
#include "io/datasets.h"
#include "io/token_shard.h"
#include "ops/embedding.h"
#include "parallel/trainer.h"

namespace strata::io {
namespace {

std::string temp_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/strata_text_" + name;
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::vector<int32_t> iota(int32_t first, int32_t count) {
  std::vector<int32_t> v(static_cast<size_t>(count));
  for (int32_t i = 0; i < count; ++i) v[static_cast<size_t>(i)] = first + i;
  return v;
}

struct Sample {
  std::vector<int32_t> input;
  std::vector<int64_t> target;
};

Sample sample_of(const Dataset& d, int64_t i) {
  Sample s;
  s.input.resize(static_cast<size_t>(shape_numel(d.input_spec().shape)));
  s.target.resize(static_cast<size_t>(shape_numel(d.target_spec().shape)));
  d.get(i, s.input.data(), s.target.data());
  return s;
}

TEST(LanguageModelDataset, WindowsOfEachShard) {
  const std::string dir = temp_dir("lm");
  write_token_shard(dir + "/train_000000.bin", iota(0, 100));
  write_token_shard(dir + "/train_000001.bin", iota(1000, 50));
  write_token_shard(dir + "/train_000002.bin", iota(2000, 8));  // T tokens: no window (needs T+1)
  const LanguageModelDataset d(open_token_shard_dir("tokens/train", dir, "train"), 8);
  EXPECT_EQ(d.name(), "tokens/train");
  EXPECT_EQ(d.size(), 99 / 8 + 49 / 8);
  EXPECT_EQ(d.input_spec().shape, Shape{8});
  EXPECT_EQ(d.input_spec().dtype, DType::kI32);
  EXPECT_EQ(d.target_spec().shape, Shape{8});
  EXPECT_EQ(d.target_spec().dtype, DType::kI64);
  EXPECT_EQ(d.num_classes(), kGpt2VocabSize);
  for (int64_t i = 0; i < d.size(); ++i) {
    const Sample s = sample_of(d, i);
    const int32_t first =
        i < 12 ? static_cast<int32_t>(8 * i) : 1000 + static_cast<int32_t>(8 * (i - 12));
    for (int t = 0; t < 8; ++t) {
      EXPECT_EQ(s.input[t], first + t) << "sample " << i;
      EXPECT_EQ(s.target[t], first + t + 1) << "sample " << i;
    }
  }
  EXPECT_TRUE(has(error_of([&] { sample_of(d, d.size()); }), "sample 18 out of range (size 18)"));
}

TEST(LanguageModelDataset, TokenOutsideTheVocabularyNamesFileAndPosition) {
  const std::string dir = temp_dir("lm_vocab");
  std::vector<int32_t> tokens = iota(0, 40);
  tokens[21] = 60000;
  write_token_shard(dir + "/train_000000.bin", tokens);
  const LanguageModelDataset d(open_token_shard_dir("tokens/train", dir, "train"), 10);
  EXPECT_NO_THROW(sample_of(d, 0));
  const std::string msg = error_of([&] { sample_of(d, 2); });
  EXPECT_TRUE(has(msg, "token 21 of " + dir + "/train_000000.bin is 60000")) << msg;
  EXPECT_TRUE(has(msg, "outside the vocabulary [0, 50257)")) << msg;
}

TEST(TokenShardDir, MissingShardsPointToPrepareText) {
  const std::string dir = temp_dir("no_val");
  write_token_shard(dir + "/train_000000.bin", iota(0, 10));
  const std::string msg = error_of([&] { open_token_shard_dir("tokens/val", dir, "test"); });
  EXPECT_TRUE(has(msg, "no val shards in '" + dir + "'")) << msg;
  EXPECT_TRUE(has(msg, "strata prepare-text")) << msg;
  EXPECT_TRUE(has(error_of([] { open_token_shard_dir("t", "/nonexistent/dir", "train"); }),
                  "'/nonexistent/dir'"));
}

std::shared_ptr<const TokenSource> synthetic(int64_t tokens, uint64_t seed = 5) {
  return make_synthetic_token_source("synthetic", tokens, kGpt2VocabSize, seed);
}

TEST(SyntheticTokens, DeterministicUniformAndKeyedByName) {
  const auto a = synthetic(100000);
  EXPECT_EQ(a->total_tokens(), 100000);
  std::vector<int32_t> x(100000), y(100), z(100);
  a->read(0, 0, 100000, x.data());
  synthetic(100000)->read(0, 500, 100, y.data());
  EXPECT_TRUE(std::equal(y.begin(), y.end(), x.begin() + 500));
  make_synthetic_token_source("other", 100000, kGpt2VocabSize, 5)->read(0, 500, 100, z.data());
  EXPECT_NE(y, z);
  double mean = 0;
  for (int32_t t : x) {
    ASSERT_GE(t, 0);
    ASSERT_LT(t, kGpt2VocabSize);
    mean += t;
  }
  mean /= static_cast<double>(x.size());
  // Uniform on [0, V): mean (V - 1) / 2, standard error V / sqrt(12 n) ~ 46.
  EXPECT_NEAR(mean, (kGpt2VocabSize - 1) / 2.0, 300.0);
}

struct MaskCounts {
  int64_t positions = 0, selected = 0, masked = 0, random = 0, kept = 0;
};

MaskCounts count_masks(const MaskedLanguageModelDataset& d, const TokenSource& source,
                       int64_t samples, int64_t T) {
  MaskCounts c;
  std::vector<int32_t> original(static_cast<size_t>(T));
  for (int64_t i = 0; i < samples; ++i) {
    const Sample s = sample_of(d, i);
    source.read(0, i * T, T, original.data());
    for (int64_t t = 0; t < T; ++t) {
      ++c.positions;
      EXPECT_EQ(s.input[static_cast<size_t>(T + t)], 0) << "token type";
      EXPECT_EQ(s.input[static_cast<size_t>(2 * T + t)], 1) << "attention mask";
      const int32_t in = s.input[static_cast<size_t>(t)];
      const int64_t target = s.target[static_cast<size_t>(t)];
      if (target == -100) {
        EXPECT_EQ(in, original[static_cast<size_t>(t)]) << "an unselected position changed";
        continue;
      }
      EXPECT_EQ(target, original[static_cast<size_t>(t)]);
      ++c.selected;
      if (in == d.options().mask_id) {
        ++c.masked;
      } else if (in == original[static_cast<size_t>(t)]) {
        ++c.kept;
      } else {
        EXPECT_GE(in, 0);
        EXPECT_LT(in, d.options().vocab_size);
        ++c.random;
      }
    }
  }
  return c;
}

TEST(MaskedLanguageModelDataset, BertMaskingStatistics) {
  const int64_t T = 128, samples = 2000;
  const auto source = synthetic(T * samples);
  MlmOptions options;
  options.seed = 3;
  const MaskedLanguageModelDataset d(source, T, options);
  EXPECT_EQ(d.size(), samples);
  EXPECT_EQ(d.input_spec().shape, (Shape{3, T}));
  EXPECT_EQ(d.input_spec().dtype, DType::kI32);
  EXPECT_EQ(d.target_spec().shape, Shape{T});
  EXPECT_EQ(d.num_classes(), kGpt2VocabSize + 1);  // the mask id past GPT-2's vocabulary
  const MaskCounts c = count_masks(d, *source, samples, T);
  // 256,000 positions: the selected share has a standard error of 0.0007; of the ~38,400 selected,
  // the mask/random/kept shares have standard errors of 0.002 or less.
  const double selected = static_cast<double>(c.selected) / static_cast<double>(c.positions);
  EXPECT_NEAR(selected, 0.15, 0.004);
  EXPECT_NEAR(static_cast<double>(c.masked) / static_cast<double>(c.selected), 0.8, 0.01);
  EXPECT_NEAR(static_cast<double>(c.random) / static_cast<double>(c.selected), 0.1, 0.01);
  EXPECT_NEAR(static_cast<double>(c.kept) / static_cast<double>(c.selected), 0.1, 0.01);
}

TEST(MaskedLanguageModelDataset, BertVocabularyAndOtherProbabilities) {
  const int64_t T = 64, samples = 500;
  const auto source = make_synthetic_token_source("bert", T * samples, 30522, 9);
  MlmOptions options;
  options.vocab_size = 30522;
  options.mask_id = 103;  // BERT's [MASK]
  options.select_prob = 0.5;
  options.mask_prob = 0.5;
  options.random_prob = 0.25;
  const MaskedLanguageModelDataset d(source, T, options);
  EXPECT_EQ(d.num_classes(), 30522);
  const MaskCounts c = count_masks(d, *source, samples, T);
  // A random replacement or a kept token may itself be 103 (1 in 30522): negligible here.
  EXPECT_NEAR(static_cast<double>(c.selected) / static_cast<double>(c.positions), 0.5, 0.02);
  EXPECT_NEAR(static_cast<double>(c.masked) / static_cast<double>(c.selected), 0.5, 0.02);
  EXPECT_NEAR(static_cast<double>(c.random) / static_cast<double>(c.selected), 0.25, 0.02);
  options.mask_prob = 0.9;
  EXPECT_TRUE(has(error_of([&] { MaskedLanguageModelDataset bad(source, T, options); }),
                  "add up to more than 1"));
}

TEST(MaskedLanguageModelDataset, DeterministicFromSeedAndIndex) {
  const int64_t T = 32;
  const auto source = synthetic(T * 300);
  MlmOptions options;
  options.seed = 1;
  const MaskedLanguageModelDataset d(source, T, options);
  const MaskedLanguageModelDataset again(source, T, options);
  options.seed = 2;
  const MaskedLanguageModelDataset other(source, T, options);
  // Read in the opposite order from another instance: the same samples.
  std::vector<Sample> reversed(300);
  for (int64_t i = 299; i >= 0; --i) reversed[static_cast<size_t>(i)] = sample_of(again, i);
  int differ = 0;
  for (int64_t i = 0; i < 300; ++i) {
    const Sample s = sample_of(d, i);
    EXPECT_EQ(s.input, reversed[static_cast<size_t>(i)].input);
    EXPECT_EQ(s.target, reversed[static_cast<size_t>(i)].target);
    differ += sample_of(other, i).target != s.target;
  }
  EXPECT_GT(differ, 250);  // another seed, other masks (P(same mask) ~ 0.85^32 per sample)
  // Through the DataLoader: the same batches with and without worker threads.
  auto shared = std::make_shared<MaskedLanguageModelDataset>(source, T, MlmOptions{});
  DataLoaderOptions lo;
  lo.batch_size = 16;
  lo.shuffle = true;
  lo.seed = 4;
  DataLoader serial(shared, lo);
  lo.num_workers = 2;
  DataLoader threaded(shared, lo);
  serial.start_epoch(1);
  threaded.start_epoch(1);
  Batch a, b;
  int batches = 0;
  while (serial.next(&a)) {
    ASSERT_TRUE(threaded.next(&b));
    EXPECT_EQ(a.input.to_vector<int32_t>(), b.input.to_vector<int32_t>());
    EXPECT_EQ(a.target.to_vector<int64_t>(), b.target.to_vector<int64_t>());
    ++batches;
  }
  EXPECT_EQ(batches, 19);
}

TEST(TokenizeCorpus, ValidationDocumentsAreSpreadEvenly) {
  std::vector<int64_t> val;
  for (int64_t d = 0; d < 500; ++d) {
    if (is_validation_document(d, 0.1)) val.push_back(d);
  }
  ASSERT_EQ(val.size(), 50u);
  for (size_t k = 0; k < val.size(); ++k) EXPECT_EQ(val[k], static_cast<int64_t>(10 * k + 9));
  for (int64_t d = 0; d < 100; ++d) EXPECT_FALSE(is_validation_document(d, 0.0));
  int64_t quarter = 0;
  for (int64_t d = 0; d < 1000; ++d) quarter += is_validation_document(d, 0.25);
  EXPECT_EQ(quarter, 250);
}

// A vocabulary of the 256 bytes and <|endoftext|>, no merges: one token per byte.
std::string byte_vocab() {
  const std::string dir = temp_dir("byte_vocab");
  std::ofstream json(dir + "/encoder.json");
  json << "{";
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = gpt2_byte_to_code_point(static_cast<uint8_t>(b));
    json << (b ? ", " : "") << "\"\\u" << std::hex << (cp < 0x1000 ? "0" : "")
         << (cp < 0x100 ? "0" : "") << (cp < 0x10 ? "0" : "") << cp << std::dec << "\": " << b;
  }
  json << ", \"<|endoftext|>\": 256}\n";
  std::ofstream(dir + "/vocab.bpe") << "#version: 0.2\n";
  return dir;
}

TEST(TokenizeCorpus, DocumentsStartWithEndOfTextAndGoWholeToASplit) {
  const BpeTokenizer bpe(byte_vocab());
  ASSERT_EQ(bpe.end_of_text(), 256);
  const std::vector<std::string> docs{"aa", "bbb", "c", "dddd"};
  const TokenizedCorpus c = tokenize_corpus(docs, bpe, 0.25);  // document 3 is validation
  EXPECT_EQ(c.train, (std::vector<int32_t>{256, 'a', 'a', 256, 'b', 'b', 'b', 256, 'c'}));
  EXPECT_EQ(c.val, (std::vector<int32_t>{256, 'd', 'd', 'd', 'd'}));
  EXPECT_EQ(c.train_documents, 3);
  EXPECT_EQ(c.val_documents, 1);
  EXPECT_FALSE(c.split_by_tokens);
  // One document with f = 0.1: the last ceil(0.1 * 21) = 3 tokens are the validation split.
  const TokenizedCorpus one = tokenize_corpus({std::string(20, 'x')}, bpe, 0.1);
  EXPECT_TRUE(one.split_by_tokens);
  EXPECT_EQ(one.train.size(), 18u);
  EXPECT_EQ(one.val, (std::vector<int32_t>{'x', 'x', 'x'}));
  EXPECT_TRUE(has(error_of([&] { tokenize_corpus(docs, bpe, 1.0); }), "must be in [0, 1)"));
}

TEST(OpenDataset, TextDatasetsFromTheCatalog) {
  const std::string dir = temp_dir("catalog");
  write_token_shard(dir + "/train_000000.bin", iota(0, 1000));
  write_token_shard(dir + "/val_000000.bin", iota(5000, 200));
  DatasetOptions o;
  o.seq_len = 16;
  const auto train = open_dataset("tokens", dir, "train", o);
  const auto test = open_dataset("tokens", dir, "test", o);
  EXPECT_EQ(train->size(), 999 / 16);
  EXPECT_EQ(test->size(), 199 / 16);
  EXPECT_EQ(test->name(), "tokens/val");
  EXPECT_EQ(sample_of(*test, 1).input[0], 5016);
  o.task = TextTask::kMaskedLanguageModel;
  const auto mlm = open_dataset("tokens", dir, "train", o);
  EXPECT_EQ(mlm->input_spec().shape, (Shape{3, 16}));
  EXPECT_EQ(mlm->size(), 1000 / 16);
  EXPECT_EQ(mlm->num_classes(), kGpt2VocabSize + 1);
  EXPECT_TRUE(has(error_of([&] { open_dataset("tokens", "", "train", o); }), "--data-dir"));
  EXPECT_TRUE(has(error_of([&] { open_dataset("tokens", dir, "dev", o); }), "unknown split 'dev'"));

  o.task = TextTask::kLanguageModel;
  const auto synth = open_dataset("synthetic-tokens", "", "train", o);
  EXPECT_EQ(synth->size(), kSyntheticTrainSamples);
  EXPECT_EQ(open_dataset("synthetic-tokens", "", "test", o)->size(), kSyntheticTestSamples);
  EXPECT_NE(sample_of(*synth, 0).input,
            sample_of(*open_dataset("synthetic-tokens", "", "test", o), 0).input);
  EXPECT_TRUE(dataset_info("brown").text);
  EXPECT_FALSE(dataset_info("fashion-mnist").text);
  EXPECT_TRUE(has(dataset_names(), "tokens, brown, synthetic-tokens"));
}

struct LossLog final : parallel::TrainObserver {
  std::vector<double> losses;
  void on_step(const parallel::StepRecord& r) override { losses.push_back(r.loss); }
};

TEST(LanguageModelDataset, TrainsABigramModelThroughTheTrainer) {
  // Tokens cycle through 0..15, so the next token is a function of the current one.
  const std::string dir = temp_dir("train");
  std::vector<int32_t> tokens(4000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % 16);
  write_token_shard(dir + "/train_000000.bin", tokens);
  write_token_shard(dir + "/val_000000.bin",
                    std::vector<int32_t>(tokens.begin(), tokens.begin() + 500));
  DatasetOptions o;
  o.seq_len = 32;
  const auto train = open_dataset("tokens", dir, "train", o);
  const auto val = open_dataset("tokens", dir, "val", o);
  ExecContext ctx(Device::cpu(), nullptr, 1);
  const proto::ModelSpec spec = graph::parse_model_spec(R"(
    name: "bigram"
    input { shape: [32] dtype: "i32" }
    layer { name: "embed" type: "token_embedding"
            token_embedding { vocab_size: 50257 width: 8 max_positions: 32 } }
    layer { name: "head" type: "linear" linear { out_features: 16 } }
  )",
                                                        "bigram");
  parallel::TrainConfig config;
  config.steps = 60;
  config.batch_size = 8;
  config.num_workers = 0;
  config.log_every = 1;  // each record is one step's loss
  config.optimizer.schedule.base_lr = 0.05;
  LossLog log;
  parallel::Trainer trainer(ctx, spec, train, val, config, parallel::PipelineConfig{}, nullptr,
                            &log);
  const parallel::TrainSummary summary = trainer.run();
  ASSERT_EQ(log.losses.size(), 60u);
  EXPECT_GT(log.losses.front(), 2.0);  // about log(16) at the start
  EXPECT_LT(log.losses.back(), 0.5 * log.losses.front());
  ASSERT_TRUE(summary.last_eval.has_value());
  EXPECT_EQ(summary.last_eval->samples, val->size() * 32);  // every position is counted
  EXPECT_GT(summary.last_eval->accuracy, 0.95);  // next-token accuracy over every position
}

}  // namespace
}  // namespace strata::io
