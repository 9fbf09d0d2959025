// PLACEHOLDER: replaced by the real kernels.
#include "ops/activation.h"

namespace strata::ops::cpu {

Tensor relu_forward(ExecContext& ctx, const Tensor& x) {
  STRATA_THROW() << "not implemented yet";
}

Tensor relu_backward(ExecContext& ctx, const Tensor& dy, const Tensor& y) {
  STRATA_THROW() << "not implemented yet";
}

Tensor gelu_forward(ExecContext& ctx, const Tensor& x) {
  STRATA_THROW() << "not implemented yet";
}

Tensor gelu_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x) {
  STRATA_THROW() << "not implemented yet";
}

}  // namespace strata::ops::cpu
