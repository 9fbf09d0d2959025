// CUDA-vs-CPU parity: run an op on cuda:0 and on the CPU reference with the same fresh random
// inputs and compare with a per-dtype bound on the relative error
//
//   rel = max_i |gpu_i - cpu_i| / max(max_i |cpu_i|, tiny)
//
// (a norm-wise bound: element-wise relative error is meaningless where the reference is near
// zero). NaN or infinity in the CUDA result never passes. The tests skip on machines without a
// CUDA device (STRATA_REQUIRE_CUDA, testing/require_gpu.h; they fail instead under
// STRATA_REQUIRE_GPU=1) and must pass where there is one.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "engine/allocator.h"
#include "engine/device.h"
#include "engine/exec_context.h"
#include "engine/tensor.h"
#include "testing/require_gpu.h"
#include "testing/testing.h"

namespace strata::testing {

// Per-precision bounds on the norm-wise relative error against the f32 CPU reference.
enum class Precision { kF32, kTF32, kBF16, kF16 };
inline double parity_bound(Precision p) {
  switch (p) {
    case Precision::kF32:
      return 1e-5;
    case Precision::kTF32:
      return 1e-3;
    case Precision::kBF16:
      return 1e-2;
    case Precision::kF16:
      return 5e-3;
  }
  return 0.0;
}

// A contiguous copy of a CPU tensor on the context's device (waits for the copy).
inline Tensor to_device(const Tensor& t, ExecContext& ctx) {
  return to_allocator(t.contiguous(), ctx.allocator());
}
// A CPU copy of a tensor on any device (waits for every op of `ctx` first).
inline Tensor to_host(const Tensor& t, ExecContext& ctx) {
  ctx.synchronize();
  if (t.device().is_cpu()) return t;
  return to_allocator(t.contiguous(), default_cpu_allocator());
}

// f32 values uniform in [lo, hi) on the CPU.
inline Tensor random_f32(const Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  return random_tensor(shape, seed, lo, hi, DType::kF32);
}

// The norm-wise relative error of `actual` (any device, any float dtype) against `expected`
// (CPU), checked against `bound`; fails on a shape mismatch or a non-finite value.
inline ::testing::AssertionResult parity(ExecContext& ctx, const Tensor& actual,
                                         const Tensor& expected, double bound,
                                         const std::string& what = "") {
  if (!actual.defined() || !expected.defined()) {
    if (actual.defined() == expected.defined()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << what << ": one side is undefined";
  }
  const Tensor a_host = to_host(actual, ctx);
  if (a_host.shape() != expected.shape()) {
    return ::testing::AssertionFailure()
           << what << ": shapes differ: " << a_host.shape_str() << " vs " << expected.shape_str();
  }
  const std::vector<double> a = a_host.to_vector<double>();
  const std::vector<double> e = expected.to_vector<double>();
  double max_ref = 0.0, max_err = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) {
      return ::testing::AssertionFailure()
             << what << ": non-finite value " << a[i] << " at flat index " << i << " (reference "
             << e[i] << ")";
    }
    max_ref = std::max(max_ref, std::fabs(e[i]));
    const double err = std::fabs(a[i] - e[i]);
    if (err > max_err) {
      max_err = err;
      worst = i;
    }
  }
  const double rel = max_err / std::max(max_ref, 1e-30);
  if (rel <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": relative error " << rel << " > " << bound << "; worst at flat index "
         << worst << ": " << a[worst] << " vs " << e[worst] << " (max |reference| " << max_ref
         << ")";
}

// Exact equality (integer outputs, masks, argmax indices).
inline ::testing::AssertionResult identical(ExecContext& ctx, const Tensor& actual,
                                            const Tensor& expected, const std::string& what = "") {
  const Tensor a_host = to_host(actual, ctx);
  if (a_host.shape() != expected.shape() || a_host.dtype() != expected.dtype()) {
    return ::testing::AssertionFailure()
           << what << ": " << a_host.str() << " vs " << expected.str();
  }
  const std::vector<double> a = a_host.to_vector<double>();
  const std::vector<double> e = expected.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    if (!(a[i] == e[i])) {
      return ::testing::AssertionFailure()
             << what << ": differs at flat index " << i << ": " << a[i] << " vs " << e[i];
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace strata::testing
