// Image folders: a directory scan at construction, decoding and transforms per sample.
//
// The scan lists each class directory recursively (std::filesystem, errors named), keeps the image
// files and sorts their paths byte-wise, so the sample order depends only on the names. Paths are
// stored once, relative to the split directory, in one string buffer (an ImageNet training split
// is 1.28 million paths). Files are not opened at construction: a scan of names is quick, while
// checking every image would mean decoding the whole dataset before the first step.
//
// get_in_epoch reads and decodes one file (io/image.h), picks its crop (resize + center crop, or
// random resized crop + flip from a Philox stream of (seed, epoch, index)) and resamples straight
// into the caller's sample row. All per-sample state is on the calling thread; the only shared
// mutable state is the skip bookkeeping (an atomic flag per file and an atomic count), so loader
// threads never wait on each other. Skipping follows the rule of the header: substitution by the
// next readable file, which keeps batches a function of the files and (seed, epoch, index).
#include "io/image_folder.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <iterator>
#include <sstream>
#include <system_error>
#include <utility>

#include "engine/check.h"
#include "engine/log.h"
#include "engine/philox.h"

namespace strata::io {
namespace {

namespace fs = std::filesystem;

constexpr const char* kExtensions[] = {".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm"};
constexpr const char* kExtensionList = ".jpg, .jpeg, .png, .bmp, .ppm, .pgm";

bool has_image_extension(const std::string& filename) {
  const size_t dot = filename.rfind('.');
  if (dot == std::string::npos) return false;
  std::string ext = filename.substr(dot);
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const char* known : kExtensions) {
    if (ext == known) return true;
  }
  return false;
}

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

// The image files below `class_dir`, as paths relative to it, in byte order.
std::vector<std::string> list_images(const fs::path& class_dir) {
  std::vector<std::string> files;
  std::error_code ec;
  fs::recursive_directory_iterator it(class_dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string filename = it->path().filename().string();
    if (!filename.empty() && filename[0] == '.') {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      ec.clear();
      continue;
    }
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec) || !has_image_extension(filename)) continue;
    files.push_back(it->path().lexically_relative(class_dir).generic_string());
  }
  if (ec) {
    STRATA_THROW() << "image-folder: cannot list '" << class_dir.string() << "': " << ec.message();
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

std::vector<std::string> list_class_directories(const std::string& dir) {
  std::vector<std::string> classes;
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code type_ec;
    if (!name.empty() && name[0] != '.' && it->is_directory(type_ec)) classes.push_back(name);
  }
  if (ec) STRATA_THROW() << "image-folder: cannot list '" << dir << "': " << ec.message();
  std::sort(classes.begin(), classes.end());
  return classes;
}

ImageFolderDataset::ImageFolderDataset(std::string name, const std::string& dir,
                                       ImageFolderOptions options)
    : name_(std::move(name)), dir_(dir), options_(options), size_(options.image_size) {
  STRATA_CHECK(size_ >= 1) << name_ << ": image_size must be at least 1, got " << size_;
  resize_ = options_.resize_size > 0
                ? options_.resize_size
                : static_cast<int64_t>(std::lround(static_cast<double>(size_) / 0.875));
  STRATA_CHECK(resize_ >= size_) << name_ << ": resize_size " << resize_
                                 << " is smaller than image_size " << size_
                                 << ": the center crop would not fit";
  if (!is_dir(dir_)) STRATA_THROW() << name_ << ": directory '" << dir_ << "' does not exist";
  classes_ = list_class_directories(dir_);
  if (classes_.empty()) {
    std::ostringstream why;
    why << name_ << ": '" << dir_ << "' holds no class directories: expected " << dir_
        << "/<class>/<image> (" << kExtensionList << ")";
    std::vector<std::string> loose = list_images(dir_);
    if (!loose.empty()) {
      why << "; it holds " << loose.size() << " images directly, like the flat ImageNet "
          << "validation archive: sort them into one directory per class (valprep.sh)";
    }
    STRATA_THROW() << why.str();
  }
  STRATA_CHECK(classes_.size() <= static_cast<size_t>(INT32_MAX))
      << name_ << ": too many classes (" << classes_.size() << ")";
  for (size_t c = 0; c < classes_.size(); ++c) {
    const std::vector<std::string> files = list_images(fs::path(dir_) / classes_[c]);
    if (files.empty()) {
      STRATA_THROW() << name_ << ": class directory '" << (fs::path(dir_) / classes_[c]).string()
                     << "' holds no image files (" << kExtensionList
                     << "): every class needs at least one, or remove the directory";
    }
    for (const std::string& f : files) {
      path_start_.push_back(relative_paths_.size());
      relative_paths_ += classes_[c] + "/" + f;
      relative_paths_ += '\0';
      labels_.push_back(static_cast<int32_t>(c));
    }
  }
  bad_.reset(new std::atomic<uint8_t>[labels_.size()]);
  for (size_t i = 0; i < labels_.size(); ++i) bad_[i].store(0, std::memory_order_relaxed);
}

void ImageFolderDataset::check_index(int64_t index) const {
  STRATA_CHECK(index >= 0 && index < size())
      << name_ << ": sample " << index << " out of range (size " << size() << ")";
}

std::string ImageFolderDataset::path(int64_t index) const {
  check_index(index);
  return (fs::path(dir_) / (relative_paths_.c_str() + path_start_[static_cast<size_t>(index)]))
      .string();
}

int64_t ImageFolderDataset::label(int64_t index) const {
  check_index(index);
  return labels_[static_cast<size_t>(index)];
}

CropResize ImageFolderDataset::crop(int64_t epoch, int64_t index, int64_t width,
                                    int64_t height) const {
  if (!options_.augment) return resize_center_crop(width, height, resize_, size_);
  PhiloxStream rng(options_.seed,
                   stable_hash("image-folder/augment") + static_cast<uint64_t>(epoch),
                   static_cast<uint64_t>(index));
  return random_resized_crop(width, height, size_, rng);
}

void ImageFolderDataset::get(int64_t index, void* input, void* target) const {
  get_in_epoch(0, index, input, target);
}

void ImageFolderDataset::get_in_epoch(int64_t epoch, int64_t index, void* input,
                                      void* target) const {
  check_index(index);
  const int64_t n = size();
  for (int64_t tried = 0, j = index; tried < n; ++tried, j = (j + 1) % n) {
    std::atomic<uint8_t>& bad = bad_[static_cast<size_t>(j)];
    if (bad.load(std::memory_order_relaxed) != 0) continue;
    RgbImage image;
    try {
      image = read_image(path(j));
    } catch (const OutOfMemoryError&) {
      throw;
    } catch (const Error& e) {
      const std::string& cls = classes_[static_cast<size_t>(labels_[static_cast<size_t>(j)])];
      if (!options_.skip_bad_samples) {
        STRATA_THROW() << name_ << ": sample " << j << " (class '" << cls << "'): " << e.message()
                       << ". Pass --skip-bad-samples (ImageFolderOptions::skip_bad_samples) to "
                       << "replace unreadable files by the next readable one";
      }
      if (bad.exchange(1) == 0) {
        skipped_.fetch_add(1);
        STRATA_LOG(WARN) << name_ << ": skipping unreadable sample " << j << " (class '" << cls
                         << "'), replaced by the next readable file: " << e.message();
      }
      continue;
    }
    resample_normalized(image, crop(epoch, index, image.width, image.height), size_, size_,
                        kImageNetMean, kImageNetStd, static_cast<float*>(input));
    *static_cast<int64_t*>(target) = labels_[static_cast<size_t>(j)];
    return;
  }
  STRATA_THROW() << name_ << ": none of the " << n << " files in '" << dir_
                 << "' could be read or decoded (skip_bad_samples): see the warnings above";
}

std::shared_ptr<const ImageFolderDataset> open_image_folder(const std::string& root, Split split,
                                                            const ImageFolderOptions& options) {
  const std::string name = std::string("image-folder/") + split_name(split);
  const fs::path base(root);
  std::vector<fs::path> candidates;
  if (split == Split::kTrain) {
    candidates = {base / "train"};
  } else {
    candidates = {base / "val", base / "test"};
  }
  for (const fs::path& dir : candidates) {
    if (!is_dir(dir)) continue;
    if (split == Split::kTest && is_dir(base / "train")) {
      const std::vector<std::string> train = list_class_directories((base / "train").string());
      const std::vector<std::string> test = list_class_directories(dir.string());
      if (train != test) {
        std::vector<std::string> only_train, only_test;
        std::set_difference(train.begin(), train.end(), test.begin(), test.end(),
                            std::back_inserter(only_train));
        std::set_difference(test.begin(), test.end(), train.begin(), train.end(),
                            std::back_inserter(only_test));
        std::ostringstream why;
        why << name << ": the class directories of '" << dir.string() << "' (" << test.size()
            << ") differ from those of '" << (base / "train").string() << "' (" << train.size()
            << "): labels are indices in the sorted class list, so both splits need the same "
            << "classes.";
        if (!only_train.empty()) why << " Only in train: '" << only_train.front() << "'";
        if (only_train.size() > 1) why << " and " << only_train.size() - 1 << " more";
        if (!only_train.empty()) why << ".";
        if (!only_test.empty())
          why << " Only in " << dir.filename().string() << ": '" << only_test.front() << "'";
        if (only_test.size() > 1) why << " and " << only_test.size() - 1 << " more";
        if (!only_test.empty()) why << ".";
        STRATA_THROW() << why.str();
      }
    }
    return std::make_shared<ImageFolderDataset>(name, dir.string(), options);
  }
  std::ostringstream why;
  why << name << ": dataset not found: ";
  if (!is_dir(base)) {
    why << "directory '" << root << "' does not exist";
  } else {
    why << "'" << root << "' has no " << (split == Split::kTrain ? "train/" : "val/ or test/")
        << " directory";
  }
  why << " (expected " << (base / "train").string() << "/<class>/<image> for train and "
      << (base / "val").string() << "/<class>/<image> for test, the ImageNet layout; images "
      << kExtensionList << "). Pass --data-dir with the folder that holds train/ and val/";
  STRATA_THROW() << why.str();
}

}  // namespace strata::io
