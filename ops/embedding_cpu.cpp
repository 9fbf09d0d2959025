// PLACEHOLDER: replaced by the real kernels.
#include "ops/embedding.h"

namespace strata::ops::cpu {

Tensor embedding_forward(ExecContext& ctx, const Tensor& ids, const Tensor& weight) {
  STRATA_THROW() << "not implemented yet";
}

void embedding_backward(ExecContext& ctx, const Tensor& dy, const Tensor& ids, const Tensor& dweight) {
  STRATA_THROW() << "not implemented yet";
}

}  // namespace strata::ops::cpu
