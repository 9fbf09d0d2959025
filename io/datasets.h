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
std::string dataset_names();  // "fashion-mnist, mnist, tokens, brown, synthetic-tokens"
const DatasetInfo& dataset_info(const std::string& name);  // throws listing the valid names

// What a text dataset needs beyond its name, directory and split (image datasets ignore it).
struct DatasetOptions {
  int64_t seq_len = 128;                     // T: tokens per sample
  TextTask task = TextTask::kLanguageModel;  // lm (GPT-2) or mlm (BERT)
  uint64_t seed = 0;                         // MLM masks and synthetic tokens
  std::string vocab_dir;                     // brown: GPT-2's vocabulary ("" = the default)
};

// Fraction of the Brown corpus's documents held out for validation (every tenth: ca10, ca20, ...
// in cats.txt order, see tokenize_corpus).
inline constexpr double kBrownValFraction = 0.1;
// Samples of the synthetic-tokens dataset per split.
inline constexpr int64_t kSyntheticTrainSamples = 16384;
inline constexpr int64_t kSyntheticTestSamples = 1024;

// Split `split` (train or test; text datasets also take val, the same as test) of dataset `name`,
// from `dir` or, when empty, the dataset's default location. Unknown names list the valid ones; a
// missing dataset names what supplies it.
std::shared_ptr<const Dataset> open_dataset(const std::string& name, const std::string& dir,
                                            const std::string& split,
                                            const DatasetOptions& options);
std::shared_ptr<const Dataset> open_dataset(const std::string& name, const std::string& dir,
                                            const std::string& split);

}  // namespace strata::io
