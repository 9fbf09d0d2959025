// Image classification folders in the ImageNet layout (torchvision's ImageFolder):
//
//   root/train/<class>/<image>      the training split
//   root/val/<class>/<image>        the test split (root/test/<class>/<image> when there is no val)
//
// Classes are the subdirectory names of a split in byte order, labelled 0, 1, ...; the test split
// must have the same class directories as the training split. A class directory is walked
// recursively (symbolic links to files are followed, to directories not); its files with the
// extensions .jpg .jpeg .png .bmp .ppm .pgm (any case) are the samples, in byte order of their path
// below the class directory; other files and names starting with '.' are ignored. Each file is
// decoded on the loader threads (io/image.h: stb_image, RGB) and transformed into
//   input  f32 (3, S, S), S = image_size: (v / 255 - mean[c]) / stddev[c], ImageNet statistics
//   target i64 scalar: the class index
// Evaluation (augment = false): the shorter side resized to resize_size, then the centered S x S
// window. Training (augment = true): a random resized crop to S x S and a random horizontal flip,
// drawn from a Philox stream keyed by (seed, stable_hash("image-folder/augment") + epoch) at
// subsequence `index`: a pure function of (seed, epoch, index) and the file, whatever thread makes
// the sample and in whatever order. The DataLoader passes the epoch through get_in_epoch.
//
// Unreadable files. A file that cannot be read or decoded (truncated or corrupt JPEG/PNG, a file
// that is not an image) is an error naming the file and the decoder's reason. With
// skip_bad_samples it is skipped instead, by this rule: sample i is made from the first readable
// file among i, i + 1, i + 2, ... (wrapping around), with that file's label and sample i's random
// draws. Whether a file is readable depends on its bytes only, so the substitution, and every
// batch, is the same for any worker count and order. Each bad file is logged once (a warning with
// the file and the reason), remembered (not decoded again) and counted by skipped_samples(). The
// count covers every sample read so far, including batches the DataLoader prefetched but the run
// did not use. When no file is readable, get() throws.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/dataset.h"
#include "io/image.h"
#include "io/mnist.h"

namespace strata::io {

struct ImageFolderOptions {
  int64_t image_size = 224;  // S: the samples are (3, S, S)
  int64_t resize_size = 0;   // evaluation: the shorter side first; 0 = round(S / 0.875), 256 at 224
  bool augment = false;      // random resized crop and flip instead of resize and center crop
  uint64_t seed = 0;         // of the augmentation
  bool skip_bad_samples = false;
};

class ImageFolderDataset final : public Dataset {
 public:
  // Scans `dir` (a split: dir/<class>/<image>). Throws strata::Error naming the directory when it
  // does not exist, holds no class directories, or a class directory holds no images.
  ImageFolderDataset(std::string name, const std::string& dir, ImageFolderOptions options);

  std::string name() const override { return name_; }
  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  SampleSpec input_spec() const override { return {{3, size_, size_}, DType::kF32}; }
  SampleSpec target_spec() const override { return {{}, DType::kI64}; }
  int64_t num_classes() const override { return static_cast<int64_t>(classes_.size()); }
  void get(int64_t index, void* input, void* target) const override;
  void get_in_epoch(int64_t epoch, int64_t index, void* input, void* target) const override;
  int64_t skipped_samples() const override { return skipped_.load(); }

  const std::string& dir() const { return dir_; }
  const std::vector<std::string>& classes() const { return classes_; }
  std::string path(int64_t index) const;  // dir/<class>/<file>
  int64_t label(int64_t index) const;
  const ImageFolderOptions& options() const { return options_; }
  int64_t resize_size() const { return resize_; }
  // The crop (and flip) that sample `index` of an image of width x height gets in epoch `epoch`.
  CropResize crop(int64_t epoch, int64_t index, int64_t width, int64_t height) const;

 private:
  void check_index(int64_t index) const;

  std::string name_;
  std::string dir_;
  ImageFolderOptions options_;
  int64_t size_ = 0;    // S
  int64_t resize_ = 0;  // the evaluation resize
  std::vector<std::string> classes_;
  std::string relative_paths_;      // "<class>/<file>\0" for every sample, in order
  std::vector<size_t> path_start_;  // offset of sample i's path in relative_paths_
  std::vector<int32_t> labels_;
  std::unique_ptr<std::atomic<uint8_t>[]> bad_;  // 1: the file is known unreadable
  mutable std::atomic<int64_t> skipped_{0};
};

// The class directories of `dir`: its subdirectory names (links to directories included) not
// starting with '.', in byte order. Throws naming `dir` when it cannot be listed.
std::vector<std::string> list_class_directories(const std::string& dir);

// Opens split `split` of the image folder at `root` (root/train, root/val or root/test, see
// above). Throws strata::Error when the split directory is missing, naming the directories
// looked for, the expected layout and the flag (--data-dir), or when the classes of the test
// split differ from those of the training split.
std::shared_ptr<const ImageFolderDataset> open_image_folder(const std::string& root, Split split,
                                                            const ImageFolderOptions& options);

}  // namespace strata::io
