// PLACEHOLDER: replaced by the real code.
#include "ops/optimizer.h"
#include "engine/check.h"

namespace strata::ops {

double global_grad_norm(ExecContext& ctx, const TensorList& grads) {
  STRATA_THROW() << "not implemented yet";
}

double clip_grad_norm(ExecContext& ctx, const TensorList& grads, double max_norm) {
  STRATA_THROW() << "not implemented yet";
}

}  // namespace strata::ops
