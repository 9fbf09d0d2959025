// MNIST and Fashion-MNIST: 28x28 grey images of 10 classes, as pairs of IDX files
// (io/idx.h) named
//
//   train-images-idx3-ubyte  train-labels-idx1-ubyte   (60000 samples)
//   t10k-images-idx3-ubyte   t10k-labels-idx1-ubyte    (10000 samples)
//
// each optionally gzip-compressed (".gz"). Debian's package dataset-fashion-mnist installs the
// Fashion-MNIST files in kFashionMnistDir; MNIST has no package and is looked for in a directory
// the user names (--data-dir).
//
// A sample is
//   input  f32 (1, H, W): (pixel / 255 - mean) / stddev
//   target i64 scalar: the class, 0..9
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/dataset.h"

namespace strata::io {

// Where the Debian package dataset-fashion-mnist installs the files.
inline constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";
inline constexpr char kFashionMnistPackage[] = "dataset-fashion-mnist";

// Per-pixel mean and standard deviation of the training sets, after scaling to [0, 1].
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;
inline constexpr float kMnistMean = 0.1307f;
inline constexpr float kMnistStd = 0.3081f;

enum class Split { kTrain, kTest };
// "train" or "test"; throws strata::Error naming the valid values otherwise.
Split parse_split(const std::string& text);
const char* split_name(Split split);

// An image classification dataset over an IDX image file (u8, (N, H, W)) and an IDX label file
// (u8, (N), every label < num_classes). Both files are read whole at construction and checked
// (dims, types, counts, label range); get() converts one image and is thread-safe.
class IdxClassificationDataset final : public Dataset {
 public:
  IdxClassificationDataset(std::string name, const std::string& images_path,
                           const std::string& labels_path, float mean, float stddev,
                           int64_t num_classes = 10);

  std::string name() const override { return name_; }
  int64_t size() const override { return count_; }
  SampleSpec input_spec() const override { return {{1, height_, width_}, DType::kF32}; }
  SampleSpec target_spec() const override { return {{}, DType::kI64}; }
  int64_t num_classes() const override { return num_classes_; }
  void get(int64_t index, void* input, void* target) const override;

  // The raw class of sample `index` and its unnormalized pixels (H * W bytes).
  int64_t label(int64_t index) const;
  const uint8_t* pixels(int64_t index) const;
  float mean() const { return mean_; }
  float stddev() const { return stddev_; }

 private:
  void check_index(int64_t index) const;

  std::string name_;
  int64_t count_ = 0;
  int64_t height_ = 0;
  int64_t width_ = 0;
  int64_t num_classes_ = 10;
  float mean_;
  float stddev_;
  std::vector<uint8_t> images_;  // (N, H, W)
  std::vector<uint8_t> labels_;  // (N)
  float lut_[256];               // normalized value of each pixel value
};

// Opens a split of Fashion-MNIST / MNIST from `dir`, preferring the uncompressed file of each
// name when both exist. Throws strata::Error when the files are missing, naming the directory,
// the files looked for, where to get them and the flag (--data-dir) that points elsewhere.
std::shared_ptr<const IdxClassificationDataset> open_fashion_mnist(const std::string& dir,
                                                                   Split split);
std::shared_ptr<const IdxClassificationDataset> open_fashion_mnist(const std::string& dir,
                                                                   const std::string& split);
std::shared_ptr<const IdxClassificationDataset> open_mnist(const std::string& dir, Split split);
std::shared_ptr<const IdxClassificationDataset> open_mnist(const std::string& dir,
                                                           const std::string& split);

}  // namespace strata::io
