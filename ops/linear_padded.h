// The linear layer over a padded output dimension: the logits of a vocabulary padded inside the
// engine to a multiple of 128 (llm.c's Vp; graph/transformer.h), so that the GPU's products have
// tile-friendly shapes, while every result that means something is the unpadded one.
//
//   weight (Np, K) whose rows [n, Np) are padding, bias (Np,) or undefined, x (..., K)
//   y (..., Np): x @ weight^T + bias on columns [0, n), -inf on the padding columns, so that a
//   softmax, an argmax or a top-k never picks them (cross-entropy leaves them out altogether with
//   CrossEntropyOptions::num_classes = n).
//
// The CPU computes columns [0, n) as the product with the first n rows of the weight, bit for bit
// linear_forward of the unpadded weight (its BLAS gives other bits for other shapes), and its
// backward reads dy's first n columns only and touches rows [0, n) of dweight and dbias. CUDA
// computes the whole padded product and overwrites the padding with -inf; its backward is the
// padded linear_backward, whose padding rows of dweight and dbias receive dy's padding columns,
// which must be zero (cross_entropy_backward with num_classes = n makes them so): padding weights
// that start at zero stay zero.
#pragma once

#include <cstdint>

#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata::ops {

Tensor linear_padded_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight,
                             const Tensor& bias, int64_t n);
// Returns dx (undefined when !need_dx); accumulates dweight (Np, K) and dbias (Np,) when defined.
Tensor linear_padded_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x,
                              const Tensor& weight, const Tensor& dweight, const Tensor& dbias,
                              int64_t n, bool need_dx = true);

namespace cpu {
Tensor linear_padded_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight,
                             const Tensor& bias, int64_t n);
Tensor linear_padded_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x,
                              const Tensor& weight, const Tensor& dweight, const Tensor& dbias,
                              int64_t n, bool need_dx);
}  // namespace cpu

// ops/linear_padded_cuda.cu: cuBLASLt's padded product, then a kernel for the -inf columns.
namespace cuda {
Tensor linear_padded_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight,
                             const Tensor& bias, int64_t n);
Tensor linear_padded_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x,
                              const Tensor& weight, const Tensor& dweight, const Tensor& dbias,
                              int64_t n, bool need_dx);
}  // namespace cuda

namespace detail {
// Checks the shapes above (the padded size Np is weight.size(0)); throws naming the op.
void check_linear_padded(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias,
                         int64_t n);
}  // namespace detail

}  // namespace strata::ops
