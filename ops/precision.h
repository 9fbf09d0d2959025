// Conversions between the floating-point dtypes, for mixed precision (--precision bf16|fp16).
//
// The training loop keeps f32 master weights, gradients and optimizer state (graph/param_store.h)
// and runs the layers on 16-bit working copies: cast_copy_ refreshes a working copy from its
// master, move_add_ moves the gradients a backward pass wrote in 16 bits into the f32 master
// gradients (and clears them for the next pass). Conversions round to nearest even; a value out
// of the 16-bit range becomes +-inf (f16), NaN stays NaN.
#pragma once

#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata::ops {

// dst = src converted to dst's dtype. Same number of elements (shapes may differ), contiguous,
// floating dtypes (f32, bf16, f16; f64 on the CPU).
void cast_copy_(ExecContext& ctx, const Tensor& dst, const Tensor& src);
// A new tensor: x converted to `dtype` (x itself when it has that dtype already).
Tensor cast(ExecContext& ctx, const Tensor& x, DType dtype);
// dst += src (converted to dst's dtype), then src = 0. Same number of elements, contiguous,
// floating dtypes; dst and src must not overlap.
void move_add_(ExecContext& ctx, const Tensor& dst, const Tensor& src);

namespace cpu {
void cast_copy_(ExecContext& ctx, const Tensor& dst, const Tensor& src);
void move_add_(ExecContext& ctx, const Tensor& dst, const Tensor& src);
}  // namespace cpu
// CUDA kernels: f32, bf16 and f16 in any pairing (ops/precision_cuda.cu).
namespace cuda {
void cast_copy_(ExecContext& ctx, const Tensor& dst, const Tensor& src);
void move_add_(ExecContext& ctx, const Tensor& dst, const Tensor& src);
}  // namespace cuda

}  // namespace strata::ops
