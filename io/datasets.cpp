#include "io/datasets.h"

#include "engine/check.h"
#include "io/mnist.h"

namespace strata::io {

const std::vector<DatasetInfo>& dataset_catalog() {
  static const std::vector<DatasetInfo> kCatalog{
      {"fashion-mnist", kFashionMnistDir,
       "Zalando's 28x28 clothing images, 10 classes (Debian: dataset-fashion-mnist)"},
      {"mnist", "", "LeCun's 28x28 handwritten digits, 10 classes (IDX files in --data-dir)"},
  };
  return kCatalog;
}

std::string dataset_names() {
  std::string s;
  for (const DatasetInfo& d : dataset_catalog()) s += (s.empty() ? "" : ", ") + d.name;
  return s;
}

std::shared_ptr<const Dataset> open_dataset(const std::string& name, const std::string& dir,
                                            const std::string& split) {
  if (name == "fashion-mnist")
    return open_fashion_mnist(dir.empty() ? kFashionMnistDir : dir, split);
  if (name == "mnist") {
    STRATA_CHECK(!dir.empty()) << "dataset mnist has no default location: pass --data-dir with "
                                  "the directory holding train-images-idx3-ubyte(.gz) etc.";
    return open_mnist(dir, split);
  }
  STRATA_THROW() << "unknown dataset '" << name << "' (valid: " << dataset_names() << ")";
}

}  // namespace strata::io
