// One training or evaluation pass of a whole model on one batch (single process, one stage).
// The pipeline executor does the same per stage and micro-batch from an instruction list.
#pragma once

#include <cstdint>

#include "engine/exec_context.h"
#include "graph/model.h"
#include "ops/cross_entropy.h"

namespace strata::graph {

class LayerProfiler;

struct BatchMetrics {
  double loss = 0.0;    // as normalized by the loss options (mean over the global batch)
  int64_t counted = 0;  // targets that are not ignored
  int64_t top1 = 0;     // correct top-1 predictions among them
  int64_t top5 = 0;     // correct top-5 predictions (0 when there are fewer than 5 classes)
};

// Logits (B, ..., V) and targets (B, ...) are flattened to (N, V) and (N,).
// Forward, loss, backward: parameter gradients accumulate into the model's bound gradients.
BatchMetrics train_forward_backward(ExecContext& ctx, Model& model, const Tensor& input,
                                    const Tensor& target, const ops::CrossEntropyOptions& loss,
                                    const ForwardOptions& options,
                                    LayerProfiler* profiler = nullptr);

// Forward in evaluation mode (no tape kept); loss normalized by the batch's own count.
BatchMetrics evaluate_batch(ExecContext& ctx, Model& model, const Tensor& input,
                            const Tensor& target, int64_t ignore_index = -100);

}  // namespace strata::graph
