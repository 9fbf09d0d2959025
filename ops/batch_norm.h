// Batch normalization over (B, C, ...) with per-channel statistics (dimension 1 is the channel).
//
// Training: normalize with the batch's mean and biased variance; update the running statistics
// in place as running = (1 - momentum) running + momentum batch, with the *unbiased* batch
// variance for running_var (PyTorch's convention). Evaluation: normalize with the running
// statistics. Inside a pipeline the "batch" is the micro-batch.
#pragma once

#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata::ops {

struct BatchNormTrainResult {
  Tensor y;            // like x
  Tensor save_mean;    // (C,) batch mean, in the statistics dtype (below)
  Tensor save_invstd;  // (C,) 1 / sqrt(batch var + eps), likewise
};

// The dtype of the statistics (save_mean, save_invstd, running_mean, running_var) for an x of
// dtype `x`: f32 for bf16 and f16 (the frameworks keep batch-norm statistics in f32 under mixed
// precision: rounding a running variance to 8 mantissa bits every step loses the update), else x's.
DType batch_norm_stat_dtype(DType x);

// x: (B, C) or (B, C, ...spatial); gamma, beta: (C,) in x's dtype; running_mean, running_var:
// (C,) in batch_norm_stat_dtype(x). f32 or f64 (bf16 and f16 too: on the CPU through f32 copies,
// ops/dispatch.cpp). Statistics accumulate in double. gamma/beta may be undefined (no affine
// transform). running_mean/running_var may be undefined together (no running statistics kept);
// otherwise they are updated in place.
// Training needs more than one value per channel (B x spatial > 1) and 0 <= momentum <= 1.
BatchNormTrainResult batch_norm_forward_train(ExecContext& ctx, const Tensor& x,
                                              const Tensor& gamma, const Tensor& beta,
                                              const Tensor& running_mean, const Tensor& running_var,
                                              double momentum, double eps);
// Evaluation: running_mean and running_var must be defined.
Tensor batch_norm_forward_eval(ExecContext& ctx, const Tensor& x, const Tensor& gamma,
                               const Tensor& beta, const Tensor& running_mean,
                               const Tensor& running_var, double eps);
// Backward of the training-mode forward (save_mean, save_invstd as it returned them). Returns dx;
// accumulates dgamma (+=) and dbeta (+=), in x's dtype, when defined.
Tensor batch_norm_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                           const Tensor& save_mean, const Tensor& save_invstd, const Tensor& dgamma,
                           const Tensor& dbeta);

namespace cpu {
BatchNormTrainResult batch_norm_forward_train(ExecContext& ctx, const Tensor& x,
                                              const Tensor& gamma, const Tensor& beta,
                                              const Tensor& running_mean, const Tensor& running_var,
                                              double momentum, double eps);
Tensor batch_norm_forward_eval(ExecContext& ctx, const Tensor& x, const Tensor& gamma,
                               const Tensor& beta, const Tensor& running_mean,
                               const Tensor& running_var, double eps);
Tensor batch_norm_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                           const Tensor& save_mean, const Tensor& save_invstd, const Tensor& dgamma,
                           const Tensor& dbeta);
}  // namespace cpu

// CUDA kernels (ops/batch_norm_cuda.cu): f32, bf16 and f16 (statistics f32), merged in double.
namespace cuda {
BatchNormTrainResult batch_norm_forward_train(ExecContext& ctx, const Tensor& x,
                                              const Tensor& gamma, const Tensor& beta,
                                              const Tensor& running_mean, const Tensor& running_var,
                                              double momentum, double eps);
Tensor batch_norm_forward_eval(ExecContext& ctx, const Tensor& x, const Tensor& gamma,
                               const Tensor& beta, const Tensor& running_mean,
                               const Tensor& running_var, double eps);
Tensor batch_norm_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& gamma,
                           const Tensor& save_mean, const Tensor& save_invstd, const Tensor& dgamma,
                           const Tensor& dbeta);
}  // namespace cuda
}  // namespace strata::ops
