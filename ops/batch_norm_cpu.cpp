// PLACEHOLDER: replaced by the real kernels.
#include "ops/batch_norm.h"

namespace strata::ops::cpu {

BatchNormTrainResult batch_norm_forward_train(ExecContext& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean, const Tensor& running_var, double momentum, double eps) {
  STRATA_THROW() << "not implemented yet";
}

Tensor batch_norm_forward_eval(ExecContext& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean, const Tensor& running_var, double eps) {
  STRATA_THROW() << "not implemented yet";
}

Tensor batch_norm_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& save_mean, const Tensor& save_invstd, const Tensor& dgamma, const Tensor& dbeta) {
  STRATA_THROW() << "not implemented yet";
}

}  // namespace strata::ops::cpu
