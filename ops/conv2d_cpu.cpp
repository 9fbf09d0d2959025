// PLACEHOLDER: replaced by the real kernels.
#include "ops/conv2d.h"

namespace strata::ops::cpu {

Tensor conv2d_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& params) {
  STRATA_THROW() << "not implemented yet";
}

Tensor conv2d_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& weight, const Conv2dParams& params, const Tensor& dweight, const Tensor& dbias, bool need_dx) {
  STRATA_THROW() << "not implemented yet";
}

}  // namespace strata::ops::cpu
