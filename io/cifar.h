// CIFAR-10 in its binary version (www.cs.toronto.edu/~kriz/cifar.html, cifar-10-binary.tar.gz,
// which extracts to cifar-10-batches-bin/):
//
//   data_batch_1.bin .. data_batch_5.bin   the training split (50000 samples)
//   test_batch.bin                         the test split (10000 samples)
//   batches.meta.txt                       optional: the 10 class names, one a line
//
// Each .bin file is a plain sequence of 3073-byte records: 1 label byte (0..9), then 3072 pixel
// bytes, the 32x32 red plane, then green, then blue, each row-major. The published files hold
// 10000 records (30,730,000 bytes) each. Strata accepts any positive whole number of records, the
// same in every training file, so that tests and users can make small files in the same format.
//
// A sample is
//   input  f32 (3, 32, 32): (pixel / 255 - mean[c]) / stddev[c], the per-channel statistics of
//          the training set (kCifar10Mean, kCifar10Std)
//   target i64 scalar: the class, 0..9
//
// Augmentation (CifarOptions::augment, for the training split): the standard random crop and
// flip of CIFAR ResNets. The image is padded by 4 black pixels (raw value 0, so the padding
// normalizes to -mean/stddev) on each side to 40x40, a 32x32 window at offsets (dy, dx), both
// uniform in [0, 8], is cut out, and with probability 1/2 it is mirrored left-right. The draws
// are a pure function of (seed, epoch, index) (a Philox stream, see augmentation()), so batches do
// not depend on the DataLoader's worker count and differ from epoch to epoch; the DataLoader
// passes the epoch through Dataset::get_in_epoch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/dataset.h"
#include "io/mnist.h"

namespace strata::io {

inline constexpr int64_t kCifarSide = 32;
inline constexpr int64_t kCifarPixelBytes = 3 * kCifarSide * kCifarSide;  // 3072
inline constexpr int64_t kCifarRecordBytes = 1 + kCifarPixelBytes;        // 3073
inline constexpr int64_t kCifarPublishedRecords = 10000;                  // per published file
inline constexpr int64_t kCifar10Classes = 10;
inline constexpr int64_t kCifarPadding = 4;  // of the random crop
inline constexpr float kCifar10Mean[3] = {0.4914f, 0.4822f, 0.4465f};
inline constexpr float kCifar10Std[3] = {0.2470f, 0.2435f, 0.2616f};

struct CifarOptions {
  bool augment = false;  // random crop (padding 4) and horizontal flip, see above
  uint64_t seed = 0;     // of the augmentation
};

// The crop window and mirroring of one augmented sample: output pixel (c, y, x) is padded-image
// pixel (c, y + dy, dx + (flip ? 31 - x : x)), where the padded image is the input shifted by
// kCifarPadding in both directions.
struct CifarAugmentation {
  int dy = kCifarPadding;
  int dx = kCifarPadding;
  bool flip = false;
};

class Cifar10Dataset final : public Dataset {
 public:
  // Reads `files` (CIFAR-10 binary batches, concatenated in this order) whole and checks them:
  // sizes (whole records, the same count in every file) and labels. `class_names` must hold 10
  // names. Throws strata::Error naming the file, the byte length expected and found, or the
  // record and byte offset of a bad label.
  Cifar10Dataset(std::string name, const std::vector<std::string>& files,
                 std::vector<std::string> class_names, CifarOptions options);

  std::string name() const override { return name_; }
  int64_t size() const override { return count_; }
  SampleSpec input_spec() const override { return {{3, kCifarSide, kCifarSide}, DType::kF32}; }
  SampleSpec target_spec() const override { return {{}, DType::kI64}; }
  int64_t num_classes() const override { return kCifar10Classes; }
  void get(int64_t index, void* input, void* target) const override;
  void get_in_epoch(int64_t epoch, int64_t index, void* input, void* target) const override;

  // The class of sample `index` and its raw pixels (kCifarPixelBytes: R, G, B planes).
  int64_t label(int64_t index) const;
  const uint8_t* pixels(int64_t index) const;
  const std::vector<std::string>& class_names() const { return class_names_; }
  const CifarOptions& options() const { return options_; }
  // What augmentation gives sample `index` in epoch `epoch` (the identity without augment).
  CifarAugmentation augmentation(int64_t epoch, int64_t index) const;

 private:
  void check_index(int64_t index) const;

  std::string name_;
  CifarOptions options_;
  int64_t count_ = 0;
  std::vector<std::string> class_names_;
  std::vector<uint8_t> records_;  // count_ records of kCifarRecordBytes, as in the files
  float lut_[3][256];             // normalized value of each pixel value, per channel
};

// The class names of a batches.meta.txt file: its non-blank lines, trimmed; there must be 10.
std::vector<std::string> read_cifar10_class_names(const std::string& path);
// airplane, automobile, bird, cat, deer, dog, frog, horse, ship, truck.
const std::vector<std::string>& cifar10_default_class_names();

// Opens a split of CIFAR-10 from `dir`, or from `dir`/cifar-10-batches-bin when `dir` is the
// directory the archive was extracted in. Class names come from batches.meta.txt when present.
// Throws strata::Error when files are missing, naming the directory, the files expected, where to
// get them and the flag (--data-dir) that points elsewhere.
std::shared_ptr<const Cifar10Dataset> open_cifar10(const std::string& dir, Split split,
                                                   const CifarOptions& options = {});

}  // namespace strata::io
