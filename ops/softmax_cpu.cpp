// Softmax over the last dimension on the CPU, one row at a time, rows split over threads.
//
// Forward: m = max(x), y = exp(x - m) / sum(exp(x - m)); the exponentials are taken in x's dtype
// (their arguments are <= 0, so they never overflow) and summed in double. A row whose entries
// are all -inf has no maximum to subtract and gives zeros rather than NaN.
// Backward: dx = y (dy - sum(dy y)), the dot product accumulated in double.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/cpu_util.h"
#include "ops/softmax.h"

namespace strata::ops::cpu {
namespace {

constexpr const char* kForward = "softmax_forward";
constexpr const char* kBackward = "softmax_backward";

int64_t row_size(const Tensor& x, const char* op, const char* name) {
  STRATA_CHECK(x.dim() >= 1 && x.size(-1) > 0)
      << op << ": " << name << " must be (..., C) with C > 0, got " << x.shape_str();
  return x.size(-1);
}

}  // namespace

Tensor softmax_forward(ExecContext& ctx, const Tensor& x) {
  detail::check_float(x, kForward, "x");
  const int64_t c = row_size(x, kForward, "x");
  const int64_t rows = x.numel() / c;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), &ctx.allocator());
  detail::dispatch_float(x.dtype(), kForward, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    detail::parallel_for(rows, std::max<int64_t>(1, 4096 / c), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = px + r * c;  // (C,)
        T* yr = py + r * c;        // (C,)
        const T m = *std::max_element(xr, xr + c);
        if (m == -std::numeric_limits<T>::infinity()) {
          std::fill(yr, yr + c, T(0));
          continue;
        }
        double sum = 0.0;
        for (int64_t j = 0; j < c; ++j) {
          yr[j] = std::exp(xr[j] - m);
          sum += yr[j];
        }
        const T inv = static_cast<T>(1.0 / sum);
        for (int64_t j = 0; j < c; ++j) yr[j] *= inv;
      }
    });
  });
  return y;
}

Tensor softmax_backward(ExecContext& ctx, const Tensor& dy, const Tensor& y) {
  detail::check_float(dy, kBackward, "dy");
  detail::check_float(y, kBackward, "y");
  detail::check_same_dtype(dy, y, kBackward, "dy", "y");
  detail::check_shape(dy, y.shape(), kBackward, "dy");
  const int64_t c = row_size(y, kBackward, "y");
  const int64_t rows = y.numel() / c;
  Tensor dx = Tensor::empty(y.shape(), y.dtype(), &ctx.allocator());
  detail::dispatch_float(y.dtype(), kBackward, [&](auto tag) {
    using T = decltype(tag);
    const T* pdy = dy.data<T>();
    const T* py = y.data<T>();
    T* pdx = dx.data<T>();
    detail::parallel_for(rows, std::max<int64_t>(1, 4096 / c), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* dyr = pdy + r * c;  // (C,)
        const T* yr = py + r * c;    // (C,)
        T* dxr = pdx + r * c;        // (C,)
        double dot = 0.0;
        for (int64_t j = 0; j < c; ++j) dot += static_cast<double>(dyr[j]) * yr[j];
        const T d = static_cast<T>(dot);
        for (int64_t j = 0; j < c; ++j) dxr[j] = yr[j] * (dyr[j] - d);
      }
    });
  });
  return dx;
}

}  // namespace strata::ops::cpu
