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

// CUDA kernels (ops/embedding_cuda.cu): weight f32/bf16/f16. Ids are validated on the device (no
// synchronization): an id outside [0, V) prints the op, its position and V, and traps, which
// leaves the CUDA context unusable (as PyTorch's device-side asserts do). The backward is
// deterministic: ids are sorted (stable radix sort) and each distinct id's dy rows are summed in
// f32 in position order, then added once into dweight.
namespace cuda {
Tensor embedding_forward(ExecContext& ctx, const Tensor& ids, const Tensor& weight);
void embedding_backward(ExecContext& ctx, const Tensor& dy, const Tensor& ids,
                        const Tensor& dweight);
}  // namespace cuda
}  // namespace strata::ops
