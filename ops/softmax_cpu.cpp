// PLACEHOLDER: replaced by the real kernels.
#include "ops/softmax.h"

namespace strata::ops::cpu {

Tensor softmax_forward(ExecContext& ctx, const Tensor& x) {
  STRATA_THROW() << "not implemented yet";
}

Tensor softmax_backward(ExecContext& ctx, const Tensor& dy, const Tensor& y) {
  STRATA_THROW() << "not implemented yet";
}

}  // namespace strata::ops::cpu
