// PLACEHOLDER: replaced by the real kernels.
#include "ops/attention.h"

namespace strata::ops::cpu {

AttentionResult attention_forward(ExecContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& key_padding_mask, const AttentionOptions& options) {
  STRATA_THROW() << "not implemented yet";
}

AttentionGrads attention_backward(ExecContext& ctx, const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& probs, const AttentionOptions& options) {
  STRATA_THROW() << "not implemented yet";
}

}  // namespace strata::ops::cpu
