// PLACEHOLDER: replaced by the real kernels.
#include "ops/pooling.h"

namespace strata::ops::cpu {

MaxPool2dResult max_pool2d_forward(ExecContext& ctx, const Tensor& x, const Pool2dParams& params) {
  STRATA_THROW() << "not implemented yet";
}

Tensor max_pool2d_backward(ExecContext& ctx, const Tensor& dy, const Tensor& indices, const Shape& x_shape) {
  STRATA_THROW() << "not implemented yet";
}

Tensor avg_pool2d_forward(ExecContext& ctx, const Tensor& x, const Pool2dParams& params) {
  STRATA_THROW() << "not implemented yet";
}

Tensor avg_pool2d_backward(ExecContext& ctx, const Tensor& dy, const Shape& x_shape, const Pool2dParams& params) {
  STRATA_THROW() << "not implemented yet";
}

Tensor adaptive_avg_pool2d_forward(ExecContext& ctx, const Tensor& x, int64_t out_h, int64_t out_w) {
  STRATA_THROW() << "not implemented yet";
}

Tensor adaptive_avg_pool2d_backward(ExecContext& ctx, const Tensor& dy, const Shape& x_shape) {
  STRATA_THROW() << "not implemented yet";
}

}  // namespace strata::ops::cpu
