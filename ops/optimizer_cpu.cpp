// Optimizer updates and the squared norm on the CPU.
//
// Updates are element-wise and memory-bound. f32 tensors are updated in f32 arithmetic, as
// PyTorch's f32 optimizers compute, in vectorized loops; f64 tensors (the reference) in double.
// Scalar factors (bias corrections) are computed once in double and rounded once. The AdamW
// update is written as PyTorch writes it:
//   param -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps),
// which is the header's formula rearranged. options.grad_scale multiplies the gradient as it is
// read (rounded once in the gradient's dtype, as scale_gradients would).
// sum_of_squares adds fixed blocks of elements in double (vectorized lanes within a block) and
// then the block sums in order, so the result does not depend on the thread count. The *_sq
// updates compute the same sum of the gradient as stored, block by block, in the update's pass.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu_util.h"
#include "ops/optimizer.h"

namespace strata::ops::cpu {
namespace {

constexpr int64_t kGrain = 1 << 14;
constexpr int64_t kBlock = 1 << 12;  // elements per partial sum of sum_of_squares

// Sum of x^2 over [i0, i1) in double lanes.
template <typename T>
double block_sum_of_squares(const T* x, int64_t i0, int64_t i1) {
  double acc = 0.0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = i0; i < i1; ++i) acc += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return acc;
}

// Runs update(i0, i1) over [0, n) in blocks of kBlock over the threads; with `sq`, also the sum of
// squares of `g` over the same blocks (the partial sums added in block order).
template <typename T, typename F>
void blocked_update(int64_t n, const T* g, double* sq, F update) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(sq != nullptr ? static_cast<size_t>(blocks) : 0, 0.0);
  detail::parallel_for(blocks, std::max<int64_t>(1, kGrain / kBlock), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t i0 = b * kBlock, i1 = std::min(n, i0 + kBlock);
      if (sq != nullptr) partial[b] = block_sum_of_squares(g, i0, i1);
      update(i0, i1);
    }
  });
  if (sq == nullptr) return;
  double total = 0.0;
  for (double s : partial) total += s;
  *sq = total;
}

// A state or gradient tensor that must match param in shape and dtype.
void check_like_param(const Tensor& t, const Tensor& param, const char* op, const char* name) {
  detail::check_float(t, op, name);
  detail::check_same_dtype(t, param, op, name, "param");
  detail::check_shape(t, param.shape(), op, name);
}

}  // namespace

namespace {

void sgd_update(ExecContext& ctx, const Tensor& param, const Tensor& grad,
                const Tensor& momentum_buf, const SgdOptions& options, int64_t step, double* sq) {
  constexpr const char* kOp = "sgd_step";
  detail::check_float(param, kOp, "param");
  check_like_param(grad, param, kOp, "grad");
  STRATA_CHECK_GE(step, 1) << kOp << ": step counts from 1";
  const double lr = options.lr, mom = options.momentum, damp = options.dampening;
  const double wd = options.weight_decay;
  detail::check_sgd_options(options, kOp);
  const bool use_momentum = mom > 0;
  if (use_momentum) check_like_param(momentum_buf, param, kOp, "momentum_buf");
  const bool first = step == 1;
  detail::dispatch_float(param.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    T* buf = use_momentum ? momentum_buf.data<T>() : nullptr;
    // In T: f32 in f32, as PyTorch; f64 in double.
    const T gs = static_cast<T>(options.grad_scale), twd = static_cast<T>(wd);
    const T tmom = static_cast<T>(mom), tdamp = static_cast<T>(1.0 - damp);
    const T tlr = static_cast<T>(lr);
    const bool nesterov = options.nesterov;
    blocked_update(param.numel(), g, sq, [&](int64_t i0, int64_t i1) {
      if (!use_momentum) {
#pragma omp simd
        for (int64_t i = i0; i < i1; ++i) p[i] -= tlr * (g[i] * gs + twd * p[i]);
        return;
      }
#pragma omp simd
      for (int64_t i = i0; i < i1; ++i) {
        const T d = g[i] * gs + twd * p[i];
        const T b = first ? d : tmom * buf[i] + tdamp * d;
        buf[i] = b;
        p[i] -= tlr * (nesterov ? d + tmom * b : b);
      }
    });
  });
}

void adamw_update(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& m,
                  const Tensor& v, const AdamWOptions& options, int64_t step, double* sq) {
  constexpr const char* kOp = "adamw_step";
  detail::check_float(param, kOp, "param");
  check_like_param(grad, param, kOp, "grad");
  check_like_param(m, param, kOp, "m");
  check_like_param(v, param, kOp, "v");
  STRATA_CHECK_GE(step, 1) << kOp << ": step counts from 1";
  const double lr = options.lr, b1 = options.beta1, b2 = options.beta2, eps = options.eps;
  const double wd = options.weight_decay;
  detail::check_adamw_options(options, kOp);
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
    const T gs = static_cast<T>(options.grad_scale);
    const T tb1 = static_cast<T>(b1), tb2 = static_cast<T>(b2);
    const T ob1 = static_cast<T>(1.0 - b1), ob2 = static_cast<T>(1.0 - b2);
    const T tstep = static_cast<T>(step_size), tbc2 = static_cast<T>(bc2_sqrt);
    const T teps = static_cast<T>(eps), tdecay = static_cast<T>(decay);
    blocked_update(param.numel(), g, sq, [&](int64_t i0, int64_t i1) {
#pragma omp simd
      for (int64_t i = i0; i < i1; ++i) {
        const T gi = g[i] * gs;
        const T mi = tb1 * pm[i] + ob1 * gi;
        const T vi = tb2 * pv[i] + ob2 * gi * gi;
        pm[i] = mi;
        pv[i] = vi;
        p[i] = p[i] * tdecay - tstep * mi / (std::sqrt(vi) / tbc2 + teps);
      }
    });
  });
}

}  // namespace

void sgd_step(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
              const SgdOptions& options, int64_t step) {
  sgd_update(ctx, param, grad, momentum_buf, options, step, nullptr);
}

double sgd_step_sq(ExecContext& ctx, const Tensor& param, const Tensor& grad,
                   const Tensor& momentum_buf, const SgdOptions& options, int64_t step) {
  double sq = 0.0;
  sgd_update(ctx, param, grad, momentum_buf, options, step, &sq);
  return sq;
}

void adamw_step(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& m,
                const Tensor& v, const AdamWOptions& options, int64_t step) {
  adamw_update(ctx, param, grad, m, v, options, step, nullptr);
}

double adamw_step_sq(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& m,
                     const Tensor& v, const AdamWOptions& options, int64_t step) {
  double sq = 0.0;
  adamw_update(ctx, param, grad, m, v, options, step, &sq);
  return sq;
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
  detail::check_adamw_vr_options(options, kOp);
  // In T arithmetic with the factors rounded once, as adamw_update: m and v are AdamW's bit for
  // bit.
  const double t = static_cast<double>(step);
  const double step_size = lr / (1.0 - std::pow(b1, t));
  const double inv_bc2 = 1.0 / (1.0 - std::pow(b2, t));
  const double decay = 1.0 - lr * wd;
  detail::dispatch_float(param.dtype(), kOp, [&](auto tag) {
    using T = decltype(tag);
    T* p = param.data<T>();
    const T* g = grad.data<T>();
    T* pm = m.data<T>();
    T* pv = v.data<T>();
    T* pm2 = m2.data<T>();
    const T tb1 = static_cast<T>(b1), tb2 = static_cast<T>(b2);
    const T ob1 = static_cast<T>(1.0 - b1), ob2 = static_cast<T>(1.0 - b2);
    const T tstep = static_cast<T>(step_size), tinv = static_cast<T>(inv_bc2);
    const T teps = static_cast<T>(eps), tdecay = static_cast<T>(decay);
    const T tscale = static_cast<T>(scale);
    detail::parallel_for(param.numel(), kGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const T gi = g[i];
        const T mi = tb1 * pm[i] + ob1 * gi;
        const T m2i = tb2 * pm2[i] + ob2 * gi;
        const T vi = tb2 * pv[i] + ob2 * gi * gi;
        pm[i] = mi;
        pm2[i] = m2i;
        pv[i] = vi;
        const T mean = m2i * tinv, second = vi * tinv;
        const T vs = mean * mean + tscale * std::max(second - mean * mean, T(0));
        p[i] = p[i] * tdecay - tstep * mi / (std::sqrt(vs) + teps);
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
            partial[b] = block_sum_of_squares(x, b * kBlock, std::min(n, (b + 1) * kBlock));
          }
        });
  });
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

}  // namespace strata::ops::cpu
