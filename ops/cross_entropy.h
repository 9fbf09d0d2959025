// Cross-entropy from logits, fused with log-softmax, with ignore index and label smoothing
// (PyTorch's definitions):
//
//   q = (1 - eps) onehot(target) + eps / V        (eps = label_smoothing)
//   loss_i = -sum_j q_j log softmax(logits_i)_j    rows whose target == ignore_index add 0
//   loss = sum_i loss_i / normalizer
//
// The normalizer is what makes micro-batching exact: a pipeline passes the number of counted
// targets in the whole global batch, so the micro-batch losses add up to the global mean.
#pragma once

#include <cstdint>

#include "engine/exec_context.h"
#include "engine/tensor.h"

namespace strata::ops {

struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;  // in [0, 1)
  // Divides the summed loss. 0: the number of targets in this call that are not ignored (a call
  // where every target is ignored then gives loss 0).
  double normalizer = 0.0;
  // Classes counted: the first num_classes columns of the logits (0: all of them). A vocabulary
  // padded for the GPU (graph/transformer.h) gives logits (N, Vp) of which the first V are the
  // model's; the padding takes no part in the softmax or the smoothing (V here is num_classes),
  // targets must be below num_classes, and its gradient is 0.
  int64_t num_classes = 0;
};

// Number of targets that are not ignore_index.
int64_t count_targets(const Tensor& targets, int64_t ignore_index);

// logits: (N, C) f32/f64 with V = options.num_classes (or C) classes counted; targets: (N,)
// i32/i64, each in [0, V) or ignore_index (anything else is an error naming the row and value).
// The CPU computes a padded call on a copy of the first V columns, so its loss and gradient are
// bit for bit those of the unpadded logits. Returns the loss as a scalar tensor of shape () in
// logits' dtype, but f32 for bf16/f16 logits (mixed precision; the CPU computes those in f32).
Tensor cross_entropy_forward(ExecContext& ctx, const Tensor& logits, const Tensor& targets,
                             const CrossEntropyOptions& options);
// dlogits = dloss * (softmax(logits) - q) / normalizer for counted rows, 0 for ignored rows and
// for the padding columns; shaped like logits.
Tensor cross_entropy_backward(ExecContext& ctx, const Tensor& logits, const Tensor& targets,
                              const CrossEntropyOptions& options, double dloss = 1.0);

namespace cpu {
Tensor cross_entropy_forward(ExecContext& ctx, const Tensor& logits, const Tensor& targets,
                             const CrossEntropyOptions& options);
Tensor cross_entropy_backward(ExecContext& ctx, const Tensor& logits, const Tensor& targets,
                              const CrossEntropyOptions& options, double dloss);
}  // namespace cpu

// CUDA kernels (ops/cross_entropy_cuda.cu): logits f32/bf16/f16 (math in f32, the summed loss in
// double, deterministic; the loss in f32, dlogits in logits' dtype). Targets are validated on the
// device without synchronizing: a target outside [0, V) that is not ignore_index prints the op, row
// and value, and traps (the CUDA context is then unusable, as after PyTorch's device-side asserts).
namespace cuda {
Tensor cross_entropy_forward(ExecContext& ctx, const Tensor& logits, const Tensor& targets,
                             const CrossEntropyOptions& options);
Tensor cross_entropy_backward(ExecContext& ctx, const Tensor& logits, const Tensor& targets,
                              const CrossEntropyOptions& options, double dloss);
}  // namespace cuda
}  // namespace strata::ops
