// The datasets `--dataset NAME` can name, and where each is found by default.
#pragma once

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
std::string dataset_names();  // "fashion-mnist, mnist"

// Split `split` (train or test) of dataset `name`, from `dir` or, when empty, the dataset's
// default location. Unknown names list the valid ones; a missing dataset names what supplies it.
std::shared_ptr<const Dataset> open_dataset(const std::string& name, const std::string& dir,
                                            const std::string& split);

}  // namespace strata::io
