// PLACEHOLDER: replaced by the real kernels.
#include "ops/shape_ops.h"

namespace strata::ops::cpu {

Tensor permute_copy(ExecContext& ctx, const Tensor& x, const std::vector<int64_t>& dims) {
  STRATA_THROW() << "not implemented yet";
}

Tensor concat(ExecContext& ctx, const TensorList& xs, int64_t dim) {
  STRATA_THROW() << "not implemented yet";
}

TensorList split(ExecContext& ctx, const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  STRATA_THROW() << "not implemented yet";
}

}  // namespace strata::ops::cpu
