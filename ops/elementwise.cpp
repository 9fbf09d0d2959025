// PLACEHOLDER: replaced by the real code.
#include "ops/elementwise.h"
#include "engine/check.h"

namespace strata::ops {

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  STRATA_THROW() << "not implemented yet";
}

BinaryGrads add_backward(ExecContext& ctx, const Tensor& dy, const Shape& a_shape, const Shape& b_shape, bool need_da, bool need_db) {
  STRATA_THROW() << "not implemented yet";
}

BinaryGrads mul_backward(ExecContext& ctx, const Tensor& dy, const Tensor& a, const Tensor& b, bool need_da, bool need_db) {
  STRATA_THROW() << "not implemented yet";
}

}  // namespace strata::ops
