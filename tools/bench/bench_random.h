// Random f32 inputs for benchmarks (values uniform in [-1, 1), reproducible).
#pragma once

#include "engine/philox.h"
#include "engine/tensor.h"

namespace strata::tools {

inline Tensor bench_random(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  PhiloxStream rng(seed, 0xbe7c);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = 2.0f * rng.next_uniform() - 1.0f;
  return t;
}

}  // namespace strata::tools
