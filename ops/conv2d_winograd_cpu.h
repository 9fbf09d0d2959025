// Winograd F(4x4, 3x3) convolution on the CPU for float32 3x3 stride-1 convolutions (Lavin and
// Gray, "Fast Algorithms for Convolutional Neural Networks", 2016). ops/conv2d_cpu.cpp routes the
// convolutions that `winograd::takes` accepts here; everything else (float64 included, so the
// reference path stays exact im2col) goes through im2col + gemm.
//
// Each output tile of 4 x 4 reads a 6 x 6 input tile; with the transforms
//   V = BT d BT^T  (input tile),  U = G g G^T  (kernel),  Y = AT M AT^T  (output tile)
// the convolution is 36 independent matrix products M[xi] (OC, T) = U[xi] (OC, C) V[xi] (C, T)
// over the T tiles of a chunk of images. The backward passes are the adjoint of that computation
// (exact gradients of the f32 Winograd forward):
//   dM = AT^T dY AT,  dU[xi] += dM[xi] V[xi]^T,  dV[xi] = U[xi]^T dM[xi],
//   dx += scatter(BT^T dV BT),  dweight += G^T dU G.
// f32 rounding error is larger than im2col's (the transforms take sums of up to 36 terms with
// coefficients up to 25): about 1e-5 relative to the output's scale at 64-512 channels, where
// im2col is about 1e-6 (tests/ops/test_conv2d_winograd.cpp measures both against float64).
#pragma once

#include "engine/exec_context.h"
#include "engine/tensor.h"
#include "ops/conv2d.h"

namespace strata::ops::cpu::winograd {

// Whether conv2d on the CPU takes the Winograd path for these arguments (already validated by
// the caller): float32, 3x3 kernel, stride 1, dilation 1, one group, padding at most 2, at least
// 16 channels on both sides and an output of at least 4 x 4 (below these im2col was faster).
bool takes(const Tensor& x, const Tensor& weight, const Conv2dParams& p);

// y (B, OC, OH, OW), every element written; bias may be null.
void forward(ExecContext& ctx, const Tensor& x, const Tensor& weight, const float* bias,
             const Conv2dParams& p, Tensor& y);

// dweight += the weight gradient (when dweight is non-null); dx = the input gradient (when dx is
// non-null; every element written). The bias gradient is the caller's.
void backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& weight,
              const Conv2dParams& p, float* dweight, float* dx);

}  // namespace strata::ops::cpu::winograd
