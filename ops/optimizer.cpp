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
