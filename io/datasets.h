// The datasets `--dataset NAME` can name, and where each is found by default.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/dataset.h"

namespace strata::io {

struct DatasetInfo {
  std::string name;         // "fashion-mnist"
  std::string default_dir;  // "" when there is no default location (a --data-dir is needed)
  std::string description;
};

const std::vector<DatasetInfo>& dataset_catalog();
std::string dataset_names();  // "fashion-mnist, mnist, ..."

// What the image datasets can be asked for; the defaults give every dataset its standard form.
struct DatasetOptions {
  // image-folder: the side S of the (3, S, S) samples, 0 = 224; synthetic-images: H = W, 0 = 32.
  // The other datasets have a fixed size: 0 or that size.
  int64_t image_size = 0;
  // cifar10, image-folder: random crops and flips on the training split (never on test).
  bool augment = true;
  // image-folder: replace unreadable files instead of failing (io/image_folder.h).
  bool skip_bad_samples = false;
  uint64_t seed = 0;         // of the augmentation and of the synthetic samples
  int64_t channels = 3;      // synthetic-images: C
  int64_t num_classes = 10;  // synthetic-images
};

// Split `split` (train or test) of dataset `name`, from `dir` or, when empty, the dataset's
// default location. Unknown names list the valid ones; a missing dataset names what supplies it;
// an option the dataset cannot honour (an image size other than its own, skip_bad_samples on a
// dataset read whole at open) is an error naming the flag.
std::shared_ptr<const Dataset> open_dataset(const std::string& name, const std::string& dir,
                                            const std::string& split,
                                            const DatasetOptions& options = {});

// The augmentation dataset `name` applies to its training split with these options, in words
// ("random crop 32 (padding 4) + horizontal flip", or "none").
std::string describe_augmentation(const std::string& name, const DatasetOptions& options);

}  // namespace strata::io
