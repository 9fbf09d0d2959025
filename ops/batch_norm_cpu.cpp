// Batch normalization on the CPU (Ioffe & Szegedy 2015), x viewed as (B, C, S) with S the product
// of the spatial dimensions (1 for (B, C) input); statistics run over the N = B S values of each
// channel, one channel per loop iteration over OpenMP threads.
//
// Numerics: every sum (the statistics, and the backward's sum dy and sum dy (x - mean)) is
// accumulated in double, in vectorized double lanes over each (b, c) row of S values
// (plane_sum, plane_squared_deviation, plane_dy_sums), then over the rows: an f32 sum over a
// 224 x 224 plane would lose ~1e-4 relative. The variance takes two passes (mean, then the sum of
// squared deviations), avoiding the cancellation of a one-pass sum of squares when
// |mean| >> std. y = x scale + shift with scale = gamma invstd and shift = beta - mean scale
// folded in double and applied in x's dtype.
// Backward of the training forward, with xhat = (x - mean) invstd:
//   dbeta  = sum(dy),  dgamma = sum(dy xhat)
//   dx     = gamma invstd (dy - dbeta / N - xhat dgamma / N)
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/batch_norm.h"
#include "ops/cpu_util.h"

namespace strata::ops::cpu {
namespace {

struct BnGeometry {
  int64_t batch = 0, channels = 0, spatial = 1;
  int64_t per_channel() const { return batch * spatial; }  // N
};

BnGeometry bn_geometry(const char* op, const Tensor& x) {
  detail::check_float(x, op, "x");
  STRATA_CHECK(x.dim() >= 2 && x.size(1) > 0)
      << op << ": x must be (B, C) or (B, C, spatial...) with C > 0, got " << x.shape_str();
  BnGeometry g;
  g.batch = x.size(0);
  g.channels = x.size(1);
  for (int64_t d = 2; d < x.dim(); ++d) g.spatial *= x.size(d);
  return g;
}

// A per-channel (C,) tensor: gamma, beta, the running or the saved statistics.
void check_channel_tensor(const char* op, const Tensor& t, const char* name, const Tensor& x) {
  detail::check_float(t, op, name);
  detail::check_same_dtype(x, t, op, "x", name);
  detail::check_shape(t, {x.size(1)}, op, name);
}

void check_affine(const char* op, const Tensor& gamma, const Tensor& beta, const Tensor& x) {
  if (gamma.defined()) check_channel_tensor(op, gamma, "gamma", x);
  if (beta.defined()) check_channel_tensor(op, beta, "beta", x);
}

// Sum of v[0..n) and of (v - center)^2, in double lanes.
template <typename T>
double plane_sum(const T* v, int64_t n) {
  double acc = 0.0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(v[i]);
  return acc;
}

template <typename T>
double plane_squared_deviation(const T* v, int64_t n, double center) {
  double acc = 0.0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(v[i]) - center;
    acc += d * d;
  }
  return acc;
}

// sum dy and sum dy (x - center) over one plane, in double lanes.
template <typename T>
void plane_dy_sums(const T* dy, const T* x, int64_t n, double center, double* sum_dy,
                   double* sum_dy_xc) {
  double a = 0.0, b = 0.0;
#pragma omp simd reduction(+ : a, b)
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(dy[i]);
    a += d;
    b += d * (static_cast<double>(x[i]) - center);
  }
  *sum_dy += a;
  *sum_dy_xc += b;
}

int64_t channel_grain(const BnGeometry& g) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(g.per_channel(), 1));
}

}  // namespace

BatchNormTrainResult batch_norm_forward_train(ExecContext& ctx, const Tensor& x,
                                              const Tensor& gamma, const Tensor& beta,
                                              const Tensor& running_mean, const Tensor& running_var,
                                              double momentum, double eps) {
  constexpr const char* kOp = "batch_norm_forward_train";
  const BnGeometry g = bn_geometry(kOp, x);
  check_affine(kOp, gamma, beta, x);
  STRATA_CHECK(running_mean.defined() == running_var.defined())
      << kOp << ": running_mean and running_var must be both defined or both undefined";
  if (running_mean.defined()) {
    check_channel_tensor(kOp, running_mean, "running_mean", x);
    check_channel_tensor(kOp, running_var, "running_var", x);
  }
  STRATA_CHECK(momentum >= 0.0 && momentum <= 1.0 && eps >= 0.0)
      << kOp << ": need 0 <= momentum <= 1 and eps >= 0, got momentum " << momentum << ", eps "
      << eps;
  const int64_t n = g.per_channel();
  STRATA_CHECK_GT(n, 1) << kOp << ": x " << x.shape_str()
                        << " has one value per channel; training needs more than one";
  BatchNormTrainResult r;
  r.y = Tensor::empty(x.shape(), x.dtype(), &ctx.allocator());
  r.save_mean = Tensor::empty({g.channels}, x.dtype(), &ctx.allocator());
  r.save_invstd = Tensor::empty({g.channels}, x.dtype(), &ctx.allocator());
  detail::dispatch_float(x.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    const T* pg = gamma.defined() ? gamma.data<T>() : nullptr;
    const T* pb = beta.defined() ? beta.data<T>() : nullptr;
    T* prm = running_mean.defined() ? running_mean.data<T>() : nullptr;
    T* prv = running_var.defined() ? running_var.data<T>() : nullptr;
    T* py = r.y.data<T>();
    T* pmean = r.save_mean.data<T>();
    T* pinvstd = r.save_invstd.data<T>();
    detail::parallel_for(g.channels, channel_grain(g), [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double sum = 0.0;
        for (int64_t b = 0; b < g.batch; ++b) {
          sum += plane_sum(px + (b * g.channels + c) * g.spatial, g.spatial);
        }
        const double mean = sum / static_cast<double>(n);
        double m2 = 0.0;
        for (int64_t b = 0; b < g.batch; ++b) {
          m2 += plane_squared_deviation(px + (b * g.channels + c) * g.spatial, g.spatial, mean);
        }
        const double invstd = 1.0 / std::sqrt(m2 / static_cast<double>(n) + eps);
        pmean[c] = static_cast<T>(mean);
        pinvstd[c] = static_cast<T>(invstd);
        if (prm != nullptr) {
          prm[c] = static_cast<T>((1.0 - momentum) * prm[c] + momentum * mean);
          prv[c] = static_cast<T>((1.0 - momentum) * prv[c] +
                                  momentum * m2 / static_cast<double>(n - 1));
        }
        const double scale_d = invstd * (pg != nullptr ? static_cast<double>(pg[c]) : 1.0);
        const T scale = static_cast<T>(scale_d);
        const T shift =
            static_cast<T>((pb != nullptr ? static_cast<double>(pb[c]) : 0.0) - mean * scale_d);
        for (int64_t b = 0; b < g.batch; ++b) {
          const T* v = px + (b * g.channels + c) * g.spatial;
          T* out = py + (b * g.channels + c) * g.spatial;
#pragma omp simd
          for (int64_t i = 0; i < g.spatial; ++i) out[i] = v[i] * scale + shift;
        }
      }
    });
  });
  return r;
}

Tensor batch_norm_forward_eval(ExecContext& ctx, const Tensor& x, const Tensor& gamma,
                               const Tensor& beta, const Tensor& running_mean,
                               const Tensor& running_var, double eps) {
  constexpr const char* kOp = "batch_norm_forward_eval";
  const BnGeometry g = bn_geometry(kOp, x);
  check_affine(kOp, gamma, beta, x);
  STRATA_CHECK(running_mean.defined() && running_var.defined())
      << kOp << ": evaluation normalizes with running_mean and running_var; both must be defined";
  check_channel_tensor(kOp, running_mean, "running_mean", x);
  check_channel_tensor(kOp, running_var, "running_var", x);
  STRATA_CHECK_GE(eps, 0.0) << kOp << ": eps must be >= 0";
  Tensor y = Tensor::empty(x.shape(), x.dtype(), &ctx.allocator());
  detail::dispatch_float(x.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    // y = x scale + shift per channel, the constants folded in double.
    std::vector<double> scale(g.channels), shift(g.channels);
    const T* prm = running_mean.data<T>();
    const T* prv = running_var.data<T>();
    for (int64_t c = 0; c < g.channels; ++c) {
      const double gamma_c = gamma.defined() ? static_cast<double>(gamma.data<T>()[c]) : 1.0;
      const double beta_c = beta.defined() ? static_cast<double>(beta.data<T>()[c]) : 0.0;
      scale[c] = gamma_c / std::sqrt(static_cast<double>(prv[c]) + eps);
      shift[c] = beta_c - static_cast<double>(prm[c]) * scale[c];
    }
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const int64_t rows = g.batch * g.channels;  // one row of S values per (b, c)
    detail::parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(g.spatial, 1)),
                         [&](int64_t r0, int64_t r1) {
                           for (int64_t row = r0; row < r1; ++row) {
                             const int64_t c = row % g.channels;
                             const T* src = px + row * g.spatial;
                             T* dst = py + row * g.spatial;
                             for (int64_t s = 0; s < g.spatial; ++s) {
                               dst[s] = static_cast<T>(src[s] * scale[c] + shift[c]);
                             }
                           }
                         });
  });
  return y;
}

Tensor batch_norm_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                           const Tensor& save_mean, const Tensor& save_invstd, const Tensor& dgamma,
                           const Tensor& dbeta) {
  constexpr const char* kOp = "batch_norm_backward";
  const BnGeometry g = bn_geometry(kOp, x);
  detail::check_float(dy, kOp, "dy");
  detail::check_same_dtype(x, dy, kOp, "x", "dy");
  detail::check_shape(dy, x.shape(), kOp, "dy");
  if (gamma.defined()) check_channel_tensor(kOp, gamma, "gamma", x);
  check_channel_tensor(kOp, save_mean, "save_mean", x);
  check_channel_tensor(kOp, save_invstd, "save_invstd", x);
  if (dgamma.defined()) check_channel_tensor(kOp, dgamma, "dgamma", x);
  if (dbeta.defined()) check_channel_tensor(kOp, dbeta, "dbeta", x);
  const int64_t n = g.per_channel();
  STRATA_CHECK_GT(n, 1) << kOp << ": x " << x.shape_str()
                        << " has one value per channel; training needs more than one";
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), &ctx.allocator());
  detail::dispatch_float(x.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    const T* pg = gamma.defined() ? gamma.data<T>() : nullptr;
    const T* pmean = save_mean.data<T>();
    const T* pinvstd = save_invstd.data<T>();
    T* pdg = dgamma.defined() ? dgamma.data<T>() : nullptr;
    T* pdb = dbeta.defined() ? dbeta.data<T>() : nullptr;
    T* pdx = dx.data<T>();
    detail::parallel_for(g.channels, channel_grain(g), [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const T mean = pmean[c], invstd = pinvstd[c];
        double sum_dy = 0.0, sum_dy_xc = 0.0;  // sum dy, sum dy (x - mean)
        for (int64_t b = 0; b < g.batch; ++b) {
          const int64_t at = (b * g.channels + c) * g.spatial;
          plane_dy_sums(pdy + at, px + at, g.spatial, static_cast<double>(mean), &sum_dy,
                        &sum_dy_xc);
        }
        const double sum_dy_xhat = sum_dy_xc * static_cast<double>(invstd);
        if (pdb != nullptr) pdb[c] += static_cast<T>(sum_dy);
        if (pdg != nullptr) pdg[c] += static_cast<T>(sum_dy_xhat);
        // dx = scale (dy - mean_dy - xhat mean_dy_xhat) = a dy + b (x - mean) + k
        const double scale = invstd * (pg != nullptr ? static_cast<double>(pg[c]) : 1.0);
        const double mean_dy = sum_dy / static_cast<double>(n);
        const double mean_dy_xhat = sum_dy_xhat / static_cast<double>(n);
        const T a = static_cast<T>(scale);
        const T bx = static_cast<T>(-scale * mean_dy_xhat * invstd);
        const T k = static_cast<T>(-scale * mean_dy);
        for (int64_t b = 0; b < g.batch; ++b) {
          const int64_t at = (b * g.channels + c) * g.spatial;
          const T* d = pdy + at;
          const T* v = px + at;
          T* out = pdx + at;
#pragma omp simd
          for (int64_t i = 0; i < g.spatial; ++i) out[i] = a * d[i] + bx * (v[i] - mean) + k;
        }
      }
    });
  });
  return dx;
}

}  // namespace strata::ops::cpu
