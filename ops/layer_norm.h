// Layer normalization over the last dimension (C), with biased variance, as GPT-2 and BERT use.
#pragma once

#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata::ops {

struct LayerNormResult {
  Tensor y;     // like x
  Tensor mean;  // (rows,) with rows = numel / C: f32 for a bf16/f16 x, else x's dtype
  Tensor rstd;  // (rows,) 1 / sqrt(var + eps), like mean
};

// x: (..., C) with C > 0; gamma, beta: (C,) (either may be undefined: no scale / no shift); all
// of one dtype, f32 or f64 (bf16 and f16 too, as everywhere: on the CPU through f32 copies,
// ops/dispatch.cpp), contiguous. eps >= 0. The CPU accumulates the statistics in double. The
// saved statistics stay f32 under bf16/f16, as the frameworks keep them, so that the backward
// normalizes with the forward's unrounded values; backward takes them in that dtype.
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
// CUDA kernels: f32, bf16 and f16 (x, gamma, beta and the gradients of one dtype; mean and rstd
// f32).
namespace cuda {
LayerNormResult layer_norm_forward(ExecContext& ctx, const Tensor& x, const Tensor& gamma,
                                   const Tensor& beta, double eps);
Tensor layer_norm_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                           const Tensor& mean, const Tensor& rstd, const Tensor& dgamma,
                           const Tensor& dbeta);
}  // namespace cuda
}  // namespace strata::ops
