// Embedding lookup: y[..., :] = weight[ids[...], :].
#pragma once

#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata::ops {

// ids: any shape, i32 or i64, each in [0, V) (an id outside names itself, its position and V);
// weight: (V, C) f32 or f64 -> y: (ids.shape..., C) in weight's dtype. Every id is checked before
// anything is written.
Tensor embedding_forward(ExecContext& ctx, const Tensor& ids, const Tensor& weight);
// dweight[ids[i], :] += dy[i, :] (dweight: (V, C)). Ids are not differentiable.
void embedding_backward(ExecContext& ctx, const Tensor& dy, const Tensor& ids,
                        const Tensor& dweight);

namespace cpu {
Tensor embedding_forward(ExecContext& ctx, const Tensor& ids, const Tensor& weight);
void embedding_backward(ExecContext& ctx, const Tensor& dy, const Tensor& ids,
                        const Tensor& dweight);
}  // namespace cpu
}  // namespace strata::ops
