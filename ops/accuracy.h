// Top-k accuracy counts.
#pragma once

#include <cstdint>

#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata::ops {

// Number of rows whose target is among the k largest logits. Ties are broken as a stable
// descending sort would: class j ranks before the target t when logit_j > logit_t, or when
// logit_j == logit_t and j < t; NaN counts as larger than every number and equal to NaN (as in
// PyTorch's sort). Rows with target == ignore_index are not counted.
// logits: (N, C) f32/f64; targets: (N,) i32/i64, each in [0, C) or ignore_index (anything else is
// an error naming the row and value); 1 <= k <= C.
int64_t topk_correct(ExecContext& ctx, const Tensor& logits, const Tensor& targets, int64_t k,
                     int64_t ignore_index = -100);

namespace cpu {
int64_t topk_correct(ExecContext& ctx, const Tensor& logits, const Tensor& targets, int64_t k,
                     int64_t ignore_index);
}  // namespace cpu

// CUDA kernel (ops/accuracy_cuda.cu): logits f32/bf16/f16. Synchronizes the context's stream to
// return the count (and to report an out-of-range target as the CPU does).
namespace cuda {
int64_t topk_correct(ExecContext& ctx, const Tensor& logits, const Tensor& targets, int64_t k,
                     int64_t ignore_index);
}  // namespace cuda
}  // namespace strata::ops
