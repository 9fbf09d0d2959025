// Memory layouts of images: NCHW (contiguous (N, C, H, W): the CPU's layout, the checkpoint and
// exchange format) and channels-last, NHWC (the CUDA convolutions' layout: cuDNN's tensor-core
// kernels read NHWC, so the CUDA image ops pass activations along in it, ops/conv2d.h).
//
// A channels-last tensor keeps the logical shape (N, C, H, W) and indexing of every other tensor;
// only its memory is (N, H, W, C): strides (H W C, 1, W C, C), the view permute({0, 3, 1, 2}) of
// a contiguous (N, H, W, C) tensor. So shapes, specs and element (n, c, h, w) mean the same in both
// layouts, contiguous() gives NCHW back (on a device too), and an op that does not read
// channels-last tensors gets NCHW copies (ops/dispatch.cpp).
#pragma once

#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata::ops {

// A 4-D tensor whose memory is (N, H, W, C) and that is not also contiguous NCHW (a tensor with
// C == 1, or H == W == 1, is both: it counts as NCHW).
bool is_channels_last(const Tensor& t);
// x (N, C, H, W) in channels-last memory: x itself when it is, else a copy.
Tensor to_channels_last(ExecContext& ctx, const Tensor& x);
// x (N, C, H, W) contiguous (NCHW): x itself when it is, else a copy.
Tensor to_channels_first(ExecContext& ctx, const Tensor& x);
// An uninitialized channels-last tensor of logical shape (N, C, H, W) from ctx's allocator.
Tensor empty_channels_last(ExecContext& ctx, const Shape& nchw, DType dtype);

// For the ops that pass channels-last activations along (ops/dispatch.cpp): element-wise ops run
// on the NHWC memory as the contiguous (N, H, W, C) tensor it is, batch norm on it as (N H W, C).
namespace detail {
// The memory of a channels-last x as a contiguous (N, H, W, C) tensor (a view).
Tensor nhwc_view(const Tensor& x);
// A contiguous (N, H, W, C) tensor as the channels-last (N, C, H, W) tensor it holds (a view).
Tensor from_nhwc(const Tensor& t);
// An operand of an element-wise op whose result is (N, C, H, W), broadcast-compatible with it
// (at most 4 dimensions), in NHWC order: 4-D (leading 1s added), permuted (N, H, W, C), and
// contiguous (a view of a channels-last or broadcast tensor, else a copy).
Tensor nhwc_operand(const Tensor& t);
// A channels-last tensor as a contiguous NCHW copy; any other tensor as it is.
Tensor nchw(const Tensor& t);
}  // namespace detail

}  // namespace strata::ops
