// Synthetic images: separable class patterns plus counter-based noise.
//
// The plaid of each class and channel is the outer product of a row grating and a column grating,
// so only K * C * (H + W) values are kept (1.3 million floats for 1000 classes of 3x224x224) and a
// sample costs one multiply and one noise draw per element. The cosines are evaluated in double
// once, at construction. The noise takes 24-bit Philox uniforms u in [0, 1) (four per Philox
// call) and maps them to noise * sqrt(12) * (u - 1/2), which has the requested standard deviation.
// The product of two cosines with independent uniform phases has variance 1/4, so the default
// noise of 0.5 gives a signal-to-noise ratio of 1 per element: hopeless for one pixel, easy for a
// model that pools over the image, which is the point.
#include "io/synthetic.h"

#include <cmath>
#include <utility>

#include "engine/check.h"
#include "engine/philox.h"

namespace strata::io {

SyntheticImageDataset::SyntheticImageDataset(Split split, SyntheticImageOptions options)
    : name_(std::string("synthetic-images/") + split_name(split)), options_(options) {
  const SyntheticImageOptions& o = options_;
  STRATA_CHECK(o.samples >= 1 && o.channels >= 1 && o.height >= 1 && o.width >= 1)
      << name_ << ": samples, channels, height and width must be at least 1, got samples "
      << o.samples << ", shape (" << o.channels << ", " << o.height << ", " << o.width << ")";
  STRATA_CHECK(o.num_classes >= 1)
      << name_ << ": num_classes must be at least 1, got " << o.num_classes;
  STRATA_CHECK(o.noise >= 0.0f && std::isfinite(o.noise))
      << name_ << ": noise must be a finite standard deviation >= 0, got " << o.noise;
  label_stream_ = stable_hash(name_ + "/label");
  noise_stream_ = stable_hash(name_ + "/noise");

  constexpr double kTwoPi = 6.283185307179586;
  const int64_t kc = o.num_classes * o.channels;
  rows_.resize(static_cast<size_t>(kc * o.height));
  cols_.resize(static_cast<size_t>(kc * o.width));
  for (int64_t k = 0; k < o.num_classes; ++k) {
    // One stream per class, shared by the splits: the task is the same in train and test.
    PhiloxStream rng(o.seed, stable_hash("synthetic-images/pattern"), static_cast<uint64_t>(k));
    for (int64_t c = 0; c < o.channels; ++c) {
      const double fy = static_cast<double>(1 + rng.next_below(3));
      const double fx = static_cast<double>(1 + rng.next_below(3));
      const double py = kTwoPi * rng.next_uniform();
      const double px = kTwoPi * rng.next_uniform();
      float* row = rows_.data() + (k * o.channels + c) * o.height;
      float* col = cols_.data() + (k * o.channels + c) * o.width;
      for (int64_t y = 0; y < o.height; ++y) {
        row[y] = static_cast<float>(
            std::cos(kTwoPi * fy * (static_cast<double>(y) + 0.5) / o.height + py));
      }
      for (int64_t x = 0; x < o.width; ++x) {
        col[x] = static_cast<float>(
            std::cos(kTwoPi * fx * (static_cast<double>(x) + 0.5) / o.width + px));
      }
    }
  }
}

void SyntheticImageDataset::check_index(int64_t index) const {
  STRATA_CHECK(index >= 0 && index < options_.samples)
      << name_ << ": sample " << index << " out of range (size " << options_.samples << ")";
}

int64_t SyntheticImageDataset::label(int64_t index) const {
  check_index(index);
  PhiloxStream rng(options_.seed, label_stream_, static_cast<uint64_t>(index));
  return static_cast<int64_t>(rng.next_below(static_cast<uint64_t>(options_.num_classes)));
}

void SyntheticImageDataset::pattern(int64_t k, float* out) const {
  STRATA_CHECK(k >= 0 && k < options_.num_classes)
      << name_ << ": class " << k << " out of range (" << options_.num_classes << " classes)";
  const SyntheticImageOptions& o = options_;
  for (int64_t c = 0; c < o.channels; ++c) {
    const float* row = rows_.data() + (k * o.channels + c) * o.height;
    const float* col = cols_.data() + (k * o.channels + c) * o.width;
    for (int64_t y = 0; y < o.height; ++y) {
      float* dst = out + (c * o.height + y) * o.width;
      for (int64_t x = 0; x < o.width; ++x) dst[x] = row[y] * col[x];
    }
  }
}

void SyntheticImageDataset::get(int64_t index, void* input, void* target) const {
  const int64_t k = label(index);
  *static_cast<int64_t*>(target) = k;
  float* out = static_cast<float*>(input);
  pattern(k, out);
  if (options_.noise == 0.0f) return;
  const float scale = options_.noise * std::sqrt(12.0f);
  PhiloxStream rng(options_.seed, noise_stream_, static_cast<uint64_t>(index));
  const int64_t n = options_.channels * options_.height * options_.width;
  for (int64_t i = 0; i < n; ++i) out[i] += scale * (rng.next_uniform() - 0.5f);
}

std::shared_ptr<const SyntheticImageDataset> open_synthetic_images(
    Split split, const SyntheticImageOptions& options) {
  return std::make_shared<SyntheticImageDataset>(split, options);
}

}  // namespace strata::io
