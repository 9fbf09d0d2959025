// PLACEHOLDER: replaced by the real kernels.
#include "ops/elementwise.h"

namespace strata::ops::cpu {

Tensor add(ExecContext& ctx, const Tensor& a, const Tensor& b) {
  STRATA_THROW() << "not implemented yet";
}

Tensor mul(ExecContext& ctx, const Tensor& a, const Tensor& b) {
  STRATA_THROW() << "not implemented yet";
}

Tensor scale(ExecContext& ctx, const Tensor& x, double alpha) {
  STRATA_THROW() << "not implemented yet";
}

void add_(ExecContext& ctx, const Tensor& dst, const Tensor& src, double alpha) {
  STRATA_THROW() << "not implemented yet";
}

Tensor sum_to_shape(ExecContext& ctx, const Tensor& t, const Shape& shape) {
  STRATA_THROW() << "not implemented yet";
}

}  // namespace strata::ops::cpu
