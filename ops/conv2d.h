// 2-D convolution (cross-correlation, as in every framework), NCHW.
#pragma once

#include <cstdint>

#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata::ops {

struct Conv2dParams {
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;  // zero padding on each side
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;  // C and OC must both be divisible by groups
};

// Output size of one spatial dimension: (in + 2 pad - dilation (k - 1) - 1) / stride + 1.
// Throws strata::Error when the dilated kernel spans more than the padded input.
int64_t conv2d_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad,
                           int64_t dilation);

// y = conv2d(x, weight) + bias
//   x: (B, C, H, W), weight: (OC, C / groups, KH, KW), bias: (OC,) or undefined
//   y: (B, OC, OH, OW)
// f32 or f64, all tensors of one dtype; contiguous. The CPU kernel's scratch (bounded column
// buffers) comes from ctx.allocator() and counts toward its limit.
Tensor conv2d_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias,
                      const Conv2dParams& params);

// Returns dx (undefined when !need_dx); accumulates dweight (+=) and dbias (+=, the sum of dy
// over B, OH, OW); either may be undefined (not needed). dy: (B, OC, OH, OW), x's dtype.
Tensor conv2d_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& weight,
                       const Conv2dParams& params, const Tensor& dweight, const Tensor& dbias,
                       bool need_dx = true);

namespace cpu {
Tensor conv2d_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias,
                      const Conv2dParams& params);
Tensor conv2d_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& weight,
                       const Conv2dParams& params, const Tensor& dweight, const Tensor& dbias,
                       bool need_dx);

// The CPU's algorithms: kAuto picks by shape (Winograd F(4x4, 3x3) for float32 3x3 stride-1
// convolutions with at least 16 channels in and out, ops/conv2d_winograd_cpu.h; im2col + gemm
// otherwise); kIm2col always takes im2col. conv2d_forward/backward above are kAuto; tests and
// tools/bench/op_bench.cpp compare the two.
enum class Conv2dAlgo { kAuto, kIm2col };
Tensor conv2d_forward_with(ExecContext& ctx, const Tensor& x, const Tensor& weight,
                           const Tensor& bias, const Conv2dParams& params, Conv2dAlgo algo);
Tensor conv2d_backward_with(ExecContext& ctx, const Tensor& dy, const Tensor& x,
                            const Tensor& weight, const Conv2dParams& params, const Tensor& dweight,
                            const Tensor& dbias, bool need_dx, Conv2dAlgo algo);
}  // namespace cpu

// CUDA kernels (ops/conv2d_cuda.cu, cuDNN): f32, bf16 and f16 (fp32 accumulation); in a build
// without cuDNN they throw.
namespace cuda {
Tensor conv2d_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias,
                      const Conv2dParams& params);
Tensor conv2d_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& weight,
                       const Conv2dParams& params, const Tensor& dweight, const Tensor& dbias,
                       bool need_dx);
}  // namespace cuda
}  // namespace strata::ops
