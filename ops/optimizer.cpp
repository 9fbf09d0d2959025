// Device-independent parts of the optimizer ops: the global gradient norm and clipping, built on
// the public sum_of_squares, scale and add_, so that they run on every device with those kernels.
// Clipping scales in place without a copy op: s = coef g (scale), g -= g (exactly 0, the norm
// being finite), g += s. Writing it as g += (coef - 1) g instead would round coef - 1 and lose
// relative precision ~2^-24 / coef in f32 when the norm is far above max_norm. On CUDA the
// gradients are scaled by one in-place kernel (cuda::scale_inplace, optimizer_cuda.cu) instead.
#include "ops/optimizer.h"

#include <cmath>

#include "engine/check.h"
#include "ops/elementwise.h"

namespace strata::ops {

namespace detail {
namespace {
void check_hyper(bool ok, const char* op, const char* field, double value, const char* rule) {
  STRATA_CHECK(ok) << op << ": options." << field << " must be " << rule << ", got " << value;
}
}  // namespace

void check_sgd_options(const SgdOptions& o, const char* op) {
  check_hyper(o.lr >= 0 && std::isfinite(o.lr), op, "lr", o.lr, "finite and >= 0");
  check_hyper(o.momentum >= 0 && std::isfinite(o.momentum), op, "momentum", o.momentum,
              "finite and >= 0");
  check_hyper(std::isfinite(o.dampening), op, "dampening", o.dampening, "finite");
  check_hyper(o.weight_decay >= 0 && std::isfinite(o.weight_decay), op, "weight_decay",
              o.weight_decay, "finite and >= 0");
  check_hyper(std::isfinite(o.grad_scale), op, "grad_scale", o.grad_scale, "finite");
  STRATA_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0))
      << op << ": options.nesterov needs momentum > 0 and dampening == 0, got momentum "
      << o.momentum << " and dampening " << o.dampening;
}

void check_adamw_options(const AdamWOptions& o, const char* op) {
  check_hyper(o.lr >= 0 && std::isfinite(o.lr), op, "lr", o.lr, "finite and >= 0");
  check_hyper(o.beta1 >= 0 && o.beta1 < 1, op, "beta1", o.beta1, "in [0, 1)");
  check_hyper(o.beta2 >= 0 && o.beta2 < 1, op, "beta2", o.beta2, "in [0, 1)");
  check_hyper(o.eps >= 0 && std::isfinite(o.eps), op, "eps", o.eps, "finite and >= 0");
  check_hyper(o.weight_decay >= 0 && std::isfinite(o.weight_decay), op, "weight_decay",
              o.weight_decay, "finite and >= 0");
  check_hyper(std::isfinite(o.grad_scale), op, "grad_scale", o.grad_scale, "finite");
}

void check_adamw_vr_options(const AdamWVrOptions& o, const char* op) {
  check_adamw_options(o.adam, op);
  check_hyper(o.variance_scale > 0 && o.variance_scale <= 1, op, "variance_scale", o.variance_scale,
              "in (0, 1]");
}
}  // namespace detail

double global_grad_norm(ExecContext& ctx, const TensorList& grads) {
  double total = 0.0;
  for (const Tensor& g : grads) {
    if (g.defined()) total += sum_of_squares(ctx, g);
  }
  return std::sqrt(total);
}

double clip_coefficient(double norm, double max_norm) {
  STRATA_CHECK(max_norm > 0 && std::isfinite(max_norm))
      << "clip_grad_norm: max_norm must be finite and > 0, got " << max_norm;
  if (!std::isfinite(norm) || norm <= max_norm) return 1.0;
  return max_norm / (norm + 1e-6);
}

void scale_gradients(ExecContext& ctx, const TensorList& grads, double coef) {
  if (coef == 1.0) return;
  for (const Tensor& g : grads) {
    if (!g.defined()) continue;
#ifdef STRATA_WITH_CUDA
    if (ctx.device().is_cuda()) {  // one in-place kernel, same rounding as scale
      cuda::scale_inplace(ctx, g, coef);
      continue;
    }
#endif
    const Tensor scaled = scale(ctx, g, coef);
    add_(ctx, g, g, -1.0);
    add_(ctx, g, scaled, 1.0);
  }
}

double clip_grad_norm(ExecContext& ctx, const TensorList& grads, double max_norm) {
  const double norm = global_grad_norm(ctx, grads);
  scale_gradients(ctx, grads, clip_coefficient(norm, max_norm));
  return norm;
}

}  // namespace strata::ops
