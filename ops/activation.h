// Element-wise activations.
//
// GELU is the tanh form GPT-2 uses:
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
#pragma once

#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata::ops {

Tensor relu_forward(ExecContext& ctx, const Tensor& x);
// dx = dy where y > 0, else 0 (y is relu's output).
Tensor relu_backward(ExecContext& ctx, const Tensor& dy, const Tensor& y);

Tensor gelu_forward(ExecContext& ctx, const Tensor& x);
// dx = dy * gelu'(x) (x is gelu's input).
Tensor gelu_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x);

namespace cpu {
Tensor relu_forward(ExecContext& ctx, const Tensor& x);
Tensor relu_backward(ExecContext& ctx, const Tensor& dy, const Tensor& y);
Tensor gelu_forward(ExecContext& ctx, const Tensor& x);
Tensor gelu_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x);
}  // namespace cpu
// CUDA kernels: f32, bf16 and f16 (computed in f32).
namespace cuda {
Tensor relu_forward(ExecContext& ctx, const Tensor& x);
Tensor relu_backward(ExecContext& ctx, const Tensor& dy, const Tensor& y);
Tensor gelu_forward(ExecContext& ctx, const Tensor& x);
Tensor gelu_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x);
}  // namespace cuda
}  // namespace strata::ops
