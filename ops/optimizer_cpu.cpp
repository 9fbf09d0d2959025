// PLACEHOLDER: replaced by the real kernels.
#include "ops/optimizer.h"

namespace strata::ops::cpu {

void sgd_step(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdOptions& options, int64_t step) {
  STRATA_THROW() << "not implemented yet";
}

void adamw_step(ExecContext& ctx, const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWOptions& options, int64_t step) {
  STRATA_THROW() << "not implemented yet";
}

double sum_of_squares(ExecContext& ctx, const Tensor& t) {
  STRATA_THROW() << "not implemented yet";
}

}  // namespace strata::ops::cpu
