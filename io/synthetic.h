// Synthetic image classification data, made on the fly: for benchmarks (no file I/O, any shape)
// and tests (a task a model can learn, with no dataset installed).
//
// Class k has a fixed pattern, per channel c a plaid of two cosine gratings,
//   pattern_k[c, y, x] = cos(2 pi fy (y + 0.5) / H + py) * cos(2 pi fx (x + 0.5) / W + px),
// with frequencies fy, fx in {1, 2, 3} and phases py, px uniform in [0, 2 pi), all drawn per
// (k, c) from a Philox stream of the seed. A sample is
//   input  f32 (C, H, W): pattern_label + noise, the noise uniform with standard deviation
//          SyntheticImageOptions::noise, independent per element
//   target i64 scalar: the label, uniform in [0, num_classes)
// The label and the noise of sample i are drawn from Philox streams keyed by (seed, split) at
// subsequence i, so the training and test splits share the patterns but not the samples, and a
// sample is a pure function of (seed, split, i): any thread, any order.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/dataset.h"
#include "io/mnist.h"

namespace strata::io {

struct SyntheticImageOptions {
  int64_t samples = 50000;  // of the split
  int64_t channels = 3;     // C
  int64_t height = 32;      // H
  int64_t width = 32;       // W
  int64_t num_classes = 10;
  uint64_t seed = 0;
  float noise = 0.5f;  // standard deviation of the noise; the patterns have 0.5 (per element)
};

class SyntheticImageDataset final : public Dataset {
 public:
  // Throws strata::Error naming the option when a size is below 1 or the noise is negative.
  SyntheticImageDataset(Split split, SyntheticImageOptions options);

  std::string name() const override { return name_; }
  int64_t size() const override { return options_.samples; }
  SampleSpec input_spec() const override {
    return {{options_.channels, options_.height, options_.width}, DType::kF32};
  }
  SampleSpec target_spec() const override { return {{}, DType::kI64}; }
  int64_t num_classes() const override { return options_.num_classes; }
  void get(int64_t index, void* input, void* target) const override;

  int64_t label(int64_t index) const;
  // The noiseless pattern of class `k`, (C, H, W) f32 at `out`.
  void pattern(int64_t k, float* out) const;
  const SyntheticImageOptions& options() const { return options_; }

 private:
  void check_index(int64_t index) const;

  std::string name_;
  SyntheticImageOptions options_;
  uint64_t label_stream_ = 0;
  uint64_t noise_stream_ = 0;
  std::vector<float> rows_;  // (K, C, H): the y grating of each class and channel
  std::vector<float> cols_;  // (K, C, W): the x grating
};

std::shared_ptr<const SyntheticImageDataset> open_synthetic_images(
    Split split, const SyntheticImageOptions& options);

}  // namespace strata::io
