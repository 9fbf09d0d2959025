// Layer normalization over the last dimension on the CPU.
//
// Forward, per row of C values: mean and biased variance are accumulated in double (two passes,
// so no cancellation from E[x^2] - E[x]^2), rstd = 1 / sqrt(var + eps), and
//   y = (x - mean) rstd gamma + beta.
// mean and rstd are saved in x's dtype; backward uses exactly those saved values.
//
// Backward, with xhat = (x - mean) rstd and g = dy gamma:
//   dx = rstd (g - mean(g) - xhat mean(g xhat))
//   dgamma += sum over rows of dy xhat,  dbeta += sum over rows of dy
// The row means are accumulated in double. dx is parallel over rows; the parameter gradients are
// parallel over columns, each thread summing its columns over every row in double, so the result
// does not depend on the thread count.
//
// f32 rows run vectorized loops of their own (forward_row_f32, backward_row_f32): the sums in
// double lanes, the element-wise parts in f32 with the row's mean and rstd rounded to f32.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "ops/cpu_util.h"
#include "ops/layer_norm.h"

namespace strata::ops::cpu {
namespace {

constexpr const char* kForward = "layer_norm_forward";
constexpr const char* kBackward = "layer_norm_backward";

// Checks an optional (C,) parameter (or parameter gradient) against x.
void check_param(const Tensor& p, const Tensor& x, int64_t c, const char* op, const char* name) {
  if (!p.defined()) return;
  detail::check_float(p, op, name);
  detail::check_same_dtype(p, x, op, name, "x");
  detail::check_shape(p, {c}, op, name);
}

int64_t check_x(const Tensor& x, const char* op) {
  detail::check_float(x, op, "x");
  STRATA_CHECK(x.dim() >= 1 && x.size(-1) > 0)
      << op << ": x must be (..., C) with C > 0, got " << x.shape_str();
  return x.size(-1);
}

// One f32 row of the forward: y, and the row's mean and rstd.
void forward_row_f32(const float* x, const float* gamma, const float* beta, float* y, int64_t c,
                     double eps, float* mean_out, float* rstd_out) {
  double sum = 0.0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < c; ++j) sum += x[j];
  const double mean = sum / static_cast<double>(c);
  double sq = 0.0;
#pragma omp simd reduction(+ : sq)
  for (int64_t j = 0; j < c; ++j) {
    const double d = static_cast<double>(x[j]) - mean;
    sq += d * d;
  }
  const double rstd = 1.0 / std::sqrt(sq / static_cast<double>(c) + eps);
  const float m = static_cast<float>(mean), r = static_cast<float>(rstd);
  *mean_out = m;
  *rstd_out = r;
  if (gamma != nullptr && beta != nullptr) {
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) y[j] = (x[j] - m) * r * gamma[j] + beta[j];
    return;
  }
#pragma omp simd
  for (int64_t j = 0; j < c; ++j) {
    float v = (x[j] - m) * r;
    if (gamma != nullptr) v *= gamma[j];
    if (beta != nullptr) v += beta[j];
    y[j] = v;
  }
}

// One f32 row of the backward's dx.
void backward_row_f32(const float* x, const float* dy, const float* gamma, float m, float rs,
                      float* dx, int64_t c) {
  double sum_g = 0.0, sum_gx = 0.0;
#pragma omp simd reduction(+ : sum_g, sum_gx)
  for (int64_t j = 0; j < c; ++j) {
    const float g = gamma != nullptr ? dy[j] * gamma[j] : dy[j];
    sum_g += g;
    sum_gx += static_cast<double>(g) * ((x[j] - m) * rs);
  }
  const float mean_g = static_cast<float>(sum_g / static_cast<double>(c));
  const float mean_gx = static_cast<float>(sum_gx / static_cast<double>(c));
#pragma omp simd
  for (int64_t j = 0; j < c; ++j) {
    const float g = gamma != nullptr ? dy[j] * gamma[j] : dy[j];
    dx[j] = rs * (g - mean_g - (x[j] - m) * rs * mean_gx);
  }
}

}  // namespace

LayerNormResult layer_norm_forward(ExecContext& ctx, const Tensor& x, const Tensor& gamma,
                                   const Tensor& beta, double eps) {
  const int64_t c = check_x(x, kForward);
  check_param(gamma, x, c, kForward, "gamma");
  check_param(beta, x, c, kForward, "beta");
  STRATA_CHECK(eps >= 0.0) << kForward << ": eps must be >= 0, got " << eps;
  const int64_t rows = x.numel() / c;
  LayerNormResult r;
  r.y = Tensor::empty(x.shape(), x.dtype(), &ctx.allocator());
  r.mean = Tensor::empty({rows}, x.dtype(), &ctx.allocator());
  r.rstd = Tensor::empty({rows}, x.dtype(), &ctx.allocator());
  detail::dispatch_float(x.dtype(), kForward, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    const T* pg = gamma.defined() ? gamma.data<T>() : nullptr;
    const T* pb = beta.defined() ? beta.data<T>() : nullptr;
    T* py = r.y.data<T>();
    T* pmean = r.mean.data<T>();
    T* prstd = r.rstd.data<T>();
    detail::parallel_for(rows, std::max<int64_t>(1, 4096 / c), [&](int64_t r0, int64_t r1) {
      for (int64_t row = r0; row < r1; ++row) {
        const T* xr = px + row * c;  // (C,)
        T* yr = py + row * c;        // (C,)
        if constexpr (std::is_same_v<T, float>) {
          forward_row_f32(xr, pg, pb, yr, c, eps, pmean + row, prstd + row);
          continue;
        }
        double sum = 0.0;
        for (int64_t j = 0; j < c; ++j) sum += xr[j];
        const double mean = sum / static_cast<double>(c);
        double sq = 0.0;
        for (int64_t j = 0; j < c; ++j) {
          const double d = xr[j] - mean;
          sq += d * d;
        }
        const double rstd = 1.0 / std::sqrt(sq / static_cast<double>(c) + eps);
        pmean[row] = static_cast<T>(mean);
        prstd[row] = static_cast<T>(rstd);
        for (int64_t j = 0; j < c; ++j) {
          double v = (xr[j] - mean) * rstd;
          if (pg != nullptr) v *= pg[j];
          if (pb != nullptr) v += pb[j];
          yr[j] = static_cast<T>(v);
        }
      }
    });
  });
  return r;
}

Tensor layer_norm_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                           const Tensor& mean, const Tensor& rstd, const Tensor& dgamma,
                           const Tensor& dbeta) {
  const int64_t c = check_x(x, kBackward);
  const int64_t rows = x.numel() / c;
  detail::check_float(dy, kBackward, "dy");
  detail::check_same_dtype(dy, x, kBackward, "dy", "x");
  detail::check_shape(dy, x.shape(), kBackward, "dy");
  for (const auto& [t, name] : {std::pair{&mean, "mean"}, std::pair{&rstd, "rstd"}}) {
    detail::check_float(*t, kBackward, name);
    detail::check_same_dtype(*t, x, kBackward, name, "x");
    detail::check_shape(*t, {rows}, kBackward, name);
  }
  check_param(gamma, x, c, kBackward, "gamma");
  check_param(dgamma, x, c, kBackward, "dgamma");
  check_param(dbeta, x, c, kBackward, "dbeta");
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), &ctx.allocator());
  detail::dispatch_float(x.dtype(), kBackward, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    const T* pg = gamma.defined() ? gamma.data<T>() : nullptr;
    const T* pmean = mean.data<T>();
    const T* prstd = rstd.data<T>();
    T* pdx = dx.data<T>();
    detail::parallel_for(rows, std::max<int64_t>(1, 4096 / c), [&](int64_t r0, int64_t r1) {
      for (int64_t row = r0; row < r1; ++row) {
        const T* xr = px + row * c;    // (C,)
        const T* dyr = pdy + row * c;  // (C,)
        T* dxr = pdx + row * c;        // (C,)
        if constexpr (std::is_same_v<T, float>) {
          backward_row_f32(xr, dyr, pg, pmean[row], prstd[row], dxr, c);
          continue;
        }
        const double m = pmean[row], rs = prstd[row];
        double sum_g = 0.0, sum_gx = 0.0;
        for (int64_t j = 0; j < c; ++j) {
          const double g = pg != nullptr ? static_cast<double>(dyr[j]) * pg[j] : dyr[j];
          sum_g += g;
          sum_gx += g * (xr[j] - m) * rs;
        }
        const double mean_g = sum_g / static_cast<double>(c);
        const double mean_gx = sum_gx / static_cast<double>(c);
        for (int64_t j = 0; j < c; ++j) {
          const double g = pg != nullptr ? static_cast<double>(dyr[j]) * pg[j] : dyr[j];
          const double xhat = (xr[j] - m) * rs;
          dxr[j] = static_cast<T>(rs * (g - mean_g - xhat * mean_gx));
        }
      }
    });
    if (!dgamma.defined() && !dbeta.defined()) return;
    T* pdg = dgamma.defined() ? dgamma.data<T>() : nullptr;
    T* pdb = dbeta.defined() ? dbeta.data<T>() : nullptr;
    detail::parallel_for(c, 64, [&](int64_t c0, int64_t c1) {
      std::vector<double> acc_g(static_cast<size_t>(c1 - c0), 0.0);
      std::vector<double> acc_b(static_cast<size_t>(c1 - c0), 0.0);
      for (int64_t row = 0; row < rows; ++row) {
        const T* xr = px + row * c;
        const T* dyr = pdy + row * c;
        const double m = pmean[row], rs = prstd[row];
        double* ag = acc_g.data();
        double* ab = acc_b.data();
#pragma omp simd
        for (int64_t j = c0; j < c1; ++j) {
          ag[j - c0] += static_cast<double>(dyr[j]) * (xr[j] - m) * rs;
          ab[j - c0] += dyr[j];
        }
      }
      for (int64_t j = c0; j < c1; ++j) {
        if (pdg != nullptr) pdg[j] += static_cast<T>(acc_g[j - c0]);
        if (pdb != nullptr) pdb[j] += static_cast<T>(acc_b[j - c0]);
      }
    });
  });
  return dx;
}

}  // namespace strata::ops::cpu
