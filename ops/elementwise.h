// Element-wise arithmetic with NumPy broadcasting, and the reduction that undoes a broadcast.
//
// Broadcasting: shapes are aligned at their last dimension; each pair of sizes must be equal or
// one of them 1 (or missing). The output has the larger size in every dimension.
#pragma once

#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata::ops {

Shape broadcast_shapes(const Shape& a, const Shape& b);  // throws naming both shapes

Tensor add(ExecContext& ctx, const Tensor& a, const Tensor& b);  // a + b, broadcast
Tensor mul(ExecContext& ctx, const Tensor& a, const Tensor& b);  // a * b, broadcast
Tensor scale(ExecContext& ctx, const Tensor& x, double alpha);   // alpha * x
// dst += alpha * src in place (same shape and dtype; dst may be any contiguous view, and src may
// be dst itself). The gradient accumulation primitive.
void add_(ExecContext& ctx, const Tensor& dst, const Tensor& src, double alpha = 1.0);

// Sums t over the dimensions that broadcasting expanded, so that the result has `shape`
// (broadcast_shapes(shape, t.shape()) must equal t.shape()). The backward of a broadcast.
Tensor sum_to_shape(ExecContext& ctx, const Tensor& t, const Shape& shape);

struct BinaryGrads {
  Tensor da, db;  // shaped like a and b (undefined unless asked for)
};
// add: da = sum_to_shape(dy, a), db = sum_to_shape(dy, b).
BinaryGrads add_backward(ExecContext& ctx, const Tensor& dy, const Shape& a_shape,
                         const Shape& b_shape, bool need_da, bool need_db);
// mul: da = sum_to_shape(dy * b, a), db = sum_to_shape(dy * a, b).
BinaryGrads mul_backward(ExecContext& ctx, const Tensor& dy, const Tensor& a, const Tensor& b,
                         bool need_da, bool need_db);

namespace cpu {
Tensor add(ExecContext& ctx, const Tensor& a, const Tensor& b);
Tensor mul(ExecContext& ctx, const Tensor& a, const Tensor& b);
Tensor scale(ExecContext& ctx, const Tensor& x, double alpha);
void add_(ExecContext& ctx, const Tensor& dst, const Tensor& src, double alpha);
Tensor sum_to_shape(ExecContext& ctx, const Tensor& t, const Shape& shape);
}  // namespace cpu
// CUDA kernels: f32, bf16 and f16 (computed in f32; sum_to_shape accumulates in double).
namespace cuda {
Tensor add(ExecContext& ctx, const Tensor& a, const Tensor& b);
Tensor mul(ExecContext& ctx, const Tensor& a, const Tensor& b);
Tensor scale(ExecContext& ctx, const Tensor& x, double alpha);
void add_(ExecContext& ctx, const Tensor& dst, const Tensor& src, double alpha);
Tensor sum_to_shape(ExecContext& ctx, const Tensor& t, const Shape& shape);
}  // namespace cuda
}  // namespace strata::ops
