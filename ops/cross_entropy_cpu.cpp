// PLACEHOLDER: replaced by the real kernels.
#include "ops/cross_entropy.h"

namespace strata::ops::cpu {

Tensor cross_entropy_forward(ExecContext& ctx, const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& options) {
  STRATA_THROW() << "not implemented yet";
}

Tensor cross_entropy_backward(ExecContext& ctx, const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& options, double dloss) {
  STRATA_THROW() << "not implemented yet";
}

}  // namespace strata::ops::cpu
