// PLACEHOLDER: replaced by the real kernels.
#include "ops/dropout.h"

namespace strata::ops::cpu {

DropoutResult dropout_forward(ExecContext& ctx, const Tensor& x, double p, const RngOffsets& rng) {
  STRATA_THROW() << "not implemented yet";
}

Tensor dropout_backward(ExecContext& ctx, const Tensor& dy, const Tensor& mask, double p) {
  STRATA_THROW() << "not implemented yet";
}

}  // namespace strata::ops::cpu
