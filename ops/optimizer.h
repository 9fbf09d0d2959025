// Optimizer updates and gradient clipping, as ops on (flat or per-parameter) contiguous buffers.
// PyTorch's update rules, so that results can be compared with it.
#pragma once

#include <cstdint>

#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata::ops {

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;      // needs momentum > 0 and dampening == 0
  double weight_decay = 0.0;  // L2, added to the gradient
  // The gradient is read as grad_scale * grad, rounded once in its dtype (the clipping
  // coefficient and the inverse loss scale, without a pass of their own over the gradients).
  double grad_scale = 1.0;
};

// g = grad_scale * grad + weight_decay * param
// buf = g on step 1, else momentum * buf + (1 - dampening) * g          (when momentum > 0)
// g = nesterov ? g + momentum * buf : buf                               (when momentum > 0)
// param -= lr * g
// param, grad, momentum_buf: same shape, f32/f64; momentum_buf may be undefined when
// momentum == 0. step counts from 1.
void sgd_step(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
              const SgdOptions& options, int64_t step);

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  // decoupled: param *= 1 - lr * weight_decay
  double grad_scale = 1.0;     // g = grad_scale * grad, as SgdOptions::grad_scale
};

// g = grad_scale * grad; param *= 1 - lr * wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// param -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps). step counts from 1.
void adamw_step(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& m,
                const Tensor& v, const AdamWOptions& options, int64_t step);

// The updates above, returning sum_of_squares(grad) of the gradient as given (before grad_scale):
// on the CPU read in the update's own pass over the gradient, elsewhere by sum_of_squares first.
// For an optimizer that does not need the norm before it updates (no clipping, no skipping of
// non-finite steps) but reports it.
double sgd_step_sq(ExecContext& ctx, const Tensor& param, const Tensor& grad,
                   const Tensor& momentum_buf, const SgdOptions& options, int64_t step);
double adamw_step_sq(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& m,
                     const Tensor& v, const AdamWOptions& options, int64_t step);
// Variance-reduced AdamW for replicas that average their weights but not their optimizer state
// (SDPipe Sec. 4, papers/sdpipe.md Sec. 2.9): each replica's second moment comes from its own
// gradients, N times noisier than the mean of N. An extra first moment m2 (EMA with beta2, as in
// the authors' kernel) gives the variance of the gradient, which is scaled by `variance_scale`
// (1/N) before it goes back into the second moment. With bias correction on every moment:
//   m = b1 m + (1 - b1) g;  m2 = b2 m2 + (1 - b2) g;  v = b2 v + (1 - b2) g^2
//   mh = m / (1 - b1^t);  m2h = m2 / (1 - b2^t);  vh = v / (1 - b2^t)
//   vs = m2h^2 + variance_scale * max(vh - m2h^2, 0)
//   param *= 1 - lr * wd;  param -= lr * mh / (sqrt(vs) + eps)
// So a constant gradient gives vs = vh, variance_scale = 1 gives AdamW (to rounding), and i.i.d.
// noise gives vs ~ mean^2 + var / N. step counts from 1.
struct AdamWVrOptions {
  AdamWOptions adam;
  double variance_scale = 1.0;  // 1/N, in (0, 1]
};
void adamw_vr_step(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& m,
                   const Tensor& v, const Tensor& m2, const AdamWVrOptions& options, int64_t step);

// The options' hyper-parameters, checked alike by every device's kernels (ops/optimizer.cpp);
// errors name `op`, the field and the rule.
namespace detail {
void check_sgd_options(const SgdOptions& options, const char* op);
void check_adamw_options(const AdamWOptions& options, const char* op);
void check_adamw_vr_options(const AdamWVrOptions& options, const char* op);
}  // namespace detail

// Sum of the squares of every element (accumulated in double).
double sum_of_squares(ExecContext& ctx, const Tensor& t);
// sqrt of the sum of squares of every element of every tensor (accumulated in double).
// Undefined entries (parameters without a gradient) are skipped.
double global_grad_norm(ExecContext& ctx, const TensorList& grads);
// max_norm / (norm + 1e-6) when norm > max_norm, else 1 (also for a non-finite norm); max_norm
// must be finite and > 0.
double clip_coefficient(double norm, double max_norm);
// Multiplies every gradient by coef in place, exactly as a single rounding of coef * g.
void scale_gradients(ExecContext& ctx, const TensorList& grads, double coef);
// When the global norm exceeds max_norm, scales every gradient by max_norm / (norm + 1e-6).
// Returns the norm before clipping (a non-finite norm leaves the gradients untouched).
// max_norm must be finite and > 0. Gradients are scaled in place (contiguous views are fine).
double clip_grad_norm(ExecContext& ctx, const TensorList& grads, double max_norm);

namespace cpu {
void sgd_step(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
              const SgdOptions& options, int64_t step);
void adamw_step(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& m,
                const Tensor& v, const AdamWOptions& options, int64_t step);
double sgd_step_sq(ExecContext& ctx, const Tensor& param, const Tensor& grad,
                   const Tensor& momentum_buf, const SgdOptions& options, int64_t step);
double adamw_step_sq(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& m,
                     const Tensor& v, const AdamWOptions& options, int64_t step);
void adamw_vr_step(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& m,
                   const Tensor& v, const Tensor& m2, const AdamWVrOptions& options, int64_t step);
double sum_of_squares(ExecContext& ctx, const Tensor& t);
}  // namespace cpu

// CUDA kernels (ops/optimizer_cuda.cu). sgd_step, adamw_step and adamw_vr_step: f32
// param/grad/state, one fused element-wise pass computing in double; options.grad_scale is applied
// by the dispatcher (scale_inplace on the gradient first), the kernels read grad as it is.
// sum_of_squares: f32/bf16/f16, accumulated in double, deterministic for a given device;
// synchronizes the stream to return the value. scale_inplace: t = float(coef) * t in t's dtype
// (f32/bf16/f16), as ops::scale rounds, for scale_gradients on CUDA tensors.
namespace cuda {
void sgd_step(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
              const SgdOptions& options, int64_t step);
void adamw_step(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& m,
                const Tensor& v, const AdamWOptions& options, int64_t step);
void adamw_vr_step(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& m,
                   const Tensor& v, const Tensor& m2, const AdamWVrOptions& options, int64_t step);
double sum_of_squares(ExecContext& ctx, const Tensor& t);
void scale_inplace(ExecContext& ctx, const Tensor& t, double coef);
}  // namespace cuda
}  // namespace strata::ops
