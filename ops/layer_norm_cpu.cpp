// PLACEHOLDER: replaced by the real kernels.
#include "ops/layer_norm.h"

namespace strata::ops::cpu {

LayerNormResult layer_norm_forward(ExecContext& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  STRATA_THROW() << "not implemented yet";
}

Tensor layer_norm_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd, const Tensor& dgamma, const Tensor& dbeta) {
  STRATA_THROW() << "not implemented yet";
}

}  // namespace strata::ops::cpu
