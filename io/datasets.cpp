// The dataset catalog: names, default locations, and the options each dataset takes.
#include "io/datasets.h"

#include "engine/check.h"
#include "io/cifar.h"
#include "io/image_folder.h"
#include "io/mnist.h"
#include "io/synthetic.h"

namespace strata::io {
namespace {

constexpr int64_t kSyntheticTrainSamples = 50000;
constexpr int64_t kSyntheticTestSamples = 10000;

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
  };
  return kCatalog;
}

std::string dataset_names() {
  std::string s;
  for (const DatasetInfo& d : dataset_catalog()) s += (s.empty() ? "" : ", ") + d.name;
  return s;
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
    o.samples = s == Split::kTrain ? kSyntheticTrainSamples : kSyntheticTestSamples;
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
