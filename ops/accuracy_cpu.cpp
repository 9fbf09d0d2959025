// PLACEHOLDER: replaced by the real kernels.
#include "ops/accuracy.h"

namespace strata::ops::cpu {

int64_t topk_correct(ExecContext& ctx, const Tensor& logits, const Tensor& targets, int64_t k, int64_t ignore_index) {
  STRATA_THROW() << "not implemented yet";
}

}  // namespace strata::ops::cpu
