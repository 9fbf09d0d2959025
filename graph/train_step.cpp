#include "graph/train_step.h"

#include "engine/check.h"
#include "ops/accuracy.h"

namespace strata::graph {
namespace {

struct Flat {
  Tensor logits;   // (N, V)
  Tensor targets;  // (N,)
};

Flat flatten_for_loss(const Tensor& logits, const Tensor& target) {
  STRATA_CHECK(logits.dim() >= 2) << "loss: the model's output must be (B, ..., classes), got "
                                  << logits.shape_str();
  const Shape expected(logits.shape().begin(), logits.shape().end() - 1);
  STRATA_CHECK(target.shape() == expected)
      << "loss: targets of shape " << target.shape_str() << " do not match logits of shape "
      << logits.shape_str();
  return {logits.reshape({-1, logits.size(-1)}), target.reshape({-1})};
}

void count_correct(ExecContext& ctx, const Flat& f, int64_t ignore_index, BatchMetrics* m) {
  m->top1 = ops::topk_correct(ctx, f.logits, f.targets, 1, ignore_index);
  m->top5 =
      f.logits.size(1) >= 5 ? ops::topk_correct(ctx, f.logits, f.targets, 5, ignore_index) : 0;
}

}  // namespace

BatchMetrics train_forward_backward(ExecContext& ctx, Model& model, const Tensor& input,
                                    const Tensor& target, const ops::CrossEntropyOptions& loss,
                                    const ForwardOptions& options, LayerProfiler* profiler) {
  Tape tape;
  ForwardOptions fwd = options;
  fwd.keep_tape = true;
  const TensorList out = model.forward(ctx, 0, model.size(), {input}, tape, fwd, profiler);
  STRATA_CHECK_EQ(out.size(), 1u) << "model " << model.name() << " must end in one output";
  const Flat f = flatten_for_loss(out[0], target);
  ops::CrossEntropyOptions counted = loss;  // a padded vocabulary's padding is no class
  if (counted.num_classes == 0) counted.num_classes = model.loss_classes();
  BatchMetrics m;
  m.loss =
      ops::cross_entropy_forward(ctx, f.logits, f.targets, counted).to(DType::kF64).item<double>();
  m.counted = ops::count_targets(f.targets, loss.ignore_index);
  count_correct(ctx, f, loss.ignore_index, &m);
  Tensor dlogits = ops::cross_entropy_backward(ctx, f.logits, f.targets, counted, 1.0);
  model.backward(ctx, 0, model.size(), {dlogits.view(out[0].shape())}, tape, profiler);
  return m;
}

BatchMetrics evaluate_batch(ExecContext& ctx, Model& model, const Tensor& input,
                            const Tensor& target, int64_t ignore_index) {
  Tape tape;
  ForwardOptions fwd;
  fwd.training = false;
  fwd.keep_tape = false;
  const TensorList out = model.forward(ctx, 0, model.size(), {input}, tape, fwd);
  STRATA_CHECK_EQ(out.size(), 1u) << "model " << model.name() << " must end in one output";
  const Flat f = flatten_for_loss(out[0], target);
  ops::CrossEntropyOptions loss;
  loss.ignore_index = ignore_index;
  loss.num_classes = model.loss_classes();
  BatchMetrics m;
  m.loss =
      ops::cross_entropy_forward(ctx, f.logits, f.targets, loss).to(DType::kF64).item<double>();
  m.counted = ops::count_targets(f.targets, ignore_index);
  count_correct(ctx, f, ignore_index, &m);
  return m;
}

}  // namespace strata::graph
