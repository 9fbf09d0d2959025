// Device-independent parts of the element-wise ops: the broadcasting rule, and the backwards of
// add and mul, which are compositions of the public ops (mul, sum_to_shape) and so run on every
// device that has those kernels.
#include "ops/elementwise.h"

#include <algorithm>

#include "engine/check.h"

namespace strata::ops {

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const size_t ndim = std::max(a.size(), b.size());
  Shape out(ndim);
  for (size_t i = 0; i < ndim; ++i) {  // i counts from the last dimension
    const int64_t sa = i < a.size() ? a[a.size() - 1 - i] : 1;
    const int64_t sb = i < b.size() ? b[b.size() - 1 - i] : 1;
    STRATA_CHECK(sa == sb || sa == 1 || sb == 1)
        << "broadcast_shapes: shapes " << shape_str(a) << " and " << shape_str(b)
        << " cannot be broadcast: dimension -" << (i + 1) << " has sizes " << sa << " and " << sb
        << " (they must be equal or one of them 1)";
    out[ndim - 1 - i] = sa == 1 ? sb : sa;
  }
  return out;
}

namespace {

void check_upstream(const Tensor& dy, const Shape& a_shape, const Shape& b_shape, const char* op) {
  STRATA_CHECK(dy.defined()) << op << ": dy is undefined";
  const Shape y_shape = broadcast_shapes(a_shape, b_shape);
  STRATA_CHECK(dy.shape() == y_shape)
      << op << ": dy has shape " << dy.shape_str() << ", expected " << shape_str(y_shape)
      << " (the broadcast of a " << shape_str(a_shape) << " and b " << shape_str(b_shape) << ")";
}

}  // namespace

BinaryGrads add_backward(ExecContext& ctx, const Tensor& dy, const Shape& a_shape,
                         const Shape& b_shape, bool need_da, bool need_db) {
  check_upstream(dy, a_shape, b_shape, "add_backward");
  BinaryGrads grads;
  // sum_to_shape always returns a new tensor, so da and db never alias dy or each other.
  if (need_da) grads.da = sum_to_shape(ctx, dy, a_shape);
  if (need_db) grads.db = sum_to_shape(ctx, dy, b_shape);
  return grads;
}

BinaryGrads mul_backward(ExecContext& ctx, const Tensor& dy, const Tensor& a, const Tensor& b,
                         bool need_da, bool need_db) {
  STRATA_CHECK(a.defined() && b.defined()) << "mul_backward: a and b must be defined";
  check_upstream(dy, a.shape(), b.shape(), "mul_backward");
  BinaryGrads grads;
  if (need_da) grads.da = sum_to_shape(ctx, mul(ctx, dy, b), a.shape());
  if (need_db) grads.db = sum_to_shape(ctx, mul(ctx, dy, a), b.shape());
  return grads;
}

}  // namespace strata::ops
