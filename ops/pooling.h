// 2-D pooling, NCHW: max, average and adaptive average.
#pragma once

#include <cstdint>

#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata::ops {

struct Pool2dParams {
  int64_t kernel_h = 2, kernel_w = 2;
  int64_t stride_h = 2, stride_w = 2;
  int64_t pad_h = 0, pad_w = 0;   // implicit padding on each side (at most half the kernel)
  bool ceil_mode = false;         // round the output size up instead of down (as PyTorch)
  bool count_include_pad = true;  // average pooling: padded zeros count in the divisor
};

// Output size of one spatial dimension, PyTorch's rule (with ceil_mode, the last window must
// start inside the input or its left padding). Throws strata::Error when the padding is more
// than half the kernel or the kernel is larger than the padded input.
int64_t pool2d_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, bool ceil_mode);

struct MaxPool2dResult {
  Tensor y;        // (B, C, OH, OW)
  Tensor indices;  // (B, C, OH, OW) i64: flat index h * W + w of the maximum in its (b, c) plane
};
// x: (B, C, H, W), f32 or f64. Padding counts as -infinity. Ties go to the first maximum in
// row-major window order; a NaN counts as a maximum (it propagates, as in PyTorch).
// count_include_pad is ignored.
MaxPool2dResult max_pool2d_forward(ExecContext& ctx, const Tensor& x, const Pool2dParams& params);
// dx: (B, C, H, W) = the gradient routed to each window's maximum (summed where windows overlap).
// dy and indices: (B, C, OH, OW) as the forward returned them; dx has dy's dtype.
Tensor max_pool2d_backward(ExecContext& ctx, const Tensor& dy, const Tensor& indices,
                           const Shape& x_shape);

// x: (B, C, H, W), f32 or f64; sums accumulate in double. The divisor is the window clipped to
// the padded input with count_include_pad (cells past the padding, which ceil_mode can add, do
// not count, as in PyTorch), else the window's cells inside the input.
Tensor avg_pool2d_forward(ExecContext& ctx, const Tensor& x, const Pool2dParams& params);
// dx: (B, C, H, W) = dy spread evenly over each window with the forward's divisor.
Tensor avg_pool2d_backward(ExecContext& ctx, const Tensor& dy, const Shape& x_shape,
                           const Pool2dParams& params);

// PyTorch's adaptive average pooling: output cell (i, j) averages input rows
// [floor(i H / OH), ceil((i + 1) H / OH)) and the same for columns.
Tensor adaptive_avg_pool2d_forward(ExecContext& ctx, const Tensor& x, int64_t out_h, int64_t out_w);
Tensor adaptive_avg_pool2d_backward(ExecContext& ctx, const Tensor& dy, const Shape& x_shape);

namespace cpu {
MaxPool2dResult max_pool2d_forward(ExecContext& ctx, const Tensor& x, const Pool2dParams& params);
Tensor max_pool2d_backward(ExecContext& ctx, const Tensor& dy, const Tensor& indices,
                           const Shape& x_shape);
Tensor avg_pool2d_forward(ExecContext& ctx, const Tensor& x, const Pool2dParams& params);
Tensor avg_pool2d_backward(ExecContext& ctx, const Tensor& dy, const Shape& x_shape,
                           const Pool2dParams& params);
Tensor adaptive_avg_pool2d_forward(ExecContext& ctx, const Tensor& x, int64_t out_h, int64_t out_w);
Tensor adaptive_avg_pool2d_backward(ExecContext& ctx, const Tensor& dy, const Shape& x_shape);
}  // namespace cpu

// CUDA kernels (ops/pooling_cuda.cu): f32, bf16 and f16, computing in f32. max_pool2d_backward
// skips out-of-plane indices instead of throwing (a kernel cannot report them without a sync).
namespace cuda {
MaxPool2dResult max_pool2d_forward(ExecContext& ctx, const Tensor& x, const Pool2dParams& params);
Tensor max_pool2d_backward(ExecContext& ctx, const Tensor& dy, const Tensor& indices,
                           const Shape& x_shape);
Tensor avg_pool2d_forward(ExecContext& ctx, const Tensor& x, const Pool2dParams& params);
Tensor avg_pool2d_backward(ExecContext& ctx, const Tensor& dy, const Shape& x_shape,
                           const Pool2dParams& params);
Tensor adaptive_avg_pool2d_forward(ExecContext& ctx, const Tensor& x, int64_t out_h, int64_t out_w);
Tensor adaptive_avg_pool2d_backward(ExecContext& ctx, const Tensor& dy, const Shape& x_shape);
}  // namespace cuda
}  // namespace strata::ops
