// Optimizer updates and the squared norm on the CPU.
//
// Updates are element-wise and memory-bound: each element's update is computed in double from
// the stored values and rounded once per stored tensor, and state that the rule reuses (the
// momentum buffer, Adam's moments) is read back as stored, so f32 results follow PyTorch's f32
// arithmetic to within rounding. Scalar factors (bias corrections) are computed once in double.
// The AdamW update is written as PyTorch writes it:
//   param -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps),
// which is the header's formula rearranged.
// sum_of_squares adds fixed blocks of elements in double and then the block sums in order, so
// the result does not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu_util.h"
#include "ops/optimizer.h"

namespace strata::ops::cpu {
namespace {

constexpr int64_t kGrain = 1 << 14;
constexpr int64_t kBlock = 1 << 12;  // elements per partial sum of sum_of_squares

// A state or gradient tensor that must match param in shape and dtype.
void check_like_param(const Tensor& t, const Tensor& param, const char* op, const char* name) {
  detail::check_float(t, op, name);
  detail::check_same_dtype(t, param, op, name, "param");
  detail::check_shape(t, param.shape(), op, name);
}

void check_hyper(bool ok, const char* op, const char* field, double value, const char* rule) {
  STRATA_CHECK(ok) << op << ": options." << field << " must be " << rule << ", got " << value;
}

}  // namespace

void sgd_step(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
              const SgdOptions& options, int64_t step) {
  constexpr const char* kOp = "sgd_step";
  detail::check_float(param, kOp, "param");
  check_like_param(grad, param, kOp, "grad");
  STRATA_CHECK_GE(step, 1) << kOp << ": step counts from 1";
  const double lr = options.lr, mom = options.momentum, damp = options.dampening;
  const double wd = options.weight_decay;
  check_hyper(lr >= 0 && std::isfinite(lr), kOp, "lr", lr, "finite and >= 0");
  check_hyper(mom >= 0 && std::isfinite(mom), kOp, "momentum", mom, "finite and >= 0");
  check_hyper(std::isfinite(damp), kOp, "dampening", damp, "finite");
  check_hyper(wd >= 0 && std::isfinite(wd), kOp, "weight_decay", wd, "finite and >= 0");
  STRATA_CHECK(!options.nesterov || (mom > 0 && damp == 0))
      << kOp << ": options.nesterov needs momentum > 0 and dampening == 0, got momentum " << mom
      << " and dampening " << damp;
  const bool use_momentum = mom > 0;
  if (use_momentum) check_like_param(momentum_buf, param, kOp, "momentum_buf");
  const bool first = step == 1;
  detail::dispatch_float(param.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    T* buf = use_momentum ? momentum_buf.data<T>() : nullptr;
    detail::parallel_for(param.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        double d = static_cast<double>(g[i]) + wd * static_cast<double>(p[i]);
        if (use_momentum) {
          const T b =
              static_cast<T>(first ? d : mom * static_cast<double>(buf[i]) + (1.0 - damp) * d);
          buf[i] = b;
          d = options.nesterov ? d + mom * static_cast<double>(b) : static_cast<double>(b);
        }
        p[i] = static_cast<T>(static_cast<double>(p[i]) - lr * d);
      }
    });
  });
}

void adamw_step(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& m,
                const Tensor& v, const AdamWOptions& options, int64_t step) {
  constexpr const char* kOp = "adamw_step";
  detail::check_float(param, kOp, "param");
  check_like_param(grad, param, kOp, "grad");
  check_like_param(m, param, kOp, "m");
  check_like_param(v, param, kOp, "v");
  STRATA_CHECK_GE(step, 1) << kOp << ": step counts from 1";
  const double lr = options.lr, b1 = options.beta1, b2 = options.beta2, eps = options.eps;
  const double wd = options.weight_decay;
  check_hyper(lr >= 0 && std::isfinite(lr), kOp, "lr", lr, "finite and >= 0");
  check_hyper(b1 >= 0 && b1 < 1, kOp, "beta1", b1, "in [0, 1)");
  check_hyper(b2 >= 0 && b2 < 1, kOp, "beta2", b2, "in [0, 1)");
  check_hyper(eps >= 0 && std::isfinite(eps), kOp, "eps", eps, "finite and >= 0");
  check_hyper(wd >= 0 && std::isfinite(wd), kOp, "weight_decay", wd, "finite and >= 0");
  const double t = static_cast<double>(step);
  const double step_size = lr / (1.0 - std::pow(b1, t));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(b2, t));
  const double decay = 1.0 - lr * wd;
  detail::dispatch_float(param.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    T* pm = m.data<T>();
    T* pv = v.data<T>();
    detail::parallel_for(param.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const double gi = g[i];
        const T mi = static_cast<T>(b1 * static_cast<double>(pm[i]) + (1.0 - b1) * gi);
        const T vi = static_cast<T>(b2 * static_cast<double>(pv[i]) + (1.0 - b2) * gi * gi);
        pm[i] = mi;
        pv[i] = vi;
        const double denom = std::sqrt(static_cast<double>(vi)) / bc2_sqrt + eps;
        p[i] = static_cast<T>(static_cast<double>(p[i]) * decay -
                              step_size * static_cast<double>(mi) / denom);
      }
    });
  });
}

void adamw_vr_step(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& m,
                   const Tensor& v, const Tensor& m2, const AdamWVrOptions& options, int64_t step) {
  constexpr const char* kOp = "adamw_vr_step";
  detail::check_float(param, kOp, "param");
  check_like_param(grad, param, kOp, "grad");
  check_like_param(m, param, kOp, "m");
  check_like_param(v, param, kOp, "v");
  check_like_param(m2, param, kOp, "m2");
  STRATA_CHECK_GE(step, 1) << kOp << ": step counts from 1";
  const AdamWOptions& a = options.adam;
  const double lr = a.lr, b1 = a.beta1, b2 = a.beta2, eps = a.eps, wd = a.weight_decay;
  const double scale = options.variance_scale;
  check_hyper(lr >= 0 && std::isfinite(lr), kOp, "lr", lr, "finite and >= 0");
  check_hyper(b1 >= 0 && b1 < 1, kOp, "beta1", b1, "in [0, 1)");
  check_hyper(b2 >= 0 && b2 < 1, kOp, "beta2", b2, "in [0, 1)");
  check_hyper(eps >= 0 && std::isfinite(eps), kOp, "eps", eps, "finite and >= 0");
  check_hyper(wd >= 0 && std::isfinite(wd), kOp, "weight_decay", wd, "finite and >= 0");
  check_hyper(scale > 0 && scale <= 1, kOp, "variance_scale", scale, "in (0, 1]");
  const double t = static_cast<double>(step);
  const double bc1 = 1.0 - std::pow(b1, t), bc2 = 1.0 - std::pow(b2, t);
  const double decay = 1.0 - lr * wd;
  detail::dispatch_float(param.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    T* pm = m.data<T>();
    T* pv = v.data<T>();
    T* pm2 = m2.data<T>();
    detail::parallel_for(param.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const double gi = g[i];
        const T mi = static_cast<T>(b1 * static_cast<double>(pm[i]) + (1.0 - b1) * gi);
        const T m2i = static_cast<T>(b2 * static_cast<double>(pm2[i]) + (1.0 - b2) * gi);
        const T vi = static_cast<T>(b2 * static_cast<double>(pv[i]) + (1.0 - b2) * gi * gi);
        pm[i] = mi;
        pm2[i] = m2i;
        pv[i] = vi;
        const double mean = static_cast<double>(m2i) / bc2;
        const double second = static_cast<double>(vi) / bc2;
        const double vs = mean * mean + scale * std::max(second - mean * mean, 0.0);
        p[i] = static_cast<T>(static_cast<double>(p[i]) * decay -
                              lr * (static_cast<double>(mi) / bc1) / (std::sqrt(vs) + eps));
      }
    });
  });
}

double sum_of_squares(ExecContext& ctx, const Tensor& t) {
  constexpr const char* kOp = "sum_of_squares";
  detail::check_float(t, kOp, "t");
  const int64_t n = t.numel();
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
  detail::dispatch_float(t.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    const T* x = t.data<T>();
    detail::parallel_for(
        blocks, std::max<int64_t>(1, kGrain / kBlock), [&](int64_t b0, int64_t b1) {
          for (int64_t b = b0; b < b1; ++b) {
            double acc = 0.0;
            for (int64_t i = b * kBlock, end = std::min(n, i + kBlock); i < end; ++i) {
              const double xi = x[i];
              acc += xi * xi;
            }
            partial[b] = acc;
          }
        });
  });
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

}  // namespace strata::ops::cpu
