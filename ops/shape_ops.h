// Data-movement ops: materialized permutes (transpose), concat and split.
//
// reshape and transpose as views live on Tensor (engine/tensor.h); their backward is the same
// view of the gradient. The ops here copy, so their results are contiguous. They move elements
// without looking at them, so every dtype works (ids and masks too).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata::ops {

// y = x.permute(dims), made contiguous. x may be any strided view.
// Backward: permute_copy(dy, inverse_permutation(dims)).
Tensor permute_copy(ExecContext& ctx, const Tensor& x, const std::vector<int64_t>& dims);
std::vector<int64_t> inverse_permutation(const std::vector<int64_t>& dims);

// Joins tensors (contiguous, same dtype) that agree in every dimension but `dim` (negative
// counts from the end). Backward: split(dy, sizes, dim).
Tensor concat(ExecContext& ctx, const TensorList& xs, int64_t dim);
// Cuts x (contiguous) along `dim` into pieces of the given sizes (which must sum to
// x.size(dim)); each piece is a contiguous copy. Backward: concat(dys, dim).
TensorList split(ExecContext& ctx, const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);

namespace cpu {
Tensor permute_copy(ExecContext& ctx, const Tensor& x, const std::vector<int64_t>& dims);
Tensor concat(ExecContext& ctx, const TensorList& xs, int64_t dim);
TensorList split(ExecContext& ctx, const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
}  // namespace cpu
// CUDA kernels: every dtype (elements are moved as 1, 2, 4 or 8-byte words).
namespace cuda {
Tensor permute_copy(ExecContext& ctx, const Tensor& x, const std::vector<int64_t>& dims);
Tensor concat(ExecContext& ctx, const TensorList& xs, int64_t dim);
TensorList split(ExecContext& ctx, const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
}  // namespace cuda
}  // namespace strata::ops
