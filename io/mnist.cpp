// MNIST-style datasets over IDX files.
//
// The files are small (47 MB of pixels for the largest split), so both are read whole at
// construction, checked once, and kept as raw bytes: a sample costs H*W table look-ups (the
// normalized value of each of the 256 pixel values is precomputed), and get() touches only
// immutable state, so any number of loader threads may call it at once.
#include "io/mnist.h"

#include <sys/stat.h>

#include <sstream>
#include <utility>

#include "engine/check.h"
#include "io/idx.h"

namespace strata::io {
namespace {

std::string dims_str(const std::vector<int64_t>& dims) {
  std::ostringstream s;
  s << "(";
  for (size_t i = 0; i < dims.size(); ++i) s << (i ? ", " : "") << dims[i];
  s << ")";
  return s.str();
}

bool is_regular_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string join(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

// `dir`/`stem`, or `dir`/`stem`.gz, or "" when neither exists.
std::string find_file(const std::string& dir, const std::string& stem) {
  for (const std::string& candidate : {join(dir, stem), join(dir, stem + ".gz")}) {
    if (is_regular_file(candidate)) return candidate;
  }
  return "";
}

struct Flavor {
  const char* name;  // "fashion-mnist"
  float mean;
  float stddev;
  bool packaged;  // installed by kFashionMnistPackage
};

std::shared_ptr<const IdxClassificationDataset> open_idx_pair(const Flavor& flavor,
                                                              const std::string& dir, Split split) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string images_stem = prefix + "-images-idx3-ubyte";
  const std::string labels_stem = prefix + "-labels-idx1-ubyte";
  const std::string name = std::string(flavor.name) + "/" + split_name(split);
  const std::string images = find_file(dir, images_stem);
  const std::string labels = find_file(dir, labels_stem);
  if (images.empty() || labels.empty()) {
    std::ostringstream why;
    why << name << ": dataset not found: ";
    if (!is_directory(dir)) {
      why << "directory '" << dir << "' does not exist";
    } else {
      why << "'" << dir << "' has no ";
      if (images.empty()) why << images_stem << "(.gz)" << (labels.empty() ? " and no " : "");
      if (labels.empty()) why << labels_stem << "(.gz)";
    }
    why << " (looked for " << images_stem << "(.gz) and " << labels_stem << "(.gz)). ";
    if (flavor.packaged) {
      why << "Install the Debian package " << kFashionMnistPackage << " (it puts the files in "
          << kFashionMnistDir << ") or pass --data-dir with a directory that holds them";
    } else {
      why << "No Debian package ships " << flavor.name << ": download the four IDX files from "
          << "yann.lecun.com/exdb/mnist (or a mirror) and pass --data-dir with their directory";
    }
    STRATA_THROW() << why.str();
  }
  return std::make_shared<IdxClassificationDataset>(name, images, labels, flavor.mean,
                                                    flavor.stddev, 10);
}

constexpr Flavor kFashionMnist{"fashion-mnist", kFashionMnistMean, kFashionMnistStd, true};
constexpr Flavor kMnist{"mnist", kMnistMean, kMnistStd, false};

}  // namespace

Split parse_split(const std::string& text) {
  if (text == "train") return Split::kTrain;
  if (text == "test") return Split::kTest;
  STRATA_THROW() << "unknown split '" << text << "': expected train or test";
}

const char* split_name(Split split) { return split == Split::kTrain ? "train" : "test"; }

IdxClassificationDataset::IdxClassificationDataset(std::string name, const std::string& images_path,
                                                   const std::string& labels_path, float mean,
                                                   float stddev, int64_t num_classes)
    : name_(std::move(name)), num_classes_(num_classes), mean_(mean), stddev_(stddev) {
  STRATA_CHECK(stddev > 0.0f) << name_ << ": the standard deviation must be positive, got "
                              << stddev;
  STRATA_CHECK(num_classes >= 1 && num_classes <= 256)
      << name_ << ": num_classes must be in [1, 256] for u8 labels, got " << num_classes;

  IdxArray images = read_idx(images_path);
  if (images.type != IdxType::kU8 || images.dims.size() != 3) {
    STRATA_THROW() << "idx: " << images_path << ": expected u8 images with 3 dims (N, H, W), found "
                   << idx_type_name(images.type) << " with dims " << dims_str(images.dims);
  }
  IdxArray labels = read_idx(labels_path);
  if (labels.type != IdxType::kU8 || labels.dims.size() != 1) {
    STRATA_THROW() << "idx: " << labels_path << ": expected u8 labels with 1 dim (N), found "
                   << idx_type_name(labels.type) << " with dims " << dims_str(labels.dims);
  }
  if (images.dims[0] != labels.dims[0]) {
    STRATA_THROW() << name_ << ": " << images_path << " holds " << images.dims[0] << " images but "
                   << labels_path << " holds " << labels.dims[0]
                   << " labels: expected the same count (files from different splits?)";
  }
  for (size_t i = 0; i < labels.data.size(); ++i) {
    if (labels.data[i] >= num_classes) {
      STRATA_THROW() << "idx: " << labels_path << ": label " << static_cast<int>(labels.data[i])
                     << " at index " << i << " (byte offset " << labels.header_bytes() + i
                     << "): expected a class below " << num_classes;
    }
  }
  count_ = images.dims[0];
  height_ = images.dims[1];
  width_ = images.dims[2];
  images_ = std::move(images.data);
  labels_ = std::move(labels.data);
  for (int v = 0; v < 256; ++v) {
    lut_[v] = (static_cast<float>(v) / 255.0f - mean_) / stddev_;
  }
}

void IdxClassificationDataset::check_index(int64_t index) const {
  STRATA_CHECK(index >= 0 && index < count_)
      << name_ << ": sample " << index << " out of range (size " << count_ << ")";
}

void IdxClassificationDataset::get(int64_t index, void* input, void* target) const {
  check_index(index);
  const int64_t pixels_per_image = height_ * width_;
  const uint8_t* src = images_.data() + index * pixels_per_image;
  float* dst = static_cast<float*>(input);
  for (int64_t i = 0; i < pixels_per_image; ++i) dst[i] = lut_[src[i]];
  *static_cast<int64_t*>(target) = labels_[static_cast<size_t>(index)];
}

int64_t IdxClassificationDataset::label(int64_t index) const {
  check_index(index);
  return labels_[static_cast<size_t>(index)];
}

const uint8_t* IdxClassificationDataset::pixels(int64_t index) const {
  check_index(index);
  return images_.data() + index * height_ * width_;
}

std::shared_ptr<const IdxClassificationDataset> open_fashion_mnist(const std::string& dir,
                                                                   Split split) {
  return open_idx_pair(kFashionMnist, dir, split);
}

std::shared_ptr<const IdxClassificationDataset> open_fashion_mnist(const std::string& dir,
                                                                   const std::string& split) {
  return open_idx_pair(kFashionMnist, dir, parse_split(split));
}

std::shared_ptr<const IdxClassificationDataset> open_mnist(const std::string& dir, Split split) {
  return open_idx_pair(kMnist, dir, split);
}

std::shared_ptr<const IdxClassificationDataset> open_mnist(const std::string& dir,
                                                           const std::string& split) {
  return open_idx_pair(kMnist, dir, parse_split(split));
}

}  // namespace strata::io
