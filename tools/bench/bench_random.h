// Random inputs for benchmarks: f32 tensors (values uniform in [-1, 1), reproducible), and a
// dataset of fixed pseudo-random features and 10 labels for throughput runs.
#pragma once

#include <string>

#include "engine/philox.h"
#include "engine/tensor.h"
#include "io/datasets.h"

namespace strata::tools {

inline Tensor bench_random(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  PhiloxStream rng(seed, 0xbe7c);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = 2.0f * rng.next_uniform() - 1.0f;
  return t;
}

// `n` samples of `features` f32 values in [-1, 1) and a label in 0..9 (throughput only; nothing is
// learned).
class RandomFeatures final : public io::Dataset {
 public:
  RandomFeatures(int64_t n, int64_t features) : n_(n), features_(features) {}
  std::string name() const override { return "random-features"; }
  int64_t size() const override { return n_; }
  io::SampleSpec input_spec() const override { return {{features_}, DType::kF32}; }
  io::SampleSpec target_spec() const override { return {{}, DType::kI64}; }
  int64_t num_classes() const override { return 10; }
  void get(int64_t i, void* input, void* target) const override {
    float* x = static_cast<float*>(input);
    for (int64_t f = 0; f < features_; ++f)
      x[f] = static_cast<float>(((i * 131 + f * 7) % 17) - 8) / 8;
    *static_cast<int64_t*>(target) = i % 10;
  }

 private:
  int64_t n_, features_;
};

}  // namespace strata::tools
