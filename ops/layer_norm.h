// Layer normalization over the last dimension (C), with biased variance, as GPT-2 and BERT use.
#pragma once

#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata::ops {

struct LayerNormResult {
  Tensor y;     // like x
  Tensor mean;  // (rows,) with rows = numel / C, in x's dtype
  Tensor rstd;  // (rows,) 1 / sqrt(var + eps)
};

// x: (..., C) with C > 0; gamma, beta: (C,) (either may be undefined: no scale / no shift); all
// of one dtype, f32 or f64, contiguous. eps >= 0. The CPU accumulates the statistics in double.
LayerNormResult layer_norm_forward(ExecContext& ctx, const Tensor& x, const Tensor& gamma,
                                   const Tensor& beta, double eps);
// Returns dx; accumulates dgamma (+=) and dbeta (+=) when defined.
Tensor layer_norm_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                           const Tensor& mean, const Tensor& rstd, const Tensor& dgamma,
                           const Tensor& dbeta);

namespace cpu {
LayerNormResult layer_norm_forward(ExecContext& ctx, const Tensor& x, const Tensor& gamma,
                                   const Tensor& beta, double eps);
Tensor layer_norm_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                           const Tensor& mean, const Tensor& rstd, const Tensor& dgamma,
                           const Tensor& dbeta);
}  // namespace cpu
// CUDA kernels: f32, bf16 and f16, all tensors of one dtype (statistics in f32).
namespace cuda {
LayerNormResult layer_norm_forward(ExecContext& ctx, const Tensor& x, const Tensor& gamma,
                                   const Tensor& beta, double eps);
Tensor layer_norm_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                           const Tensor& mean, const Tensor& rstd, const Tensor& dgamma,
                           const Tensor& dbeta);
}  // namespace cuda
}  // namespace strata::ops
