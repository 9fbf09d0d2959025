// Softmax over the last dimension (numerically stable: the row maximum is subtracted first).
// x: (..., C) f32 or f64, contiguous, C > 0. A row whose entries are all -inf (every position
// masked) gives zeros, not NaN.
#pragma once

#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata::ops {

Tensor softmax_forward(ExecContext& ctx, const Tensor& x);
// dx = y * (dy - sum(dy * y)) row by row (y is softmax's output).
Tensor softmax_backward(ExecContext& ctx, const Tensor& dy, const Tensor& y);

namespace cpu {
Tensor softmax_forward(ExecContext& ctx, const Tensor& x);
Tensor softmax_backward(ExecContext& ctx, const Tensor& dy, const Tensor& y);
}  // namespace cpu
// CUDA kernels: f32, bf16 and f16 (computed and accumulated in f32).
namespace cuda {
Tensor softmax_forward(ExecContext& ctx, const Tensor& x);
Tensor softmax_backward(ExecContext& ctx, const Tensor& dy, const Tensor& y);
}  // namespace cuda
}  // namespace strata::ops
