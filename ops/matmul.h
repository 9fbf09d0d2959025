// Matrix products and the linear (fully connected) layer. CPU: OpenBLAS sgemm/dgemm.
#pragma once

#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata::ops {

// c = op(a) @ op(b), where op transposes the last two dimensions when asked.
//   a: (..., M, K), or (..., K, M) with trans_a
//   b: (..., K, N), or (..., N, K) with trans_b; b may also be 2-D and is then shared by every
//      batch entry of a
//   c: (..., M, N); the leading (batch) dimensions of a and b must be equal.
// f32 or f64, a and b of the same dtype; contiguous.
Tensor matmul(ExecContext& ctx, const Tensor& a, const Tensor& b, bool trans_a = false,
              bool trans_b = false);

struct MatmulGrads {
  Tensor da;  // like a (undefined unless asked for)
  Tensor db;  // like b (undefined unless asked for)
};
// Gradients of matmul for the upstream gradient dc (shape of c). Both are new tensors
// (activation-gradient semantics); when b was shared over the batch, db sums over it.
MatmulGrads matmul_backward(ExecContext& ctx, const Tensor& dc, const Tensor& a, const Tensor& b,
                            bool trans_a, bool trans_b, bool need_da, bool need_db);

// y = x @ weight^T + bias
//   x: (..., K), weight: (M, K), bias: (M,) or undefined  ->  y: (..., M)
Tensor linear_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias);

// Returns dx (undefined when !need_dx); accumulates dweight += dy^T x and dbias += sum(dy) over
// all leading dimensions. dweight/dbias may be undefined (not needed).
Tensor linear_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& weight,
                       const Tensor& dweight, const Tensor& dbias, bool need_dx = true);

// The linear layer followed by GELU (tanh form, ops/activation.h) in one op:
//   pre = x @ weight^T + bias,  y = gelu(pre)
// x: (..., K), weight: (M, K), bias: (M,) or undefined  ->  y and pre: (..., M). pre is what
// gelu_backward needs (then linear_backward). On CUDA one cuBLASLt product with the
// GELU_AUX_BIAS epilogue writes both.
struct LinearGeluResult {
  Tensor y;
  Tensor pre;
};
LinearGeluResult linear_gelu_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight,
                                     const Tensor& bias);

namespace cpu {
Tensor matmul(ExecContext& ctx, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b);
MatmulGrads matmul_backward(ExecContext& ctx, const Tensor& dc, const Tensor& a, const Tensor& b,
                            bool trans_a, bool trans_b, bool need_da, bool need_db);
Tensor linear_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias);
Tensor linear_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& weight,
                       const Tensor& dweight, const Tensor& dbias, bool need_dx);
LinearGeluResult linear_gelu_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight,
                                     const Tensor& bias);
}  // namespace cpu

// cuBLASLt (ops/matmul_cuda.cu): f32 (TF32 tensor cores when the context's math mode says so),
// bf16 and f16 tensors, products accumulated in f32.
namespace cuda {
Tensor matmul(ExecContext& ctx, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b);
MatmulGrads matmul_backward(ExecContext& ctx, const Tensor& dc, const Tensor& a, const Tensor& b,
                            bool trans_a, bool trans_b, bool need_da, bool need_db);
Tensor linear_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias);
Tensor linear_backward(ExecContext& ctx, const Tensor& dy, const Tensor& x, const Tensor& weight,
                       const Tensor& dweight, const Tensor& dbias, bool need_dx);
LinearGeluResult linear_gelu_forward(ExecContext& ctx, const Tensor& x, const Tensor& weight,
                                     const Tensor& bias);
}  // namespace cuda
}  // namespace strata::ops
