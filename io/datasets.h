// The datasets `--dataset NAME` can name, and where each is found by default.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/dataset.h"
#include "io/text_datasets.h"

namespace strata::io {

struct DatasetInfo {
  std::string name;         // "fashion-mnist"
  std::string default_dir;  // "" when there is no default location (a --data-dir is needed)
  std::string description;
  bool text = false;  // samples are token windows (DatasetOptions apply)
};

const std::vector<DatasetInfo>& dataset_catalog();
std::string dataset_names();  // "fashion-mnist, mnist, cifar10, ..., brown, synthetic-tokens"
const DatasetInfo& dataset_info(const std::string& name);  // throws listing the valid names

// What a dataset can be asked for beyond its name, directory and split; the defaults give every
// dataset its standard form. Image datasets ignore the text fields and text datasets the image
// fields.
struct DatasetOptions {
  uint64_t seed = 0;  // augmentation, MLM masks, synthetic samples
  // image-folder: the side S of the (3, S, S) samples, 0 = 224; synthetic-images: H = W, 0 = 32.
  // The other image datasets have a fixed size: 0 or that size.
  int64_t image_size = 0;
  // cifar10, image-folder: random crops and flips on the training split (never on test).
  bool augment = true;
  // image-folder: replace unreadable files instead of failing (io/image_folder.h).
  bool skip_bad_samples = false;
  int64_t channels = 3;                      // synthetic-images: C
  int64_t num_classes = 10;                  // synthetic-images
  int64_t seq_len = 128;                     // text: T, tokens per sample
  TextTask task = TextTask::kLanguageModel;  // text: lm (GPT-2) or mlm (BERT)
  std::string vocab_dir;                     // brown: GPT-2's vocabulary ("" = the default)
  int64_t vocab_size = 0;  // synthetic-tokens: tokens uniform in [0, V); 0 = GPT-2's 50257
};

// Fraction of the Brown corpus's documents held out for validation (every tenth: ca10, ca20, ...
// in cats.txt order, see tokenize_corpus).
inline constexpr double kBrownValFraction = 0.1;
// Samples of the synthetic-tokens dataset per split.
inline constexpr int64_t kSyntheticTrainSamples = 16384;
inline constexpr int64_t kSyntheticTestSamples = 1024;

// Split `split` (train or test; text datasets also take val, the same as test) of dataset `name`,
// from `dir` or, when empty, the dataset's default location. Unknown names list the valid ones; a
// missing dataset names what supplies it; an option the dataset cannot honour (an image size other
// than its own, skip_bad_samples on a dataset read whole at open) is an error naming the flag.
std::shared_ptr<const Dataset> open_dataset(const std::string& name, const std::string& dir,
                                            const std::string& split,
                                            const DatasetOptions& options = {});

// The augmentation dataset `name` applies to its training split with these options, in words
// ("random crop 32 (padding 4) + horizontal flip", or "none").
std::string describe_augmentation(const std::string& name, const DatasetOptions& options);

}  // namespace strata::io
