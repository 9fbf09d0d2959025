// Test helpers: seeded random tensors, element-wise comparison with a useful failure message, and
// the float64 finite-difference gradient checker every backward is tested with (after Caffe's
// GradientChecker).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <sstream>
#include <string>

#include "engine/philox.h"
#include "engine/tensor.h"

namespace strata::testing {

// Values uniform in [lo, hi), reproducible from the seed.
inline Tensor random_tensor(const Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0,
                            DType dtype = DType::kF64) {
  Tensor t = Tensor::empty(shape, DType::kF64);
  PhiloxStream rng(seed, 0x7e57);
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = lo + (hi - lo) * rng.next_uniform();
  return t.to(dtype);
}

// Integer ids uniform in [0, n).
inline Tensor random_ids(const Shape& shape, int64_t n, uint64_t seed, DType dtype = DType::kI64) {
  std::vector<int64_t> v(static_cast<size_t>(shape_numel(shape)));
  PhiloxStream rng(seed, 0x1d5);
  for (auto& x : v) x = static_cast<int64_t>(rng.next_below(static_cast<uint64_t>(n)));
  return Tensor::from_vector(v, shape).to(dtype);
}

// Every element satisfies |actual - expected| <= atol + rtol |expected| (NaN never does).
inline ::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected,
                                            double atol, double rtol) {
  if (actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure()
           << "shapes differ: " << actual.shape_str() << " vs " << expected.shape_str();
  }
  const std::vector<double> a = actual.to_vector<double>();
  const std::vector<double> e = expected.to_vector<double>();
  double worst = -1.0;
  size_t worst_i = 0;
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double err = std::fabs(a[i] - e[i]);
    const bool ok = err <= atol + rtol * std::fabs(e[i]);  // false for NaN
    if (!ok) {
      ++bad;
      if (!(err <= worst)) {
        worst = err;
        worst_i = i;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << a.size() << " elements differ; worst at flat index " << worst_i
         << ": actual " << a[worst_i] << " vs expected " << e[worst_i] << " (atol " << atol
         << ", rtol " << rtol << ")";
}

struct GradCheckOptions {
  double step = 1e-6;  // central-difference step
  double atol = 1e-7;
  double rtol = 1e-5;
};

// Checks analytic gradients against central differences of the scalar
//   L(inputs) = sum(forward(inputs) * upstream)
// whose gradient with respect to input i is what a backward given `upstream` must return.
// Inputs are f64 tensors; forward must be a pure function of them. analytic[i] may be undefined
// to skip input i (e.g. integer ids).
inline ::testing::AssertionResult gradients_match(
    const std::function<Tensor(const TensorList&)>& forward, const TensorList& inputs,
    const Tensor& upstream, const TensorList& analytic, const GradCheckOptions& options = {}) {
  if (inputs.size() != analytic.size()) {
    return ::testing::AssertionFailure() << "one analytic gradient per input is needed";
  }
  auto loss = [&](const TensorList& xs) {
    const Tensor y = forward(xs);
    const std::vector<double> yv = y.to_vector<double>();
    const std::vector<double> uv = upstream.to_vector<double>();
    double l = 0.0;
    for (size_t i = 0; i < yv.size(); ++i) l += yv[i] * uv[i];
    return l;
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!analytic[i].defined()) continue;
    if (analytic[i].shape() != inputs[i].shape()) {
      return ::testing::AssertionFailure()
             << "gradient of input " << i << " has shape " << analytic[i].shape_str()
             << ", input has " << inputs[i].shape_str();
    }
    TensorList xs;
    for (const Tensor& x : inputs) xs.push_back(x.clone());
    double* p = xs[i].data<double>();
    const std::vector<double> grad = analytic[i].to_vector<double>();
    for (int64_t j = 0; j < xs[i].numel(); ++j) {
      const double saved = p[j];
      p[j] = saved + options.step;
      const double plus = loss(xs);
      p[j] = saved - options.step;
      const double minus = loss(xs);
      p[j] = saved;
      const double numeric = (plus - minus) / (2.0 * options.step);
      const double err = std::fabs(numeric - grad[j]);
      if (!(err <= options.atol + options.rtol * std::fabs(numeric))) {
        return ::testing::AssertionFailure()
               << "input " << i << " element " << j << ": analytic " << grad[j] << " vs numeric "
               << numeric << " (|diff| " << err << ")";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace strata::testing
